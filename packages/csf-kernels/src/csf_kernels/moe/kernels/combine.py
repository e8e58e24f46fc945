"""Triton: the top-k weighted sum of a fused MoE layer, ``out[t] = sum_j w[t, j] * y[t * k + j]``.

In float32 (deterministic: no atomics), rounded once to bf16, in one of two forms (``TK``). Up to a few
tokens (``TK`` > 0: slots padded to a power of two) a program loads the ``k`` slots of its token together as
one [TK, BH] tile, so a call waits on one round of loads per split rather than one per slot and split (at
one token those rounds are the whole kernel's latency). For more tokens (``TK`` = 0) a program walks the
slots in order over wide rows: enough programs in flight that their latencies overlap, where the tile form's
four-times-as-many narrow programs and cross-warp sums measure slower (``docs/perf-notes.md``, "The combine
takes a token's slots as one tile up to 32 tokens"). ``y`` is the FC2 output:
bf16 ``[pairs, H]`` with global scale and bias applied, or (``PARTIAL``) the float32 partials of a
split-K FC2 ``[splits, pairs, H]``, summed here in split order before the global scale and bias. A slot
whose expert id lies outside [0, E) (vLLM's graph padding) contributes exactly nothing: its ``y`` row
was never written and is never read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.runtime.pdl import await_predecessor

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
    "TK": "constexpr",  # 0: slots walked in order; > 0: a token's slots as one tile (k padded to a power of 2)
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}


@triton.jit
def route_expert(topk_ids, route, num_experts, IDS64: tl.constexpr):
    """(expert id, live) of route ``route``: ids outside [0, E) (graph padding) are not live."""
    if IDS64:
        e = tl.load(topk_ids.to(tl.pointer_type(tl.int64)) + route)
    else:
        e = tl.load(topk_ids + route)
    return e, (e >= 0) & (e < num_experts)


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
    PDL: tl.constexpr,
):
    await_predecessor(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    hm = h < hidden
    if TK > 0:
        acc = _slots_as_tile(y, part, gscale, bias, topk_ids, topk_weights, t, h, hm, hidden, top_k, num_experts,
                             splits, pairs, IDS64, PARTIAL, HAS_BIAS, HAS_GSCALE, TK)  # fmt: skip
    else:
        acc = tl.zeros([BH], dtype=tl.float32)
        for j in range(0, top_k):
            route = t * top_k + j
            e, live = route_expert(topk_ids, route, num_experts, IDS64)
            wt = tl.load(topk_weights + route)
            if PARTIAL:
                es = tl.where(live, e, 0).to(tl.int64)
                v = tl.zeros([BH], dtype=tl.float32)
                for s in range(0, splits):
                    v += tl.load(part + (s * pairs + route) * hidden + h, mask=hm & live, other=0.0)
                if HAS_GSCALE:
                    v = v * tl.load(gscale + es)
                if HAS_BIAS:
                    v += tl.load(bias + es * hidden + h, mask=hm & live, other=0.0)
            else:
                v = tl.load(y + route * hidden + h, mask=hm & live, other=0.0).to(tl.float32)
            acc += tl.where(live, wt * v, 0.0)
    tl.store(out + t * hidden + h, acc.to(tl.bfloat16), mask=hm)


@triton.jit
def _slots_as_tile(y, part, gscale, bias, topk_ids, topk_weights, t, h, hm, hidden, top_k, num_experts, splits,
                   pairs, IDS64: tl.constexpr, PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_GSCALE: tl.constexpr, TK: tl.constexpr):  # fmt: skip
    """Token ``t``'s weighted sum over columns ``h``, its slots loaded together as [TK, BH] tiles."""
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
        v = tl.zeros([TK, h.shape[0]], dtype=tl.float32)
        for s in range(0, splits):  # in split order
            v += tl.load(part + (s * pairs + route)[:, None] * hidden + h[None, :], mask=m, other=0.0)
        if HAS_GSCALE:
            v = v * tl.load(gscale + es, mask=live, other=0.0)[:, None]
        if HAS_BIAS:
            v += tl.load(bias + es[:, None] * hidden + h[None, :], mask=m, other=0.0)
    else:
        v = tl.load(y + route[:, None] * hidden + h[None, :], mask=m, other=0.0).to(tl.float32)
    return tl.sum(tl.where(m, wt[:, None] * v, 0.0), axis=0)
