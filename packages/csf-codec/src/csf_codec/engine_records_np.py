"""Engine records' CPU hot path (:mod:`csf_codec.engine_records`): whole-array numpy passes over one span of row
blocks, no loop over tiles.

A tile's record length under a candidate window ``[o, o + 2**w - 1]`` (offsets from the row base) needs its
exception count and how many of them are escapes (more than 4 below or 3 above). Both are differences of
``C(k)``, the tile's positions whose offset is ``<= k``. Offsets in the base window ``[0, 2**wb - 1]`` (nearly
every scale) are counted densely, one pass a level inside it (none for MXFP4 but ``k = 0``); the others, the
plane's exceptions, are listed once and counted per tile and threshold by one bincount. Padding positions count
as offset 0 and are taken back out of the windows that do not hold 0. Offsets are ``(scale - base) mod 256``:
exact in the base window, since a row base is at most ``256 - 2**wb``.
"""

from __future__ import annotations

import functools

import numpy as np

from .engine_record_layout import (
    ABOVE_CODES,
    BELOW_CODES,
    CODE_SHIFT,
    COUNT_SHIFT,
    ESCAPE_CODE,
    HEADER_BYTES,
    MODE_RAW,
    MODE_WIDTH,
    ORIGIN_SHIFT,
    RECORD_ALIGN,
    UNITS_SHIFT,
    entry_bytes,
    raw_units,
    selector_bytes,
    units_for,
)
from .inline_np import ClassPlan, _valid_positions
from .swar import group_counts, pack_bits
from .tile_layout import TILE_ROWS

__all__ = [
    "build_records",
    "choose_windows",
    "join_records",
    "offsets",
    "pick_windows",
    "ranks",
    "split_records",
    "thresholds",
    "tile_limits",
    "window_units",
]

_WIDTH_MODE = {w: m for m, w in MODE_WIDTH.items()}
_BIG = 1 << 20  # the length of a window that leaves the byte range
_DENSE_PASSES = 99  # in-window levels counted a pass each; more are read off one histogram


def offsets(tiles: np.ndarray, base: np.ndarray, valid: np.ndarray, plan: ClassPlan) -> np.ndarray:
    """uint8 [T, 128 tc]: each position's ``(scale - row base) mod 256``; padding positions read 0."""
    nb = base.shape[0]
    size = TILE_ROWS * plan.cols
    b = np.repeat(base.astype(np.uint8), plan.cols, axis=1)[:, None, :]
    e = tiles.reshape(nb, plan.count, size) - b
    pad = np.flatnonzero(~valid.all(axis=1))
    if pad.size:
        e[pad] *= np.repeat(valid[pad], plan.cols, axis=1)[:, None, :]
    return e.reshape(tiles.shape)


@functools.cache
def thresholds(windows) -> tuple[int, ...]:
    """The ``k`` whose ``C(k)`` the windows' lengths read, ascending."""
    ks = set()
    for w, o in windows:
        lo, hi = o, o + (1 << w) - 1
        ks |= {lo - 1, hi, lo - BELOW_CODES - 1, hi + ABOVE_CODES}
    return tuple(sorted(ks))


@functools.cache
def _window_rows(windows):
    """Per window: the rows of :func:`thresholds` at ``lo - 1``, ``hi``, ``lo - 5`` and ``hi + 3``, whether
    padding (offset 0) lies outside it, its origin, top and selector width (int64 [windows] each)."""
    at = {k: i for i, k in enumerate(thresholds(windows))}
    w = np.array([w for w, _ in windows])
    o = np.array([o for _, o in windows])
    hi = o + (1 << w) - 1
    rows = [np.array([at[k] for k in ks]) for ks in (o - 1, hi, o - BELOW_CODES - 1, hi + ABOVE_CODES)]
    return (*rows, ~((o <= 0) & (0 <= hi)), o, hi, w)


