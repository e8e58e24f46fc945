"""Triton: merge the split partials of sparse MLA decode into the bf16 output (and the log-sum-exp).

One program per (query row, head). out = sum_s w_s o_s / (sum_s w_s + exp(sink - M)), w_s =
exp(lse_s - M), M the largest of the split maxima and the sink. A row with no live candidate gets zeros
and lse = -inf. The returned lse covers the keys only (the sink scales the output, as FlashMLA's does).
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
    d = tl.arange(0, LATENT)
    first = row.to(tl.int64) * splits
    m = tl.full([], float("-inf"), tl.float32)
    for s in range(0, splits):
        m = tl.maximum(m, tl.load(part_lse + (first + s) * heads + hd))
    if HAS_SINK:
        sink = tl.load(attn_sink + hd)
        m = tl.maximum(m, sink)
    m_ref = reference_max(m)
    num = tl.zeros([LATENT], tl.float32)
    den = tl.full([], 0.0, tl.float32)
    for s in range(0, splits):
        w = split_weight(tl.load(part_lse + (first + s) * heads + hd), m_ref)
        at = ((first + s) * heads + hd) * LATENT + d
        if PARTIAL_BF16:
            o = tl.load(part_out.to(tl.pointer_type(tl.bfloat16)) + at).to(tl.float32)
        else:
            o = tl.load(part_out + at)
        num += weighted(w, o)
        den += w
    total = den
    if HAS_SINK:
        total = den + tl.exp(sink - m_ref)
    tl.store(out + pid.to(tl.int64) * LATENT + d, finished(num, total).to(tl.bfloat16))
    if WRITE_LSE:
        tl.store(lse_out + pid, keys_lse(den, m_ref))
