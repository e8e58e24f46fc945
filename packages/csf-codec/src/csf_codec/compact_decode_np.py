"""The compact form's CPU decoder: numpy passes over row spans, each span decoded on its own.

A span's chunks have their position codes in the span's own bytes of the stream (the chunk counts say
where, :class:`csf_codec.compact_np.ChunkTable`). The far codes and escaped bytes are shared by the
plane, so a first pass counts each chunk's far flags (one popcount of the stream masked to them, no
per-exception work); then every span decodes its selectors, positions and exception values
independently, two at a time, with memory bounded by a span, and is final when it returns.

Per exception the decoder makes a small, fixed number of array passes: the unary buckets' ones are
found in the stream masked to the buckets (a byte mask built per chunk, not per bit), each position's
low part is read from one 16-bit window, and only the far flags that are set are located.
"""

from __future__ import annotations

import numpy as np

from .compact_code import CHUNK, ESCAPE_CODE, FAR_BITS, LOW_BITS, exact_distances
from .compact_np import ChunkTable, distances, exception_fields, exclusive_cumsum, raw_chunks, row_spans, value_classes
from .errors import CorruptPayloadError
from .swar import POPCOUNT, gather_bits, map_spans, range_mask, set_bits, unpack_bits

__all__ = ["decode_rows_np"]


def _value_shift(width: int) -> np.ndarray:
    """int16 by selector field: an exception's value minus (its base + its field), for a near exception
    (far flag 0): side 1 lies ``top + 1 + step`` above the base, side 0 ``1 + step`` below it."""
    f = np.arange(1 << width, dtype=np.int16)
    side, step = f & 1, f >> 1
    return np.where(side == 1, (1 << width) + step, -1 - step) - f


_VALUE_SHIFT = {w: _value_shift(w) for w in (1, 2, 4)}