def _level_counts(tiles, e, plan: ClassPlan, windows, base_width: int) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """``C(k)`` (int64 [T]) for every threshold the windows' lengths need (module docstring), and the flat
    positions (int32) of the listed offsets: the base window's exceptions."""
    size = TILE_ROWS * plan.cols
    span = 1 << base_width
    flags = e >= span
    nout = group_counts(flags.reshape(-1), size)
    idx = np.flatnonzero(flags).astype(np.int32)  # int32: a span holds far fewer than 2**31 scales
    t = idx // np.int32(size)
    value = tiles.reshape(-1)[idx]
    off = value.astype(np.int16) - (value - e.reshape(-1)[idx])  # the row base is the value less e, mod 256
    ths = np.array(thresholds(windows))
    dense = ths[(ths >= 0) & (ths < span - 1)]
    sparse = np.union1d(ths[(ths < 0) | (ths >= span - 1)], [-1] if dense.size else []).astype(np.int64)
    m = sparse.size + 1
    # bucket = how many thresholds lie below the offset, by a table over the thresholds' range
    first = int(sparse[0]) - 1
    lut = np.searchsorted(sparse, np.arange(first, int(sparse[-1]) + 2)).astype(np.int64)
    bucket = lut[np.clip(off, first, int(sparse[-1]) + 1) - first]
    hist = np.bincount(t * m + bucket, minlength=tiles.shape[0] * m)
    le = np.cumsum(hist.reshape(-1, m), axis=1)  # le[:, i]: listed offsets <= sparse[i]
    counts = {}
    for i, k in enumerate(sparse.tolist()):
        counts[k] = le[:, i] if k < 0 else size - (nout - le[:, i])
    for k in dense.tolist():
        counts[k] = counts[-1] + group_counts((e <= k).reshape(-1), size)
    return counts, idx


def tile_limits(base, valid, plan: ClassPlan):
    """Per tile (int64 [T] each): its padding positions, and the smallest and largest real row base of its block."""
    if valid.all():  # no padding slots: the bases' own extremes
        npad = np.zeros(base.shape[0], dtype=np.int64)
        lo, hi = base.min(axis=1).astype(np.int64), base.max(axis=1).astype(np.int64)
    else:
        b = base.astype(np.int32)
        npad = TILE_ROWS * plan.cols - valid.sum(axis=1) * plan.cols
        lo = np.where(valid, b, 1 << 20).min(axis=1)
        hi = np.where(valid, b, -(1 << 20)).max(axis=1)
    return tuple(np.repeat(a.astype(np.int64), plan.count) for a in (npad, lo, hi))


def window_units(c: np.ndarray, npad, bmin, bmax, cols: int, windows) -> np.ndarray:
    """int64 [windows, T]: each window's record length / 16 from the tiles' level counts ``C(k)`` (int [thresholds,
    T], :func:`thresholds` order; padding counted at offset 0), every window in one pass; a window that leaves the
    byte range for a real row of the tile's block is never the shortest."""
    size = TILE_ROWS * cols
    below, top, far_below, far_above, pad_out, o, hi, w = _window_rows(windows)
    n = size - (c[top] - c[below]) - pad_out[:, None] * npad[None, :]
    esc = c[far_below] + size - c[far_above]
    u = units_for(HEADER_BYTES + selector_bytes(w, cols)[:, None] + entry_bytes(n) + esc)
    legal = (bmin[None, :] + o[:, None] >= 0) & (bmax[None, :] + hi[:, None] <= 255)
    return np.where(legal, u, _BIG)


def pick_windows(units: np.ndarray, cols: int):
    """Each tile's window (fewest record bytes, then list order), whether it goes raw (no window strictly shorter
    than the raw record), and its record's length / 16 (int64 [T] each)."""
    k = units.shape[0]
    key = units * k + np.arange(k)[:, None]
    best = key.argmin(axis=0)
    best_units = key.min(axis=0) // k
    raw = best_units >= raw_units(cols)
    return best, raw, np.where(raw, raw_units(cols), best_units)


