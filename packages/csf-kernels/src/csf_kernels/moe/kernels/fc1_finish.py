"""Triton: finish a split-K FC1: sum the float32 partials in split order, then global scale, bias and
the activation, exactly as the unsplit GEMM's epilogue does; store bf16 ``[pairs, N]``, or with ``RELABEL``
(the K step of FC2's wgmma programs that copy relabelled activations) ``[pairs, NP]`` in the relabelled
order (csf_kernels.moe.relabel: NP = N rounded up to whole steps, the padding zero).

Routes whose expert id lies outside [0, E) are skipped (their partials were never written).
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.moe.kernels.gemm import SWIGLU_ALPHA, SWIGLU_LIMIT
from csf_kernels.moe.kernels.relabel import logical_column
from csf_kernels.runtime.pdl import await_predecessor

MULTIPLE_OF = {"n_out": 16}  # integer arguments compiled in as divisible (checked at bind)

SIGNATURE = {
    "part": "*fp32",
    "topk_ids": "*i32",
    "gscale": "*fp32",
    "bias": "*fp32",
    "out": "*bf16",
    "pairs": "i32",
    "n_out": "i32",
    "splits": "i32",
    "num_experts": "i32",
    "IDS64": "constexpr",
    "ACT": "constexpr",
    "HAS_BIAS": "constexpr",
    "HAS_GSCALE": "constexpr",
    "BH": "constexpr",
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
    "RELABEL": "constexpr",  # 0: [pairs, N] as is; else the K step of the relabelled order
}


@triton.jit
def moe_fc1_finish(
    part,
    topk_ids,
    gscale,
    bias,
    out,
    pairs,
    n_out,
    splits,
    num_experts,
    IDS64: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_GSCALE: tl.constexpr,
    BH: tl.constexpr,
    PDL: tl.constexpr,
    RELABEL: tl.constexpr,
):
    await_predecessor(PDL)
    route = tl.program_id(0)
    n = tl.program_id(1) * BH + tl.arange(0, BH)
    nm = n < n_out
    if IDS64:
        e = tl.load(topk_ids.to(tl.pointer_type(tl.int64)) + route)
    else:
        e = tl.load(topk_ids + route)
    if (e < 0) | (e >= num_experts):
        return
    e = e.to(tl.int32)
    R = 2 * n_out
    acc_a = tl.zeros([BH], dtype=tl.float32)
    acc_b = tl.zeros([BH], dtype=tl.float32)
    for s in range(0, splits):
        row = (s * pairs + route).to(tl.int64) * R
        acc_a += tl.load(part + row + n, mask=nm, other=0.0)
        acc_b += tl.load(part + row + n_out + n, mask=nm, other=0.0)
    if HAS_GSCALE:
        g = tl.load(gscale + e)
        acc_a = acc_a * g
        acc_b = acc_b * g
    if HAS_BIAS:
        acc_a += tl.load(bias + e.to(tl.int64) * R + n, mask=nm, other=0.0)
        acc_b += tl.load(bias + e.to(tl.int64) * R + n_out + n, mask=nm, other=0.0)
    if ACT == 0:
        y = acc_a / (1.0 + tl.exp(-acc_a)) * acc_b
    else:
        gate = tl.minimum(acc_a, SWIGLU_LIMIT)
        up = tl.minimum(tl.maximum(acc_b, -SWIGLU_LIMIT), SWIGLU_LIMIT)
        y = gate / (1.0 + tl.exp(-SWIGLU_ALPHA * gate)) * (up + 1.0)
    if RELABEL:  # columns past N are zero (every term above was masked to zero there)
        n_pad = tl.cdiv(n_out, RELABEL) * RELABEL
        pos = logical_column(n, RELABEL)
        tl.store(out + route.to(tl.int64) * n_pad + pos, y.to(tl.bfloat16), mask=n < n_pad)
    else:
        tl.store(out + route.to(tl.int64) * n_out + n, y.to(tl.bfloat16), mask=nm)
