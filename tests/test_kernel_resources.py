"""scripts/kernel_resources.py: the theoretical CTAs a Hopper SM holds, by each limit."""

from __future__ import annotations

import pytest

from tests.repo_scripts import load_script

resources = load_script("scripts/kernel_resources.py", "kernel_resources")


@pytest.mark.parametrize(
    ("registers", "threads", "shared", "ctas", "bound_by"),
    [
        (168, 384, 200_000, 1, "registers+shared"),  # a warp-specialized GEMM: one CTA a SM
        (32, 128, 0, 16, "registers+threads"),
        (40, 128, 0, 12, "registers"),  # 40 registers round up to 1,280 a warp
        (16, 64, 0, 32, "threads+ctas"),
        (32, 128, 60_000, 3, "shared"),  # 1 KB reserved a CTA: 3 x 61,000 fit, 4 do not
    ],
)
def test_ctas_per_sm_names_the_binding_limit(registers, threads, shared, ctas, bound_by):
    got = resources.ctas_per_sm(registers, threads, shared)
    assert (got["ctas"], got["bound_by"]) == (ctas, bound_by)
