"""W4A8's FP8 activation programs in Triton's CPU interpreter (a subprocess entry point): the cases of
``tests/moe/w4a8_gather_cases.py``, which together must cover padding routes, padding slots, tokens whose routes land
in several blocks and experts over several blocks.

Usage: python -m tests.moe.interpret_w4a8_gather SEED -> prints "ok <cases>" or exits non-zero.
"""

from __future__ import annotations

import sys
from collections import Counter

from tests.interpreter import run_launch
from tests.moe.w4a8_gather_cases import CASES, run_case


def main(seed: int) -> None:
    covered = Counter()
    for case in CASES:
        covered.update(run_case(seed, *case, run=run_launch, device="cpu"))
    missing = [what for what, n in covered.items() if n == 0]
    assert not missing, f"seed {seed}: no case covered {missing}"
    print(f"ok {len(CASES)} ({', '.join(f'{k} {v}' for k, v in covered.items())})")


if __name__ == "__main__":
    main(int(sys.argv[1]))
