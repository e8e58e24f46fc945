"""W4A8's FP8 activation programs (FC1's gather by token, FC2's row quantizer) in Triton's CPU interpreter, bit for bit
against the torch references."""

from __future__ import annotations

from tests.interpreted import run_interpreted


def test_w4a8_gather_in_the_interpreter():
    run_interpreted("tests.moe.interpret_w4a8_gather", "ok 4")
