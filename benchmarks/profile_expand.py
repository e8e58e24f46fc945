"""One DS4.1-TP4 inline expansion (W13 or W2), for a profiler (ncu) to look at: no timing of its own.

    ncu --clock-control none -k regex:expand_inline -c 1 --section SpeedOfLight ... \\
        python3 benchmarks/profile_expand.py [--plane w2]
"""

from __future__ import annotations

import argparse

import torch

from csf_codec import MXFP4, encode_inline
from csf_codec.synthetic import SEED_REGIME, synthetic_scale_plane
from csf_kernels import runtime
from csf_kernels.expand import expand_inline

PLANES = {"w13": ((384, 1152, 160), 576), "w2": ((384, 5120, 18), None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plane", choices=sorted(PLANES), default="w13")
    shape, group = PLANES[ap.parse_args().plane]
    runtime.freeze()
    plane = synthetic_scale_plane(shape, MXFP4, stats=SEED_REGIME, seed=7).cuda()
    inline = encode_inline(plane, MXFP4, row_group=group)
    out = torch.empty_like(plane)
    expand_inline(inline, out)
    torch.cuda.synchronize()
    assert torch.equal(out, plane)


if __name__ == "__main__":
    main()
