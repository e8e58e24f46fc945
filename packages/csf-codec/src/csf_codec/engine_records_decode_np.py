"""Engine records' CPU decoder (:mod:`csf_codec.engine_records`): one column class of a span of row blocks, every
field checked, in whole-array numpy passes. The reference: :mod:`csf_codec.engine_records_decode_c` runs the same
checks, in the same order and with the same messages, in the C extension, and the tests compare the two.

Canonical choice is checked from what decoding reads, without re-encoding: a tile's record length under any
candidate window follows from ``C(k)``, its positions whose offset from the row base is ``<= k`` (padding at
offset 0; :mod:`csf_codec.engine_records_np`). A selector record gives ``C(k)`` exactly: its exceptions' offsets
are decoded, and every other real position lies at ``o + field``, so counts of its selector fields place them (a
popcount for 1-bit fields; for wider ones a compare-and-count pass a level the records' common origin needs, and
a histogram for records of other origins). Raw tiles, which are rare, are counted from their bytes as the encoder
counts them.

The row-base check (format section 6) starts here too: :func:`base_window_counts` counts, per slot, the row's
decoded scales below its stored base, at it, at its window's top and inside it, while the span's tiles are in
cache; :func:`csf_codec.rowbase.proven_bases` turns those four numbers into a proof for nearly every row, so only
the rest are recomputed from the plane.
"""

from __future__ import annotations

import functools

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
from .engine_records_np import choose_windows, offsets, pick_windows, ranks, thresholds, tile_limits, window_units
from .errors import CorruptPayloadError
from .inline_np import ClassPlan
from .swar import group_counts, grouped_histogram, pack_bits, unpack_bits
from .tile_layout import TILE_ROWS

__all__ = ["base_window_counts", "decode_records", "position_bases"]


# a code's value less its window's low end (``lo - 1 - code`` below, ``hi + code - 3`` above); escapes are read
_CODE_STEP = {
    w: np.array([-1 - c for c in range(BELOW_CODES)] + [(1 << w) + c for c in range(ABOVE_CODES)] + [0], np.int32)
    for w in MODE_WIDTH.values()
}
assert all(len(v) == ESCAPE_CODE + 1 for v in _CODE_STEP.values())


def _fail(name: str, fault: str):
    raise CorruptPayloadError(name, fault)


def _check_padding(rec, sel, used, units, name: str) -> None:
    """Bytes from ``used`` to the record's end (all in its last 16) are zero."""
    last = rec.reshape(rec.shape[0], -1, RECORD_ALIGN)[sel, units[sel] - 1]  # [S, 16]: one gather a record
    start = used - (units[sel] - 1) * RECORD_ALIGN  # the first padding byte within it (0 to 16)
    if np.logical_and(last, np.arange(RECORD_ALIGN)[None, :] >= start[:, None]).any():
        _fail(name, "a record's padding bytes are not zero")


def _selector_levels(ks, packed, fields, width, o, n, npad, t, off) -> np.ndarray:
    """int32 [thresholds, S]: ``C(k)`` of S selector records of one width, less their padding (added by the
    caller), from their selectors, origins, counts, and their exceptions' records ``t`` and offsets. 1-bit
    fields are counted by popcount of the packed selectors (uint8 [S, bytes], bytes a multiple of 8), wider
    ones by a histogram of the fields (uint8 [S, size])."""
    size = np.int32(fields.shape[1])
    rel = ks[:, None] - o.astype(np.int32)[None, :]  # the field a threshold falls on: fields <= rel are at offsets <= k
    if width == 1:
        zeros = size - np.add.reduce(np.bitwise_count(packed.view(np.uint64)), axis=1, dtype=np.int32)
        at = np.where(rel >= 1, size, zeros[None, :])
    else:
        at = _wide_levels(fields, rel, width)
    out = np.where(rel >= 0, at - (n + npad).astype(np.int32)[None, :], np.int32(0))  # exceptions, padding: field 0
    if t.size:
        bucket = _buckets(tuple(ks.tolist()))[off + 256]  # the first threshold >= the offset
        m = ks.size + 1
        hist = np.bincount(t * m + bucket, minlength=o.size * m).reshape(o.size, m)
        out += np.cumsum(hist, axis=1, dtype=np.int32)[:, : ks.size].T
    return out