def choose_windows(tiles, e, base, valid, plan: ClassPlan, windows, base_width: int):
    """:func:`pick_windows` for native tiles (uint8 [T, 128 tc], slot order) and their :func:`offsets` ``e``; and
    the flat positions of the base window's exceptions, which :func:`build_records` reuses."""
    c, listed = _level_counts(tiles, e, plan, windows, base_width)
    npad, bmin, bmax = tile_limits(base, valid, plan)
    levels = np.stack([c[k] for k in thresholds(windows)])
    return (*pick_windows(window_units(levels, npad, bmin, bmax, plan.cols, windows), plan.cols), listed)


def _code_table(width: int) -> np.ndarray:
    """uint16 [512]: at ``d + 256`` the entry bits 9-11 of an exception ``d = value - window low end`` (outside
    ``[0, 2**width - 1]``): its 3-bit code, shifted into place."""
    d = np.arange(-256, 256)
    above = d - ((1 << width) - 1)
    code = np.where(
        d < 0,
        np.where(-d <= BELOW_CODES, -d - 1, ESCAPE_CODE),
        np.where(above <= ABOVE_CODES, above + BELOW_CODES - 1, ESCAPE_CODE),
    )
    return (code << CODE_SHIFT).astype(np.uint16)


_CODE_BITS = {w: _code_table(w) for w in MODE_WIDTH.values()}


