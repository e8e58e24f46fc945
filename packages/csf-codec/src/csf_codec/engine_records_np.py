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

import numpy as np

from .engine_record_layout import (
    ABOVE_CODES,
    BELOW_CODES,
    CODE_SHIFT,
    COUNT_MASK,
    COUNT_SHIFT,
    ESCAPE_CODE,
    HEADER_BYTES,
    MODE_RAW,
    MODE_WIDTH,
    ORIGIN_SHIFT,
    POSITION_MASK,
    RECORD_ALIGN,
    RESERVED_SHIFT,
    UNITS_MASK,
    UNITS_SHIFT,
    entry_bytes,
    raw_units,
    selector_bytes,
    units_for,
)
from .errors import CorruptPayloadError
from .inline_np import ClassPlan, _valid_positions
from .swar import group_counts, pack_bits, unpack_bits
from .tile_layout import TILE_ROWS

__all__ = ["build_records", "choose_windows", "decode_records", "join_records", "split_records"]

_WIDTH_MODE = {w: m for m, w in MODE_WIDTH.items()}
_BIG = 1 << 20  # the length of a window that leaves the byte range


def _offsets(tiles: np.ndarray, base: np.ndarray, valid: np.ndarray, plan: ClassPlan) -> np.ndarray:
    """uint8 [T, 128 tc]: each position's ``(scale - row base) mod 256``; padding positions read 0."""
    nb = base.shape[0]
    size = TILE_ROWS * plan.cols
    b = np.repeat(base.astype(np.uint8), plan.cols, axis=1)[:, None, :]
    e = tiles.reshape(nb, plan.count, size) - b
    pad = np.flatnonzero(~valid.all(axis=1))
    if pad.size:
        e[pad] *= np.repeat(valid[pad], plan.cols, axis=1)[:, None, :]
    return e.reshape(tiles.shape)


def _thresholds(windows) -> list[int]:
    ks = set()
    for w, o in windows:
        lo, hi = o, o + (1 << w) - 1
        ks |= {lo - 1, hi, lo - BELOW_CODES - 1, hi + ABOVE_CODES}
    return sorted(ks)