def _wide_levels(fields: np.ndarray, rel: np.ndarray, width: int) -> np.ndarray:
    """int32 [thresholds, S]: each record's fields ``<= rel`` (clipped to the field range; ``rel`` as in
    :func:`_selector_levels`). When most records share an origin (NVFP4's tiles keep the base window), each level
    they need is one compare-and-count pass over every record; the others take a histogram of their fields."""
    top = (1 << width) - 1
    size = fields.shape[1]
    clipped = np.clip(rel, 0, top)
    origin = rel[0] - rel[0].min()  # the origins, shifted to start at 0
    major = int(np.bincount(origin).argmax())
    mine = origin == major
    rest = np.flatnonzero(~mine)
    at = np.empty(rel.shape, dtype=np.int32)
    if rest.size * 2 < origin.size:
        first = int(np.argmax(mine))
        column = clipped[:, first]  # the level each threshold reads in those records
        got = np.full((top + 1, fields.shape[0]), size, dtype=np.int32)
        for j in set(column.tolist()) - {top}:  # a pass a level; the other records' results are not used
            got[j] = group_counts((fields <= j).reshape(-1), size)
        at[:] = got[column]
    else:
        rest = np.arange(origin.size)
    if rest.size:
        cum = np.cumsum(grouped_histogram(fields[rest], top + 1), axis=1)
        at[:, rest] = np.take_along_axis(cum.T, clipped[:, rest], axis=0)
    return at


@functools.cache
def _buckets(ks: tuple[int, ...]) -> np.ndarray:
    """At ``offset + 256``: the index of the first threshold at or above the offset."""
    return np.searchsorted(np.array(ks), np.arange(-256, 256)).astype(np.int32)


