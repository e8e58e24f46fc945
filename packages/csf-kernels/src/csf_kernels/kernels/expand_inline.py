"""Triton: expand inline CSF tiles (docs/csf-format.md section 5) into the native scale plane.

A program of the full-tile class (4 columns per tile) decodes one 128-row block of one expert across
``program_tiles`` column tiles, ``CTG`` per step, computing what depends only on the row block (row
bases, output rows) once, and the row block's tail tile (the plane's last 1..3 columns, ``TTC``) when it
writes the rows' last full tiles. A plane with no full tiles has only the tail class: a program decodes
the tail tiles of ``RBP`` row blocks. Either way whole rows come from one program. Phase one
writes every position from its selector (or its raw tile); after a CTA barrier, phase two overwrites
the exceptions, so each position's final value is written by exactly one ordered pair of stores.

Routed-experts-only expansion passes the expert ids; ids outside [0, E) are vLLM's CUDA-graph padding:
they are clamped for addressing and write nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl

# kernel id, version and warps: csf_kernels.families.EXPAND_INLINE
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
    "row_blocks": "i32",
    "program_tiles": "i32",
    "tail_S": "i32",
    "S": "constexpr",
    "TC": "constexpr",
    "TTC": "constexpr",
    "CTG": "constexpr",
    "RBP": "constexpr",
    "EC": "constexpr",
    "DB": "constexpr",
    "STORE": "constexpr",
}


@triton.jit
def _slot_row(slot):
    # slot = 32 warp + 4 quad + 2 half + pair  ->  row = 64 half + 16 warp + quad + 8 pair
    return 64 * ((slot >> 1) & 1) + 16 * (slot >> 5) + ((slot >> 2) & 7) + 8 * (slot & 1)


@triton.jit
def _spread(x, width, N: tl.constexpr):
    """A slot's ``N`` ``width``-bit fields (its tile's columns) -> one per byte."""
    fmask = (1 << width) - 1
    out = x & fmask
    for k in tl.static_range(1, N):
        out |= ((x >> (k * width)) & fmask) << (8 * k)
    return out


@triton.jit
def _quad_row(within, q, K: tl.constexpr):
    # slot 4 q + k of a row block: row 64 half + 16 warp + quad + 8 pair, with half = k >> 1, pair = k & 1
    return within * 128 + 64 * (K >> 1) + 16 * (q >> 3) + (q & 7) + 8 * (K & 1)


@triton.jit
def _row_offset(row, cols, STORE: tl.constexpr):
    """Where a row starts, in units of the store width."""
    return (row * cols) // STORE


@triton.jit
def _quad_word(lo, hi, qbit, width, fbits, fmask, base_word, is_raw, raw32, ok, out, offset, ct, K: tl.constexpr,
               STORE: tl.constexpr):  # fmt: skip
    """Decode slot 4 q + K's word of each tile ([CTG, 32]) and store it at ``offset`` + the tile's column."""
    src = tl.where((width == 4) & (K >= 2), hi, lo)
    shift = tl.where(width == 4, 16 * (K % 2), (qbit & 31) + fbits * K)
    word = base_word + _spread((src >> shift) & fmask, width, 4)  # no carries: every byte stays in 0..255
    word = tl.where(is_raw, tl.load(raw32 + K, mask=is_raw & ok, other=0), word)
    if STORE == 4:
        tl.store(out.to(tl.pointer_type(tl.int32)) + offset + ct, word, mask=ok)
    elif STORE == 2:
        dst = out.to(tl.pointer_type(tl.int16)) + offset + 2 * ct
        tl.store(dst, (word & 0xFFFF).to(tl.int16), mask=ok)
        tl.store(dst + 1, ((word >> 16) & 0xFFFF).to(tl.int16), mask=ok)
    else:
        for b in tl.static_range(4):
            tl.store(out + offset + 4 * ct + b, ((word >> (8 * b)) & 0xFF).to(tl.uint8), mask=ok)


@triton.jit
def _full_tiles(
    rb,
    within,
    row0,
    row_group,
    cols,
    class_tiles,
    t_begin,
    t_end,
    live,
    records,
    base_ref,
    base_delta,
    raw,
    out,
    S: tl.constexpr,
    CTG: tl.constexpr,
    DB: tl.constexpr,
    STORE: tl.constexpr,
):
    """Decode and store full tiles [t_begin, t_end) of a row block, CTG tiles x 32 quads per step.

    A thread decodes a quad (four consecutive slots, the rows one wgmma lane holds) of a tile: one header,
    one or two selector words serve four output words. What depends only on the quad (row bases, output
    rows) is computed once per program, not once per tile."""
    q = tl.arange(0, 32)[None, :]
    if DB == 4:  # the quad's four base deltas: one 16-bit word
        deltas = tl.load(base_delta.to(tl.pointer_type(tl.int16)) + rb * 32 + q).to(tl.int32)
    else:
        deltas = tl.load(base_delta.to(tl.pointer_type(tl.int32)) + rb * 32 + q)
    base = tl.load(base_ref + rb).to(tl.int32)
    dmask: tl.constexpr = (1 << DB) - 1
    # each slot's row base replicated into the four bytes of a word (the origin is added per tile)
    bw0 = (base + (deltas & dmask)) * 0x01010101
    bw1 = (base + ((deltas >> DB) & dmask)) * 0x01010101
    bw2 = (base + ((deltas >> (2 * DB)) & dmask)) * 0x01010101
    bw3 = (base + ((deltas >> (3 * DB)) & dmask)) * 0x01010101
    r0 = _quad_row(within, q, 0)
    r1 = _quad_row(within, q, 1)
    r2 = _quad_row(within, q, 2)
    r3 = _quad_row(within, q, 3)
    ok0 = live & (r0 < row_group)
    ok1 = live & (r1 < row_group)
    ok2 = live & (r2 < row_group)
    ok3 = live & (r3 < row_group)
    o0 = _row_offset(row0 + r0, cols, STORE)
    o1 = _row_offset(row0 + r1, cols, STORE)
    o2 = _row_offset(row0 + r2, cols, STORE)
    o3 = _row_offset(row0 + r3, cols, STORE)
    t_local = tl.arange(0, CTG)[:, None]
    for c in range(t_begin, t_end, CTG):
        ct = c + t_local
        tile_ok = ct < t_end
        # records are 16-byte aligned and S is a multiple of 16: the header is one aligned 32-bit word
        rec32 = records.to(tl.pointer_type(tl.int32)) + (rb * class_tiles + tl.where(tile_ok, ct, 0)) * (S // 4)
        h = tl.load(rec32 + (S // 4 - 1), mask=tile_ok, other=0)
        mode = h & 3
        is_raw = mode == 3
        width = tl.where(is_raw, 1, 1 << mode)
        origin = (h >> 8) & 0xFF
        origin_word = tl.where(origin >= 128, origin - 256, origin) * 0x01010101
        # the quad's 16 * width selector bits start at bit 16 * width * q: within one 32-bit word for 1- and
        # 2-bit fields, two words for 4-bit fields
        qbit = q * 16 * width
        w_lo = qbit >> 5
        lo = tl.load(rec32 + w_lo, mask=tile_ok & (w_lo < S // 4 - 1), other=0)
        hi = tl.load(rec32 + w_lo + 1, mask=tile_ok & (width == 4) & (w_lo + 1 < S // 4 - 1), other=0)
        fbits = 4 * width
        fmask = (1 << fbits) - 1
        raw32 = raw.to(tl.pointer_type(tl.int32)) + (h >> 2) * 128 + 4 * q
        _quad_word(lo, hi, qbit, width, fbits, fmask, bw0 + origin_word, is_raw, raw32, tile_ok & ok0, out, o0, ct, 0,
                   STORE)  # fmt: skip
        _quad_word(lo, hi, qbit, width, fbits, fmask, bw1 + origin_word, is_raw, raw32, tile_ok & ok1, out, o1, ct, 1,
                   STORE)  # fmt: skip
        _quad_word(lo, hi, qbit, width, fbits, fmask, bw2 + origin_word, is_raw, raw32, tile_ok & ok2, out, o2, ct, 2,
                   STORE)  # fmt: skip
        _quad_word(lo, hi, qbit, width, fbits, fmask, bw3 + origin_word, is_raw, raw32, tile_ok & ok3, out, o3, ct, 3,
                   STORE)  # fmt: skip


@triton.jit
def _tail_tile(rb, within, row0, row_group, cols, col, live, records, base_ref, base_delta, raw, out, S,
               TC: tl.constexpr, DB: tl.constexpr, STORE: tl.constexpr):  # fmt: skip
    """Decode and store the tail tile (1..3 columns from column ``col``; one record per row block) of row
    blocks ``rb`` (scalar or [RBP, 1]), a thread per slot."""
    slot = tl.arange(0, 128)[None, :]
    rec = records + rb * S
    h = tl.load(rec.to(tl.pointer_type(tl.int32)) + (S // 4 - 1))
    mode = h & 3
    width = tl.where(mode == 3, 1, 1 << mode)
    origin = (h >> 8) & 0xFF
    origin = tl.where(origin >= 128, origin - 256, origin)
    is_raw = mode == 3
    bit = slot * TC * width  # the slot's TC fields: TC * width contiguous bits from here
    in_rec = (bit >> 3) + 1 < S - 4  # impossible modes never read past the record
    lo_b = tl.load(rec + (bit >> 3), mask=in_rec, other=0).to(tl.int32)
    hi_b = tl.load(rec + (bit >> 3) + 1, mask=in_rec, other=0).to(tl.int32)
    x = ((lo_b | (hi_b << 8)) >> (bit & 7)) & ((1 << (TC * width)) - 1)
    spread = _spread(x, width, TC)
    dbit = slot * DB
    dbyte = tl.load(base_delta + rb * (16 * DB) + (dbit >> 3)).to(tl.int32)
    base = tl.load(base_ref + rb).to(tl.int32) + ((dbyte >> (dbit & 7)) & ((1 << DB) - 1))
    word = (base + origin) * 0x01010101 + spread  # no carries: every byte stays within 0..255
    raw_tile = (h >> 2) * (128 * TC)
    for k in tl.static_range(TC):
        rb_k = tl.load(raw + raw_tile + slot * TC + k, mask=is_raw & live, other=0).to(tl.int32)
        word = tl.where(is_raw, tl.where(k == 0, rb_k, word | (rb_k << (8 * k))), word)
    row_local = within * 128 + _slot_row(slot)
    ok = live & (row_local < row_group)
    offset = (row0 + row_local) * cols + col
    if STORE == 2:  # TC is even: 16-bit halves
        for k in tl.static_range(TC // 2):
            half = ((word >> (16 * k)) & 0xFFFF).to(tl.int16)
            tl.store(out.to(tl.pointer_type(tl.int16)) + offset // 2 + k, half, mask=ok)
    else:
        for k in tl.static_range(TC):
            tl.store(out + offset + k, ((word >> (8 * k)) & 0xFF).to(tl.uint8), mask=ok)


@triton.jit
def _row_block(j, expert_ids, blocks_per_expert, blocks_per_group, row_group, rows_per_expert, num_experts):
    """Row-block program ``j`` (scalar or tensor) -> its inline row block, 128-row block within its row
    group, first plane row of that group, and whether its expert id is live (not graph padding)."""
    routed = j // blocks_per_expert
    blk = j % blocks_per_expert
    e = tl.load(expert_ids + routed)
    live = (e >= 0) & (e < num_experts)
    e = tl.where(live, e, 0)  # 32-bit offsets: planes stay below 2 GiB (checked on the host)
    rb = e * blocks_per_expert + blk
    row0 = e * rows_per_expert + (blk // blocks_per_group) * row_group
    return rb, blk % blocks_per_group, row0, live


@triton.jit
def _exceptions(rb, within, row0, live, ct, ee, tile_ok, records, class_tiles, cols, col0, row_group, out,
                S, TC: tl.constexpr):  # fmt: skip
    """Phase two: store exception ``ee`` of tile ``ct`` (its class starting at column ``col0``) of row block
    ``rb`` (flat element tensors)."""
    rec = records + (rb * class_tiles + tl.where(tile_ok, ct, 0)) * S
    h = tl.load(rec.to(tl.pointer_type(tl.int32)) + (S // 4 - 1), mask=tile_ok, other=3)  # masked: raw
    mode = h & 3
    sb = 16 * TC * (1 << tl.where(mode == 3, 0, mode))
    count = tl.where(mode == 3, 0, (h >> 2) & 63)
    cap = tl.minimum((S - 4 - sb) // 3, 63)
    em = tile_ok & (ee < count) & (ee < cap) & live
    # positions: u16 at an even offset of a 16-byte aligned record
    pos = tl.load((rec + sb).to(tl.pointer_type(tl.int16)) + ee, mask=em, other=0).to(tl.int32) & 0xFFFF
    exc = tl.load(rec + sb + 2 * cap + ee, mask=em, other=0)
    row_e = within * 128 + _slot_row(pos // TC)
    dst = out + (row0 + row_e) * cols + col0 + ct * TC + pos % TC
    tl.store(dst, exc, mask=em & (row_e < row_group))


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
    row_blocks,
    program_tiles,
    tail_S,
    S: tl.constexpr,  # record bytes of this column class
    TC: tl.constexpr,  # columns per tile in this class (4, or the tail's 1..3)
    TTC: tl.constexpr,  # full tiles: the plane's tail columns (0: none), decoded by the same program
    CTG: tl.constexpr,  # full tiles: column tiles per step (a power of two)
    RBP: tl.constexpr,  # tails: row blocks per program (a power of two; full tiles: 1)
    EC: tl.constexpr,  # exception entries read per tile: a power of two >= any mode's capacity at S
    DB: tl.constexpr,  # bits per row-base delta: 4 (MXFP4) or 8 (NVFP4)
    STORE: tl.constexpr,  # bytes per store (4, 2, 1): the widest the rows stay aligned for
):
    if TC == 4:
        # one row block, column tiles [t_begin, t_end): a multiple of CTG (the host's choice), fewer at the
        # plane's edge; a thread decodes a quad of slots per tile
        rb, within, row0, live = _row_block(tl.program_id(0), expert_ids, blocks_per_expert, blocks_per_group,
                                            row_group, rows_per_expert, num_experts)  # fmt: skip
        t_begin = tl.program_id(1) * program_tiles
        t_end = tl.minimum(t_begin + program_tiles, class_tiles)
        _full_tiles(rb, within, row0, row_group, cols, class_tiles, t_begin, t_end, live, records, base_ref,
                    base_delta, raw, out, S, CTG, DB, STORE)  # fmt: skip
        # the row block's tail tile, in the program that writes the rows' last full tiles (one launch per
        # plane; whole rows from one program)
        tail_col = 4 * class_tiles
        TSTORE: tl.constexpr = 2 if (TTC == 2 and STORE >= 2) else 1
        if TTC > 0:
            if t_end == class_tiles:
                _tail_tile(rb, within, row0, row_group, cols, tail_col, live, tail_records, base_ref, base_delta,
                           tail_raw, out, tail_S, TTC, DB, TSTORE)  # fmt: skip
        tl.debug_barrier()  # phase two's stores must land after phase one's on the same bytes
        # CTG tiles x EC entries per step, flat so that headers and entries share one layout
        i = tl.arange(0, CTG * EC)
        for c in range(t_begin, t_end, CTG):
            ct = c + i // EC
            _exceptions(rb, within, row0, live, ct, i % EC, ct < t_end, records, class_tiles, cols, 0, row_group,
                        out, S, TC)  # fmt: skip
        if TTC > 0:
            if t_end == class_tiles:
                k = tl.arange(0, 16)
                for e0 in tl.static_range(0, 64, 16):  # a header counts at most 63 exceptions
                    _exceptions(rb, within, row0, live, 0, e0 + k, True, tail_records, 1, cols, tail_col, row_group,
                                out, tail_S, TTC)  # fmt: skip
    else:
        # the tail tile (one per row block) of RBP row blocks; a thread decodes one slot
        j = tl.program_id(0) * RBP + tl.arange(0, RBP)[:, None]
        j_ok = j < row_blocks
        rb, within, row0, live = _row_block(tl.where(j_ok, j, 0), expert_ids, blocks_per_expert, blocks_per_group,
                                            row_group, rows_per_expert, num_experts)  # fmt: skip
        _tail_tile(rb, within, row0, row_group, cols, 0, live & j_ok, records, base_ref, base_delta, raw, out, S,
                   TC, DB, STORE)  # fmt: skip
        tl.debug_barrier()  # phase two's stores must land after phase one's on the same bytes
        i = tl.arange(0, RBP * EC)
        j = tl.program_id(0) * RBP + i // EC
        j_ok = j < row_blocks
        rb, within, row0, live = _row_block(tl.where(j_ok, j, 0), expert_ids, blocks_per_expert, blocks_per_group,
                                            row_group, rows_per_expert, num_experts)  # fmt: skip
        _exceptions(rb, within, row0, live, 0, i % EC, j_ok, records, 1, cols, 0, row_group, out, S, TC)
