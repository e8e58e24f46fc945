"""The CSF inline record read from Triton programs: header fields, exception capacity and slot order."""

from __future__ import annotations

import triton
import triton.language as tl

from csf_kernels import record

MODE_MASK = tl.constexpr(record.MODE_MASK)
MODE_RAW = tl.constexpr(record.MODE_RAW)
COUNT_SHIFT = tl.constexpr(record.COUNT_SHIFT)
COUNT_MASK = tl.constexpr(record.COUNT_MASK)
ORIGIN_SHIFT = tl.constexpr(record.ORIGIN_SHIFT)
ORIGIN_MASK = tl.constexpr(record.ORIGIN_MASK)
RAW_INDEX_SHIFT = tl.constexpr(record.RAW_INDEX_SHIFT)
HEADER_BYTES = tl.constexpr(record.HEADER_BYTES)
EXCEPTION_BYTES = tl.constexpr(record.EXCEPTION_BYTES)
MAX_EXCEPTIONS = tl.constexpr(record.MAX_EXCEPTIONS)


@triton.jit
def header_mode(h):
    """The selector mode (0, 1, 2: 1-, 2-, 4-bit fields) or ``MODE_RAW``."""
    return h & MODE_MASK


@triton.jit
def header_is_raw(h):
    return (h & MODE_MASK) == MODE_RAW


@triton.jit
def header_count(h):
    """A selector record's exception count (meaningless for a raw one)."""
    return (h >> COUNT_SHIFT) & COUNT_MASK


@triton.jit
def header_origin(h):
    """A selector record's window origin, the signed byte of bits 8-15."""
    o = (h >> ORIGIN_SHIFT) & ORIGIN_MASK
    return tl.where(o >= 128, o - 256, o)


@triton.jit
def header_origin_word(h):
    """The origin replicated into the four bytes of a word (one add offsets four scales)."""
    return header_origin(h) * 0x01010101


@triton.jit
def header_raw_index(h):
    """A raw record's index among its column class's raw tiles."""
    return h >> RAW_INDEX_SHIFT


@triton.jit
def exception_capacity(record_bytes, selector_bytes):
    """How many exceptions a record of ``record_bytes`` holds after ``selector_bytes`` of selectors."""
    return tl.minimum((record_bytes - HEADER_BYTES - selector_bytes) // EXCEPTION_BYTES, MAX_EXCEPTIONS)


@triton.jit
def slot_row(slot):
    """``tile_layout.slot_to_row``: slot = 32 warp + 4 quad + 2 half + pair -> 64 half + 16 warp + quad + 8 pair."""
    return 64 * ((slot >> 1) & 1) + 16 * (slot >> 5) + ((slot >> 2) & 7) + 8 * (slot & 1)


@triton.jit
def row_slot(row):
    """``tile_layout.row_to_slot``, the inverse of :func:`slot_row` for a row within its 128-row block."""
    return 32 * ((row >> 4) & 3) + 4 * (row & 7) + 2 * (row >> 6) + ((row >> 3) & 1)


@triton.jit
def row_block_of(e, row, R, row_group, blocks_per_group):
    """The inline row block holding weight row ``row`` of expert ``e``."""
    return (e * (R // row_group) + row // row_group) * blocks_per_group + (row % row_group) // 128


@triton.jit
def record_at(records, tail, rb, t, full_tiles, S, S_TAIL):
    """Column tile ``t``'s record of row block ``rb`` and its size (the tail tile's past the full ones)."""
    is_tail = t >= full_tiles
    return tl.where(is_tail, tail + rb * S_TAIL, records + (rb * full_tiles + t) * S), tl.where(is_tail, S_TAIL, S)


@triton.jit
def record_header(records, tail, rb, t, steps, full_tiles, S, S_TAIL):
    """Tile ``t``'s record header (one per tile, uniform over the program); 0 past the last step."""
    rec, sbytes = record_at(records, tail, rb, t, full_tiles, S, S_TAIL)
    return tl.load(rec.to(tl.pointer_type(tl.int32)) + (sbytes // 4 - 1), mask=t < steps, other=0)


@triton.jit
def selector_words(records, tail, rb, slot, valid, t, h, full_tiles, S, S_TAIL, TC):
    """The 32-bit words holding each row's selector fields in tile ``t`` (header ``h``): (lo, hi)."""
    tcx = tl.where(t >= full_tiles, TC, 4)
    rec, sbytes = record_at(records, tail, rb, t, full_tiles, S, S_TAIL)
    rec32 = rec.to(tl.pointer_type(tl.int32))
    mode = header_mode(h)
    is_raw = mode == MODE_RAW
    wi = (slot * tcx * tl.where(is_raw, 1, 1 << mode)) >> 5
    lo = tl.load(rec32 + wi, mask=valid & ~is_raw, other=0)
    hi = tl.load(rec32 + wi + 1, mask=valid & ~is_raw & (wi + 1 < sbytes // 4 - 1), other=0)
    return lo, hi
