"""Triton: expand a compact CSF payload (docs/csf-format.md section 4) into the native scale plane.

One program decodes one 128-row segment (restricted to one expert's rows when experts are routed):
it rebuilds the segment's row bases with a segmented scan over the 2-bit base codes, writes every
scale as base + selector, then, after a CTA barrier, overwrites the exceptions and raw chunks of the
256-scale chunks that overlap its rows. Per-payload tables (chunk byte offsets, each segment's first
escape) come from :func:`csf_kernels.expand.compact_tables.compact_tables`, computed once with torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

SIGNATURE = {
    "codes": "*u8",
    "escapes": "*u8",
    "selectors": "*u8",
    "counts": "*u8",
    "exceptions": "*u8",
    "chunk_offsets": "*i64",
    "segment_escapes": "*i32",
    "out": "*u8",
    "expert_ids": "*i32",
    "rows_per_expert": "i32",
    "segments_per_expert": "i32",
    "num_experts": "i32",
    "total_rows": "i32",
    "cols": "i32",
    "W": "constexpr",
    "CB": "constexpr",
}


@triton.jit
def _segmented_sum(value_a, flag_a, value_b, flag_b):
    # rows after an escape restart from the escaped base; others add their delta
    return tl.where(flag_b, value_b, value_a + value_b), flag_a | flag_b


@triton.jit
def expand_compact_segments(
    codes,
    escapes,
    selectors,
    counts,
    exceptions,
    chunk_offsets,
    segment_escapes,
    out,
    expert_ids,
    rows_per_expert,
    segments_per_expert,
    num_experts,
    total_rows,
    cols,
    W: tl.constexpr,  # selector width of this payload
    CB: tl.constexpr,  # columns per inner step
):
    pid = tl.program_id(0)
    routed = pid // segments_per_expert
    j = pid % segments_per_expert
    e = tl.load(expert_ids + routed)
    live = (e >= 0) & (e < num_experts)
    e = tl.where(live, e, 0).to(tl.int64)
    first_row = e * rows_per_expert
    end_row = tl.minimum(first_row + rows_per_expert, total_rows)
    seg = first_row // 128 + j
    seg_row0 = seg * 128
    # this program owns the rows of its segment that belong to its expert
    lo_row = tl.maximum(seg_row0, first_row)
    hi_row = tl.minimum(seg_row0 + 128, end_row)
    live = live & (lo_row < hi_row)

    r = tl.arange(0, 128)
    row = seg_row0 + r
    in_seg = row < total_rows
    code = (tl.load(codes + (row >> 2), mask=in_seg & live, other=0).to(tl.int32) >> ((row & 3) * 2)) & 3
    is_esc = (code == 3) & in_seg
    rank = tl.cumsum(is_esc.to(tl.int32), axis=0) - 1
    esc_base = tl.load(segment_escapes + seg, mask=live, other=0)
    esc_val = tl.load(escapes + esc_base + rank, mask=is_esc & live, other=0).to(tl.int32)
    delta = tl.where(code == 1, 1, tl.where(code == 2, -1, 0))
    value = tl.where(is_esc, esc_val, delta)
    base, _ = tl.associative_scan((value, is_esc), 0, _segmented_sum)
    mine = live & (row >= lo_row) & (row < hi_row)

    c0 = 0
    while c0 < cols:  # while, not range(): Triton's interpreter cannot range over a runtime bound
        c = c0 + tl.arange(0, CB)
        flat = row.to(tl.int64)[:, None] * cols + c[None, :]
        m = mine[:, None] & (c[None, :] < cols)
        bit = flat * W
        byte = tl.load(selectors + (bit >> 3), mask=m, other=0).to(tl.int32)
        field = (byte >> (bit & 7).to(tl.int32)) & ((1 << W) - 1)
        tl.store(out + flat, (base[:, None] + field).to(tl.uint8), mask=m)
        c0 += CB

    tl.debug_barrier()  # exceptions overwrite phase one's bytes: order them after it

    lo = lo_row.to(tl.int64) * cols
    hi = hi_row.to(tl.int64) * cols
    lane = tl.arange(0, 256)
    ch_first = lo // 256
    ch_last = tl.where(live, (hi + 255) // 256, ch_first)
    ch = ch_first
    while ch < ch_last:
        n = tl.load(counts + ch).to(tl.int32)
        off = tl.load(chunk_offsets + ch)
        chunk0 = ch * 256
        if n == 255:
            where = chunk0 + lane
            m = (where >= lo) & (where < hi)
            tl.store(out + where, tl.load(exceptions + off + lane, mask=m, other=0), mask=m)
        else:
            m = lane < n
            pos = tl.load(exceptions + off + lane, mask=m, other=0).to(tl.int64)
            val = tl.load(exceptions + off + n + lane, mask=m, other=0)
            where = chunk0 + pos
            tl.store(out + where, val, mask=m & (where >= lo) & (where < hi))
        ch += 1
