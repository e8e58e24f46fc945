"""The inline-expansion Triton kernel, run by Triton's CPU interpreter, reproduces the native planes.

The GPU test runs the same cases from the AOT cache on the H200 (test_expand_gpu.py).
"""

from __future__ import annotations

import pytest

from tests.interpreted import run_interpreted

pytest.importorskip("triton")


def test_interpreted_expansion_matches_the_planes():
    run_interpreted("tests.kernels.interpret_expand", "ok 13", timeout=600)
