"""The per-row base byte: the one place that decides it.

A row's base for offset width ``w`` is the smallest ``b`` in ``[0, 256 - 2**w]`` that maximises how many
of the row's scale bytes lie in the window ``[b, b + 2**w - 1]``. Keeping the window inside the byte
range means decoders add offsets to bases without carries or wrap-around. The rule depends only on the
row's own bytes, so slicing rows (tensor parallelism along N) never changes a row's base.
"""

from __future__ import annotations

import numpy as np
import torch

from .swar import grouped_histogram, map_spans

__all__ = ["proven_bases", "row_bases", "row_bases_c", "row_bases_for_widths", "row_bases_np"]

_ROWS_PER_CHUNK = 1 << 15  # bounds the [rows, 256] histogram to 32 MiB of int32


def row_bases_for_widths(rows: torch.Tensor, widths: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Bases (uint8 [R]) of a uint8 [R, C] plane for each offset width, from one histogram pass."""
    if rows.dtype != torch.uint8 or rows.dim() != 2:
        raise TypeError(f"row_bases expects a uint8 [rows, columns] tensor, got {rows.dtype} {tuple(rows.shape)}")
    if rows.device.type == "cpu":
        return {w: torch.from_numpy(b) for w, b in row_bases_c(rows.numpy(), widths).items()}
    return _row_bases_torch(rows, widths)


def _row_bases_torch(rows: torch.Tensor, widths: tuple[int, ...]) -> dict[int, torch.Tensor]:
    out = {w: torch.empty(rows.shape[0], dtype=torch.uint8, device=rows.device) for w in widths}
    if rows.shape[1] == 0:
        for t in out.values():
            t.zero_()
        return out
    for start in range(0, rows.shape[0], _ROWS_PER_CHUNK):
        chunk = rows[start : start + _ROWS_PER_CHUNK].long()
        hist = torch.zeros(chunk.shape[0], 257, dtype=torch.int32, device=rows.device)
        hist[:, 1:].scatter_add_(1, chunk, torch.ones_like(chunk, dtype=torch.int32))
        cum = hist.cumsum(dim=1, dtype=torch.int32)  # cum[:, v + 1] = count of bytes <= v
        for w in widths:
            span = 1 << w
            window = cum[:, span:] - cum[:, : 257 - span]  # window[:, b] = count in [b, b + span - 1]
            out[w][start : start + chunk.shape[0]] = window.argmax(dim=1).to(torch.uint8)
    return out


def row_bases_c(rows: np.ndarray, widths: tuple[int, ...]) -> dict[int, np.ndarray]:
    """:func:`row_bases_np` (the reference) on the C extension: one pass a row for every width, rows in two
    halves on the span workers (the GIL released)."""
    from .native import native

    nat = native()
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    r, c = rows.shape
    out = {w: np.empty(r, dtype=np.uint8) for w in widths}
    ws, outs = list(out), list(out.values())
    step = max(1, min(-(-r // 2), _SCALES_PER_PASS // max(c, 1)))
    map_spans(lambda a: nat.row_bases(rows, ws, outs, a, min(a + step, r), c), range(0, r, step))
    return out


def row_bases(rows: torch.Tensor, width: int) -> torch.Tensor:
    return row_bases_for_widths(rows, (width,))[width]


_SCALES_PER_PASS = 1 << 20


def row_bases_np(rows: np.ndarray, widths: tuple[int, ...]) -> dict[int, np.ndarray]:
    """:func:`row_bases_for_widths` on a uint8 [R, C] numpy array, by whole-array byte passes.

    A row whose bytes span fewer than ``2**w`` values fits one window whole, so its base is the smallest
    such window's start, ``max(0, max - 2**w + 1)``: most rows are settled by their minimum and maximum.
    For the others, of minimum ``m`` and bytes spanning ``L <= 32`` values, ``le[k]`` (how many bytes
    are ``<= m + k``) for ``k < L`` gives every window count: the window at ``m + j`` holds
    ``le[j + 2**w - 1] - le[j - 1]``; windows starting below ``m - 2**w + 1`` or above the row's maximum
    hold nothing. Those rows are grouped by spread so that narrow rows pay for few levels; wider rows
    (NaN bytes, zero rows beside normal ones, NVFP4 rows with outlier blocks) take a full histogram.
    """
    r, c = rows.shape
    out = {w: np.zeros(r, dtype=np.uint8) for w in widths}
    if c == 0 or r == 0:
        return out
    step = max(1, _SCALES_PER_PASS // c)

    def one(start: int) -> None:
        x = rows[start : start + step]
        xt = np.ascontiguousarray(x.T) if c < _NARROW else None  # narrow rows: transposed once, for every pass
        lo, hi = (xt.min(axis=0), xt.max(axis=0)) if xt is not None else (x.min(axis=1), x.max(axis=1))
        for w in widths:  # every row that one window holds whole; the others are overwritten below
            out[w][start : start + x.shape[0]] = np.maximum(hi, (1 << w) - 1) - ((1 << w) - 1)
        hard = np.flatnonzero(hi - lo >= 1 << min(widths))
        if not hard.size:
            return
        lo, spread = lo[hard], hi[hard] - lo[hard]
        groups = np.searchsorted(np.array(_SPREAD_GROUPS), spread, side="right")
        if max(widths) > 4:  # windows wider than the level table's padding: histograms for every row
            groups[:] = len(_SPREAD_GROUPS)
        for g in range(len(_SPREAD_GROUPS) + 1):
            pick = np.flatnonzero(groups == g)
            if not pick.size:
                continue
            at = hard[pick]
            if g == len(_SPREAD_GROUPS):
                got = _histogram_bases(x[at], widths)
            else:
                levels = int(spread[pick].max()) + 1
                if levels > _LEVEL_PASSES:
                    le = _histogram_level_counts(x[at], lo[pick], levels)
                else:
                    cols = np.take(xt, at, axis=1) if xt is not None else np.ascontiguousarray(x[at].T)
                    le = _level_counts(cols, lo[pick], levels)
                got = _level_bases(le, lo[pick], levels, widths)
            for w, b in got.items():
                out[w][start + at] = b

    map_spans(one, range(0, r, step))
    return out


def proven_bases(base: np.ndarray, at_base, at_top, inside, cols: int, width: int) -> np.ndarray:
    """bool: where three counts of a row's scales prove ``base`` (int) its base for width ``w``, without the row:
    how many lie ``at_base``, at the ``at_top`` of its window (``base + 2**w - 1``) and ``inside`` it.

    With ``W = 2**w`` and ``outside = cols - inside``: a window starting ``b < base`` holds at most
    ``outside + inside - at_top`` (it misses the window's top), so fewer than ``inside`` when ``at_top >
    outside``; one starting ``b > base`` holds at most ``inside - at_base + outside``, so no more when ``at_base
    >= outside``. Where neither side has a legal window (``base`` 0, or ``256 - W``) its condition falls away.
    False proves nothing: the caller takes such rows' bases from :func:`row_bases_np`."""
    span = 1 << width
    outside = cols - inside
    ok = (base >= 0) & (base <= 256 - span)
    ok &= (base == 0) | (at_top > outside)
    ok &= (base == 256 - span) | (at_base >= outside)
    return ok


_SPREAD_GROUPS = (3, 15, 31)  # rows spreading over at most 4, 16, 32 values; wider rows: histogram


def _level_bases(le: np.ndarray, lo: np.ndarray, levels: int, widths: tuple[int, ...]) -> dict[int, np.ndarray]:
    """Bases of rows spanning at most ``levels`` values from their level counts ``le`` (:func:`_level_counts`),
    for each width whose window some of them overflow (the others keep the one-window base).

    Relative to the row's minimum, a window at ``j < 0`` holds ``le[j + W - 1] <= le[W - 1]``, and one past
    ``levels - W`` holds ``C - le[j - 1]``, no more than the last window before it: only ``j`` in ``[0, levels -
    W]`` can win, chosen with rows along the last axis (numpy reduces short rows one at a time) by one maximum.
    Where ``j = 0`` wins, the smallest window holding as many starts at ``k - W + 1``, ``k`` the largest level
    below ``W`` that the row occupies (the byte range cuts it off at 0); every winner stays below ``256 - W``,
    as the row's maximum does."""
    c = int(le[-1, 0])  # the rows' scales
    key_t = np.int16 if c < 1 << 9 else np.int32 if c < 1 << 25 else np.int64
    out = {}
    for w in widths:
        span = 1 << w
        last = levels - span  # the last window that can win
        if last < 0:
            continue
        lows = le[_PAD - 1 : _PAD + last]  # le[j - 1]
        tops = le[_PAD + span - 1 : _PAD + last + span]  # le[j + W - 1]
        # one maximum over count * 64 + (63 - j): the most scales, then the smallest base
        key = (tops - lows).astype(key_t) * key_t(64) + (63 - np.arange(last + 1, dtype=key_t))[:, None]
        best = 63 - (key.max(axis=0) & 63)
        occupied = span - np.add.reduce(le[_PAD : _PAD + span] == tops[0], axis=0, dtype=np.int16)
        below = np.maximum(lo.astype(np.int16) + occupied - (span - 1), 0)
        out[w] = np.where(best == 0, below, lo + best).astype(np.uint8)
    return out


_PAD = 16  # le columns below lo and above the widest window's top


def _level_counts(cols: np.ndarray, lo: np.ndarray, levels: int) -> np.ndarray:
    """``le`` [2 * _PAD + levels, rows]: ``le[_PAD + k]`` = a row's bytes <= lo + k; none below lo, all C
    from the row's own maximum on. Counted over the transposed rows (``cols``, uint8 [C, rows]), column against
    column, in the narrowest count type that holds C; ``cols`` (a copy) is overwritten."""
    c, n_rows = cols.shape
    count_t = _count_type(c)
    rel = cols
    rel -= lo  # bytes relative to the row's minimum: no wrap
    le = np.empty((2 * _PAD + levels, n_rows), dtype=count_t)
    le[:_PAD] = 0
    le[_PAD + levels - 1 :] = c
    flags = np.empty(rel.shape, dtype=bool)
    for k in range(levels - 1):
        np.less_equal(rel, k, out=flags)
        np.add.reduce(flags, axis=0, dtype=count_t, out=le[_PAD + k])
    return le


def _count_type(c: int):
    return np.uint8 if c < 1 << 8 else np.uint16 if c < 1 << 16 else np.int64


_LEVEL_PASSES = 16  # rows spreading over more levels are counted by a histogram, not a pass a level


def _histogram_level_counts(x: np.ndarray, lo: np.ndarray, levels: int) -> np.ndarray:
    """:func:`_level_counts` from one histogram of each row's ``byte - lo``, summed up."""
    n_rows, c = x.shape
    count_t = _count_type(c)
    le = np.empty((2 * _PAD + levels, n_rows), dtype=count_t)
    le[:_PAD] = 0
    le[_PAD : _PAD + levels] = np.cumsum(grouped_histogram(x, levels, lo), axis=1).T
    le[_PAD + levels :] = c
    return le


def _histogram_bases(x: np.ndarray, widths: tuple[int, ...]) -> dict[int, np.ndarray]:
    """Bases of wide rows from full 256-bin histograms (one bincount over row-offset keys)."""
    n = x.shape[0]
    keys = (np.arange(n, dtype=np.int64) << 8)[:, None] + x
    cum = np.zeros((n, 257), dtype=np.int32)
    np.cumsum(np.bincount(keys.reshape(-1), minlength=n << 8).reshape(n, 256), axis=1, out=cum[:, 1:])
    return {w: (cum[:, 1 << w :] - cum[:, : 257 - (1 << w)]).argmax(axis=1).astype(np.uint8) for w in widths}


_NARROW = 128  # rows narrower than this are transposed: numpy reduces short rows one at a time
