"""Sparse MLA decode and merge programs in Triton's CPU interpreter, against the float32 reference.

The GPU tests run the same programs from the AOT cache on the H200 (test_mla_gpu.py).
"""

from __future__ import annotations

import pytest

from tests.interpreted import run_interpreted

pytest.importorskip("triton")


def test_interpreted_decode_matches_the_reference_with_splits_sinks_packed_queries_and_a_late_maximum():
    run_interpreted("tests.attention.interpret_mla", "ok 18", timeout=900)
