"""A split engine layer call in Triton's CPU interpreter, torch standing in for the split GEMMs
(``tests/moe/interpret_engine_split.py``): the partials' layout, FC1's finish and the partial combine against the
float32 reference."""

from __future__ import annotations

from tests.interpreted import run_interpreted


def test_split_layer_in_the_interpreter():
    run_interpreted("tests.moe.interpret_engine_split", "ok 4")
