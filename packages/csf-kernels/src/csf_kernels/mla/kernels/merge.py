"""Triton: merge the split partials of sparse MLA decode into the bf16 output (and the log-sum-exp).

One program per (query row, head). out = sum_s w_s o_s / (sum_s w_s + exp(sink - M)), w_s =
exp(lse_s - M), M the largest of the split maxima and the sink. A row with no live candidate gets zeros
and lse = -inf. The returned lse covers the keys only (the sink scales the output, as FlashMLA's does).

The merge sits on a call's critical path after its decode, and loading each split's lse and then its partial
row in turn makes it a chain of dependent round trips (``docs/perf-notes.md``, "The merge loads every split's
lse in one vector load"), so its loads are issued together:
every split's lse for the maximum in one vector load, and the partial rows four splits a round, the first
round beside that load (the partials do not depend on the maximum). The sums still add split by split in
order, so the bits are those of a split-by-split merge (and a single split's are the decode's direct finish).
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.mla.kernels.finish import finished, keys_lse, reference_max, split_weight, weighted
from csf_kernels.runtime.pdl import await_predecessor

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
LSE_BLOCK = tl.constexpr(32)  # splits whose lse one vector load reads for the maximum


@triton.jit
def _split_row(part_out, part_lse, first, s, splits, heads, hd, PARTIAL_BF16: tl.constexpr):
    """Split ``s``'s lse and float32 partial row [512] (-inf and zeros past the last split: it then adds +0.0)."""
    slot = (first + s) * heads + hd
    lse = tl.load(part_lse + slot, mask=s < splits, other=float("-inf"))
    at = slot * LATENT + tl.arange(0, LATENT)
    if PARTIAL_BF16:
        return lse, tl.load(part_out.to(tl.pointer_type(tl.bfloat16)) + at, mask=s < splits, other=0.0).to(tl.float32)
    return lse, tl.load(part_out + at, mask=s < splits, other=0.0)


@triton.jit
def _add(num, den, lse, o, m_ref):
    w = split_weight(lse, m_ref)
    return num + weighted(w, o), den + w


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
    if HAS_SINK:
        sink = tl.load(attn_sink + hd)
    m = tl.full([], float("-inf"), tl.float32)
    m_ref = tl.full([], 0.0, tl.float32)
    num = tl.zeros([LATENT], tl.float32)
    den = tl.full([], 0.0, tl.float32)
    for s0 in range(0, splits, 4):
        # a round of four splits' rows, loaded before any is summed (written out: a loop would interleave them)
        l0, o0 = _split_row(part_out, part_lse, first, s0, splits, heads, hd, PARTIAL_BF16)
        l1, o1 = _split_row(part_out, part_lse, first, s0 + 1, splits, heads, hd, PARTIAL_BF16)
        l2, o2 = _split_row(part_out, part_lse, first, s0 + 2, splits, heads, hd, PARTIAL_BF16)
        l3, o3 = _split_row(part_out, part_lse, first, s0 + 3, splits, heads, hd, PARTIAL_BF16)
        if s0 == 0:  # the maximum over every split, its loads beside the first round's
            for b in range(0, splits, LSE_BLOCK):
                ks = b + tl.arange(0, LSE_BLOCK)
                block = tl.load(part_lse + (first + ks) * heads + hd, mask=ks < splits, other=float("-inf"))
                m = tl.maximum(m, tl.max(block))
            if HAS_SINK:
                m = tl.maximum(m, sink)
            m_ref = reference_max(m)
        num, den = _add(num, den, l0, o0, m_ref)
        num, den = _add(num, den, l1, o1, m_ref)
        num, den = _add(num, den, l2, o2, m_ref)
        num, den = _add(num, den, l3, o3, m_ref)
    total = den
    if HAS_SINK:
        total = den + tl.exp(sink - m_ref)
    d = tl.arange(0, LATENT)
    tl.store(out + pid.to(tl.int64) * LATENT + d, finished(num, total).to(tl.bfloat16))
    if WRITE_LSE:
        tl.store(lse_out + pid, keys_lse(den, m_ref))
