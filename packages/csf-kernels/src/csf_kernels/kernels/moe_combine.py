"""Triton: the top-k weighted sum of a fused MoE layer, ``out[t] = sum_j w[t, j] * y[t * k + j]``.

In float32 (deterministic: no atomics), rounded once to bf16. A program loads the ``k`` slots of its token
together (``TK`` >= k rows of one tile), so a call waits on one round of loads per split rather than one per
slot and split (at one token the slots' loads were the whole kernel's latency). ``y`` is the FC2 output:
bf16 ``[pairs, H]`` with global scale and bias applied, or (``PARTIAL``) the float32 partials of a
split-K FC2 ``[splits, pairs, H]``, summed here in split order before the global scale and bias. A slot
whose expert id lies outside [0, E) (vLLM's graph padding) contributes exactly nothing: its ``y`` row
was never written and is never read.
"""

from __future__ import annotations

import triton
import triton.language as tl

MULTIPLE_OF = {"hidden": 16}  # integer arguments compiled in as divisible (checked at bind)

SIGNATURE = {
    "y": "*bf16",
    "part": "*fp32",
    "gscale": "*fp32",
    "bias": "*fp32",
    "topk_ids": "*i32",
    "topk_weights": "*fp32",
    "out": "*bf16",
    "hidden": "i32",
    "top_k": "i32",
    "num_experts": "i32",
    "splits": "i32",
    "pairs": "i32",
    "IDS64": "constexpr",
    "PARTIAL": "constexpr",
    "HAS_BIAS": "constexpr",
    "HAS_GSCALE": "constexpr",
    "BH": "constexpr",  # output columns per program
    "TK": "constexpr",  # slots per token, padded to a power of two
}


@triton.jit
def moe_combine(
    y,
    part,
    gscale,
    bias,
    topk_ids,
    topk_weights,
    out,
    hidden,
    top_k,
    num_experts,
    splits,
    pairs,
    IDS64: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_GSCALE: tl.constexpr,
    BH: tl.constexpr,
    TK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    hm = h < hidden
    j = tl.arange(0, TK)
    route = t * top_k + j  # [TK] slots of token t
    if IDS64:
        e = tl.load(topk_ids.to(tl.pointer_type(tl.int64)) + route, mask=j < top_k, other=-1)
    else:
        e = tl.load(topk_ids + route, mask=j < top_k, other=-1)
    live = (j < top_k) & (e >= 0) & (e < num_experts)
    wt = tl.load(topk_weights + route, mask=live, other=0.0)
    m = live[:, None] & hm[None, :]
    if PARTIAL:
        es = tl.where(live, e, 0).to(tl.int64)
        v = tl.zeros([TK, BH], dtype=tl.float32)
        for s in range(0, splits):  # in split order
            v += tl.load(part + (s * pairs + route)[:, None] * hidden + h[None, :], mask=m, other=0.0)
        if HAS_GSCALE:
            v = v * tl.load(gscale + es, mask=live, other=0.0)[:, None]
        if HAS_BIAS:
            v += tl.load(bias + es[:, None] * hidden + h[None, :], mask=m, other=0.0)
    else:
        v = tl.load(y + route[:, None] * hidden + h[None, :], mask=m, other=0.0).to(tl.float32)
    acc = tl.sum(tl.where(m, wt[:, None] * v, 0.0), axis=0)
    tl.store(out + t * hidden + h, acc.to(tl.bfloat16), mask=hm)