def ranks(tile_of: np.ndarray, tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Per tile the number of listed items (``tile_of`` ascending), and each item's rank within its tile."""
    nk = np.bincount(tile_of, minlength=tiles)
    return nk, np.arange(tile_of.size, dtype=tile_of.dtype) - (np.cumsum(nk) - nk).astype(tile_of.dtype)[tile_of]


def build_records(tiles, e, base, valid, plan: ClassPlan, windows, choice) -> np.ndarray:
    """uint8 [T, 16 * max units]: each tile's record, zero past its length (``e``: the tiles' :func:`offsets`;
    ``choice``: :func:`choose_windows`' result with the plane's row-base width)."""
    best, raw, units, listed, base_width = choice
    t_count, size, tc = tiles.shape[0], TILE_ROWS * plan.cols, plan.cols
    width = RECORD_ALIGN * int(units.max(initial=1))
    rec = np.zeros((t_count, width), dtype=np.uint8)
    flat = rec.reshape(-1)
    vpos = None if valid.all() else _valid_positions(valid, plan)
    header = (units.astype(np.uint32) << UNITS_SHIFT) | np.where(raw, MODE_RAW, 0).astype(np.uint32)
    for j, (w, o) in enumerate(windows):
        sel = np.flatnonzero((best == j) & ~raw)
        if not sel.size:
            continue
        every = sel.size == t_count  # every tile takes this window: slices, no gathers
        f = (e if every else e[sel]) - np.uint8(o & 0xFF)  # from the window's low end, mod 256: exact when legal
        inside = f < (1 << w)
        if vpos is not None:
            inside &= vpos if every else vpos[sel]
            outside = ~inside & (vpos if every else vpos[sel])
        else:
            outside = ~inside
        sb = selector_bytes(w, tc)
        if every and (w, o) == (base_width, 0):  # the base window: its exceptions are listed already
            idx = listed
        else:
            idx = np.flatnonzero(outside).astype(np.int32)  # int32: a span holds far fewer than 2**31 scales
        tl = idx // np.int32(size)
        p = idx - tl * np.int32(size)
        rt = tl if every else sel.astype(np.int32)[tl]
        val = tiles.reshape(-1)[rt * np.int32(size) + p]
        lo = val - f.reshape(-1)[idx]  # f = (value - low end) mod 256, and the low end is a byte
        np.multiply(f, inside, out=f)  # the fields: exceptions and padding store 0
        rec[sel if not every else slice(None), HEADER_BYTES : HEADER_BYTES + sb] = pack_bits(f.reshape(-1), w).reshape(
            sel.size, sb
        )
        nk, rank = ranks(tl, sel.size)
        entry = p.astype(np.uint16) | _CODE_BITS[w][val.astype(np.int16) - lo + 256]
        at = rt * np.int32(width) + np.int32(HEADER_BYTES + sb) + ((rank * 3) >> 1)  # each entry's first byte
        even = (rank & 1) == 0
        flat[at[even]] = entry[even] & 0xFF
        flat[at[even] + 1] = entry[even] >> 8  # the low nibble; an odd partner fills the high one
        odd = ~even
        flat[at[odd]] |= ((entry[odd] & 0xF) << 4).astype(np.uint8)
        flat[at[odd] + 1] = entry[odd] >> 4
        esc = np.flatnonzero((entry >> CODE_SHIFT) == ESCAPE_CODE)
        if esc.size:
            _, erank = ranks(tl[esc], sel.size)
            flat[rt[esc] * width + HEADER_BYTES + sb + entry_bytes(nk[tl[esc]]) + erank] = val[esc]
        origin = np.uint32((o & 0xFF) << ORIGIN_SHIFT)
        header[sel] |= _WIDTH_MODE[w] | origin | (nk.astype(np.uint32) << COUNT_SHIFT)
    raw_ids = np.flatnonzero(raw)
    if raw_ids.size:
        rec[raw_ids, HEADER_BYTES : HEADER_BYTES + size] = tiles[raw_ids]
    rec[:, :HEADER_BYTES] = header.astype("<u4").view(np.uint8).reshape(-1, HEADER_BYTES)
    return rec


# ------------------------------------------------------------------------------------------ body <-> staging


def _class_slots(units: np.ndarray, plans) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Each record's length and first unit (16 bytes) in its span's body (block order), and each class's ids."""
    u = units.reshape(-1).astype(np.int64)
    starts = np.cumsum(u) - u
    ct = units.shape[1]
    ids, col = [], 0
    for plan in plans:
        block_ids = np.arange(units.shape[0])[:, None] * ct + col + np.arange(plan.count)[None, :]
        ids.append(block_ids.reshape(-1))
        col += plan.count
    return u, starts, ids


def join_records(staged: list[np.ndarray], units: np.ndarray, plans) -> np.ndarray:
    """The span's body: every class's staged records ([T_c, width]) in block order, each cut to its length. Records
    move as rows of 16 bytes."""
    u, starts, ids = _class_slots(units, plans)
    out = np.empty((int(u.sum()), RECORD_ALIGN), dtype=np.uint8)
    for rec, rid in zip(staged, ids, strict=True):
        if not rid.size:
            continue
        rows = rec.reshape(rid.size, -1, RECORD_ALIGN)
        keep = np.arange(rows.shape[1])[None, :] < u[rid][:, None]
        first = int(starts[rid[0]])
        if np.array_equal(starts[rid], np.cumsum(u[rid]) - u[rid] + first):  # consecutive in the body
            out[first : first + int(u[rid].sum())] = rows[keep]
        else:
            out[(starts[rid][:, None] + np.arange(rows.shape[1])[None, :])[keep]] = rows[keep]
    return out.reshape(-1)


def split_records(body: np.ndarray, units: np.ndarray, plans) -> list[np.ndarray]:
    """Each class's records as rows of ``16 * max units`` bytes, gathered 16 bytes at a time; a row's bytes past its
    record's length are the records' after it (or the body's last 16), which the decoder never reads. ``units``
    must already sum to the body's length."""
    u, starts, ids = _class_slots(units, plans)
    rows = body.reshape(-1, RECORD_ALIGN)
    out = []
    for rid in ids:
        width = int(u[rid].max(initial=1))
        at = np.minimum(starts[rid][:, None] + np.arange(width)[None, :], max(rows.shape[0] - 1, 0))
        out.append(rows[at].reshape(rid.size, width * RECORD_ALIGN))
    return out
