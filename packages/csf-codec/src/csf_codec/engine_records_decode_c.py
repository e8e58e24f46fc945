"""Engine records' CPU decoder on the C extension (:mod:`csf_codec.native`): a span's row blocks in one C call that
releases the GIL (:func:`decode_span_c`), column class by column class, a tile at a time: every field checked, the
values, and the canonical-choice check from each tile's ``C(k)`` (the numpy decoder's checks, order and messages:
:func:`csf_codec.engine_records_decode_np.decode_records`, the reference). The numpy passes report the first check
any tile fails; the C loop ranks its faults in that order and reports the least. The call also writes the tiles to
their rows and checks each row block's stored bases against its rows while they are in cache
(:func:`csf_codec.engine_records._span_bases_ok`, the reference)."""

from __future__ import annotations

import numpy as np

from .engine_records_np import thresholds
from .errors import CorruptPayloadError
from .native import native
from .record_layout import DELTA_BITS, MODE_WIDTH

__all__ = ["decode_span_c"]

_MODE_FAULTS = (
    "a {w}-bit record's window is not a candidate window",
    "a tile window leaves the byte range",
    "a record's selectors and exception count run past its length",
    "a padding slot's selector is not zero",
    "the unused half of a record's last exception entry is not zero",
    "an exception position lies outside its tile",
    "exception positions are not strictly ascending",
    "an exception sits on padding or on a non-zero selector",
    "a record's length disagrees with its exception count and escapes",
    "an exception repeats a value its selector could express",
    "an escape holds a value a code reaches",
    "an exception code points outside the byte range",
    "a record's padding bytes are not zero",
)
_RAW_FAULTS = (
    "a raw record's header carries an origin or a count",
    "a raw record's length is not the raw length",
    "a record's padding bytes are not zero",
    "a raw record stores non-zero bytes for padding slots",
)
_FAULTS = {
    1: "a record header's length disagrees with its offsets byte",
    2: "a record header's reserved bits are not zero",
    **{3 + 16 * m + k: f.format(w=MODE_WIDTH[m]) for m in MODE_WIDTH for k, f in enumerate(_MODE_FAULTS)},
    **{51 + k: f for k, f in enumerate(_RAW_FAULTS)},
    60: "a tile's record is not the shortest its candidate windows give",
}
_BOUNDS = 61  # a table index numpy would refuse (a record length below one unit, refused before): numpy decides


def decode_span_c(out, seg, units, base, valid, br, base_ref, windows, fmt, name: str) -> bool | None:
    """A span of row blocks, whole, in one C call: every record (``seg``, the span's body; ``units`` int [blocks,
    col tiles]) decoded and checked as the numpy reference checks them, full tiles before tail tiles, the tiles
    written to their rows of ``out`` (uint8 [plane rows, cols]; ``br``: each slot's plane row, -1 for padding); then
    whether each block's stored bases (``base`` int [blocks, 128], ``base_ref`` uint8 [blocks]) are the ones its rows
    give, proven from the rows' counts for 1-bit base windows or recomputed. None when the numpy path must decide (a
    table index numpy would refuse): the caller decodes the span again that way."""
    fault, _, bases_ok = native().decode_engine_rows(
        out,
        seg,
        np.ascontiguousarray(units, dtype=np.int64),
        np.ascontiguousarray(base, dtype=np.int16),
        np.ascontiguousarray(valid, dtype=np.bool_),
        np.ascontiguousarray(br, dtype=np.int64),
        np.ascontiguousarray(windows, dtype=np.int64).reshape(-1),
        np.array(thresholds(tuple(windows)), dtype=np.int32),
        out.shape[1],
        fmt.row_base_width,
        int(fmt.row_base_width == 1),  # three counts a row prove a 1-bit window's base for nearly every row
        np.ascontiguousarray(base_ref, dtype=np.uint8),
        DELTA_BITS[fmt.name],
    )
    if fault == _BOUNDS:
        return None
    if fault:
        raise CorruptPayloadError(name, _FAULTS[fault])
    return bool(bases_ok)