def _level_counts(tiles, e, base, plan: ClassPlan, windows, base_width: int) -> dict[int, np.ndarray]:
    """``C(k)`` (int64 [T]) for every threshold the windows' lengths need (module docstring)."""
    size = TILE_ROWS * plan.cols
    span = 1 << base_width
    flags = e >= span
    nout = group_counts(flags.reshape(-1), size)
    idx = np.flatnonzero(flags)
    t, p = np.divmod(idx, size)
    off = tiles.reshape(-1)[idx].astype(np.int16) - base.reshape(-1)[(t // plan.count) * TILE_ROWS + p // plan.cols]
    ths = np.array(_thresholds(windows))
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
    return counts


def choose_windows(tiles, base, valid, plan: ClassPlan, windows, base_width: int):
    """Each tile's window (fewest record bytes, then list order), whether it goes raw (no window strictly
    shorter than the raw record), and its record's length / 16 (int64 [T] each)."""
    size = TILE_ROWS * plan.cols
    e = _offsets(tiles, base, valid, plan)
    c = _level_counts(tiles, e, base, plan, windows, base_width)
    npad = np.repeat(size - valid.sum(axis=1) * plan.cols, plan.count)
    b = base.astype(np.int32)
    bmin = np.repeat(np.where(valid, b, 1 << 20).min(axis=1), plan.count)
    bmax = np.repeat(np.where(valid, b, -(1 << 20)).max(axis=1), plan.count)
    units = np.empty((len(windows), tiles.shape[0]), dtype=np.int64)
    for j, (w, o) in enumerate(windows):
        hi = o + (1 << w) - 1
        n = size - (c[hi] - c[o - 1]) - (0 if o <= 0 <= hi else npad)
        esc = c[o - BELOW_CODES - 1] + size - c[hi + ABOVE_CODES]
        u = units_for(HEADER_BYTES + selector_bytes(w, plan.cols) + entry_bytes(n) + esc)
        units[j] = np.where((bmin + o >= 0) & (bmax + hi <= 255), u, _BIG)
    k = len(windows)
    key = units * k + np.arange(k)[:, None]
    best = key.argmin(axis=0)
    best_units = key.min(axis=0) // k if k else np.full(tiles.shape[0], _BIG)
    raw = best_units >= raw_units(plan.cols)
    return best, raw, np.where(raw, raw_units(plan.cols), best_units)


def _codes(d: np.ndarray, width: int) -> np.ndarray:
    """The 3-bit code of exceptions ``d = value - window low end`` (outside ``[0, 2**width - 1]``)."""
    above = d - ((1 << width) - 1)
    return np.where(
        d < 0,
        np.where(-d <= BELOW_CODES, -d - 1, ESCAPE_CODE),
        np.where(above <= ABOVE_CODES, above + BELOW_CODES - 1, ESCAPE_CODE),
    )


def _ranks(tile_of: np.ndarray, tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Per tile the number of listed items (``tile_of`` ascending), and each item's rank within its tile."""
    nk = np.bincount(tile_of, minlength=tiles)
    return nk, np.arange(tile_of.size) - (np.cumsum(nk) - nk)[tile_of]


def build_records(tiles, base, valid, plan: ClassPlan, windows, best, raw, units) -> np.ndarray:
    """uint8 [T, 16 * max units]: each tile's record, zero past its length."""
    t_count, size, tc = tiles.shape[0], TILE_ROWS * plan.cols, plan.cols
    width = RECORD_ALIGN * int(units.max(initial=1))
    rec = np.zeros((t_count, width), dtype=np.uint8)
    flat = rec.reshape(-1)
    e = _offsets(tiles, base, valid, plan)
    vpos = None if valid.all() else _valid_positions(valid, plan)
    header = (units.astype(np.uint32) << UNITS_SHIFT) | np.where(raw, MODE_RAW, 0).astype(np.uint32)
    for j, (w, o) in enumerate(windows):
        sel = np.flatnonzero((best == j) & ~raw)
        if not sel.size:
            continue
        f = e[sel] - np.uint8(o & 0xFF)  # offset from the window's low end, mod 256: exact for a legal window
        inside = f < (1 << w)
        if vpos is not None:
            inside &= vpos[sel]
            outside = ~inside & vpos[sel]
        else:
            outside = ~inside
        sb = selector_bytes(w, tc)
        rec[sel, HEADER_BYTES : HEADER_BYTES + sb] = pack_bits((f * inside).reshape(-1), w).reshape(sel.size, sb)
        tl, p = np.divmod(np.flatnonzero(outside), size)
        nk, rank = _ranks(tl, sel.size)
        rt = sel[tl]
        val = tiles.reshape(-1)[rt * size + p]
        code = _codes(val.astype(np.int32) - base.reshape(-1)[(rt // plan.count) * TILE_ROWS + p // tc] - o, w)
        entry = p | (code << CODE_SHIFT)
        at = rt * width + HEADER_BYTES + sb + (3 * rank) // 2  # flat byte of each entry's first byte
        even = (rank & 1) == 0
        flat[at[even]] = entry[even] & 0xFF
        flat[at[even] + 1] = entry[even] >> 8  # the low nibble; an odd partner fills the high one
        odd = ~even
        flat[at[odd]] |= ((entry[odd] & 0xF) << 4).astype(np.uint8)
        flat[at[odd] + 1] = entry[odd] >> 4
        esc = np.flatnonzero(code == ESCAPE_CODE)
        if esc.size:
            _, erank = _ranks(tl[esc], sel.size)
            flat[rt[esc] * width + HEADER_BYTES + sb + entry_bytes(nk[tl[esc]]) + erank] = val[esc]
        origin = np.uint32((o & 0xFF) << ORIGIN_SHIFT)
        header[sel] |= _WIDTH_MODE[w] | origin | (nk.astype(np.uint32) << COUNT_SHIFT)
    raw_ids = np.flatnonzero(raw)
    if raw_ids.size:
        rec[raw_ids, HEADER_BYTES : HEADER_BYTES + size] = tiles[raw_ids]
    rec[:, :HEADER_BYTES] = header.astype("<u4").view(np.uint8).reshape(-1, HEADER_BYTES)
    return rec


# ------------------------------------------------------------------------------------------ body <-> staging


def _class_slots(units: np.ndarray, plans) -> tuple[np.ndarray, list[np.ndarray]]:
    """Byte offset of each record of a span (block order) in its body, and each class's record ids."""
    lengths = units.reshape(-1).astype(np.int64) * RECORD_ALIGN
    starts = np.cumsum(lengths) - lengths
    ct = units.shape[1]
    ids, col = [], 0
    for plan in plans:
        block_ids = np.arange(units.shape[0])[:, None] * ct + col + np.arange(plan.count)[None, :]
        ids.append(block_ids.reshape(-1))
        col += plan.count
    return starts, ids


def _placement(starts: np.ndarray, lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The staging mask of records of ``lengths`` bytes in rows of ``width``, and where their bytes sit in the body
    (None: the records follow each other there, in row order)."""
    mask = np.arange(width)[None, :] < lengths[:, None]
    if lengths.size and np.array_equal(starts, np.cumsum(lengths) - lengths + starts[0]):
        return mask, None
    return mask, np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


def join_records(staged: list[np.ndarray], units: np.ndarray, plans) -> np.ndarray:
    """The span's body: every class's staged records ([T_c, width]) in block order, each cut to its length."""
    starts, ids = _class_slots(units, plans)
    lengths = units.reshape(-1).astype(np.int64) * RECORD_ALIGN
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    for rec, rid in zip(staged, ids, strict=True):
        mask, where = _placement(starts[rid], lengths[rid], rec.shape[1])
        if where is None:
            out[starts[rid][0] : starts[rid][0] + int(lengths[rid].sum())] = rec[mask] if rid.size else 0
        else:
            out[where] = rec[mask]
    return out


def split_records(body: np.ndarray, units: np.ndarray, plans) -> list[np.ndarray]:
    """Inverse of :func:`join_records`: each class's records as rows of ``16 * max units`` bytes, zero past their
    length. ``units`` must already sum to the body's length."""
    starts, ids = _class_slots(units, plans)
    lengths = units.reshape(-1).astype(np.int64) * RECORD_ALIGN
    out = []
    for rid in ids:
        width = int(lengths[rid].max(initial=RECORD_ALIGN))
        rec = np.zeros((rid.size, width), dtype=np.uint8)
        mask, where = _placement(starts[rid], lengths[rid], width)
        if where is None:
            rec[mask] = body[starts[rid][0] : starts[rid][0] + int(lengths[rid].sum())] if rid.size else 0
        else:
            rec[mask] = body[where]
        out.append(rec)
    return out


# ------------------------------------------------------------------------------------------------- decoder


def _fail(name: str, fault: str):
    raise CorruptPayloadError(name, fault)


def _check_padding(rec, sel, used, units, name: str) -> None:
    """Bytes from ``used`` to the record's end (all in its last 16) are zero."""
    end = units[sel] * RECORD_ALIGN
    cols = end[:, None] - RECORD_ALIGN + np.arange(RECORD_ALIGN)[None, :]
    if np.logical_and(rec[sel[:, None], cols], cols >= used[:, None]).any():
        _fail(name, "a record's padding bytes are not zero")


def decode_records(rec, units, base, valid, plan: ClassPlan, windows, name: str) -> np.ndarray:
    """uint8 [T, 128 tc] native bytes (slot order) of one class's staged records, every field checked; the window
    choice is checked by the caller."""
    t_count, size, tc = rec.shape[0], TILE_ROWS * plan.cols, plan.cols
    width = rec.shape[1]
    flat = rec.reshape(-1)
    h = np.ascontiguousarray(rec[:, :HEADER_BYTES]).view("<u4").reshape(-1).astype(np.int64)
    if ((h >> UNITS_SHIFT) & UNITS_MASK != units).any():
        _fail(name, "a record header's length disagrees with its offsets byte")
    if (h >> RESERVED_SHIFT).any():
        _fail(name, "a record header's reserved bits are not zero")
    mode = h & 3
    vals = np.empty((t_count, size), dtype=np.uint8)
    padded = np.flatnonzero(~valid.all(axis=1))  # blocks with padding slots, and their tiles
    pad_tiles = np.zeros(t_count, dtype=bool)
    pad_tiles.reshape(-1, plan.count)[padded] = True
    vpos = np.repeat(valid, tc, axis=1) if padded.size else None  # per block
    b = base.astype(np.int32)
    bmin = np.where(valid, b, 1 << 20).min(axis=1)
    bmax = np.where(valid, b, -(1 << 20)).max(axis=1)
    base_pos = np.repeat(base.astype(np.uint8), tc, axis=1)  # forged bases wrap; the window check refuses them
    for m, w in MODE_WIDTH.items():
        sel = np.flatnonzero(mode == m)
        if not sel.size:
            continue
        hs = h[sel]
        o = (((hs >> ORIGIN_SHIFT) & 0xFF) ^ 0x80) - 0x80
        n = (hs >> COUNT_SHIFT) & COUNT_MASK
        if not np.isin(o, [oo for ww, oo in windows if ww == w]).all():
            _fail(name, f"a {w}-bit record's window is not a candidate window")
        blk = sel // plan.count
        if ((bmin[blk] + o < 0) | (bmax[blk] + o + (1 << w) - 1 > 255)).any():
            _fail(name, "a tile window leaves the byte range")
        sb = selector_bytes(w, tc)
        entries_end = HEADER_BYTES + sb + entry_bytes(n)
        if (entries_end > units[sel] * RECORD_ALIGN).any():
            _fail(name, "a record's selectors and exception count run past its length")
        packed = np.ascontiguousarray(rec[sel, HEADER_BYTES : HEADER_BYTES + sb]).reshape(-1)
        fields = unpack_bits(packed, w, sel.size * size).reshape(sel.size, size)
        if vpos is not None:
            ps = np.flatnonzero(pad_tiles[sel])
            if ps.size and fields[ps][~vpos[blk[ps]]].any():
                _fail(name, "a padding slot's selector is not zero")
        if sel.size == t_count:  # every tile in this mode: broadcast the bases instead of gathering them
            v = (fields.reshape(-1, plan.count, size) + base_pos[:, None, :]).reshape(t_count, size)
        else:
            v = fields + base_pos[blk]
        v += o.astype(np.uint8)[:, None]  # the window's low end, plus the field
        odd = np.flatnonzero(n & 1)
        if odd.size and (flat[sel[odd] * width + entries_end[odd] - 1] >> 4).any():
            _fail(name, "the unused half of a record's last exception entry is not zero")
        used = entries_end
        total = int(n.sum())
        if total:
            t = np.repeat(np.arange(sel.size), n)
            rank = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
            row = sel[t] * width
            at = row + HEADER_BYTES + sb + (3 * rank) // 2
            word = flat[at].astype(np.int32) | (flat[at + 1].astype(np.int32) << 8)
            entry = (word >> (4 * (rank & 1))) & 0xFFF
            pos, code = entry & POSITION_MASK, entry >> CODE_SHIFT
            if (pos >= size).any():
                _fail(name, "an exception position lies outside its tile")
            g = t * size + pos
            if (g[1:] <= g[:-1]).any():
                _fail(name, "exception positions are not strictly ascending")
            if (vpos is not None and not vpos[blk[t], pos].all()) or fields.reshape(-1)[g].any():
                _fail(name, "an exception sits on padding or on a non-zero selector")
            esc = np.flatnonzero(code == ESCAPE_CODE)
            used = entries_end + np.bincount(t[esc], minlength=sel.size)
            if (units_for(used) != units[sel]).any():
                _fail(name, "a record's length disagrees with its exception count and escapes")
            lo = b.reshape(-1)[blk[t] * TILE_ROWS + pos // tc] + o[t]
            hi = lo + (1 << w) - 1
            value = np.where(code < BELOW_CODES, lo - 1 - code, hi + code - (BELOW_CODES - 1))
            if esc.size:
                _, erank = _ranks(t[esc], sel.size)
                value[esc] = flat[row[esc] + entries_end[t[esc]] + erank]
                ev, elo, ehi = value[esc], lo[esc], hi[esc]
                if ((ev >= elo) & (ev <= ehi)).any():
                    _fail(name, "an exception repeats a value its selector could express")
                if ((ev >= elo - BELOW_CODES) & (ev <= ehi + ABOVE_CODES)).any():
                    _fail(name, "an escape holds a value a code reaches")
            if ((value < 0) | (value > 255)).any():
                _fail(name, "an exception code points outside the byte range")
            v.reshape(-1)[g] = value
        elif (units_for(used) != units[sel]).any():
            _fail(name, "a record's length disagrees with its exception count and escapes")
        _check_padding(rec, sel, used, units, name)
        if sel.size == t_count:
            vals = v
        else:
            vals[sel] = v
    sel = np.flatnonzero(mode == MODE_RAW)
    if sel.size:
        if ((h[sel] >> ORIGIN_SHIFT) & 0xFFFF).any():
            _fail(name, "a raw record's header carries an origin or a count")
        if (units[sel] != raw_units(tc)).any():
            _fail(name, "a raw record's length is not the raw length")
        _check_padding(rec, sel, np.full(sel.size, HEADER_BYTES + size), units, name)
        vals[sel] = rec[sel, HEADER_BYTES : HEADER_BYTES + size]
        if vpos is not None and vals[sel][~vpos[sel // plan.count]].any():
            _fail(name, "a raw record stores non-zero bytes for padding slots")
    return vals
