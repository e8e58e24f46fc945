"""The compact form's CPU encoder over row spans, and the exception code's tables shared with the CPU decoder
(:mod:`csf_codec.compact_decode_np`).

Byte-identical to the torch code in :mod:`csf_codec.compact_torch` (which stays the path for other
devices); spans of a multiple of 256 rows split every section on chunk boundaries, so they are encoded
independently, two at a time (the loops release the GIL), and memory stays bounded by a span. Two passes: the
row pass (every width's row bases, base codes and chunk counts) picks the width, and from the chunk table
(:class:`BodyLayout`) each span writes its part of the body in place. Only the exception section's bit streams
(listed streams, far codes) cross spans: the encoder ors the spans' bytes together. The loops run in C
(:mod:`csf_codec.compact_encode_c`); the numpy passes here (:func:`width_stats_np`, :func:`span_sections_np`)
are the reference the tests compare with.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from .compact_code import (
    CHUNK,
    ESCAPE_CODE,
    FAR_BITS,
    LISTED_BITS,
    LOW_BITS,
    MAX_LISTED,
    RAW,
    exact_distances,
    listed_cost_bits,
)
from .compact_encode_c import span_sections_c, width_stats_c
from .rowbase import row_bases_np
from .swar import group_counts, map_spans, pack_bits, scatter_bits

__all__ = [
    "BodyLayout",
    "ChunkTable",
    "base_codes_np",
    "chunk_table",
    "encode_body_np",
    "encode_sections_np",
    "exclusive_cumsum",
]

SEGMENT_ROWS = 128
_SAME, _UP, _DOWN, _ESCAPE = 0, 1, 2, 3
_SCALES_PER_SPAN = 1 << 20


def row_spans(rows: int, cols: int) -> list[tuple[int, int]]:
    step = 256 * max(1, _SCALES_PER_SPAN // (256 * max(cols, 1)))
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.size, dtype=np.int64)
    if x.size > 1:
        np.cumsum(x[:-1], out=out[1:])
    return out


_CODE_OF_STEP = np.array([_DOWN, _SAME, _UP, _ESCAPE], dtype=np.uint8)  # by base step + 1, capped at 3


def base_codes_np(bases: np.ndarray) -> np.ndarray:
    step = np.full(bases.size, 3, dtype=np.uint16)
    step[1:] = np.minimum((bases[1:].astype(np.int16) - bases[:-1] + 1).astype(np.uint16), 3)  # -2 and below wrap
    codes = _CODE_OF_STEP[step]
    codes[::SEGMENT_ROWS] = _ESCAPE
    return codes


def scan_bases_np(codes: np.ndarray, escapes: np.ndarray) -> np.ndarray:
    """Row bases (int32) from 2-bit codes: each row adds its step to the last escaped base above it.

    One running sum of the steps, corrected at each escape by the difference between its stored base
    and the sum reached there; row 0 of every segment escapes, so the escapes are few and every row's
    correction comes from one of them.
    """
    r = codes.size
    if r == 0:
        return np.zeros(0, dtype=np.int32)
    step = (codes == _UP).astype(np.int32)
    step -= codes == _DOWN
    at = np.flatnonzero(codes == _ESCAPE)  # row 0 among them
    reached = np.cumsum(step, dtype=np.int32)[at]
    gap = escapes.astype(np.int32) - reached  # what each escape's run must add to the running sum
    step[at] += np.diff(gap, prepend=0)
    return np.cumsum(step, dtype=np.int32)


def chunk_lengths_np(scales: int) -> np.ndarray:
    n = -(-scales // CHUNK)
    lens = np.full(n, CHUNK, dtype=np.int64)
    if n:
        lens[-1] = scales - CHUNK * (n - 1)
    return lens


def copy_chunks(packed, offsets, flat, ids, lens, *, to_chunks: bool) -> None:
    """Raw chunks ``ids`` between the plane (``flat``, chunk k at k*256) and ``packed`` (at ``offsets``)."""
    full = ids[lens[ids] == CHUNK]
    at = offsets[full][:, None] + np.arange(CHUNK)
    grid = flat[: flat.size // CHUNK * CHUNK].reshape(-1, CHUNK)
    if to_chunks:
        grid[full] = packed[at]
    else:
        packed[at] = grid[full]
    for k in ids[lens[ids] != CHUNK]:  # the plane's last, shorter chunk
        lo, n = int(offsets[k]), int(lens[k])
        if to_chunks:
            flat[k * CHUNK : k * CHUNK + n] = packed[lo : lo + n]
        else:
            packed[lo : lo + n] = flat[k * CHUNK : k * CHUNK + n]


def distances(values: np.ndarray, bases: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(side, distance) of exception bytes from their rows' windows: side 1 above, 0 below."""
    v, b = values.astype(np.int16), bases.astype(np.int16)
    above = v > b
    return above, np.where(above, v - b - ((1 << width) - 1), b - v)


