"""W4A8's gather-and-quantize programs in Triton's CPU interpreter (a subprocess entry point): the cases of
``tests/moe/w4a8_gather_cases.py``.

Usage: python -m tests.moe.interpret_w4a8_gather SEED -> prints "ok <cases>" or exits non-zero.
"""

from __future__ import annotations

import sys

from tests.interpreter import run_launch
from tests.moe.w4a8_gather_cases import CASES, run_case


def main(seed: int) -> None:
    for case in CASES:
        run_case(seed, *case, run=run_launch, device="cpu")
    print(f"ok {len(CASES)}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
