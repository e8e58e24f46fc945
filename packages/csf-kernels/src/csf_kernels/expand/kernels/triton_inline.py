"""Triton: expand inline CSF tiles (docs/csf-format.md section 5) into the native scale plane.

A program decodes one 128-row block of one expert across ``CT`` full column tiles (4 columns each), and,
in the program that holds a row block's last full tiles, its tail tile (the plane's last 1..3 columns).
A thread works on quads (the four consecutive slots one wgmma lane holds): the quad's row bases come
from one 16- or 32-bit word, its selectors from one word per tile. Elements are laid out [quad, slot of
the quad, tile], so a thread's words of one row are contiguous columns: 16-byte stores when the rows
allow them. Every load a program needs (bases, headers, selectors, exception entries) is issued before
its first store, so a program waits on memory once.

Phase one writes every position from its selector (or its raw tile); after a CTA barrier, phase two
overwrites the exceptions, so each position's final value is written by exactly one ordered pair of
stores.

Routed-experts-only expansion passes the expert ids; ids outside [0, E) are vLLM's CUDA-graph padding:
they are clamped for addressing and write nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels.record.triton import (
    EXCEPTION_BYTES,
    HEADER_BYTES,
    MODE_RAW,
    exception_capacity,
    header_count,
    header_is_raw,
    header_mode,
    header_origin_word,
    header_raw_index,
    slot_row,
)

# kernel id, version and warps: csf_kernels.expand.specs.EXPAND_INLINE
SIGNATURE = {
    "base_ref": "*u8",
    "base_delta": "*u8",
    "records": "*u8",
    "raw": "*u8",
    "tail_records": "*u8",
    "tail_raw": "*u8",
    "out": "*u8",
    "expert_ids": "*i32",
    "blocks_per_expert": "i32",
    "blocks_per_group": "i32",
    "row_group": "i32",
    "rows_per_expert": "i32",
    "cols": "i32",
    "class_tiles": "i32",
    "num_experts": "i32",
    "tail_S": "i32",
    "S": "constexpr",
    "CT": "constexpr",
    "MAXW": "constexpr",
    "EC": "constexpr",
    "TTC": "constexpr",
    "DB": "constexpr",
    "STORE": "constexpr",
    "NARROW": "constexpr",
}

# tail exception entries read before the barrier; more (rare records) in a loop after it
TAIL_ENTRIES = tl.constexpr(16)


@triton.jit
def _spread(x, width, N: tl.constexpr):
    """A slot's ``N`` ``width``-bit fields (its tile's columns) -> one per byte."""
    fmask = (1 << width) - 1
    out = x & fmask
    for k in tl.static_range(1, N):
        out |= ((x >> (k * width)) & fmask) << (8 * k)
    return out


@triton.jit
def _row_block(expert_ids, blocks_per_expert, blocks_per_group, row_group, rows_per_expert, num_experts):
    """This program's inline row block, its 128-row block within its row group, the first plane row of
    that group, and whether its expert id is live (not graph padding). Grid: (column runs, row blocks
    of an expert, routed experts)."""
    blk = tl.program_id(1)
    e = tl.load(expert_ids + tl.program_id(2))
    live = (e >= 0) & (e < num_experts)
    e = tl.where(live, e, 0)  # 32-bit offsets: planes stay below 2 GiB (checked on the host)
    rb = e * blocks_per_expert + blk
    row0 = e * rows_per_expert + (blk // blocks_per_group) * row_group
    return rb, blk % blocks_per_group, row0, live


@triton.jit
def _quad_bases(rb, q, base_ref, base_delta, DB: tl.constexpr):
    """[Q, 4, 1]: slot 4 q + k's row base replicated into the four bytes of a word (``q``: [Q, 1, 1])."""
    k = tl.arange(0, 4)[None, :, None]
    if DB == 4:  # the quad's four base deltas: one 16-bit word
        deltas = tl.load(base_delta.to(tl.pointer_type(tl.int16)) + rb * 32 + q).to(tl.int32)
    else:
        deltas = tl.load(base_delta.to(tl.pointer_type(tl.int32)) + rb * 32 + q)
    base = tl.load(base_ref + rb).to(tl.int32)
    return (base + ((deltas >> (DB * k)) & ((1 << DB) - 1))) * 0x01010101


