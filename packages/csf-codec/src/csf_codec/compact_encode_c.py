"""The compact encoder's loops on the C extension (:mod:`csf_codec.native`), the GIL released, spans on the workers:
the row pass (every width's row bases, base codes and chunk counts) and each span's part of the body. The numpy
passes in :mod:`csf_codec.compact_np` stay the reference the tests compare with (byte-identical payloads)."""

from __future__ import annotations

import numpy as np

from .compact_code import CHUNK
from .native import native
from .swar import map_spans

__all__ = ["span_sections_c", "width_stats_c"]


def width_stats_c(rows: np.ndarray, widths: tuple[int, ...], spans):
    """:func:`csf_codec.compact_np.width_stats_np` in one C pass over each span's rows: a row's bases and counts at
    every width from its cumulative counts, found once (``native_compact_encode.c``)."""
    nat = native()
    r, c = rows.shape
    ws = np.array(widths, dtype=np.int64)
    bases = np.empty((len(widths), r), dtype=np.uint8)
    codes = np.empty((len(widths), r), dtype=np.uint8)

    def span(sp: tuple[int, int]) -> np.ndarray:
        a, b = sp
        out = np.empty((len(widths), 3, -(-(b - a) * c // CHUNK)), dtype=np.uint16)  # at most 256 a chunk
        nat.compact_rows(rows, c, ws, a, b, bases, codes, out)
        return out

    per_span = map_spans(span, spans) or [np.zeros((len(widths), 3, 0), dtype=np.uint16)]
    counts = np.concatenate(per_span, axis=2)
    return (
        {w: bases[i] for i, w in enumerate(widths)},
        {w: codes[i] for i, w in enumerate(widths)},
        {w: tuple(counts[i]) for i, w in enumerate(widths)},
    )


def span_sections_c(rows, bases, width: int, table, lay, body: np.ndarray, span: tuple[int, int]):
    """:func:`csf_codec.compact_np.span_sections_np` in one C pass over the span's chunks
    (``native_compact_span.c``): the span's selectors, raw chunks and escaped bytes written into ``body`` where
    ``lay`` (:class:`csf_codec.compact_np.BodyLayout`) puts them; returns (stream start, stream bytes, far start,
    far bytes), the parts a neighbouring span may share a byte of."""
    a, b = span
    sel, raw, esc, (stream_at, stream_len), (far_at, far_bit0, n_far) = lay.span_parts(body, table, width, a, b)
    sl = lay.chunks(a, b)
    stream = np.empty(stream_len, dtype=np.uint8)
    far = np.empty(-(-(far_bit0 + 3 * n_far) // 8), dtype=np.uint8)
    fault = native().encode_compact_span(
        rows,
        np.ascontiguousarray(bases, dtype=np.uint8),
        rows.shape[1],
        width,
        a,
        b,
        np.ascontiguousarray(table.raw[sl]),
        np.ascontiguousarray(table.listed[sl], dtype=np.int64),
        np.ascontiguousarray(table.bit_offsets[sl] - 8 * stream_at, dtype=np.int64),
        np.ascontiguousarray(table.lens[sl], dtype=np.int64),
        sel,
        stream,
        far,
        far_bit0,
        n_far,
        esc,
        raw,
    )
    if fault:
        raise AssertionError(f"encode_compact_span: the rows disagree with the chunk tables (fault {fault})")
    return stream_at, stream, far_at, far
