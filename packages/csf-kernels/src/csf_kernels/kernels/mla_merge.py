"""Triton: merge the split partials of sparse MLA decode into the bf16 output (and the log-sum-exp).

One program per (query row, head). out = sum_s w_s o_s / (sum_s w_s + exp(sink - M)), w_s =
exp(lse_s - M), M the largest of the split maxima and the sink. A row with no live candidate gets zeros
and lse = -inf. The returned lse covers the keys only (the sink scales the output, as FlashMLA's does).

The merge sits on a call's critical path after its decode (run 252: it ended 3.3-4.6 us after the decode
at 2-4 splits, when it loaded each split's lse and then its partial row in turn), so its loads are issued
together: the first ``SPLIT_BLOCK`` splits' lse and partial rows in one round (the partials do not depend on
the maximum), further splits' lse ``LSE_BLOCK`` at a time, then their partials ``SPLIT_BLOCK`` at a time. A
single split's sums are that split's terms alone, as the decode's direct finish computes them (same bits).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .mla_finish import finished, keys_lse, reference_max, split_weight, weighted
from .pdl import await_predecessor

SIGNATURE = {
    "part_out": "*fp32",  # [rows * splits, heads, 512], float32 or bf16 (PARTIAL_BF16)
    "part_lse": "*fp32",  # [rows * splits, heads]
    "attn_sink": "*fp32",  # [heads] (HAS_SINK)
    "out": "*bf16",  # [rows, heads, 512]
    "lse_out": "*fp32",  # [rows, heads] (WRITE_LSE)
    "heads": "i32",
    "splits": "i32",
    "PARTIAL_BF16": "constexpr",
    "HAS_SINK": "constexpr",
    "WRITE_LSE": "constexpr",
    "PDL": "constexpr",  # launched as a programmatic dependent launch (kernels/pdl.py)
}
MULTIPLE_OF = {"heads": 16}

LATENT = tl.constexpr(512)
LSE_BLOCK = tl.constexpr(32)  # further splits' lse read by one vector load
SPLIT_BLOCK = tl.constexpr(8)  # splits whose partial rows one round loads


@triton.jit
def _split_terms(part_out, part_lse, first, ks, splits, heads, hd, PARTIAL_BF16: tl.constexpr):
    """The lse [SPLIT_BLOCK] and partial rows [SPLIT_BLOCK, 512] (float32) of splits ``ks`` (-inf and zeros past
    the last split)."""
    live = ks < splits
    slot = (first + ks) * heads + hd
    lse = tl.load(part_lse + slot, mask=live, other=float("-inf"))
    at = slot[:, None] * LATENT + tl.arange(0, LATENT)[None, :]
    if PARTIAL_BF16:
        o = tl.load(part_out.to(tl.pointer_type(tl.bfloat16)) + at, mask=live[:, None], other=0.0).to(tl.float32)
    else:
        o = tl.load(part_out + at, mask=live[:, None], other=0.0)
    return lse, o


@triton.jit
def mla_merge(
    part_out,
    part_lse,
    attn_sink,
    out,
    lse_out,
    heads,
    splits,
    PARTIAL_BF16: tl.constexpr,
    HAS_SINK: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    PDL: tl.constexpr,
):
    await_predecessor(PDL)
    pid = tl.program_id(0)  # row * heads + head
    row = pid // heads
    hd = pid % heads
    first = row.to(tl.int64) * splits
    ks = tl.arange(0, SPLIT_BLOCK)
    lse, o = _split_terms(part_out, part_lse, first, ks, splits, heads, hd, PARTIAL_BF16)
    m = tl.max(lse)
    for s0 in range(SPLIT_BLOCK, splits, LSE_BLOCK):
        more = s0 + tl.arange(0, LSE_BLOCK)
        more_lse = tl.load(part_lse + (first + more) * heads + hd, mask=more < splits, other=float("-inf"))
        m = tl.maximum(m, tl.max(more_lse))
    if HAS_SINK:
        sink = tl.load(attn_sink + hd)
        m = tl.maximum(m, sink)
    m_ref = reference_max(m)
    w = split_weight(lse, m_ref)
    num = tl.sum(weighted(w[:, None], o), 0)
    den = tl.sum(w, 0)
    for s0 in range(SPLIT_BLOCK, splits, SPLIT_BLOCK):
        lse, o = _split_terms(part_out, part_lse, first, s0 + ks, splits, heads, hd, PARTIAL_BF16)
        w = split_weight(lse, m_ref)
        num += tl.sum(weighted(w[:, None], o), 0)
        den += tl.sum(w, 0)
    total = den
    if HAS_SINK:
        total = den + tl.exp(sink - m_ref)
    d = tl.arange(0, LATENT)
    tl.store(out + pid.to(tl.int64) * LATENT + d, finished(num, total).to(tl.bfloat16))
    if WRITE_LSE:
        tl.store(lse_out + pid, keys_lse(den, m_ref))
