"""A split engine layer call (``csf_moe.engine_split``) in Triton's CPU interpreter (a subprocess entry point): the
launches ``EngineMoE.launches`` builds, the alignment, FC1's finish and the partial combine interpreted, torch standing
in for the two split GEMMs from their launch arguments (block map, route ids, ``top_k``, ``pairs``, ``split_steps``:
each split's float32 products over its K range at ``s * pairs + route``, W13's engine rows at the ``[gate; up]``
columns the kernel stores them to, no global scale). The output must match ``csf_moe.reference`` within the GPU layer
tests' tolerance: a partial in the wrong column, a bias in the wrong order or a split summed twice would not.

Usage: python -m tests.moe.interpret_engine_split SEED -> prints "ok <cases>" or exits non-zero.
"""

from __future__ import annotations

import sys

import torch

from csf_codec import scale_format
from csf_codec.quantize import dequantize_mxfp4, dequantize_nvfp4
from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.engine_panels import fc1_engine_rows
from csf_moe.engine_layer import EngineMoE, engine_weights
from csf_moe.reference import moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from tests.interpreter import run_launch
from tests.moe.padding_routes import with_padding_routes

REL_TOL = 2e-2  # tests/moe/test_engine_layer_gpu.py's


def _weights(ref, fc: str, e: int, interleaved: bool) -> torch.Tensor:
    """Expert ``e``'s weights as the split GEMM multiplies them (float32, no NVFP4 global scale), W13 in engine
    row order."""
    values, scales = (ref.w13, ref.w13_scale) if fc == "fc1" else (ref.w2, ref.w2_scale)
    if ref.fmt == "mxfp4":
        w = dequantize_mxfp4(values[e], scales[e]).float()
    else:
        w = dequantize_nvfp4(values[e], scales[e], torch.ones(())).float()
    if fc == "fc1":
        w = w[fc1_engine_rows(w.shape[0] // 2, interleaved)]
    return w


def _split_gemm(launch, ref, interleaved: bool) -> None:
    """The split GEMM's stand-in, from its launch's arguments."""
    x, part, block_expert, meta, sorted_ids = (launch.args[i] for i in (2, 3, 6, 7, 8))
    top_k, pairs, step = launch.args[-4:-1]
    form, bm = launch.spec.fact["PART"], launch.spec.fact["TN"]
    rows = part.shape[1]
    j = torch.arange(rows)
    n = (j // 16) * 8 + j % 8
    col = torch.where(j % 16 < 8, n, rows // 2 + n) if form == "fc1" else j
    k_steps = x.shape[1] // 64
    for b in range(int(meta[0])):
        w = _weights(ref, form, int(block_expert[b]), interleaved)
        for i in range(bm):
            route = int(sorted_ids[b * bm + i])
            if not 0 <= route < pairs:
                continue
            row = x[route // top_k].float()
            for s, k0 in enumerate(range(0, k_steps, step)):
                k = slice(64 * k0, 64 * min(k0 + step, k_steps))
                part[s * pairs + route, col] = w[:, k] @ row[k]


def _case(seed: int, fmt: str, act: str, bias: bool, tokens: int, splits) -> None:
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format(fmt), experts=8, hidden=256, intermediate=256, top_k=2,
                      activation=act, bias=bias)  # fmt: skip
    ref = synthetic_layer(geo, seed=seed % 1000).reference()
    layer = EngineMoE(engine_weights(ref, act), geo.top_k, splits=splits)
    x, ids, w = synthetic_routing(geo, tokens, torch.Generator().manual_seed(seed))
    if tokens > 1:  # graph padding: inert
        ids = with_padding_routes(ids, geo.experts, invalid=[-1])
    out = torch.full_like(x, float("nan"))
    launches, keep = layer.launches(x, ids, w, out)
    for buf in keep:  # every buffer poisoned: what the split programs do not write stays NaN (or -1)
        if isinstance(buf, torch.Tensor) and buf is not w:
            buf.fill_(float("nan") if buf.is_floating_point() else -1)
    w32 = keep[-1]
    if w32 is not w:
        w32.copy_(w)
    kinds = [launch.spec.fact.get("PART") for launch in launches if launch.spec.kernel == "moe.engine_gemm"]
    assert kinds == ["fc1", "rows"], kinds
    for launch in launches:
        if launch.spec.kernel == "moe.engine_gemm":
            _split_gemm(launch, ref, act == "swiglu_oai")
        else:
            run_launch(launch)
    want = moe_reference(x, ref, w, ids, kind=act)
    err = float((out.float() - want).norm() / want.norm())
    assert torch.isfinite(out.float()).all(), (fmt, act, tokens, "unwritten outputs")
    assert err < REL_TOL, (fmt, act, bias, tokens, splits, err)


def main(seed: int) -> None:
    cases = [
        ("mxfp4", "silu", False, 1, (2, 2)),
        ("mxfp4", "swiglu_oai", True, 3, (2, 2)),
        ("mxfp4", "swiglu_oai", True, 1, (1, 2)),
        ("nvfp4", "silu", False, 2, (4, 2)),
    ]
    for case in cases:
        _case(seed, *case)
    print(f"ok {len(cases)}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
