"""The inline form's CPU encoder and decoder, as whole-array numpy passes over spans of row blocks.

Byte-identical to the torch code in :mod:`csf_codec.inline` (the path for other devices). A tile's
bytes are gathered in slot order once, four columns at a time as uint32 words. Window choice needs,
per tile and candidate window, the exceptions it leaves: they come from a few level counts of the
biased offset ``e = scale - base + 8`` (``le[k]`` = positions with ``e <= k``), since every candidate
window ``[o, o + 2**w - 1]`` holds ``le[o + 2**w + 7] - le[o + 7]`` positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import CorruptPayloadError
from .record_layout import MAX_EXCEPTIONS
from .swar import group_counts, map_spans, pack_bits, unpack_bits
from .tile_layout import TILE_COLS, TILE_ROWS, slot_to_row

__all__ = ["ClassPlan", "decode_class_np", "encode_class_np"]

_BIAS = 8
_FAR = 255  # biased offset of padding slots and of offsets outside [-8, 246]: inside no window
_HEADER = 4
_EXCEPTION = 3
_MODE_RAW = 3
_WIDTH_MODE = {1: 0, 2: 1, 4: 2}
_MODE_WIDTH = {0: 1, 1: 2, 2: 4}
_SCALES_PER_SPAN = 1 << 20
# the encoder's spans are larger: each is a few hundred small-array passes, and two threads share the GIL
# between them; its span temporaries are a few bytes a scale
_ENCODE_SCALES = 1 << 21
_TRUST = 28  # e is exact below _TRUST + _BIAS


@dataclass(frozen=True)
class ClassPlan:
    """One column class (full 4-column tiles, or the tail tile) of a plane."""

    start: int  # first column
    count: int  # tiles per row block
    cols: int  # tc


def block_spans(row_blocks: int, cols: int, group: int = 1, scales: int = 0) -> list[tuple[int, int]]:
    """Spans of about ``scales`` (default :data:`_SCALES_PER_SPAN`) scales, each a whole number of ``group``
    blocks (a row group's)."""
    step = max(1, (scales or _SCALES_PER_SPAN) // (TILE_ROWS * max(cols, 1)) // group) * group
    return [(a, min(a + step, row_blocks)) for a in range(0, row_blocks, step)]


_SLOT_ROWS = np.array([slot_to_row(s) for s in range(TILE_ROWS)], dtype=np.int64)
# slot = 32 warp + 4 quad + 2 half + pair and row = 64 half + 16 warp + 8 pair + quad: slot order is an axis
# permutation of the rows, so the decoders write tiles back to rows by one strided copy, with no index array
# (the same copy the other way is slower than a take and a transpose: its inner loops are two elements long)
_SLOT_AXES, _ROW_AXES = (4, 8, 2, 2), (2, 4, 2, 8)  # (warp, quad, half, pair), (half, warp, pair, quad)
_TO_ROWS = (0, 4, 2, 5, 3, 1, 6)  # [block, tile, warp, quad, half, pair, x] -> [block, half, warp, pair, quad, tile, x]
assert np.array_equal(np.arange(TILE_ROWS).reshape(_ROW_AXES).transpose(1, 3, 0, 2).reshape(-1), _SLOT_ROWS), (
    "slot order is not the axis permutation the tile copies assume"
)


_WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32}  # a tile row of tc columns as one element


def _words(cols: np.ndarray, plan: ClassPlan) -> np.ndarray:
    """A class's columns with a tile row's ``tc`` bytes as one element (uint32 for four columns, uint16
    for a two-column tail), so that transposes move whole tile rows rather than bytes; a view whenever
    the last axis is contiguous."""
    if plan.cols in _WORD and cols.strides[1] == 1:
        return cols.view(_WORD[plan.cols])
    return cols[..., None]


def group_blocks(br: np.ndarray) -> int:
    """Blocks per row group of a plane whose groups end in a partial block (the first group's), else 1."""
    partial = np.flatnonzero(br[:, -1] < 0)
    return int(partial[0]) + 1 if partial.size else 1


def _span_groups(br: np.ndarray) -> tuple[int, int, int] | None:
    """(first row, row groups, rows per group) when the span's blocks are whole row groups of consecutive rows,
    each group's padding (if any) in its last block: then tiles and rows convert by strided copies. Else None.
    ``br`` is a span of a geometry's block rows; each block's first row, the first block's slot order and the
    padding count are checked (no array the size of ``br`` is built: this runs once a span and class)."""
    nb = br.shape[0]
    first = int(br[0, 0]) if br.size else -1
    if first < 0:
        return None
    pad = br[:, -1] < 0
    bpg = int(np.argmax(pad)) + 1 if pad.any() else nb  # no padding: the span is one group
    if nb % bpg:
        return None
    last = br[bpg - 1]
    rg = (bpg - 1) * TILE_ROWS + int((last >= 0).sum())
    groups = nb // bpg
    starts = first + rg * (np.arange(nb) // bpg) + TILE_ROWS * (np.arange(nb) % bpg)
    ok = np.array_equal(br[:, 0], starts) and np.array_equal(
        br[0], first + np.where(_SLOT_ROWS < rg, _SLOT_ROWS, -1 - first)
    )
    ok = ok and int((br < 0).sum()) == groups * (bpg * TILE_ROWS - rg)
    return (first, groups, rg) if ok else None


def _gather_tiles(rows: np.ndarray, br: np.ndarray, plan: ClassPlan) -> np.ndarray:
    """Native bytes [blocks * count, 128 * tc] of one class, slot * tc + column order; padding reads 0."""
    nb = br.shape[0]
    layout = _span_groups(br)
    if layout is not None and layout[1] * layout[2] == nb * TILE_ROWS:  # no padding: transposes, no gather
        first = layout[0]
        cols = rows[first : first + nb * TILE_ROWS, plan.start : plan.start + plan.count * plan.cols]
        # tile rows to the last axis but one (long inner copies), then into slot order along it
        unit = _words(cols, plan).reshape(nb, TILE_ROWS, plan.count, -1)
        tiles = np.take(np.ascontiguousarray(unit.transpose(0, 2, 1, 3)), _SLOT_ROWS, axis=2)
        return tiles.view(np.uint8).reshape(nb * plan.count, TILE_ROWS * plan.cols)
    real = br >= 0
    first, last = int(br[real].min()), int(br[real].max())  # a span's blocks cover consecutive rows
    idx = np.where(real, br - first, 0).reshape(-1)
    cols = rows[first : last + 1, plan.start : plan.start + plan.count * plan.cols]
    if plan.cols == TILE_COLS:
        words = np.ascontiguousarray(cols).view(np.uint32)[idx]  # a row's four columns per word
        if not real.all():
            words[~real.reshape(-1)] = 0
        tiles = words.reshape(nb, TILE_ROWS, plan.count).transpose(0, 2, 1)
        return np.ascontiguousarray(tiles).view(np.uint8).reshape(nb * plan.count, -1)
    picked = cols[idx]
    if not real.all():
        picked[~real.reshape(-1)] = 0
    return picked.reshape(nb, TILE_ROWS * plan.cols)


def _biased(tiles: np.ndarray, base: np.ndarray, valid: np.ndarray, plan: ClassPlan) -> np.ndarray:
    """e = scale - base + 8 as uint8, exact for offsets in [-8, 27] (every candidate window lies there);
    other offsets read 36 or more, padding reads 255.

    The uint8 wrap can only bring offsets of 248 and more (rows based below 8) or of -229 and less (rows
    based above 227) into that range; in blocks holding such rows those positions are set to 255.
    """
    nb = base.shape[0]
    size = TILE_ROWS * plan.cols
    t = tiles.reshape(nb, plan.count, size)
    # padding slots read 0: a base of 9 there makes their e 0 - 9 + 8, which wraps to 255 in the same pass
    slot = np.where(valid, base, _BIAS + 1).astype(np.uint8)
    b = np.repeat(slot, plan.cols, axis=1)[:, None, :]  # [nb, 1, 128 tc]: contiguous rows
    e = t - b
    e += np.uint8(_BIAS)
    fix = np.flatnonzero((valid & ((base < _BIAS) | (base > 255 - _TRUST))).any(axis=1))
    if fix.size:  # a true offset in [-8, 27] has e < 8 exactly when the scale lies below its base
        ef, tf, bf = e[fix], t[fix], b[fix]
        e[fix] = np.where((ef < _TRUST + _BIAS) & ((ef < _BIAS) != (tf < bf)), np.uint8(_FAR), ef)
    return e.reshape(tiles.shape)


def _levels(windows) -> list[int]:
    return sorted({o + _BIAS - 1 for _, o in windows} | {o + (1 << w) - 1 + _BIAS for w, o in windows})


def _valid_positions(valid: np.ndarray, plan: ClassPlan) -> np.ndarray:
    """bool [blocks * count, 128 * tc]: which positions of each tile hold a real row."""
    v = np.repeat(valid, plan.cols, axis=1)
    return np.repeat(v, plan.count, axis=0)


def _span_offsets(rows, br, base, valid, plan: ClassPlan) -> tuple[np.ndarray, np.ndarray]:
    """A span's tiles of one class and their biased offsets (:func:`_biased`)."""
    tiles = _gather_tiles(rows, br, plan)
    return tiles, _biased(tiles, base, valid, plan)


def _level_counts_np(e: np.ndarray, size: int, levels: list[int]) -> dict[int, np.ndarray]:
    """Each tile's (``size`` bytes of ``e``) bytes at or below each level (int64 [T] a level), by one
    compare-and-count pass a level: the reference :func:`_level_counts_c` is compared with."""
    flags = np.empty(e.size, dtype=bool)  # one buffer for every level: no fresh pages a level
    le = {}
    for k in levels:
        np.less_equal(e.reshape(-1), k, out=flags)
        le[k] = group_counts(flags, size)
    return le


def _level_counts_c(e: np.ndarray, size: int, levels: list[int]) -> dict[int, np.ndarray]:
    """:func:`_level_counts_np` in one C pass over the tiles (a histogram of each), the GIL released."""
    from .native import native

    out = np.empty((len(levels), e.size // size), dtype=np.int64)
    native().level_counts(np.ascontiguousarray(e).reshape(-1), size, np.array(levels, dtype=np.int64), out)
    return dict(zip(levels, out, strict=True))


LEVEL_COUNTS = _level_counts_c  # the encoder's; the tests set _level_counts_np here to compare payloads


def _window_counts(e: np.ndarray, base, valid, plan: ClassPlan, windows):
    """:func:`window_stats` from a span's biased offsets."""
    size = TILE_ROWS * plan.cols
    le = LEVEL_COUNTS(e, size, _levels(windows))
    nvalid = np.repeat(valid.sum(axis=1) * plan.cols, plan.count)
    b = base.astype(np.int32)
    bmin = np.where(valid, b, 1 << 20).min(axis=1)
    bmax = np.where(valid, b, -(1 << 20)).max(axis=1)
    n, legal = [], []
    for w, o in windows:
        inside = le[o + (1 << w) - 1 + _BIAS] - le[o + _BIAS - 1]
        n.append((nvalid - inside).astype(np.int32))
        ok = ((bmin + o >= 0) & (bmax + o + (1 << w) - 1 <= 255)) | ~valid.any(axis=1)
        legal.append(np.repeat(ok, plan.count))
    return np.stack(n), np.stack(legal)


def window_stats(rows, br, base, valid, plan: ClassPlan, windows):
    """Per window and tile of a span of one class: the exceptions it leaves (int32 [K, T]) and whether it
    stays in the byte range for every real row (bool [K, T])."""
    _, e = _span_offsets(rows, br, base, valid, plan)
    return _window_counts(e, base, valid, plan, windows)


def _raw_count(n: np.ndarray, legal: np.ndarray, caps: np.ndarray) -> int:
    return int((~(legal & (n <= caps[:, None])).any(axis=0)).sum())


def choose(n: np.ndarray, legal: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each tile's window (fewest exceptions that fit, then list order) and which tiles go raw."""
    k = n.shape[0]
    fits = legal & (n <= caps[:, None])
    key = np.where(fits, n.astype(np.int64) * k + np.arange(k)[:, None], 1 << 40)
    return key.argmin(axis=0), ~fits.any(axis=0)


def build_records(rows, br, base, valid, plan: ClassPlan, best, raw, s: int, windows, caps, raw_start: int, span=None):
    """The S-byte records of a span's tiles of one class, and its raw tiles. ``span``: the span's (tiles,
    offsets) when the caller holds them (its offsets are overwritten); else they are gathered again (a plane's
    offsets are not kept).

    Every tile's fields and exceptions come from whole-span passes with the tile's window as a per-tile
    operand; only the packing is split, by selector width."""
    size = TILE_ROWS * plan.cols
    tiles, e = span if span is not None else _span_offsets(rows, br, base, valid, plan)
    k = np.array([_WIDTH_MODE[w] for w, _ in windows], dtype=np.uint32)[best]  # a tile's mode
    width = np.left_shift(1, k).astype(np.int64)  # modes 0, 1, 2 are widths 1, 2, 4
    low = np.array([o + _BIAS for _, o in windows], dtype=np.uint8)[best]
    top = np.where(raw, 255, (1 << width) - 1).astype(np.uint8)  # raw tiles: no position lies outside
    f = np.subtract(e, low[:, None], out=e)  # the field, where it lies inside the window
    outside = f > top[:, None]
    np.multiply(f, ~outside, out=f)  # outside fields are 0
    pad = np.flatnonzero(~valid.all(axis=1))
    if pad.size:  # padding positions hold no exceptions; only blocks with padding are read again
        blocks = outside.reshape(valid.shape[0], plan.count, size)
        blocks[pad] &= np.repeat(valid[pad], plan.cols, axis=1)[:, None, :]
    records = np.zeros((e.shape[0], s), dtype=np.uint8)
    _pack_selectors(records, f, width, raw)
    nk = _place_exceptions(records, tiles, outside, width * (size // 8), caps[best])
    header = k | (nk.astype(np.uint32) << 2) | ((low.astype(np.uint32) - _BIAS) & 0xFF) << 8
    records[:, s - _HEADER :] = header.astype("<u4").view(np.uint8).reshape(-1, _HEADER)
    _raw_headers(records, raw, raw_start)
    return records, tiles[np.flatnonzero(raw)]


def _pack_selectors(records: np.ndarray, fields: np.ndarray, width: np.ndarray, raw: np.ndarray) -> None:
    """Pack each selector tile's fields (uint8 [T, 128 tc]) at the start of its record, one call a width."""
    size = fields.shape[1]
    for w in (1, 2, 4):
        pick = (width == w) & ~raw
        sb = size * w // 8
        if pick.all():  # one width for every tile (the common case): no gather
            records[:, :sb] = pack_bits(fields.reshape(-1), w).reshape(-1, sb)
        elif pick.any():
            sel = np.flatnonzero(pick)
            records[sel, :sb] = pack_bits(fields[sel].reshape(-1), w).reshape(sel.size, sb)


def _place_exceptions(records: np.ndarray, tiles: np.ndarray, outside: np.ndarray, sb: np.ndarray, cap) -> np.ndarray:
    """Write the ``outside`` positions of every tile (u16, ascending) and their bytes after its ``sb`` selector
    bytes, in slots of its capacity ``cap``; returns each tile's count."""
    s, size = records.shape[1], tiles.shape[1]
    flat, pos16 = records.reshape(-1), records.reshape(-1).view("<u2")  # S and the selector bytes are even
    idx = np.flatnonzero(outside)
    t, p = np.divmod(idx, size)
    nk = np.bincount(t, minlength=records.shape[0])
    rank = np.arange(idx.size) - (np.cumsum(nk) - nk)[t]
    after = t * s + sb[t]  # each exception's record, at its first byte after the selectors
    pos16[after // 2 + rank] = p
    flat[after + 2 * cap[t] + rank] = tiles.reshape(-1)[idx]
    return nk


def _raw_headers(records: np.ndarray, raw: np.ndarray, start: int) -> None:
    """Write the ``raw`` tiles' headers: mode raw and their raw tiles' indices, counted from ``start``."""
    ids = np.flatnonzero(raw)
    header = _MODE_RAW | ((start + np.arange(ids.size, dtype=np.uint32)) << 2)
    records[ids, -_HEADER:] = header.astype("<u4").view(np.uint8).reshape(-1, _HEADER)


def _encode_spans(br: np.ndarray, plan: ClassPlan) -> list[tuple[int, int]]:
    """The encoder's spans: a first one a quarter of the others' size, since it runs alone (it picks the record
    size the others are built for), then spans of :data:`_ENCODE_SCALES`."""
    cols, group = plan.count * plan.cols, group_blocks(br)
    head = block_spans(br.shape[0], cols, group, max(1, _ENCODE_SCALES // 4))[0][1]
    rest = block_spans(br.shape[0] - head, cols, group, _ENCODE_SCALES)
    return [(0, head)] + [(a + head, b + head) for a, b in rest]


def encode_class_np(rows, br, base, valid, plan: ClassPlan, windows, sizes, capacity):
    """(S, records [T, S], raw tiles) of one column class: S from ``sizes`` with the smallest total.

    The record size is a plane-wide choice, but each tile's window given S is its own. So each span's records
    are built in the pass that counts its windows, for the size the first span alone would choose (the span
    is encoded before the others to learn it), from tiles and offsets already at hand; only when the whole
    class chooses another size are the spans gathered and built again."""
    spans = _encode_spans(br, plan)
    size = TILE_ROWS * plan.cols

    def caps(s: int) -> np.ndarray:
        return np.array([capacity(w, s, plan.cols) for w, _ in windows], dtype=np.int64)

    def totals(n: np.ndarray, legal: np.ndarray) -> np.ndarray:
        """Bytes of a span's tiles for each record size (records, and raw tiles): they add up over spans."""
        return np.array([n.shape[1] * s + _raw_count(n, legal, caps(s)) * size for s in sizes])

    def pick(total: np.ndarray) -> int:
        return min(zip(total.tolist(), sizes, strict=True))[1]  # the fewest bytes, then the smallest size

    def first(i: int, guess: int | None):
        a, b = spans[i]
        part = (rows, br[a:b], base[a:b], valid[a:b], plan)
        tiles, e = _span_offsets(*part)
        n, legal = _window_counts(e, *part[2:], windows)
        total = totals(n, legal)
        s = pick(total) if guess is None else guess
        best, raw = choose(n, legal, caps(s))
        return n, legal, raw, build_records(*part, best, raw, s, windows, caps(s), 0, span=(tiles, e)), total

    head = first(0, None)
    guess = head[3][0].shape[1]
    stats = [head, *map_spans(lambda i: first(i, guess), range(1, len(spans)))]
    s = pick(sum(st[4] for st in stats))
    if s == guess:
        built = [st[3] for st in stats]
        start = 0
        for st in stats:
            if start:  # built counting its raw tiles from 0
                _raw_headers(st[3][0], st[2], start)
            start += st[3][1].shape[0]
    else:
        n = np.concatenate([st[0] for st in stats], axis=1)
        legal = np.concatenate([st[1] for st in stats], axis=1)
        del stats
        built = _build_spans(rows, br, base, valid, plan, spans, n, legal, s, windows, caps(s))
    records = np.concatenate([r for r, _ in built])
    raws = np.concatenate([r for _, r in built])
    return s, records, raws


def _build_spans(rows, br, base, valid, plan: ClassPlan, spans, n, legal, s: int, windows, caps):
    """Every span's (records, raw tiles) for record size ``s``, its tiles gathered again."""
    best, raw = choose(n, legal, caps)
    bounds = np.cumsum([0] + [(b - a) * plan.count for a, b in spans])
    raw_before = np.concatenate([[0], np.cumsum(raw)])[bounds[:-1]]

    def build(i: int):
        a, b = spans[i]
        t0, t1 = bounds[i], bounds[i + 1]
        part = (rows, br[a:b], base[a:b], valid[a:b], plan)
        return build_records(*part, best[t0:t1], raw[t0:t1], s, windows, caps, int(raw_before[i]))

    return map_spans(build, range(len(spans)))


def decode_class_np(out, records, raw, br, base, valid, plan: ClassPlan, s: int, capacity, name: str) -> None:
    """Decode one column class's records (all row blocks) into ``out`` (uint8 [R, C]), validating each."""
    size = TILE_ROWS * plan.cols
    bmin = np.where(valid, base, 1 << 14).min(axis=1)  # base: int16 [blocks, 128]
    bmax = np.where(valid, base, -(1 << 14)).max(axis=1)

    def span(sp: tuple[int, int]) -> None:
        a, b = sp
        rec = records[a * plan.count : b * plan.count]
        h = np.ascontiguousarray(rec[:, s - _HEADER :]).view("<u4").reshape(-1).astype(np.int64)
        mode = h & 3
        vals = np.empty((rec.shape[0], size), dtype=np.uint8)
        vpos = None if valid[a:b].all() else _valid_positions(valid[a:b], plan)
        # each position's row base, as bytes: padding slots and forged bases wrap, and are dropped or
        # refused by the window check before a value is kept
        base_pos = np.repeat(base[a:b].astype(np.uint8), plan.cols, axis=1)
        for m, w in _MODE_WIDTH.items():
            sel = np.flatnonzero(mode == m)
            if not sel.size:
                continue
            hs = h[sel]
            cnt = (hs >> 2) & 63
            o = (((hs >> 8) & 0xFF) ^ 0x80) - 0x80
            cap = capacity(w, s, plan.cols)
            if cap < 0 or (hs >> 16).any() or (cnt > cap).any():
                raise CorruptPayloadError(name, f"a {w}-bit tile header is impossible for {s}-byte records")
            blk = a + sel // plan.count
            if ((bmin[blk] + o < 0) | (bmax[blk] + o + (1 << w) - 1 > 255)).any():
                raise CorruptPayloadError(name, "a tile window leaves the byte range")
            sb = size * w // 8
            rest = rec[sel, sb : s - _HEADER]  # positions, values, then bytes no field uses
            if np.logical_and(rest, cnt[:, None] <= _slot_of_byte(cap, rest.shape[1])).any():
                raise CorruptPayloadError(name, "a record's unused exception slots or padding are not zero")
            fields = unpack_bits(np.ascontiguousarray(rec[sel, :sb]).reshape(-1), w, sel.size * size)
            if vpos is not None and fields.reshape(sel.size, size)[~vpos[sel]].any():
                raise CorruptPayloadError(name, "a padding slot's selector is not zero")
            v = fields.reshape(sel.size, size) + base_pos[sel // plan.count]
            v += o.astype(np.uint8)[:, None]  # the window's low end, plus the field
            total = int(cnt.sum())
            if total:
                t = np.repeat(np.arange(sel.size), cnt)
                rank = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
                rt = sel[t]
                pos = rec[rt, sb + 2 * rank].astype(np.int64) | (rec[rt, sb + 2 * rank + 1].astype(np.int64) << 8)
                val = rec[rt, sb + 2 * cap + rank]
                if (pos >= size).any():
                    raise CorruptPayloadError(name, "an exception position lies outside its tile")
                g = t * size + pos
                if (g[1:] <= g[:-1]).any():
                    raise CorruptPayloadError(name, "exception positions are not strictly ascending")
                pad = ~vpos[rt, pos] if vpos is not None else np.zeros(total, dtype=bool)
                if (pad | (fields[g] != 0)).any():
                    raise CorruptPayloadError(name, "an exception sits on padding or on a non-zero selector")
                flat = v.reshape(-1)
                if ((val - flat[g]) < (1 << w)).any():  # flat holds the window's low end there
                    raise CorruptPayloadError(name, "an exception repeats a value its selector could express")
                flat[g] = val
            vals[sel] = v
        raw_sel = np.flatnonzero(mode == _MODE_RAW)
        raw_idx = h[raw_sel] >> 2
        if (raw_idx >= raw.shape[0]).any():
            raise CorruptPayloadError(name, "a raw tile index points past the raw tiles")
        if rec[raw_sel, : s - _HEADER].any():
            raise CorruptPayloadError(name, "a raw tile's record holds bytes besides its header")
        vals[raw_sel] = raw[raw_idx]
        if vpos is not None and vals[raw_sel][~vpos[raw_sel]].any():
            raise CorruptPayloadError(name, "a raw tile stores non-zero bytes for padding slots")
        _scatter(out, vals, br[a:b], plan)

    map_spans(span, block_spans(br.shape[0], plan.count * plan.cols, group_blocks(br)))


def _slot_of_byte(cap: int, length: int) -> np.ndarray:
    """For each byte after a record's selectors, the exception slot it belongs to (position bytes, then
    value bytes; :data:`MAX_EXCEPTIONS` for bytes no field uses): unused while the count is <= it."""
    k = np.arange(length)
    return np.where(k < 2 * cap, k // 2, np.where(k < 3 * cap, k - 2 * cap, MAX_EXCEPTIONS))


def _scatter(out: np.ndarray, vals: np.ndarray, br: np.ndarray, plan: ClassPlan) -> None:
    nb = br.shape[0]
    layout = _span_groups(br)
    if layout is not None:  # the inverse of _gather_tiles: one strided copy, and one more past padding
        first, groups, rg = layout
        dst = _words(out[first : first + groups * rg, plan.start : plan.start + plan.count * plan.cols], plan)
        padded = groups * rg != nb * TILE_ROWS
        rows = np.empty((nb * TILE_ROWS, *dst.shape[1:]), dtype=dst.dtype) if padded else dst
        src = vals.view(dst.dtype).reshape(nb, plan.count, *_SLOT_AXES, -1)
        rows.reshape(nb, *_ROW_AXES, plan.count, -1)[...] = src.transpose(_TO_ROWS)
        if padded:
            dst.reshape(groups, rg, *dst.shape[1:])[...] = rows.reshape(groups, -1, *dst.shape[1:])[:, :rg]
        return
    keep = br >= 0
    if plan.cols == TILE_COLS and out.shape[1] % TILE_COLS == 0:  # move four columns as one word
        words = vals.view(np.uint32).reshape(nb, plan.count, TILE_ROWS).transpose(0, 2, 1)
        c0 = plan.start // TILE_COLS
        out.view(np.uint32)[br[keep], c0 : c0 + plan.count] = words[keep]
        return
    tiles = vals.reshape(nb, plan.count, TILE_ROWS, plan.cols).transpose(0, 2, 1, 3).reshape(nb, TILE_ROWS, -1)
    out[br[keep], plan.start : plan.start + plan.count * plan.cols] = tiles[keep]
