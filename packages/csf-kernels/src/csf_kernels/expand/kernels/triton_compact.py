"""Triton: expand a compact CSF payload (docs/csf-format.md section 4) into the native scale plane.

One program decodes one 128-row segment (restricted to one expert's rows when experts are routed):
it rebuilds the segment's row bases with a segmented scan over the 2-bit base codes, writes every
scale as base + selector, then, after a CTA barrier, overwrites the exceptions and raw chunks of the
256-scale chunks that overlap its rows. A listed chunk's position code is decoded with one lane per bit
of its unary buckets: a set bit's rank among the set bits is its exception's rank, the clear bits before
it its high part. The exception's selector field (its side and near distance) and the base, read back
as phase one's byte minus the field, place its value. Per-payload tables (each chunk's first bit or
byte, its far codes' first bit and escaped bytes' first byte, each segment's first escape) come from
:func:`csf_kernels.expand.compact_tables.compact_tables`, computed once with torch.
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
    "far_offsets": "*i64",
    "escape_offsets": "*i64",
    "segment_escapes": "*i32",
    "out": "*u8",
    "expert_ids": "*i32",
    "rows_per_expert": "i32",
    "segments_per_expert": "i32",
    "num_experts": "i32",
    "total_rows": "i32",
    "cols": "i32",
    "exception_bytes": "i64",
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
    far_offsets,
    escape_offsets,
    segment_escapes,
    out,
    expert_ids,
    rows_per_expert,
    segments_per_expert,
    num_experts,
    total_rows,
    cols,
    exception_bytes,
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
    bit_lane = tl.arange(0, 512)  # a listed chunk's unary buckets: n <= 254 ones and 256 >> l <= 256 zeros
    TOP: tl.constexpr = (1 << W) - 1
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
        elif n > 0:
            low = 0  # the low-part width: the one that makes the code shortest, ties to the smaller
            best = 256
            for cand in tl.static_range(1, 8):
                cost = n * cand + (256 >> cand)
                better = cost < best
                low = tl.where(better, cand, low)
                best = tl.where(better, cost, best)
            buckets = 256 >> low
            tail = off + n + buckets  # bits: unary buckets [off, tail), low parts, then far flags
            at = off + bit_lane
            ubyte = tl.load(
                exceptions + (at >> 3), mask=(bit_lane < n + buckets) & ((at >> 3) < exception_bytes), other=0
            )
            one = ((ubyte.to(tl.int32) >> (at & 7).to(tl.int32)) & 1) == 1
            one_rank = tl.cumsum(one.to(tl.int32), axis=0) - 1
            lo_at = tail + one_rank * low
            lo_m = one & ((lo_at >> 3) + 1 < exception_bytes)
            word = tl.load(exceptions + (lo_at >> 3), mask=one & ((lo_at >> 3) < exception_bytes), other=0).to(tl.int32)
            word |= tl.load(exceptions + (lo_at >> 3) + 1, mask=lo_m, other=0).to(tl.int32) << 8
            pos = ((bit_lane - one_rank) << low) | ((word >> (lo_at & 7).to(tl.int32)) & ((1 << low) - 1))
            fl_at = tail + n * low + one_rank
            fl = tl.load(exceptions + (fl_at >> 3), mask=one & ((fl_at >> 3) < exception_bytes), other=0)
            far = one & (((fl.to(tl.int32) >> (fl_at & 7).to(tl.int32)) & 1) == 1)
            where = chunk0 + pos
            mine_exc = one & (pos < 256) & (where >= lo) & (where < hi)
            sel_bit = where * W
            sel = tl.load(selectors + (sel_bit >> 3), mask=mine_exc, other=0).to(tl.int32)
            sel_field = (sel >> (sel_bit & 7).to(tl.int32)) & TOP
            # the row's base from phase one's scan, not read back from ``out``: another program expanding the same
            # expert (a routed id listed twice) may already have patched this byte
            exc_row = tl.minimum(tl.maximum(where // cols - seg_row0, 0), 127).to(tl.int32)
            exc_base = tl.gather(base, exc_row, 0)
            far_rank = tl.cumsum(far.to(tl.int32), axis=0) - 1
            fc_at = tl.load(far_offsets + ch) + 3 * far_rank
            fc_m = far & ((fc_at >> 3) < exception_bytes)
            fword = tl.load(exceptions + (fc_at >> 3), mask=fc_m, other=0).to(tl.int32)
            fword |= (
                tl.load(exceptions + (fc_at >> 3) + 1, mask=fc_m & ((fc_at >> 3) + 1 < exception_bytes), other=0).to(
                    tl.int32
                )
                << 8
            )
            far_code = tl.where(far, (fword >> (fc_at & 7).to(tl.int32)) & 7, 0)
            esc = far & (far_code == 7)
            esc_at = tl.load(escape_offsets + ch) + tl.cumsum(esc.to(tl.int32), axis=0) - 1
            escaped = tl.load(exceptions + esc_at, mask=esc & (esc_at < exception_bytes), other=0).to(tl.int32)
            dist = (sel_field >> 1) + 1 + far.to(tl.int32) + far_code
            exc_value = tl.where((sel_field & 1) == 1, exc_base + TOP + dist, exc_base - dist)
            exc_value = tl.where(esc, escaped, exc_value)
            tl.store(out + where, exc_value.to(tl.uint8), mask=mine_exc)
        ch += 1