def exception_fields(side: np.ndarray, dist: np.ndarray, width: int) -> np.ndarray:
    """The selector field an exception stores: its side, and its distance up to K + 1."""
    return (side + (np.minimum(dist - 1, exact_distances(width)) << 1)).astype(np.uint8)


def value_classes(dist: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(far, escaped) flags of exceptions by distance."""
    k = exact_distances(width)
    return dist >= k + 2, dist >= k + 2 + ESCAPE_CODE


def raw_chunks(n: np.ndarray, far: np.ndarray, esc: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Which chunks are stored raw: listing them would cost at least their native bytes."""
    return (n > MAX_LISTED) | (listed_cost_bits(np.minimum(n, CHUNK), far, esc) >= 8 * lens)


@dataclass(frozen=True)
class _SpanExceptions:
    """One row span's exceptions at one width: their places and codes, and the span's selector fields."""

    fields: np.ndarray  # uint8 per scale: the offset in the window, 0 at exceptions
    idx: np.ndarray  # span-flat index of each exception, ascending
    side: np.ndarray
    dist: np.ndarray


def _chunk_counts(rows: np.ndarray, bases: np.ndarray, width: int, span: tuple[int, int]):
    """Exceptions, far ones and escaped ones per chunk of rows [a, b): scales more than 0, K + 1 and
    K + 8 below or above their row's window.

    From one pass ``d = x - base`` (mod 256): a scale lies outside the window widened by ``reach`` iff
    ``d + reach`` (mod 256) exceeds ``top + 2 * reach``, for rows whose widened window stays inside the
    byte range; the few rows near either end are recounted with their clipped window."""
    x, base = rows[span[0] : span[1]], bases[span[0] : span[1]]
    d = x - np.repeat(base, x.shape[1]).reshape(x.shape)
    top, k = (1 << width) - 1, exact_distances(width)
    out = []
    for reach in (0, k + 1, k + 1 + ESCAPE_CODE):
        flags = (d + np.uint8(reach)) > np.uint8(top + 2 * reach)
        edge = np.flatnonzero((base < reach) | (base > 255 - top - reach))
        if edge.size:  # outside [lo, hi] iff x - lo wraps past hi - lo
            lo = np.maximum(base[edge].astype(np.int16) - reach, 0)
            hi = np.minimum(base[edge].astype(np.int16) + top + reach, 255)
            flags[edge] = (x[edge] - lo.astype(np.uint8)[:, None]) > (hi - lo).astype(np.uint8)[:, None]
        out.append(group_counts(flags.reshape(-1), CHUNK))
    return tuple(out)


def width_stats_np(rows: np.ndarray, widths: tuple[int, ...], spans):
    """Every width's row bases (uint8 [R]), base codes (uint8 [R]) and per-chunk (exceptions, far, escaped) counts
    ([chunks] each; the C pass gives uint16), by numpy passes: the reference
    :func:`csf_codec.compact_encode_c.width_stats_c` is compared with."""
    bases = row_bases_np(rows, widths)
    codes = {w: base_codes_np(bases[w]) for w in widths}
    counts = {}
    for w in widths:
        per_span = [_chunk_counts(rows, bases[w], w, s) for s in spans] or [(np.zeros(0, np.int64),) * 3]
        counts[w] = tuple(np.concatenate(p) for p in zip(*per_span, strict=True))
    return bases, codes, counts


def _choose_width(r: int, c: int, widths, codes, counts, lens) -> int:
    """The width of the smallest payload (ties: the smaller), from every width's base codes and chunk counts."""
    sections = -(-r // 4) + lens.size  # base codes and chunk counts: the same for every width
    best = None
    for w in sorted(widths):
        n, far, esc = counts[w]
        raw = raw_chunks(n, far, esc, lens)
        listed = ~raw
        bits = int(LISTED_BITS[np.where(raw, 0, n)].sum())
        exc = -(-bits // 8) + int(lens[raw].sum()) + -(-FAR_BITS * int(far[listed].sum()) // 8) + int(esc[listed].sum())
        size = sections + int(np.count_nonzero(codes[w] == _ESCAPE)) + -(-(r * c * w) // 8) + exc
        if best is None or size < best[0]:
            best = (size, w)
    return best[1]


def _span_exceptions(x: np.ndarray, base: np.ndarray, width: int) -> _SpanExceptions:
    c = x.shape[1]
    u = (x - np.repeat(base, c).reshape(x.shape)).reshape(-1)  # below the base wraps past the window
    idx = np.flatnonzero(u >= (1 << width))
    side, dist = distances(x.reshape(-1)[idx], base[idx // c], width)
    u[idx] = 0
    return _SpanExceptions(u, idx, side, dist)


@dataclass(frozen=True)
class ChunkTable:
    """Where each chunk's exceptions lie in the exception section, from the chunk counts alone."""

    raw: np.ndarray  # bool
    lens: np.ndarray  # scales per chunk
    listed: np.ndarray  # exceptions of listed chunks (0 for raw ones)
    bit_offsets: np.ndarray  # listed chunks: their stream's first bit
    raw_offsets: np.ndarray  # raw chunks: their native bytes' first byte
    stream_bits: int  # the listed streams' bits
    stream_bytes: int  # the listed streams, padded to a byte
    raw_end: int  # the raw chunks' native bytes end here (far codes follow)


def chunk_table(counts: np.ndarray, lens: np.ndarray) -> ChunkTable:
    counts = counts.astype(np.int64)
    raw = counts == RAW
    listed = np.where(raw, 0, counts)
    bits = LISTED_BITS[np.minimum(listed, CHUNK)]
    bit_offsets = exclusive_cumsum(bits)
    total = int(bit_offsets[-1] + bits[-1]) if bits.size else 0
    stream_bytes = -(-total // 8)
    raw_lens = np.where(raw, lens, 0)
    raw_offsets = stream_bytes + exclusive_cumsum(raw_lens)
    end = stream_bytes + int(raw_lens.sum())
    return ChunkTable(raw, lens, listed, bit_offsets, raw_offsets, total, stream_bytes, end)


def _listed_fields(ex: _SpanExceptions, keep: np.ndarray, n: np.ndarray, bit0: np.ndarray, width: int):
    """Bit offsets and values of the kept exceptions' position codes and far flags (see compact_code)."""
    idx, dist = ex.idx[keep], ex.dist[keep]
    ch = idx >> 8
    rank = np.arange(idx.size) - exclusive_cumsum(n)[ch]
    pos = idx & (CHUNK - 1)
    cnt = n[ch]
    low = LOW_BITS[cnt]
    o = bit0[ch]
    tail = o + cnt + (CHUNK >> low)
    offsets = np.concatenate([o + (pos >> low) + rank, tail + rank * low, tail + cnt * low + rank])
    far = value_classes(dist, width)[0]
    values = np.concatenate([np.ones(idx.size, np.int64), pos & ((1 << low) - 1), far])
    return offsets, values, far


@dataclass(frozen=True)
class BodyLayout:
    """Where everything lies in the compact body at the chosen width, from the chunk table and counts alone, so that
    each span writes its parts in place: the five sections' starts and sizes, and per chunk how many raw bytes,
    listed far exceptions and listed escaped ones come before it."""

    cols: int
    starts: tuple[int, ...]  # each section's first byte in the body
    sizes: tuple[int, ...]
    raw_before: np.ndarray  # int64 [chunks + 1]
    far_before: np.ndarray
    esc_before: np.ndarray

    @classmethod
    def of(cls, r: int, c: int, width: int, escapes: int, table: ChunkTable, far: np.ndarray, esc: np.ndarray):
        listed = ~table.raw
        raw_before, far_before, esc_before = (
            np.concatenate([np.zeros(1, np.int64), np.cumsum(x, dtype=np.int64)])
            for x in (np.where(table.raw, table.lens, 0), np.where(listed, far, 0), np.where(listed, esc, 0))
        )
        far_bytes = -(-FAR_BITS * int(far_before[-1]) // 8)
        exc = table.raw_end + far_bytes + int(esc_before[-1])
        sizes = (-(-r // 4), escapes, -(-(r * c * width) // 8), table.lens.size, exc)
        starts = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes[:-1])]))
        return cls(c, starts, sizes, raw_before, far_before, esc_before)

    def chunks(self, a: int, b: int) -> slice:
        """The chunks of rows [a, b)."""
        return slice(a * self.cols // CHUNK, -(-b * self.cols // CHUNK))

    def span_parts(self, body: np.ndarray, table: ChunkTable, width: int, a: int, b: int):
        """Rows [a, b)'s views of the body (selectors, raw chunks, escaped bytes), their listed streams' first byte
        and length in bytes, and their far codes' first byte, first bit in it and count."""
        sl = self.chunks(a, b)
        c0, c1 = sl.start, sl.stop
        sel_at = self.starts[2] + a * self.cols * width // 8
        sel = body[sel_at : self.starts[2] + -(-b * self.cols * width // 8)]
        exc = self.starts[4]
        raw = body[exc + table.stream_bytes + self.raw_before[c0] : exc + table.stream_bytes + self.raw_before[c1]]
        esc_at = exc + table.raw_end + -(-FAR_BITS * int(self.far_before[-1]) // 8)
        esc = body[esc_at + self.esc_before[c0] : esc_at + self.esc_before[c1]]
        start = int(table.bit_offsets[c0]) >> 3 if c1 > c0 else 0
        end = table.stream_bits if c1 >= table.lens.size else int(table.bit_offsets[c1])
        far0 = FAR_BITS * int(self.far_before[c0])
        return (
            sel,
            raw,
            esc,
            (start, max(-(-end // 8) - start, 0)),
            (far0 >> 3, far0 & 7, int(self.far_before[c1] - self.far_before[c0])),
        )


def span_sections_np(rows, bases, width: int, table: ChunkTable, lay: BodyLayout, body: np.ndarray, span):
    """A span's part of the body at one width, by numpy passes (the reference
    :func:`csf_codec.compact_encode_c.span_sections_c` is compared with): its packed selectors, raw chunks' bytes and
    listed escaped bytes written into ``body`` where ``lay`` puts them; returns its listed streams' first byte and
    bytes, and its far codes' first byte and bytes (from the bit the layout gives), which neighbouring spans may
    share a byte of."""
    a, b = span
    sel, raw_view, esc_view, (start, stream_len), (far_at, far_bit0, _) = lay.span_parts(body, table, width, a, b)
    k = exact_distances(width)
    x = rows[a:b]
    flat = x.reshape(-1)
    base = bases[a:b]
    ex = _span_exceptions(x, base, width)
    fields = ex.fields
    fields[ex.idx] = exception_fields(ex.side, ex.dist, width)
    sel[:] = pack_bits(fields, width)
    sl = lay.chunks(a, b)
    span_raw = table.raw[sl]
    keep = ~span_raw[ex.idx >> 8]
    bit0 = table.bit_offsets[sl]
    offsets, values, far_l = _listed_fields(ex, keep, table.listed[sl], bit0 - 8 * start, width)
    stream = scatter_bits(stream_len, offsets, values)
    dist = ex.dist[keep][far_l]
    far_codes = np.minimum(dist - (k + 2), ESCAPE_CODE)
    far = scatter_bits(
        -(-(far_bit0 + FAR_BITS * far_codes.size) // 8), far_bit0 + FAR_BITS * np.arange(far_codes.size), far_codes
    )
    esc_view[:] = flat[ex.idx[keep][far_l][far_codes == ESCAPE_CODE]]
    copy_chunks(
        raw_view,
        exclusive_cumsum(np.where(span_raw, table.lens[sl], 0)),
        flat,
        np.flatnonzero(span_raw),
        table.lens[sl],
        to_chunks=False,
    )
    return start, stream, far_at, far


WIDTH_STATS = width_stats_c  # the encoder's; the tests set width_stats_np here to compare payloads
SPAN_SECTIONS = span_sections_c  # the encoder's; the tests set span_sections_np here to compare payloads


def encode_body_np(rows: np.ndarray, widths: tuple[int, ...], head: int = 0) -> tuple[int, tuple[int, ...], np.ndarray]:
    """The width, five section sizes and body of the compact form of a uint8 [R, C] plane, the body written in
    place after ``head`` unwritten bytes of the array returned (an envelope's header goes there)."""
    r, c = rows.shape
    spans = row_spans(r, c)
    lens = chunk_lengths_np(r * c)
    bases, codes, counts = WIDTH_STATS(rows, widths, spans)  # one pass over the rows for every width
    width = _choose_width(r, c, widths, codes, counts, lens)
    n, far, esc = counts[width]
    raw = raw_chunks(n, far, esc, lens)
    chunk_counts = np.where(raw, RAW, n).astype(np.uint8)
    table = chunk_table(chunk_counts, lens)
    escapes = bases[width][codes[width] == _ESCAPE]
    lay = BodyLayout.of(r, c, width, escapes.size, table, far, esc)
    payload = np.empty(head + sum(lay.sizes), dtype=np.uint8)
    body = payload[head:]
    s = lay.starts
    body[s[0] : s[1]] = pack_bits(codes[width], 2)
    body[s[1] : s[2]] = escapes
    body[s[3] : s[4]] = chunk_counts
    streams = body[s[4] : s[4] + table.stream_bytes]
    streams[:] = 0
    far_section = body[s[4] + table.raw_end : s[4] + table.raw_end + -(-FAR_BITS * int(lay.far_before[-1]) // 8)]
    far_section[:] = 0
    for start, stream, far_at, far_bytes in map_spans(
        partial(SPAN_SECTIONS, rows, bases[width], width, table, lay, body), spans
    ):
        streams[start : start + stream.size] |= stream  # neighbouring spans may share a byte: or them in
        far_section[far_at : far_at + far_bytes.size] |= far_bytes
    return width, lay.sizes, payload


def encode_sections_np(rows: np.ndarray, widths: tuple[int, ...]) -> tuple[int, list[np.ndarray]]:
    """The width and five body sections (views of one body) of the compact form of a uint8 [R, C] plane."""
    width, sizes, body = encode_body_np(rows, widths)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return width, [body[bounds[i] : bounds[i + 1]] for i in range(5)]
