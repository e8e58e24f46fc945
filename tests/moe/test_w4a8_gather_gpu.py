"""W4A8's FP8 activation programs on the GPU from the AOT cache, frozen: FC1's gather by token and FC2's row quantizer
store the hardware's division and E4M3 conversion bit for bit as the CPU torch references, routed slots only, and
the combine through the routes' slots reads nothing else (tests/moe/w4a8_gather_cases.py)."""

from __future__ import annotations

import os

import pytest

from tests.moe.w4a8_gather_cases import GPU_CASES, run_case

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")


@pytest.mark.parametrize("case", GPU_CASES, ids=[f"T{c[0]}-E{c[1]}-H{c[2]}-k{c[3]}" for c in GPU_CASES])
def test_w4a8_gather_matches_the_references(case):
    run_case(SEED, *case, run=lambda launch: launch.bind("w4a8 gather test")(), device="cuda")
