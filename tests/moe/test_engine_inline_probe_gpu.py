"""The inline scale source's scale slots, observed (``tests/moe/inline_probe.py``): a GEMM of E2M1 1.0 weights and
one-hot route rows writes each (weight row, K block)'s scale factor, so the inline program's slots are compared with
the torch twin's bytes one by one, and a wrong byte is reported by unit, tile row, K block, K step and ring stage,
record, decoder lane and slot, staging slot, and the kind of position (selector, raw, exception code), with the
mismatch counts per kind. Runs in seconds:

    pytest tests/moe/test_engine_inline_probe_gpu.py -q -x -s

The native program runs the same probe first: its bytes must be the twin's too, else the probe (not the decoder) is
at fault. Each case runs with the launch's CTA count, 5 and 1, so CTAs walk several units: the staging slots and the
ring turn over across units, through invalid blocks (which decode nothing) between valid ones."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from csf_codec.engine_records import encode_engine_records
from csf_codec.synthetic import DOWN_PROJ_DENSE, synthetic_scale_plane
from csf_kernels import runtime
from csf_kernels.moe.engine import grouped_fp4_gemm_launch
from csf_kernels.moe.engine_inline import device_records
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel

from .inline_probe import make_probe, probe_planes, report, twin_scales

pytestmark = pytest.mark.gpu

SEED = int.from_bytes(os.urandom(3), "little")
_K = {"mxfp4": 1088, "nvfp4": 576}  # 9 records a row block (MXFP4's last a 2-column tail), 17 or 9 K steps


def _stages(tile_n: int, fmt: str) -> int | None:
    try:
        from csf_kernels.moe.kernels.engine_gemm import GroupedFp4Gemm
    except ImportError:  # the report then gives ring positions only
        return None
    return GroupedFp4Gemm(tile_n, fmt=fmt, scales="inline").stages


def _planes(fmt: str, experts: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Expert 0 random bytes (raw records), the others synthetic planes (selector records with exceptions of every
    code and escapes); no NaN codes."""
    stats = DOWN_PROJ_DENSE if fmt == "mxfp4" else None
    planes = synthetic_scale_plane((experts, rows, cols), fmt, stats, seed=seed % 1000)
    g = torch.Generator().manual_seed(seed)
    planes[0] = torch.randint(0, 256, (rows, cols), generator=g).to(torch.uint8)
    return probe_planes(planes, fmt)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tile_n", [16, 256])
def test_inline_scale_slots_equal_the_twins(tile_n, fmt):
    experts, rows = 4, 320  # 320 rows: tile 2 is half past the expert
    seed = SEED + tile_n
    probe = make_probe(fmt, experts, rows, _K[fmt], tile_n)
    planes = _planes(fmt, experts, rows, probe.cols, seed)
    records = encode_engine_records(planes, fmt, row_group=rows)
    want = twin_scales(records, experts, rows, probe.cols)
    w_panel = torch.stack([engine_weight_panel(probe.packed[e]) for e in range(experts)]).cuda()
    native = torch.stack([engine_scale_panel(planes[e], fmt) for e in range(experts)]).cuda()
    inline = device_records(records, fmt, "cuda")
    x, block_expert = probe.x.cuda(), probe.block_expert.cuda()
    meta = torch.tensor([block_expert.numel()], dtype=torch.int32, device="cuda")
    gscale = torch.ones(experts, dtype=torch.float32, device="cuda") if fmt == "nvfp4" else None
    stages = _stages(tile_n, fmt)
    failures = []
    for scales in (native, inline):
        source = "native" if scales is native else "inline"
        runtime.freeze()
        try:
            stand_in = torch.empty(x.shape[0], rows, dtype=torch.bfloat16, device="cuda")
            launch = grouped_fp4_gemm_launch(w_panel, scales, x, stand_in, block_expert, meta, tile_n=tile_n, fmt=fmt,
                                             global_scale=gscale)  # fmt: skip
            for ctas in sorted({launch.grid[0], 5, 1}, reverse=True):
                out = torch.full((x.shape[0], rows), float("nan"), dtype=torch.bfloat16, device="cuda")
                args = [out if a is stand_in else a for a in launch.args]
                assert args[-5] == launch.grid[0], (
                    "the CTA count is the fifth argument from the end (top_k, pairs, split_steps, pdl)"
                )
                args[-5] = ctas
                dataclasses.replace(launch, grid=(ctas, 1, 1), args=tuple(args)).bind("inline probe")()
                torch.cuda.synchronize()
                text = report(probe.exposed(out), want, probe, records, ctas=ctas, stages=stages)
                if text:
                    failures.append(f"{source}, {ctas} CTAs (seed {seed}):\n{text}")
                    print(failures[-1])
        finally:
            runtime.unfreeze()
    assert not failures, "\n".join(failures)
