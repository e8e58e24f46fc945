"""One DS4.1-TP4 inline expansion (W13 or W2), for a profiler (ncu) to look at: no timing of its own.

    ncu --clock-control none -k regex:expand_inline -c 1 --section SpeedOfLight ... \\
        python3 benchmarks/profile_expand.py [--plane w2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_expand import layer_planes

from csf_kernels import runtime
from csf_kernels.expand.launch import ENGINES, expand_inline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plane", choices=("w13", "w2"), default="w13")
    ap.add_argument("--engine", choices=ENGINES, default="auto")
    a = ap.parse_args()
    proj = a.plane
    runtime.freeze()
    plane, inline = layer_planes()[1][proj]  # the planes bench_expand times
    out = torch.empty_like(plane)
    expand_inline(inline, out, engine=a.engine)
    torch.cuda.synchronize()
    assert torch.equal(out, plane)


if __name__ == "__main__":
    main()
