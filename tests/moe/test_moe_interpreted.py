"""The whole fused MoE layer (align, GEMMs with every scale source, combine) in Triton's CPU interpreter.

The GPU tests run the same programs from the AOT cache on the H200 (test_moe_gpu.py).
"""

from __future__ import annotations

import pytest

from tests.interpreted import run_interpreted

pytest.importorskip("triton")


@pytest.mark.slow
def test_interpreted_layer_sources_agree_and_match_the_reference():
    run_interpreted("tests.moe.interpret_moe", "ok 24", timeout=900)


def test_interpreted_alignment_in_one_program_groups_routes_as_two_do():
    run_interpreted("tests.moe.interpret_align", "ok 21", timeout=600)


def test_interpreted_relabelled_activations_match_the_reference_order():
    run_interpreted("tests.moe.interpret_relabel", "ok 12", timeout=600)
