"""One DS4.1-TP4 W13 inline expansion, for a profiler (ncu) to look at: no timing of its own.

    ncu --clock-control none -k regex:expand_inline -c 1 --section SpeedOfLight ... \\
        python3 benchmarks/profile_expand.py
"""

from __future__ import annotations

import torch

from csf_codec import MXFP4, encode_inline
from csf_codec.synthetic import SEED_REGIME, synthetic_scale_plane
from csf_kernels import runtime
from csf_kernels.expand import expand_inline


def main() -> None:
    runtime.freeze()
    plane = synthetic_scale_plane((384, 1152, 160), MXFP4, stats=SEED_REGIME, seed=7).cuda()
    inline = encode_inline(plane, MXFP4, row_group=576)
    out = torch.empty_like(plane)
    expand_inline(inline, out)
    torch.cuda.synchronize()
    assert torch.equal(out, plane)


if __name__ == "__main__":
    main()
