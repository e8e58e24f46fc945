"""Triton: expand inline CSF tiles (docs/csf-format.md section 5) into the native scale plane.

One program decodes one 128-row block of one expert across ``CTG`` column tiles of one column class
(full 4-column tiles, or the tail tile) and writes whole row segments of the native plane. Phase one
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
    "out": "*u8",
    "expert_ids": "*i32",
    "blocks_per_expert": "i32",
    "blocks_per_group": "i32",
    "row_group": "i32",
    "rows_per_expert": "i32",
    "cols": "i32",
    "col_start": "i32",
    "class_tiles": "i32",
    "num_experts": "i32",
    "S": "constexpr",
    "TC": "constexpr",
    "CTG": "constexpr",
    "EP": "constexpr",
    "DB": "constexpr",
    "STORE": "constexpr",
}


@triton.jit
def _slot_row(slot):
    # slot = 32 warp + 4 quad + 2 half + pair  ->  row = 64 half + 16 warp + quad + 8 pair
    return 64 * ((slot >> 1) & 1) + 16 * (slot >> 5) + ((slot >> 2) & 7) + 8 * (slot & 1)


@triton.jit
def _header(rec):
    h = tl.load(rec + 0).to(tl.int32)
    h |= tl.load(rec + 1).to(tl.int32) << 8
    h |= tl.load(rec + 2).to(tl.int32) << 16
    h |= tl.load(rec + 3).to(tl.int32) << 24
    return h


@triton.jit
def _spread(x, width):
    """A full tile slot's four ``width``-bit fields -> one per byte."""
    fmask = (1 << width) - 1
    out = x & fmask
    for k in tl.static_range(1, 4):
        out |= ((x >> (k * width)) & fmask) << (8 * k)
    return out