class _SpanCodes:
    """The listed chunks of chunk range [c0, c1) that hold exceptions, their bits in span-local terms."""

    def __init__(self, stream: np.ndarray, table: ChunkTable, c0: int, c1: int):
        n = table.listed[c0:c1]
        self.has = np.flatnonzero(n)
        self.cnt = n[self.has]
        if not self.has.size:
            return
        self.low = LOW_BITS[self.cnt]
        start = table.bit_offsets[c0:c1][self.has]
        first = int(start[0]) >> 3
        self.start = start - 8 * first
        self.tail = self.start + self.cnt + (CHUNK >> self.low)  # each chunk's unary buckets end here
        self.flags = self.tail + self.cnt * self.low  # and its far flags start here
        end = int(self.flags[-1] + self.cnt[-1])
        self.first = first
        self.bytes = stream[first : first - (-end // 8)]

    def unary_mask(self) -> np.ndarray:
        return range_mask(self.start, self.tail, self.bytes.size)


def _positions(span: _SpanCodes, far_flags: np.ndarray, lens: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(span-flat index of every exception, ascending; the indices into it of the far ones), from the
    span's codes and the plane's stream masked to its far flags."""
    cnt, low = span.cnt, span.low
    ones = np.flatnonzero(np.unpackbits(span.bytes & span.unary_mask(), bitorder="little").view(bool))
    before = np.cumsum(cnt) - cnt  # exceptions of the span before each chunk
    # the ones are sorted and the buckets disjoint: when there are as many as the counts and each chunk's
    # first and last (by rank) lie in its buckets, every chunk's buckets hold exactly its count
    last = before + cnt - 1
    if ones.size != last[-1] + 1 or (ones[before] < span.start).any() or (ones[last] >= span.tail).any():
        raise CorruptPayloadError(name, "a chunk's position code does not hold its count of exceptions")
    which = np.repeat(np.arange(cnt.size), cnt)
    rank = np.arange(ones.size)
    lw = low[which]
    high = ones - rank - (span.start - before)[which]  # ones before it in its chunk's buckets: its zeros
    at = (span.tail - low * before)[which] + lw * rank  # its low part's first bit
    padded = np.concatenate([span.bytes, np.zeros(1, dtype=np.uint8)])
    window = padded[:-1].astype(np.uint16) | (padded[1:].astype(np.uint16) << 8)
    pos = (high << lw) | ((window[at >> 3] >> (at & 7)) & ((1 << lw) - 1))
    # strictly ascending overall and each chunk's last inside the chunk: then every position is in order
    if (pos[last] >= lens[span.has]).any():
        raise CorruptPayloadError(name, "an exception position lies past the end of its chunk")
    idx = (span.has * CHUNK)[which] + pos
    if (idx[1:] <= idx[:-1]).any():
        raise CorruptPayloadError(name, "exception positions are not strictly ascending")
    flags = set_bits(far_flags[span.first : span.first + span.bytes.size])  # far flags are rare
    flags = flags[flags >= span.start[0]]  # the first byte may end the previous span's last chunk
    chunk = np.searchsorted(span.flags, flags, side="right") - 1
    return idx, before[chunk] + flags - span.flags[chunk]


def _near_values(fields, vals, far, width: int, name: str) -> np.ndarray:
    """Exception bytes as if none were far, from their selector fields and the decoded ``base + field``
    there; the far ones (indices ``far``) must be open. A far exception lies beyond its near value, so a
    near value outside the byte range is an error either way."""
    if far.size and ((fields[far] >> 1) != exact_distances(width)).any():
        raise CorruptPayloadError(name, "an exception placed by its selector is flagged far")
    value = vals.astype(np.int16) + _VALUE_SHIFT[width][fields]
    if (value & ~0xFF).any():
        raise CorruptPayloadError(name, "an exception's value leaves the byte range")
    return value.astype(np.uint8)


def _far_values(near, above, codes, escaped, width: int, name: str) -> np.ndarray:
    """Far exceptions' bytes from their near values, sides (``above``), far codes and escaped bytes."""
    value = near.astype(np.int16) + np.where(above, 1, -1).astype(np.int16) * (1 + codes).astype(np.int16)
    esc = codes == ESCAPE_CODE
    if esc.any():  # a far exception is open: its near value lies K + 1 beyond its window
        k, near16 = exact_distances(width), near[esc].astype(np.int16)
        base = np.where(above[esc], near16 - (1 << width) - k, near16 + 1 + k)
        side, dist = distances(escaped, base, width)
        if (side != above[esc]).any() or (dist < k + 2 + ESCAPE_CODE).any():
            raise CorruptPayloadError(name, "an escaped exception byte lies within reach of its far code")
        value[esc] = escaped
    if (value & ~0xFF).any():
        raise CorruptPayloadError(name, "an exception's value leaves the byte range")
    return value.astype(np.uint8)


def _check_raw(native, fields, base, lens_raw, width: int, name: str) -> None:
    """A raw chunk is canonical: its selectors are the fields its native bytes give, and its exceptions
    would not list in fewer bits than the native bytes."""
    u = native - base
    outside = u >= (1 << width)
    side, dist = distances(native[outside], base[outside], width)
    want = np.where(outside, np.uint8(0), u)
    want[outside] = exception_fields(side, dist, width)
    if (fields != want).any():
        raise CorruptPayloadError(name, "a raw chunk's selectors differ from the scales it stores")
    chunk = np.repeat(np.arange(lens_raw.size), lens_raw)
    far, esc = value_classes(dist, width)
    n = np.bincount(chunk[outside], minlength=lens_raw.size)
    nf = np.bincount(chunk[outside][far], minlength=lens_raw.size)
    ne = np.bincount(chunk[outside][esc], minlength=lens_raw.size)
    if (~raw_chunks(n, nf, ne, lens_raw)).any():
        raise CorruptPayloadError(name, "a raw chunk holds few enough exceptions to be listed")


def _patch_raw(vals, fields, exceptions, table: ChunkTable, c0: int, c1: int, width: int, name: str) -> None:
    ids = np.flatnonzero(table.raw[c0:c1])
    if not ids.size:
        return
    n = table.lens[c0:c1][ids]
    within = np.arange(int(n.sum())) - np.repeat(exclusive_cumsum(n), n)
    at = np.repeat(ids * CHUNK, n) + within
    native = exceptions[np.repeat(table.raw_offsets[c0:c1][ids], n) + within]
    field = fields[at]
    _check_raw(native, field, vals[at] - field, n, width, name)
    vals[at] = native


def _far_flags(stream: np.ndarray, table: ChunkTable) -> tuple[np.ndarray, np.ndarray]:
    """The stream masked to the far flags, and int64 [chunks + 1]: the flags set in the chunks before each
    chunk (the last: all of them), one popcount of the masked stream; no byte holds two chunks' flags. Built
    :data:`_FLAG_CHUNKS` listed chunks at a time, so that the per-chunk temporaries stay small beside the plane."""
    listed = table.listed
    has = np.flatnonzero(listed)
    per_chunk = np.zeros(listed.size, dtype=np.int64)
    masked = np.zeros(stream.size, dtype=np.uint8)
    for a in range(0, has.size, _FLAG_CHUNKS):
        ids = has[a : a + _FLAG_CHUNKS]
        cnt = listed[ids]
        low = LOW_BITS[cnt]
        flags = table.bit_offsets[ids] + cnt + (CHUNK >> low) + cnt * low
        first, end = int(flags[0]) >> 3, -(-int(flags[-1] + cnt[-1]) // 8)  # the bytes these flags take
        base = 8 * first
        part = stream[first:end] & range_mask(flags - base, flags + cnt - base, end - first)
        masked[first:end] = part
        per_chunk[ids] = np.add.reduceat(POPCOUNT[part], (flags >> 3) - first, dtype=np.uint16)  # <= 256 a chunk
    return masked, np.concatenate([[0], np.cumsum(per_chunk)])


_FLAG_CHUNKS = 1 << 13


def decode_rows_np(
    bases, selectors, table: ChunkTable, exceptions, rows: int, cols: int, width: int, name: str, hasher=None
):
    """The flat native plane from structurally validated sections and row bases, checking every exception.

    ``hasher`` (a hashlib object), when given, is fed the plane's bytes in order, each span as soon as it
    is final, so the digest is computed while later spans are decoded."""
    out = np.empty(rows * cols, dtype=np.uint8)
    b8 = bases.astype(np.uint8)
    spans = row_spans(rows, cols)
    stream = exceptions[: table.stream_bytes]
    if table.stream_bits % 8 and stream[-1] >> (table.stream_bits % 8):
        raise CorruptPayloadError(name, "the padding after the position codes is not zero")
    far_flags, far_before = _far_flags(stream, table)
    n_far = int(far_before[-1])
    far_end = table.raw_end + -(-FAR_BITS * n_far // 8)
    if far_end > exceptions.size:
        raise CorruptPayloadError(name, f"exception section holds {exceptions.size} bytes, its codes need {far_end}")
    far_stream = exceptions[table.raw_end : far_end]
    if (FAR_BITS * n_far) % 8 and far_stream[-1] >> ((FAR_BITS * n_far) % 8):
        raise CorruptPayloadError(name, "the padding after the far codes is not zero")
    codes = gather_bits(far_stream, FAR_BITS * np.arange(n_far), FAR_BITS)
    is_esc = codes == ESCAPE_CODE
    need = far_end + int(is_esc.sum())
    if need != exceptions.size:
        raise CorruptPayloadError(name, f"exception section holds {exceptions.size} bytes, its codes need {need}")
    escaped = exceptions[far_end:]
    esc_before = np.concatenate([[0], np.cumsum(is_esc)])

    def span(s: tuple[int, int]) -> tuple[int, int]:
        a, b = s
        lo, hi = a * cols, b * cols  # lo is chunk c0's first scale: spans are whole 256-row blocks
        c0, c1 = lo // CHUNK, -(-hi // CHUNK)
        fields = unpack_bits(selectors[lo * width // 8 : -(-hi * width // 8)], width, hi - lo)
        vals = out[lo:hi]
        np.add(fields, np.repeat(b8[a:b], cols), out=vals)
        codes_of = _SpanCodes(stream, table, c0, c1)
        if codes_of.has.size:
            idx, far = _positions(codes_of, far_flags, table.lens[c0:c1], name)
            field = fields[idx]
            vals[idx] = _near_values(field, vals[idx], far, width, name)
            if far.size:
                f0, f1 = far_before[c0], far_before[c1]
                at = idx[far]
                side = (field[far] & 1) == 1
                esc = escaped[esc_before[f0] : esc_before[f1]]
                vals[at] = _far_values(vals[at], side, codes[f0:f1], esc, width, name)
        _patch_raw(vals, fields, exceptions, table, c0, c1, width, name)
        return lo, hi

    map_spans(span, spans, None if hasher is None else lambda done: hasher.update(out[done[0] : done[1]]))
    return out
