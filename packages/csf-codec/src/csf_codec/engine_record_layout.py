"""The engine record's byte layout (``docs/csf-format.md`` section 6): every constant a reader needs, CPU or GPU.

A record of one tile (128 rows x ``tc`` scale columns), its length a multiple of 16 bytes::

    [0, 4)                      header u32 LE
    [4, 4 + 16 tc w)            selectors: field p = slot * tc + column at bit p * w
    [.., + ceil(1.5 n))         n exception entries of 12 bits, entry i at bit 12 i (two per three bytes)
    [.., + escapes)             one byte per escape entry, in entry order
    [.., length)                zero

Row block starts are u32 counts of 16-byte units (a plane's body reaches 64 GiB).

Header: bits 0-1 mode (0: 1-bit, 1: 2-bit, 2: 4-bit selectors, 3: raw), bits 2-7 length / 16, bits 8-15 the
window origin o (int8), bits 16-24 the exception count n, bits 25-31 zero. A raw record is the header (origin and
count 0) and the tile's native bytes in position order, from byte 4.

Entry: bits 0-8 the position p, bits 9-11 the code: 0-3 the value lies 1-4 below the window (``lo - 1 - code``),
4-6 it lies 1-3 above (``hi + code - 3``), 7 an escape (the value is the record's next escape byte).
"""

from __future__ import annotations

from .record_layout import MODE_RAW, MODE_WIDTH

__all__ = [
    "ABOVE_CODES",
    "BELOW_CODES",
    "CODE_SHIFT",
    "COUNT_MASK",
    "COUNT_SHIFT",
    "ESCAPE_CODE",
    "HEADER_BYTES",
    "MAX_BODY_UNITS",
    "MODE_RAW",
    "MODE_WIDTH",
    "ORIGIN_SHIFT",
    "POSITION_MASK",
    "RECORD_ALIGN",
    "RESERVED_SHIFT",
    "UNITS_MASK",
    "UNITS_SHIFT",
    "block_start_units",
    "entry_bytes",
    "raw_units",
    "selector_bytes",
    "units_for",
]

HEADER_BYTES = 4
RECORD_ALIGN = 16  # a record's length is a multiple of this: the engine copies it with cp.async.bulk
MAX_BODY_UNITS = (1 << 32) - 1  # block starts are u32 counts of RECORD_ALIGN units: a body reaches 64 GiB
UNITS_SHIFT = 2  # length / 16 in bits 2-7
UNITS_MASK = 0x3F
ORIGIN_SHIFT = 8  # int8 in bits 8-15
COUNT_SHIFT = 16  # exception count in bits 16-24
COUNT_MASK = 0x1FF
RESERVED_SHIFT = 25  # bits 25-31 are zero
POSITION_MASK = 0x1FF  # an entry's bits 0-8
CODE_SHIFT = 9  # an entry's bits 9-11
BELOW_CODES = 4  # codes 0-3: 1-4 below the window's low end
ABOVE_CODES = 3  # codes 4-6: 1-3 above its high end
ESCAPE_CODE = 7


def selector_bytes(width: int, cols: int) -> int:
    return 16 * cols * width


def entry_bytes(count: int):
    """Bytes of ``count`` 12-bit entries (an odd count leaves the last byte's high nibble zero); numpy-friendly."""
    return (3 * count + 1) // 2


def units_for(used):
    """Length / 16 of a record whose fields take ``used`` bytes; numpy-friendly."""
    return -(-used // RECORD_ALIGN)


def block_start_units(block_start):
    """Each row block's start in ``body`` in 16-byte units, whichever way ``block_start`` stores it: 8-byte
    elements count bytes (u64), narrower ones count 16-byte units (u32); numpy- and torch-friendly."""
    return block_start // RECORD_ALIGN if block_start.dtype.itemsize == 8 else block_start


def raw_units(cols: int) -> int:
    return units_for(HEADER_BYTES + 128 * cols)


assert raw_units(4) <= UNITS_MASK and set(MODE_WIDTH) == {0, 1, 2} and MODE_RAW == 3
