"""Triton: the engine layer's passes around its grouped GEMMs (``docs/moe-engine.md`` §4.6).

* ``engine_act`` (the unfused arm): FC1's bf16 output ``h [slots, 2N]`` -> FC2's input ``a [slots, N]``: the block's
  expert's bias, then SiLU-and-mul (W13 rows [gate; up]) or gpt-oss's clamped SwiGLU (rows interleaved), in float32,
  rounded once. It first checks its slot against the blocks in use (``meta[0]``, device data: graph-safe).
* ``engine_combine``: ``out[t] = sum_j w[t, j] * (y[t k + j] + b2[e_j])`` in float32, ``j`` in order, over FC2's
  rows stored at their routes (``y [pairs, H]``, a token's ``k`` rows contiguous); a route whose expert id lies
  outside [0, E) contributes nothing (FC2 never stored its row). ``INV`` (W4A8, whose FC2 stores in block order):
  ``y [slots, H]``, route ``t k + j``'s row at its slot ``inverse[t k + j]`` (the alignment's ``route_slots``).
* ``engine_gather_tokens``: FC1's input in block order, for the FC1 GEMM that reads its rows by TMA tiles instead of
  gathering them in its producer warps: a program reads ``RT`` tokens' rows of ``x`` once and stores each at its
  routes' slots (``route_slots [pairs]``, the alignment's inverse, -1: no slot). A slot without a route is not
  written: its row only ever reaches that slot's own outputs (a GEMM's output column for a route reads that route's
  row alone), which FC2 never stores, and an expert's padding is up to a third of the slots at 8192 tokens. Going by
  token reads ``x`` once where going by slot reads a token's row once a route (``top_k`` times, from DRAM once ``x``
  outgrows L2). W4A8's quantizing gather goes the same way (:mod:`~csf_kernels.moe.kernels.engine_fp8_gather`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.moe.kernels.combine import route_expert
from csf_kernels.runtime.pdl import await_predecessor

SIGNATURE_ACT = {
    "h": "*bf16",
    "block_expert": "*i32",
    "meta": "*i32",
    "bias": "*fp32",
    "a": "*bf16",
    "inter": "i32",
    "num_experts": "i32",
    "BM": "constexpr",
    "BN": "constexpr",
    "ACT": "constexpr",  # 0: silu ([gate; up]), 1: gpt-oss's clamped SwiGLU (gate, up interleaved)
    "HAS_BIAS": "constexpr",
    "PDL": "constexpr",
}

SIGNATURE_COMBINE = {
    "y": "*bf16",
    "inverse": "*i32",
    "bias": "*fp32",
    "topk_ids": "*i32",
    "topk_weights": "*fp32",
    "out": "*bf16",
    "hidden": "i32",
    "top_k": "i32",
    "num_experts": "i32",
    "IDS64": "constexpr",
    "HAS_BIAS": "constexpr",
    "INV": "constexpr",
    "BH": "constexpr",
    "PDL": "constexpr",
}

SIGNATURE_GATHER_TOKENS = {
    "x": "*bf16",
    "route_slots": "*i32",
    "xs": "*bf16",
    "tokens": "i32",
    "hidden": "i32",
    "top_k": "i32",
    "slots": "i32",  # xs's rows: a slot past them (never written by the alignment) is not stored
    "RT": "constexpr",  # tokens a program
    "BH": "constexpr",
    "PDL": "constexpr",
}

SWIGLU_ALPHA = tl.constexpr(1.702)
SWIGLU_LIMIT = tl.constexpr(7.0)


@triton.jit
def engine_gather_tokens(x, route_slots, xs, tokens, hidden, top_k, slots, RT: tl.constexpr, BH: tl.constexpr,
                         PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    t = tl.program_id(0) * RT + tl.arange(0, RT)
    c = tl.program_id(1) * BH + tl.arange(0, BH)
    held = t < tokens
    cols = c[None, :] < hidden
    v = tl.load(x + t.to(tl.int64)[:, None] * hidden + c[None, :], mask=held[:, None] & cols)
    for j in range(0, top_k):
        s = tl.load(route_slots + t * top_k + j, mask=held, other=-1)
        live = (s >= 0) & (s < slots)
        tl.store(xs + tl.where(live, s, 0).to(tl.int64)[:, None] * hidden + c[None, :], v, mask=live[:, None] & cols)


@triton.jit
def engine_act(h, block_expert, meta, bias, a, inter, num_experts, BM: tl.constexpr, BN: tl.constexpr,
               ACT: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    s = tl.program_id(0)
    if s >= tl.load(meta) * BM:
        return
    e = tl.load(block_expert + s // BM)
    e = tl.where((e >= 0) & (e < num_experts), e, 0).to(tl.int64)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    m = n < inter
    row = h + s.to(tl.int64) * 2 * inter
    if ACT == 0:
        gi, ui = n, inter + n
    else:
        gi, ui = 2 * n, 2 * n + 1
    gate = tl.load(row + gi, mask=m, other=0.0).to(tl.float32)
    up = tl.load(row + ui, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        gate += tl.load(bias + e * 2 * inter + gi, mask=m, other=0.0)
        up += tl.load(bias + e * 2 * inter + ui, mask=m, other=0.0)
    if ACT == 0:
        v = gate * tl.sigmoid(gate) * up
    else:
        gate = tl.minimum(gate, SWIGLU_LIMIT)
        up = tl.minimum(tl.maximum(up, -SWIGLU_LIMIT), SWIGLU_LIMIT)
        v = gate * tl.sigmoid(SWIGLU_ALPHA * gate) * (up + 1.0)
    tl.store(a + s.to(tl.int64) * inter + n, v.to(tl.bfloat16), mask=m)


@triton.jit
def engine_combine(y, inverse, bias, topk_ids, topk_weights, out, hidden, top_k, num_experts, IDS64: tl.constexpr,
                   HAS_BIAS: tl.constexpr, INV: tl.constexpr, BH: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    await_predecessor(PDL)
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BH + tl.arange(0, BH)
    m = c < hidden
    acc = tl.zeros([BH], dtype=tl.float32)
    for j in range(0, top_k):
        route = t * top_k + j
        e, live = route_expert(topk_ids, route, num_experts, IDS64)
        row = route
        if INV:
            row = tl.load(inverse + route, mask=live, other=0).to(tl.int64)
        v = tl.load(y + row * hidden + c, mask=m & live, other=0.0).to(tl.float32)
        if HAS_BIAS:
            v += tl.load(bias + tl.where(live, e, 0).to(tl.int64) * hidden + c, mask=m & live, other=0.0)
        acc += tl.where(live, tl.load(topk_weights + route) * v, 0.0)
    tl.store(out + t * hidden + c, acc.to(tl.bfloat16), mask=m)
