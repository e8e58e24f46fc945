"""The CSF inline record on the GPU: one home for how every program reads it.

Each dialect's decode helpers sit side by side here (``triton``, ``gluon``, ``cute``), every constant imported
from :mod:`csf_codec.record_layout` (the record's bytes) and :mod:`csf_codec.tile_layout` (slot order), so a
kernel never spells a header bit or a slot formula itself. ``reference`` holds the torch reference of a stage's
decode; ``cute_stage_decoder`` the CuTe program that decodes one stage (the building block of inline GEMMs).

Only this ``__init__`` is free of compiler imports; the dialect modules import triton or cutlass.
"""

from csf_codec.record_layout import (
    COUNT_MASK,
    COUNT_SHIFT,
    DELTA_BITS,
    EXCEPTION_BYTES,
    HEADER_BYTES,
    MAX_EXCEPTIONS,
    MODE_MASK,
    MODE_RAW,
    ORIGIN_MASK,
    ORIGIN_SHIFT,
    RAW_INDEX_SHIFT,
    RECORD_ALIGN,
)
from csf_codec.tile_layout import TILE_COLS, TILE_ROWS

__all__ = [
    "COUNT_MASK",
    "COUNT_SHIFT",
    "DELTA_BITS",
    "EXCEPTION_BYTES",
    "HEADER_BYTES",
    "MAX_EXCEPTIONS",
    "MODE_MASK",
    "MODE_RAW",
    "ORIGIN_MASK",
    "ORIGIN_SHIFT",
    "RAW_INDEX_SHIFT",
    "RECORD_ALIGN",
    "TILE_COLS",
    "TILE_ROWS",
]
