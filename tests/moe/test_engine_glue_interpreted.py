"""The engine layer's align, gather, activation and combine passes in Triton's CPU interpreter."""

from __future__ import annotations

from tests.interpreted import run_interpreted


def test_engine_glue_in_the_interpreter():
    run_interpreted("tests.moe.interpret_engine_glue", "ok 4")
