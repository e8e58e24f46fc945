"""The inline form's CPU decoder on the C extension (:mod:`csf_codec.native`): per span, the records' checks and
values in one C call that releases the GIL (the numpy decoder's checks, order and messages:
:func:`csf_codec.inline_np.decode_class_np`, the reference), then the same strided copy of the tiles to rows."""

from __future__ import annotations

import numpy as np

from .errors import CorruptPayloadError
from .inline_np import _MODE_WIDTH, ClassPlan, _scatter, block_spans, group_blocks
from .native import native
from .swar import map_spans
from .tile_layout import TILE_ROWS

__all__ = ["decode_class_c"]

_FAULTS = {
    2: "a tile window leaves the byte range",
    3: "a record's unused exception slots or padding are not zero",
    4: "a padding slot's selector is not zero",
    5: "an exception position lies outside its tile",
    6: "exception positions are not strictly ascending",
    7: "an exception sits on padding or on a non-zero selector",
    8: "an exception repeats a value its selector could express",
    9: "a raw tile index points past the raw tiles",
    10: "a raw tile's record holds bytes besides its header",
    11: "a raw tile stores non-zero bytes for padding slots",
    12: "a record's exception slots run past the record",
}


def decode_class_c(out, records, raw, br, base, valid, plan: ClassPlan, s: int, capacity, name: str) -> None:
    """:func:`csf_codec.inline_np.decode_class_np` (same arguments, bytes and errors) on the C loops."""
    nat = native()
    size = TILE_ROWS * plan.cols
    bmin = np.ascontiguousarray(np.where(valid, base, 1 << 14).min(axis=1), dtype=np.int64)
    bmax = np.ascontiguousarray(np.where(valid, base, -(1 << 14)).max(axis=1), dtype=np.int64)
    caps = np.array([capacity(w, s, plan.cols) for w in _MODE_WIDTH.values()], dtype=np.int64)
    args = (
        np.ascontiguousarray(records, dtype=np.uint8),
        np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, size) if raw.size else np.zeros((0, size), np.uint8),
        np.ascontiguousarray(base, dtype=np.int16),
        np.ascontiguousarray(valid, dtype=np.bool_),
        bmin,
        bmax,
        caps,
    )

    def span(sp: tuple[int, int]) -> None:
        a, b = sp
        vals = np.empty(((b - a) * plan.count, size), dtype=np.uint8)
        fault, mode, _ = nat.decode_inline_span(vals, *args, a, b, plan.count, plan.cols, s)
        if fault == 1:
            raise CorruptPayloadError(name, f"a {_MODE_WIDTH[mode]}-bit tile header is impossible for {s}-byte records")
        if fault:
            raise CorruptPayloadError(name, _FAULTS[fault])
        _scatter(out, vals, br[a:b], plan)

    map_spans(span, block_spans(br.shape[0], plan.count * plan.cols, group_blocks(br)))