@triton.jit
def _full_tile_quads(
    rb,
    within,
    row0,
    row_group,
    cols,
    col_start,
    ct,
    tile_ok,
    live,
    rec32,
    h,
    width,
    origin,
    is_raw,
    base_ref,
    base_delta,
    raw,
    out,
    S: tl.constexpr,
    DB: tl.constexpr,
    STORE: tl.constexpr,
):
    """Decode and store the words of full tiles, a quad of slots per element ([EP tiles, 32 quads])."""
    q = tl.arange(0, 32)[None, :]
    # the quad's 16 * width selector bits start at bit 16 * width * q: within one 32-bit word for 1- and
    # 2-bit fields, two words for 4-bit fields
    qbit = q * 16 * width
    w_lo = qbit >> 5
    lo = tl.load(rec32 + w_lo, mask=tile_ok & (w_lo < S // 4 - 1), other=0)
    hi = tl.load(rec32 + w_lo + 1, mask=tile_ok & (width == 4) & (w_lo + 1 < S // 4 - 1), other=0)
    fbits = 4 * width
    fmask = (1 << fbits) - 1
    if DB == 4:  # the quad's four base deltas: one 16-bit word
        deltas = tl.load(base_delta.to(tl.pointer_type(tl.int16)) + rb * 32 + q).to(tl.int32)
    else:
        deltas = tl.load(base_delta.to(tl.pointer_type(tl.int32)) + rb * 32 + q)
    base0 = tl.load(base_ref + rb).to(tl.int32) + origin
    raw32 = raw.to(tl.pointer_type(tl.int32)) + (h >> 2) * 128 + 4 * q
    for k in tl.static_range(4):
        src = tl.where((width == 4) & (k >= 2), hi, lo)
        shift = tl.where(width == 4, 16 * (k % 2), (qbit & 31) + fbits * k)
        x = (src >> shift) & fmask
        base = base0 + ((deltas >> (DB * k)) & ((1 << DB) - 1))
        word = base * 0x01010101 + _spread(x, width)  # no carries: every byte stays in 0..255
        word = tl.where(is_raw, tl.load(raw32 + k, mask=is_raw & tile_ok, other=0), word)
        # slot 4 q + k: row 64 half + 16 warp + quad + 8 pair, with half = k >> 1, pair = k & 1
        row_local = within * 128 + 64 * (k >> 1) + 16 * (q >> 3) + (q & 7) + 8 * (k & 1)
        ok = live & tile_ok & (row_local < row_group)
        row = row0 + row_local
        if STORE == 4:
            tl.store(out.to(tl.pointer_type(tl.int32)) + row * (cols // 4) + col_start // 4 + ct, word, mask=ok)
        elif STORE == 2:
            offset = (row * cols + col_start + ct * 4) // 2
            tl.store(out.to(tl.pointer_type(tl.int16)) + offset, (word & 0xFFFF).to(tl.int16), mask=ok)
            tl.store(out.to(tl.pointer_type(tl.int16)) + offset + 1, ((word >> 16) & 0xFFFF).to(tl.int16), mask=ok)
        else:
            offset = row * cols + col_start + ct * 4
            for b in tl.static_range(4):
                tl.store(out + offset + b, ((word >> (8 * b)) & 0xFF).to(tl.uint8), mask=ok)


@triton.jit
def expand_inline_tiles(
    base_ref,
    base_delta,
    records,
    raw,
    out,
    expert_ids,
    blocks_per_expert,
    blocks_per_group,
    row_group,
    rows_per_expert,
    cols,
    col_start,
    class_tiles,
    num_experts,
    S: tl.constexpr,  # record bytes of this column class
    TC: tl.constexpr,  # columns per tile in this class (4, or the tail's 1..3)
    CTG: tl.constexpr,  # column tiles per program
    EP: tl.constexpr,  # next power of two >= CTG (exception phase rows)
    DB: tl.constexpr,  # bits per row-base delta: 4 (MXFP4) or 8 (NVFP4)
    STORE: tl.constexpr,  # bytes per store (4, 2, 1): the widest the rows stay aligned for
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    routed = pid_r // blocks_per_expert
    blk = pid_r % blocks_per_expert
    e = tl.load(expert_ids + routed)
    live = (e >= 0) & (e < num_experts)
    e = tl.where(live, e, 0)  # 32-bit offsets: planes stay below 2 GiB (checked on the host)
    rb = e * blocks_per_expert + blk
    group = blk // blocks_per_group
    within = blk % blocks_per_group
    row0 = e * rows_per_expert + group * row_group

    # phase one. Full tiles: a thread decodes a quad (four consecutive slots, the rows one wgmma lane
    # holds) of a tile: one header, one or two selector words and one base-delta word serve four output
    # words. Tail tiles: a thread decodes one slot.
    t_local = tl.arange(0, EP)[:, None]
    ct = pid_c * CTG + t_local
    tile_ok = (t_local < CTG) & (ct < class_tiles)
    tile = (rb * class_tiles + tl.where(tile_ok, ct, 0)).to(tl.int32)  # < 2**31 / S: checked on the host
    # records are 16-byte aligned and S is a multiple of 16: the header is one aligned 32-bit word
    rec32 = records.to(tl.pointer_type(tl.int32)) + tile * (S // 4)
    h = tl.load(rec32 + (S // 4 - 1))
    mode = h & 3
    width = tl.where(mode == 3, 1, 1 << mode)
    origin = (h >> 8) & 0xFF
    origin = tl.where(origin >= 128, origin - 256, origin)
    is_raw = mode == 3
    if TC == 4:
        _full_tile_quads(
            rb,
            within,
            row0,
            row_group,
            cols,
            col_start,
            ct,
            tile_ok,
            live,
            rec32,
            h,
            width,
            origin,
            is_raw,
            base_ref,
            base_delta,
            raw,
            out,
            S,
            DB,
            STORE,
        )
    else:
        slot = tl.arange(0, 128)[None, :]
        rec = records + tile * S
        bit = slot * TC * width  # the slot's TC fields: TC * width contiguous bits from here
        in_rec = (bit >> 3) + 1 < S - 4  # impossible modes never read past the record
        lo_b = tl.load(rec + (bit >> 3), mask=in_rec, other=0).to(tl.int32)
        hi_b = tl.load(rec + (bit >> 3) + 1, mask=in_rec, other=0).to(tl.int32)
        x = ((lo_b | (hi_b << 8)) >> (bit & 7)) & ((1 << (TC * width)) - 1)
        fmask = (1 << width) - 1
        spread = x & fmask
        for k in tl.static_range(1, TC):
            spread |= ((x >> (k * width)) & fmask) << (8 * k)
        dbit = slot * DB
        dbyte = tl.load(base_delta + rb * (16 * DB) + (dbit >> 3)).to(tl.int32)
        base = tl.load(base_ref + rb).to(tl.int32) + ((dbyte >> (dbit & 7)) & ((1 << DB) - 1))
        word = (base + origin) * 0x01010101 + spread  # no carries: every byte stays within 0..255
        raw_tile = (h >> 2) * (128 * TC)
        for k in tl.static_range(TC):
            rb_k = tl.load(raw + raw_tile + slot * TC + k, mask=is_raw & tile_ok, other=0).to(tl.int32)
            word = tl.where(is_raw, tl.where(k == 0, rb_k, word | (rb_k << (8 * k))), word)
        row_local = within * 128 + _slot_row(slot)
        ok = live & tile_ok & (row_local < row_group)
        if STORE == 4:  # one 32-bit store per (slot, tile)
            word_index = (row0 + row_local) * (cols // 4) + col_start // 4 + ct
            tl.store(out.to(tl.pointer_type(tl.int32)) + word_index, word, mask=ok)
        else:
            offset = (row0 + row_local) * cols + col_start + ct * TC
            if STORE == 2:  # TC is even: 16-bit halves
                for k in tl.static_range(TC // 2):
                    half = ((word >> (16 * k)) & 0xFFFF).to(tl.int16)
                    tl.store(out.to(tl.pointer_type(tl.int16)) + offset // 2 + k, half, mask=ok)
            else:
                for k in tl.static_range(TC):
                    tl.store(out + offset + k, ((word >> (8 * k)) & 0xFF).to(tl.uint8), mask=ok)

    tl.debug_barrier()  # phase two's stores must land after phase one's on the same bytes

    # phase two: exceptions, [EP tiles, 64 entries]
    tt = tl.arange(0, EP)[:, None]
    ee = tl.arange(0, 64)[None, :]
    ct2 = pid_c * CTG + tt
    tile_ok = (tt < CTG) & (ct2 < class_tiles)
    rec2 = records + (rb * class_tiles + tl.where(tile_ok, ct2, 0)) * S
    h2 = _header(rec2 + S - 4)
    mode2 = h2 & 3
    w2 = 1 << tl.where(mode2 == 3, 0, mode2)
    count = tl.where(mode2 == 3, 0, (h2 >> 2) & 63)
    sb = 16 * TC * w2
    cap = tl.minimum((S - 4 - sb) // 3, 63)
    em = tile_ok & (ee < count) & (ee < cap) & live
    pos = tl.load(rec2 + sb + 2 * ee, mask=em, other=0).to(tl.int32)
    pos |= tl.load(rec2 + sb + 2 * ee + 1, mask=em, other=0).to(tl.int32) << 8
    exc = tl.load(rec2 + sb + 2 * cap + ee, mask=em, other=0)
    slot_e = pos // TC
    row_e = within * 128 + _slot_row(slot_e)
    dst2 = out + (row0 + row_e) * cols + col_start + ct2 * TC + pos % TC
    tl.store(dst2, exc, mask=em & (row_e < row_group))
