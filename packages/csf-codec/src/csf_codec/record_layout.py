"""The inline CSF tile record's byte layout: one place for every constant a decoder needs (CPU or GPU).

A record of S bytes for a tile of ``tc`` columns with selector width w (``docs/csf-format.md`` section 5)::

    [0, 16 tc w)                      selectors: field p = slot * tc + column at bit p * w
    [16 tc w, +2 cap)                 exception positions p, u16 little-endian, ascending
    [16 tc w + 2 cap, +cap)           exception values
    [S - 4, S)                        header u32

The header: bits 0-1 the mode (selector width, or raw); in selector modes bits 2-7 the exception count and bits
8-15 the origin (int8), bits 16-31 zero; in raw mode bits 2-31 the tile's index among its class's raw tiles.
``cap = min(MAX_EXCEPTIONS, (S - HEADER_BYTES - 16 tc w) // EXCEPTION_BYTES)``.
"""

from __future__ import annotations

__all__ = [
    "COUNT_MASK",
    "COUNT_SHIFT",
    "DELTA_BITS",
    "EXCEPTION_BYTES",
    "HEADER_BYTES",
    "MAX_EXCEPTIONS",
    "MODE_MASK",
    "MODE_RAW",
    "MODE_WIDTH",
    "ORIGIN_MASK",
    "ORIGIN_SHIFT",
    "RAW_INDEX_SHIFT",
    "RECORD_ALIGN",
]

HEADER_BYTES = 4  # the record's last u32
MODE_MASK = 0x3  # header bits 0-1
MODE_RAW = 3
MODE_WIDTH = {0: 1, 1: 2, 2: 4}  # selector mode -> bits per field
COUNT_SHIFT = 2  # selector modes: exception count in bits 2-7
COUNT_MASK = 0x3F
MAX_EXCEPTIONS = COUNT_MASK
ORIGIN_SHIFT = 8  # selector modes: the window's origin, an int8 in bits 8-15
ORIGIN_MASK = 0xFF
RAW_INDEX_SHIFT = 2  # raw mode: the raw tile's index in bits 2-31
EXCEPTION_BYTES = 3  # a u16 position and a u8 value
RECORD_ALIGN = 16  # record sizes are multiples of this: a stage copies them in aligned 16-byte chunks
DELTA_BITS = {"mxfp4": 4, "nvfp4": 8}  # bits per slot of a row block's base deltas
