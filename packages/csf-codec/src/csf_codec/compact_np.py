"""The compact form's CPU encoder and decoder, as whole-array numpy passes over row spans.

Byte-identical to the torch code in :mod:`csf_codec.compact` (which stays the path for other devices);
spans of a multiple of 256 rows split every section on byte and chunk boundaries, so they are encoded
and decoded independently, two at a time (numpy releases the GIL), and memory stays bounded by a span.
"""

from __future__ import annotations

import numpy as np

from .errors import CorruptPayloadError
from .rowbase import row_bases_np
from .swar import group_counts, map_spans, pack_bits, unpack_bits

__all__ = ["base_codes_np", "decode_rows_np", "encode_sections_np", "exclusive_cumsum"]

CHUNK = 256
RAW = 255
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


def _chunk_lengths(scales: int) -> np.ndarray:
    n = -(-scales // CHUNK)
    lens = np.full(n, CHUNK, dtype=np.int64)
    if n:
        lens[-1] = scales - CHUNK * (n - 1)
    return lens


def _outside(x: np.ndarray, base: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    d = (x - base[:, None]).reshape(-1)  # uint8: below the base wraps past the window too
    return d, d >= (1 << width)


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


def _raw_chunks(vals, fields, exceptions, offsets, ids, lens, top: int, name: str) -> None:
    """Copy a span's raw chunks into ``vals`` (which holds base + selector there), checking that they are
    canonical: their selectors are what a listed chunk's would be, and their exceptions fill half or more."""
    n = lens[ids]
    total = int(n.sum())
    within = np.arange(total) - np.repeat(exclusive_cumsum(n), n)
    where = np.repeat(ids * CHUNK, n) + within
    native = exceptions[np.repeat(offsets[ids], n) + within]
    field = fields[where]
    d = native - (vals[where] - field)  # uint8: scale - base
    inside = d <= top
    if (field != np.where(inside, d, 0)).any():
        raise CorruptPayloadError(name, "a raw chunk's selectors differ from the scales it stores")
    outside = np.add.reduceat(~inside, exclusive_cumsum(n)) if total else n
    if (2 * outside < n).any():
        raise CorruptPayloadError(name, "a raw chunk holds few enough exceptions to be listed")
    vals[where] = native


def encode_sections_np(rows: np.ndarray, widths: tuple[int, ...]) -> tuple[int, list[np.ndarray]]:
    """The width and five body sections of the compact form of a uint8 [R, C] plane."""
    r, c = rows.shape
    bases = row_bases_np(rows, widths)  # one pass: the level counts are shared by every width
    codes: dict[int, np.ndarray] = {}
    spans = row_spans(r, c)
    lens = _chunk_lengths(r * c)
    head = 2 * (-(-r // 4)) + lens.size  # base codes and chunk counts: the same for every width

    def size(w: int) -> int:
        def span_bytes(span: tuple[int, int]) -> int:
            a, b = span
            n = group_counts(_outside(rows[a:b], bases[w][a:b], w)[1], CHUNK)
            ln = lens[a * c // CHUNK : a * c // CHUNK + n.size]
            return int(np.where(2 * n >= ln, ln, 2 * n).sum())

        fixed = head - (-(-r // 4)) + int((codes[w] == _ESCAPE).sum()) + -(-(r * c * w) // 8)
        return fixed + sum(map_spans(span_bytes, spans))

    def lower_bound(w: int) -> int:  # every 128-row segment escapes once; exceptions cost >= 0
        return head - (-(-r // 4)) + -(-r // SEGMENT_ROWS) + -(-(r * c * w) // 8)

    best = None
    for w in sorted(widths):
        if best is not None and lower_bound(w) > best[0]:
            continue
        codes[w] = base_codes_np(bases[w])
        n = size(w)
        if best is None or n < best[0]:
            best = (n, w)
    width = best[1]

    def span_sections(span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = span
        x = rows[a:b]
        flat = x.reshape(-1)
        d, outside = _outside(x, bases[width][a:b], width)
        selectors = pack_bits(d == 1 if width == 1 else np.where(outside, np.uint8(0), d), width)
        n = group_counts(outside, CHUNK)
        ln = lens[a * c // CHUNK : a * c // CHUNK + n.size]
        raw = 2 * n >= ln
        chunk_bytes = np.where(raw, ln, 2 * n)
        offsets = exclusive_cumsum(chunk_bytes)
        exc = np.empty(int(chunk_bytes.sum()), dtype=np.uint8)
        idx = np.flatnonzero(outside)
        ch = idx >> 8
        keep = ~raw[ch]
        idx, ch = idx[keep], ch[keep]
        listed = np.where(raw, 0, n)
        rank = np.arange(idx.size) - exclusive_cumsum(listed)[ch]
        exc[offsets[ch] + rank] = idx.astype(np.uint8)  # position within the chunk: the low byte
        exc[offsets[ch] + n[ch] + rank] = flat[idx]
        copy_chunks(exc, offsets, flat, np.flatnonzero(raw), ln, to_chunks=False)
        return selectors, np.where(raw, RAW, n).astype(np.uint8), exc

    parts = map_spans(span_sections, spans)
    escapes = bases[width][codes[width] == _ESCAPE]
    empty = np.zeros(0, dtype=np.uint8)
    cat = [np.concatenate([p[i] for p in parts]) if parts else empty for i in range(3)]
    return width, [pack_bits(codes[width], 2), escapes, *cat]


def decode_rows_np(
    bases: np.ndarray,
    selectors: np.ndarray,
    counts: np.ndarray,
    exceptions: np.ndarray,
    chunk_offsets: np.ndarray,
    rows: int,
    cols: int,
    width: int,
    name: str,
) -> np.ndarray:
    """The flat native plane from validated sections and row bases, checking every exception."""
    total = rows * cols
    out = np.empty(total, dtype=np.uint8)
    lens = _chunk_lengths(total)
    counts = counts.astype(np.int64)
    b8 = bases.astype(np.uint8)
    top = (1 << width) - 1

    def span(s: tuple[int, int]) -> None:
        a, b = s
        lo, hi = a * cols, b * cols
        fields = unpack_bits(selectors[lo * width // 8 : -(-hi * width // 8)], width, hi - lo)
        vals = out[lo:hi]
        np.add(fields.reshape(b - a, cols), b8[a:b, None], out=vals.reshape(b - a, cols))
        c0, c1 = lo // CHUNK, -(-hi // CHUNK)
        n, ln, off = counts[c0:c1], lens[c0:c1], chunk_offsets[c0:c1]
        raw = n == RAW
        listed = np.where(raw, 0, n)
        k = int(listed.sum())
        if k:
            at = np.arange(k)
            pos = exceptions[np.repeat(off - exclusive_cumsum(listed), listed) + at].astype(np.int64)
            val = exceptions[np.repeat(off - exclusive_cumsum(listed) + n, listed) + at]
            if (pos >= np.repeat(ln, listed)).any():
                raise CorruptPayloadError(name, "an exception position lies past the end of its chunk")
            where = np.repeat(np.arange(0, n.size * CHUNK, CHUNK), listed) + pos
            if (where[1:] <= where[:-1]).any():  # positions stay inside their chunks: ascending per chunk
                raise CorruptPayloadError(name, "exception positions are not strictly ascending")
            field = fields[where]
            if field.any():
                raise CorruptPayloadError(name, "an exception's selector is not zero")
            if ((val - vals[where]) <= top).any():  # uint8: vals holds the base there; inside iff v - base <= top
                raise CorruptPayloadError(name, "an exception repeats a value its selector could express")
            vals[where] = val
        ids = np.flatnonzero(raw)
        if ids.size:
            _raw_chunks(vals, fields, exceptions, off, ids, ln, top, name)

    map_spans(span, row_spans(rows, cols))
    return out