@triton.jit
def _quad_rows(within, q):
    """[Q, 4, 1]: the row (within its row group) of slot 4 q + k: 64 half + 16 warp + quad + 8 pair."""
    k = tl.arange(0, 4)[None, :, None]
    return within * 128 + 64 * (k >> 1) + 16 * (q >> 3) + (q & 7) + 8 * (k & 1)


@triton.jit
def _full_words(rb, q, c0, class_tiles, bases, records, raw, S: tl.constexpr, CT: tl.constexpr,
                MAXW: tl.constexpr):  # fmt: skip
    """[Q, 4, CT]: the words (slot 4 q + k, columns of tile c0 + t) of full tiles, before exceptions."""
    k = tl.arange(0, 4)[None, :, None]
    ct = c0 + tl.arange(0, CT)[None, None, :]
    tile_ok = (ct >= 0) & (ct < class_tiles)
    # records are 16-byte aligned and S is a multiple of 16: the header is one aligned 32-bit word
    rec32 = records.to(tl.pointer_type(tl.int32)) + (rb * class_tiles + tl.where(tile_ok, ct, 0)) * (S // 4)
    h = tl.load(rec32 + (S // 4 - 1), mask=tile_ok, other=0)
    is_raw = header_is_raw(h)
    if MAXW == 1:
        # only 1-bit selectors fit this record size: a quad's 16 bits are half a word, at a fixed place
        sel = tl.load(rec32 + (q >> 1), mask=tile_ok, other=0)
        nibble = (sel >> (16 * (q & 1) + 4 * k)) & 0xF
        spread = (nibble * 0x00204081) & 0x01010101  # bit i -> byte i (shifted copies never overlap)
    else:
        width = tl.where(is_raw, 1, 1 << header_mode(h))
        # the quad's 16 * width bits start at bit 16 * width * q: one word for 1- and 2-bit fields, two for 4
        qbit = q * 16 * width
        w_lo = qbit >> 5
        lo = tl.load(rec32 + w_lo, mask=tile_ok & (w_lo < S // 4 - 1), other=0)
        hi = tl.load(rec32 + w_lo + 1, mask=tile_ok & (width == 4) & (w_lo + 1 < S // 4 - 1), other=0)
        src = tl.where((width == 4) & (k >= 2), hi, lo)
        shift = tl.where(width == 4, 16 * (k % 2), (qbit & 31) + 4 * width * k)
        spread = _spread(src >> shift, width, 4)
    word = bases + header_origin_word(h) + spread  # no carries: every byte stays in 0..255
    # a raw tile's quad is one 16-byte word of native bytes: 4 slots x 4 columns
    raw32 = raw.to(tl.pointer_type(tl.int32)) + header_raw_index(h) * 128 + 4 * q + k
    return tl.where(is_raw, tl.load(raw32, mask=is_raw & tile_ok, other=0), word)


@triton.jit
def _store_full(words, out, row0, rows, ok, c0, class_tiles, cols, CT: tl.constexpr, STORE: tl.constexpr):
    """Store [32, 4, CT] words at their rows (``rows`` [32, 4, 1] within the group from ``row0``)."""
    ct = c0 + tl.arange(0, CT)[None, None, :]
    if STORE >= 8:
        # rows of STORE-byte multiples hold a multiple of STORE / 4 tiles: written so, the tile mask is
        # constant over a vector, and a thread's contiguous words of a row become one vector store
        vw: tl.constexpr = STORE // 4
        dst = out.to(tl.pointer_type(tl.int32)) + (row0 + rows) * ((cols // STORE) * vw) + ct
        tl.store(dst, words, mask=ok & (ct < (class_tiles // vw) * vw))
    elif STORE == 4:
        dst = out.to(tl.pointer_type(tl.int32)) + (row0 + rows) * (cols // 4) + ct
        tl.store(dst, words, mask=ok & (ct < class_tiles))
    elif STORE == 2:
        dst = out.to(tl.pointer_type(tl.int16)) + (row0 + rows) * (cols // 2) + 2 * ct
        m = ok & (ct < class_tiles)
        tl.store(dst, (words & 0xFFFF).to(tl.int16), mask=m)
        tl.store(dst + 1, ((words >> 16) & 0xFFFF).to(tl.int16), mask=m)
    else:
        dst = out + (row0 + rows) * cols + 4 * ct
        m = ok & (ct < class_tiles)
        for b in tl.static_range(4):
            tl.store(dst + b, ((words >> (8 * b)) & 0xFF).to(tl.uint8), mask=m)


@triton.jit
def _store_narrow_rows(words, out, row0, rows, ok, cols, CT: tl.constexpr, HALVES: tl.constexpr):
    """Store a whole row block of a narrow plane without a tail (rows 4- but not 8-byte aligned, of at
    most ``HALVES`` = 2 * CT 16-bit halves; every full tile in this program) from ``words`` [32, 4, CT]
    as halves, lanes along a row's halves and then along consecutive rows (the quad index), so a store
    instruction writes consecutive whole rows. Stored a tile word at a time, 18-byte rows put one
    partial L2 sector per lane, which makes the store L2-bound with DRAM nearly idle. Narrow rows with a
    tail take ``_store_row_pairs``."""
    tl.static_assert(HALVES == 2 * CT, "a narrow program's tiles hold its whole rows")
    w = tl.permute(words, (1, 0, 2))  # [k, q, t]: the quad index (consecutive rows) next to the columns
    halves = tl.reshape(tl.join(w & 0xFFFF, (w >> 16) & 0xFFFF), [4, 32, 2 * CT])
    u = tl.arange(0, 2 * CT)[None, None, :]
    dst = out.to(tl.pointer_type(tl.int16)) + (row0 + tl.permute(rows, (1, 0, 2))) * (cols // 2) + u
    tl.store(dst, halves.to(tl.int16), mask=tl.permute(ok, (1, 0, 2)) & (2 * u < cols))


@triton.jit
def _store_row_pairs(rb, within, row0, row_group, live, class_tiles, cols, th, trec, tail_S, base_ref, base_delta,
                     records, raw, tail_raw, out, S: tl.constexpr, CT: tl.constexpr, MAXW: tl.constexpr,
                     DB: tl.constexpr):  # fmt: skip
    """Decode and store a whole row block of a narrow plane with a 2-column tail (rows of 4 * class_tiles
    + 2 bytes, 2-byte aligned, class_tiles <= CT) as 32-bit words. Rows 2 m and 2 m + 1 are quads q and
    q + 1 of the same slot k, and together one aligned run of 2 * class_tiles + 1 words: row A's tile
    words, then A's tail with B's first two columns and B's words shifted by half a word (B decoded
    twice, a tile apart). Two stores per pair, each a contiguous run: stored a tile word at a time,
    18-byte rows put one partial L2 sector per lane, which makes the store L2-bound with DRAM nearly
    idle."""
    qa = 2 * tl.arange(0, 16)[:, None, None]  # row A of each pair (even rows)
    qb = qa + 1
    ba = _quad_bases(rb, qa, base_ref, base_delta, DB)
    bb = _quad_bases(rb, qb, base_ref, base_delta, DB)
    ta = _tail_words(th, trec, tail_raw, tail_S, qa, ba, live, 2)
    tb = _tail_words(th, trec, tail_raw, tail_S, qb, bb, live, 2)
    wa = _full_words(rb, qa, 0, class_tiles, ba, records, raw, S, CT, MAXW)
    # the pair's words from class_tiles on, t = 0..class_tiles: (A's tail | B's word 0 << 16), then B's
    # words shifted by half a word, (B[t - 1] >> 16) | (B[t] << 16), B's tail as word class_tiles
    t = tl.arange(0, 2 * CT)[None, None, :]
    b_prev = _full_words(rb, qb, -1, class_tiles, bb, records, raw, S, 2 * CT, MAXW)
    b_this = tl.where(t == class_tiles, tb, _full_words(rb, qb, 0, class_tiles, bb, records, raw, S, 2 * CT, MAXW))
    b_prev = tl.where(t == 0, ta, b_prev)  # t = 0: A's tail takes the low half
    joined = (b_prev >> tl.where(t == 0, 0, 16)) & 0xFFFF | (b_this << 16)
    rows_a = _quad_rows(within, qa)
    ok = live & (rows_a < row_group)  # row groups are even: pairs are whole
    # a pair's first word: row0 and rows_a are even
    dst = out.to(tl.pointer_type(tl.int32)) + (row0 + rows_a) // 2 * (cols // 2)
    tw = tl.arange(0, CT)[None, None, :]
    tl.store(dst + tw, wa, mask=ok & (tw < class_tiles))
    tl.store(dst + class_tiles + t, joined, mask=ok & (t <= class_tiles))


@triton.jit
def _tail_words(th, trec, tail_raw, tail_S, q, bases, live, TTC: tl.constexpr):
    """[Q, 4, 1]: the tail tile's words (TTC columns in the low bytes) from its header ``th`` (scalar)."""
    k = tl.arange(0, 4)[None, :, None]
    t_raw = header_is_raw(th)
    width = tl.where(t_raw, 1, 1 << header_mode(th))
    fbits = TTC * width  # a slot's bits; a quad's 4 * fbits (<= 48) may straddle two words
    bit = q * 4 * fbits
    wi = bit >> 5
    rec32 = trec.to(tl.pointer_type(tl.int32))
    lo = tl.load(rec32 + wi, mask=live & (wi < tail_S // 4 - 1), other=0)
    hi = tl.load(rec32 + wi + 1, mask=live & (wi + 1 < tail_S // 4 - 1), other=0)
    x = lo.to(tl.uint32, bitcast=True).to(tl.uint64) | (hi.to(tl.uint32, bitcast=True).to(tl.uint64) << 32)
    field = ((x >> ((bit & 31) + fbits * k).to(tl.uint64)) & ((1 << fbits) - 1).to(tl.uint64)).to(tl.int32)
    word = bases + header_origin_word(th) + _spread(field, width, TTC)
    raw = tail_raw + header_raw_index(th) * (128 * TTC) + (4 * q + k) * TTC
    raw_word = tl.load(raw, mask=live & t_raw, other=0).to(tl.int32)
    for c in tl.static_range(1, TTC):
        raw_word |= tl.load(raw + c, mask=live & t_raw, other=0).to(tl.int32) << (8 * c)
    return tl.where(t_raw, raw_word, word)


@triton.jit
def _store_tail(word, out, row0, rows, ok, col, cols, TTC: tl.constexpr, STORE: tl.constexpr):
    dst = out + (row0 + rows) * cols + col
    if TTC == 2 and STORE >= 2:  # the rows' even length keeps the tail's two bytes aligned
        tl.store(dst.to(tl.pointer_type(tl.int16)), (word & 0xFFFF).to(tl.int16), mask=ok)
    else:
        for c in tl.static_range(TTC):
            tl.store(dst + c, ((word >> (8 * c)) & 0xFF).to(tl.uint8), mask=ok)


@triton.jit
def _exception_entries(rec, h, ee, ok, within, row0, row_group, cols, col, record_bytes, TC: tl.constexpr,
                       MAXW: tl.constexpr):  # fmt: skip
    """Exception ``ee`` of the record at ``rec`` (header ``h``) of a tile starting at column ``col``:
    (destination, value, mask). ``MAXW``: the widest selectors the record size allows (0: unknown)."""
    mode = header_mode(h)
    if MAXW == 1:  # the only selector mode: positions and values sit at fixed offsets
        sb = 16 * TC
        cap = (record_bytes - HEADER_BYTES - sb) // EXCEPTION_BYTES
        in_list = ok & (ee < cap)
    else:
        sb = 16 * TC * (1 << tl.where(mode == MODE_RAW, 0, mode))
        cap = exception_capacity(record_bytes, sb)
        in_list = ok & (ee < cap) & (ee < tl.where(mode == MODE_RAW, 0, header_count(h)))
    # positions: u16 at an even offset of a 16-byte aligned record
    pos = tl.load((rec + sb).to(tl.pointer_type(tl.int16)) + ee, mask=in_list, other=0).to(tl.int32) & 0xFFFF
    value = tl.load(rec + sb + 2 * cap + ee, mask=in_list, other=0)
    count = tl.where(mode == MODE_RAW, 0, header_count(h))
    row = within * 128 + slot_row(pos // TC)
    m = in_list & (ee < count) & (pos < 128 * TC) & (row < row_group)
    return (row0 + row) * cols + col + pos % TC, value, m


@triton.jit
def expand_inline_tiles(
    base_ref,
    base_delta,
    records,
    raw,
    tail_records,
    tail_raw,
    out,
    expert_ids,
    blocks_per_expert,
    blocks_per_group,
    row_group,
    rows_per_expert,
    cols,
    class_tiles,
    num_experts,
    tail_S,
    S: tl.constexpr,  # full-tile record bytes (0: the plane is narrower than one tile)
    CT: tl.constexpr,  # full tiles per program (a power of two)
    MAXW: tl.constexpr,  # the widest selectors a full-tile record of S bytes holds (1, 2 or 4)
    EC: tl.constexpr,  # exception entries read per full tile: a power of two >= any mode's capacity at S
    TTC: tl.constexpr,  # the plane's tail columns (0: none), decoded by the program holding the last tiles
    DB: tl.constexpr,  # bits per row-base delta: 4 (MXFP4) or 8 (NVFP4)
    STORE: tl.constexpr,  # bytes per store (16, 8, 4, 2, 1): the widest the rows stay aligned for
    NARROW: tl.constexpr,  # narrow planes: halves per row, a power of two (a program stores whole rows); or 0
):
    rb, within, row0, live = _row_block(expert_ids, blocks_per_expert, blocks_per_group, row_group,
                                        rows_per_expert, num_experts)  # fmt: skip
    c0 = tl.program_id(0) * CT
    q = tl.arange(0, 32)[:, None, None]
    bases = _quad_bases(rb, q, base_ref, base_delta, DB)
    rows = _quad_rows(within, q)
    ok = live & (rows < row_group)
    # every load first: full-tile words, their exception entries, the tail's words and first entries
    PAIRS: tl.constexpr = NARROW > 0 and TTC == 2  # narrow rows with a 2-column tail: stored as row pairs
    if S > 0:
        if not PAIRS:
            words = _full_words(rb, q, c0, class_tiles, bases, records, raw, S, CT, MAXW)
        i = tl.arange(0, CT * EC)
        et = c0 + i // EC
        et_ok = et < class_tiles
        erec = records + (rb * class_tiles + tl.where(et_ok, et, 0)) * S
        eh = tl.load(erec.to(tl.pointer_type(tl.int32)) + (S // 4 - 1), mask=et_ok, other=3)  # masked: raw
        e_off, e_val, e_ok = _exception_entries(erec, eh, i % EC, et_ok & live, within, row0, row_group, cols,
                                                4 * et, S, 4, MAXW)  # fmt: skip
    if TTC > 0:
        t_live = live & (c0 + CT >= class_tiles)  # the program holding the row block's last full tiles
        trec = tail_records + rb * tail_S
        th = tl.load(trec.to(tl.pointer_type(tl.int32)) + (tail_S // 4 - 1), mask=t_live, other=3)
        if not PAIRS:
            t_words = _tail_words(th, trec, tail_raw, tail_S, q, bases, t_live, TTC)
        te = tl.arange(0, TAIL_ENTRIES)
        t_off, t_val, t_ok = _exception_entries(trec, th, te, t_live, within, row0, row_group, cols,
                                                4 * class_tiles, tail_S, TTC, 0)  # fmt: skip
    # phase one
    if PAIRS:
        _store_row_pairs(rb, within, row0, row_group, live, class_tiles, cols, th, trec, tail_S, base_ref,
                         base_delta, records, raw, tail_raw, out, S, CT, MAXW, DB)  # fmt: skip
    elif NARROW:
        tl.static_assert(TTC == 0, "narrow planes with a tail are stored as row pairs")
        _store_narrow_rows(words, out, row0, rows, ok, cols, CT, NARROW)
    else:
        if S > 0:
            _store_full(words, out, row0, rows, ok, c0, class_tiles, cols, CT, STORE)
        if TTC > 0:
            _store_tail(t_words, out, row0, rows, ok & t_live, 4 * class_tiles, cols, TTC, STORE)
    tl.debug_barrier()  # phase two's stores must land after phase one's on the same bytes
    if S > 0:
        tl.store(out + e_off, e_val, mask=e_ok)
    if TTC > 0:
        tl.store(out + t_off, t_val, mask=t_ok)
        # records with more tail exceptions than were read ahead (large tail records only)
        t_count = tl.where(header_is_raw(th), 0, header_count(th))
        for e0 in range(TAIL_ENTRIES, t_count, TAIL_ENTRIES):
            t_off, t_val, t_ok = _exception_entries(trec, th, e0 + te, t_live, within, row0, row_group, cols,
                                                    4 * class_tiles, tail_S, TTC, 0)  # fmt: skip
            tl.store(out + t_off, t_val, mask=t_ok)
