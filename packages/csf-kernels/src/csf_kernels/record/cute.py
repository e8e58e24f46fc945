"""The CSF inline record read from CuTe DSL programs: header fields, exception capacity, and a quad's words.

Plain Python functions over DSL values: a program's trace inlines them, so they cost nothing at run time.
"""

from __future__ import annotations

import cutlass
from cutlass import Int32, Uint32

from csf_kernels import record

__all__ = [
    "CHUNK_BYTES",
    "HEADER_BYTES",
    "MAX_EXCEPTIONS",
    "exception_capacity",
    "header_count",
    "header_mode",
    "header_raw_index",
    "quad_words",
    "selector_origin",
    "selector_origin_word",
    "spread_fields",
]

CHUNK_BYTES = record.RECORD_ALIGN  # a record is staged in 16-byte copies
HEADER_BYTES = record.HEADER_BYTES
MAX_EXCEPTIONS = record.MAX_EXCEPTIONS


def header_mode(h):
    """The selector mode (0, 1, 2: 1-, 2-, 4-bit fields) or ``record.MODE_RAW``."""
    return Int32(h & record.MODE_MASK)


def header_count(h):
    """A selector record's exception count (meaningless for a raw one)."""
    return Int32((h >> record.COUNT_SHIFT) & record.COUNT_MASK)


def header_raw_index(h):
    """A raw record's index among its column class's raw tiles."""
    return Int32(h >> record.RAW_INDEX_SHIFT)


def selector_origin(h):
    """The window origin of a header in a selector mode (bits 16-31 zero): the signed byte of bits 8-15."""
    return Int32(h << (24 - record.ORIGIN_SHIFT)) >> 24


def selector_origin_word(h):
    """:func:`selector_origin` replicated into the four bytes of a word (one add offsets four scales)."""
    return Uint32(selector_origin(h) * 0x01010101)


def exception_capacity(record_bytes, selector_bytes):
    """How many exceptions a record of ``record_bytes`` holds after ``selector_bytes`` of selectors."""
    return cutlass.min(Int32(MAX_EXCEPTIONS), (record_bytes - HEADER_BYTES - selector_bytes) // record.EXCEPTION_BYTES)


def spread_fields(grp, width: int):
    """Four ``width``-bit fields (the columns of one slot) -> one per byte of a word."""
    field = (1 << width) - 1
    out = grp & field
    for c in range(1, 4):
        out = out | ((grp & (field << (c * width))) << (c * (8 - width)))
    return out


def quad_words(bases, ow, fields):
    """A quad's four words: row base + origin + spread fields, per byte (real rows never carry)."""
    return tuple(bases[k] + ow + fields[k] for k in range(4))