def decode_records(rec, units, base, valid, plan: ClassPlan, windows, base_width: int, name: str) -> np.ndarray:
    """uint8 [T, 128 tc] native bytes (slot order) of one class's staged records, every field and the window choice
    checked."""
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
    npad, bmin, bmax = (a.astype(np.int32) for a in tile_limits(base, valid, plan))  # int32: small per-tile arrays
    base_pos = position_bases(base, tc)  # forged bases wrap; the window check refuses them
    ks = np.array(thresholds(windows), dtype=np.int32)
    levels = np.zeros((ks.size, t_count), dtype=np.int32)  # C(k) of the selector records
    chosen = np.zeros(t_count, dtype=np.int64)  # their window's index in the list
    for m, w in MODE_WIDTH.items():
        sel = np.flatnonzero(mode == m)
        if not sel.size:
            continue
        hs = h[sel]
        o = (((hs >> ORIGIN_SHIFT) & 0xFF) ^ 0x80) - 0x80
        n = (hs >> COUNT_SHIFT) & COUNT_MASK
        index = np.full(256, -1, dtype=np.int64)  # origin byte -> the window's place in the list
        for j, (ww, oo) in enumerate(windows):
            if ww == w:
                index[oo & 0xFF] = j
        chosen[sel] = index[o & 0xFF]
        if (chosen[sel] < 0).any():
            _fail(name, f"a {w}-bit record's window is not a candidate window")
        blk = sel // plan.count
        if ((bmin[sel] + o < 0) | (bmax[sel] + o + (1 << w) - 1 > 255)).any():
            _fail(name, "a tile window leaves the byte range")
        sb = selector_bytes(w, tc)
        entries_end = HEADER_BYTES + sb + entry_bytes(n)
        if (entries_end > units[sel] * RECORD_ALIGN).any():
            _fail(name, "a record's selectors and exception count run past its length")
        packed = np.ascontiguousarray(rec[sel, HEADER_BYTES : HEADER_BYTES + sb])
        fields = unpack_bits(packed.reshape(-1), w, sel.size * size).reshape(sel.size, size)
        if vpos is not None:  # on the packed selectors of tiles with padding, against their padding's bits
            ps = np.flatnonzero(pad_tiles[sel])
            holes = pack_bits((~vpos).reshape(-1).view(np.uint8) * np.uint8((1 << w) - 1), w)  # all w bits
            holes = holes.reshape(vpos.shape[0], -1)
            if ps.size and (packed[ps] & holes[blk[ps]]).any():
                _fail(name, "a padding slot's selector is not zero")
        odd = np.flatnonzero(n & 1)
        if odd.size and (flat[sel[odd] * width + entries_end[odd] - 1] >> 4).any():
            _fail(name, "the unused half of a record's last exception entry is not zero")
        used = entries_end
        total = int(n.sum())
        t = off = np.zeros(0, dtype=np.int32)
        if total:  # int32 indices: a span's records hold far fewer than 2**31 bytes
            n32 = n.astype(np.int32)
            t = np.repeat(np.arange(sel.size, dtype=np.int32), n32)
            rank = np.arange(total, dtype=np.int32) - np.repeat(np.cumsum(n32, dtype=np.int32) - n32, n32)
            row = (sel.astype(np.int32) * np.int32(width))[t]
            at = row + np.int32(HEADER_BYTES + sb) + ((rank * 3) >> 1)
            word = flat[at].astype(np.int32) | (flat[at + 1].astype(np.int32) << 8)
            entry = (word >> ((rank & 1) << 2)) & 0xFFF
            del word, at, rank  # the span's exception arrays are a few MB: the peak is the fields and these
            pos, code = entry & POSITION_MASK, entry >> CODE_SHIFT
            if (pos >= size).any():
                _fail(name, "an exception position lies outside its tile")
            g = t * np.int32(size) + pos
            if (g[1:] <= g[:-1]).any():
                _fail(name, "exception positions are not strictly ascending")
            if fields.reshape(-1)[g].any():
                _fail(name, "an exception sits on padding or on a non-zero selector")
            if vpos is not None:  # only exceptions of tiles with padding can sit on it
                inpad = np.flatnonzero(pad_tiles[sel][t])
                if inpad.size and not vpos[blk[t[inpad]], pos[inpad]].all():
                    _fail(name, "an exception sits on padding or on a non-zero selector")
            esc = np.flatnonzero(code == ESCAPE_CODE)
            used = entries_end + np.bincount(t[esc], minlength=sel.size)
            if (units_for(used) != units[sel]).any():
                _fail(name, "a record's length disagrees with its exception count and escapes")
            lo = (base_pos[blk[t], pos].astype(np.int32) + o.astype(np.int32)[t]) & 0xFF  # the window's low end
            value = lo + _CODE_STEP[w][code]
            if esc.size:
                _, erank = ranks(t[esc], sel.size)
                value[esc] = flat[row[esc] + entries_end[t[esc]] + erank]
                ev, elo = value[esc], lo[esc]
                ehi = elo + ((1 << w) - 1)
                if ((ev >= elo) & (ev <= ehi)).any():
                    _fail(name, "an exception repeats a value its selector could express")
                if ((ev >= elo - BELOW_CODES) & (ev <= ehi + ABOVE_CODES)).any():
                    _fail(name, "an escape holds a value a code reaches")
            if ((value < 0) | (value > 255)).any():
                _fail(name, "an exception code points outside the byte range")
            off = value - lo + o.astype(np.int32)[t]  # from the row base
        elif (units_for(used) != units[sel]).any():
            _fail(name, "a record's length disagrees with its exception count and escapes")
        _check_padding(rec, sel, used, units, name)
        levels[:, sel] = _selector_levels(ks, packed, fields, w, o, n, npad[sel], t, off)
        # the values, in the fields' own array (its last use was above): the window's low end plus the field
        if sel.size == t_count:  # every tile in this mode: broadcast the bases instead of gathering them
            v = fields.reshape(-1, plan.count, size)
            v += base_pos[:, None, :]
            v = fields
        else:
            v = fields
            v += base_pos[blk]
        v += o.astype(np.uint8)[:, None]
        if total:
            v.reshape(-1)[g] = value
        if sel.size == t_count:
            vals = v
        else:
            vals[sel] = v
    raw_sel = np.flatnonzero(mode == MODE_RAW)
    if raw_sel.size:
        if ((h[raw_sel] >> ORIGIN_SHIFT) & 0xFFFF).any():
            _fail(name, "a raw record's header carries an origin or a count")
        if (units[raw_sel] != raw_units(tc)).any():
            _fail(name, "a raw record's length is not the raw length")
        _check_padding(rec, raw_sel, np.full(raw_sel.size, HEADER_BYTES + size), units, name)
        vals[raw_sel] = rec[raw_sel, HEADER_BYTES : HEADER_BYTES + size]
        if vpos is not None and vals[raw_sel][~vpos[raw_sel // plan.count]].any():
            _fail(name, "a raw record stores non-zero bytes for padding slots")
    limits = (npad, bmin, bmax)
    _check_choice(levels, chosen, mode, vals, units, base, valid, limits, plan, windows, base_width, name)
    return vals


def _check_choice(levels, chosen, mode, vals, units, base, valid, limits, plan, windows, base_width, name) -> None:
    """Every selector record has the window the encoder picks and its length; every raw tile has no window
    strictly shorter than the raw record."""
    sel = np.flatnonzero(mode != MODE_RAW)
    if sel.size:
        every = sel.size == mode.size
        npad, bmin, bmax = (a if every else a[sel] for a in limits)
        if not every:
            levels = levels[:, sel]
        if npad.any():
            levels = levels + npad * (np.array(thresholds(windows)) >= 0)[:, None]
        best, raw, want = pick_windows(window_units(levels, npad, bmin, bmax, plan.cols, windows), plan.cols)
        if raw.any() or not (np.array_equal(best, chosen[sel]) and np.array_equal(want, units[sel])):
            _fail(name, "a tile's record is not the shortest its candidate windows give")
    raw_sel = np.flatnonzero(mode == MODE_RAW)
    if raw_sel.size:
        blk = raw_sel // plan.count
        one = ClassPlan(start=plan.start, count=1, cols=plan.cols)  # each raw tile with its own block's bases
        tiles = vals[raw_sel]
        e = offsets(tiles, base[blk], valid[blk], one)
        raw = choose_windows(tiles, e, base[blk], valid[blk], one, windows, base_width)[1]
        if not raw.all():
            _fail(name, "a tile's record is not the shortest its candidate windows give")


# ------------------------------------------------------------------------------------- the row-base check


def base_window_counts(vals: np.ndarray, base: np.ndarray, plan: ClassPlan, width: int) -> np.ndarray:
    """int32 [3, blocks, 128]: per slot, over one class's columns of decoded tiles (``vals``, slot order), how
    many of the row's scales lie at its row base, at its window's top (``base + 2**width - 1``) and in the
    window: what :func:`csf_codec.rowbase.proven_bases` reads. Whole-array passes over tiles still in cache;
    ``vals`` is overwritten (with each scale's offset from its row base). Padding slots count garbage; their rows
    do not exist."""
    nb, span = base.shape[0], 1 << width
    e = vals.reshape(nb, plan.count, TILE_ROWS * plan.cols)
    # from the base, mod 256: in the window exactly when below span (a legal base is <= 256 - span); forged bases
    # wrap, and proven_bases refuses them
    e -= position_bases(base, plan.cols)[:, None, :]
    out = np.empty((3, nb, TILE_ROWS), dtype=np.int32)
    out[0] = _slot_sums(e == 0, plan)
    out[1] = _slot_sums(e == span - 1, plan)
    out[2] = out[0] + out[1] if span == 2 else _slot_sums(e < span, plan)
    return out


_LANES = {4: np.uint32, 2: np.uint16}  # a slot's tc bytes as one element


def position_bases(base: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [blocks, 128 cols]: each slot's row base (int, wrapped to a byte) at each of its positions; a
    multiply for 2 and 4 columns (numpy's repeat and a broadcast size-4 axis are both several times slower)."""
    b = base.astype(np.uint8)
    lane = _LANES.get(cols)
    if lane is None:
        return np.repeat(b, cols, axis=1)
    return (b.astype(lane) * lane(0x01010101 if cols == 4 else 0x0101)).view(np.uint8)


def _slot_sums(flags: np.ndarray, plan: ClassPlan) -> np.ndarray:
    """int32 [blocks, 128]: set flags (bool [blocks, count, 128 tc]) per slot, over the tiles and columns."""
    nb = flags.shape[0]
    lane = _LANES.get(plan.cols)
    if lane is None:
        return flags.reshape(nb, plan.count, TILE_ROWS, plan.cols).sum(axis=(1, 3), dtype=np.int32)
    words = flags.view(lane).reshape(nb, plan.count, TILE_ROWS)
    total = np.zeros((nb, TILE_ROWS), dtype=np.int32)
    step = 255 // plan.cols  # a slot's bytes then add up to at most 255: one multiply folds them
    for a in range(0, plan.count, step):
        part = words[:, a : a + step]
        if part.shape[1] <= 8:  # a few tiles: adds of whole [blocks, 128] slices beat a short reduction
            s = part[:, 0].copy()
            for i in range(1, part.shape[1]):
                s += part[:, i]
        else:
            s = np.add.reduce(part, axis=1, dtype=lane)
        total += (s * lane(0x01010101 if plan.cols == 4 else 0x0101)) >> lane(8 * (plan.cols - 1))
    return total
