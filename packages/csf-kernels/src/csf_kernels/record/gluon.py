"""The CSF inline record read from Gluon programs: header fields, exception capacity, slot order, and where a
tile's record, header and selector words lie (the same rules as :mod:`csf_kernels.record.triton`)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from csf_kernels import record

MODE_MASK = gl.constexpr(record.MODE_MASK)
MODE_RAW = gl.constexpr(record.MODE_RAW)
COUNT_SHIFT = gl.constexpr(record.COUNT_SHIFT)
COUNT_MASK = gl.constexpr(record.COUNT_MASK)
ORIGIN_SHIFT = gl.constexpr(record.ORIGIN_SHIFT)
ORIGIN_MASK = gl.constexpr(record.ORIGIN_MASK)
RAW_INDEX_SHIFT = gl.constexpr(record.RAW_INDEX_SHIFT)
HEADER_BYTES = gl.constexpr(record.HEADER_BYTES)
EXCEPTION_BYTES = gl.constexpr(record.EXCEPTION_BYTES)
MAX_EXCEPTIONS = gl.constexpr(record.MAX_EXCEPTIONS)


@gluon.jit
def header_mode(h):
    """The selector mode (0, 1, 2: 1-, 2-, 4-bit fields) or ``MODE_RAW``."""
    return h & MODE_MASK


@gluon.jit
def header_count(h):
    """A selector record's exception count (meaningless for a raw one)."""
    return (h >> COUNT_SHIFT) & COUNT_MASK


@gluon.jit
def header_origin(h):
    """A selector record's window origin, the signed byte of bits 8-15."""
    o = (h >> ORIGIN_SHIFT) & ORIGIN_MASK
    return gl.where(o >= 128, o - 256, o)


@gluon.jit
def selector_header_origin(h):
    """:func:`header_origin` of a header known to be in a selector mode (bits 16-31 zero): two shifts."""
    return (h << (24 - ORIGIN_SHIFT)) >> 24


@gluon.jit
def header_raw_index(h):
    """A raw record's index among its column class's raw tiles."""
    return h >> RAW_INDEX_SHIFT


@gluon.jit
def exception_capacity(record_bytes, selector_bytes):
    """How many exceptions a record of ``record_bytes`` holds after ``selector_bytes`` of selectors
    (csf_codec.inline.exception_capacity); their value bytes start ``2 cap`` bytes past their positions."""
    return gl.minimum((record_bytes - HEADER_BYTES - selector_bytes) // EXCEPTION_BYTES, MAX_EXCEPTIONS)


@gluon.jit
def row_slot(row):
    """``tile_layout.row_to_slot``: row = 64 half + 16 warp + quad + 8 pair -> 32 warp + 4 quad + 2 half + pair."""
    return 32 * ((row >> 4) & 3) + 4 * (row & 7) + 2 * (row >> 6) + ((row >> 3) & 1)


@gluon.jit
def row_block_of(e, row, R, row_group, blocks_per_group):
    """The inline row block holding weight row ``row`` of expert ``e``."""
    return (e * (R // row_group) + row // row_group) * blocks_per_group + (row % row_group) // 128


@gluon.jit
def record_at(records, tail, rb, t, full_tiles, S, S_TAIL):
    """Column tile ``t``'s record of row block ``rb`` and its size (the tail tile's past the full ones)."""
    is_tail = t >= full_tiles
    return gl.where(is_tail, tail + rb * S_TAIL, records + (rb * full_tiles + t) * S), gl.where(is_tail, S_TAIL, S)


@gluon.jit
def record_header(records, tail, rb, t, steps, full_tiles, S, S_TAIL):
    """Tile ``t``'s record header (one per tile, uniform over the program); 0 past the last step."""
    rec, sbytes = record_at(records, tail, rb, t, full_tiles, S, S_TAIL)
    return gl.load(rec.to(gl.pointer_type(gl.int32)) + (sbytes // 4 - 1), mask=t < steps, other=0)


@gluon.jit
def selector_words(records, tail, rb, slot, valid, t, h, full_tiles, S, S_TAIL, TC):
    """The 32-bit words holding each row's selector fields in tile ``t`` (header ``h``): (lo, hi)."""
    tcx = gl.where(t >= full_tiles, TC, 4)
    rec, sbytes = record_at(records, tail, rb, t, full_tiles, S, S_TAIL)
    rec32 = rec.to(gl.pointer_type(gl.int32))
    mode = header_mode(h)
    is_raw = mode == MODE_RAW
    wi = (slot * tcx * gl.where(is_raw, 1, 1 << mode)) >> 5
    lo = gl.load(rec32 + wi, mask=valid & ~is_raw, other=0)
    hi = gl.load(rec32 + wi + 1, mask=valid & ~is_raw & (wi + 1 < sbytes // 4 - 1), other=0)
    return lo, hi
