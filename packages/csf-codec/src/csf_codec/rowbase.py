"""The per-row base byte: the one place that decides it.

A row's base for offset width ``w`` is the smallest ``b`` in ``[0, 256 - 2**w]`` that maximises how many
of the row's scale bytes lie in the window ``[b, b + 2**w - 1]``. Keeping the window inside the byte
range means decoders add offsets to bases without carries or wrap-around. The rule depends only on the
row's own bytes, so slicing rows (tensor parallelism along N) never changes a row's base.
"""

from __future__ import annotations

import numpy as np
import torch

from .swar import map_spans, row_counts

__all__ = ["row_bases", "row_bases_for_widths", "row_bases_np"]

_ROWS_PER_CHUNK = 1 << 15  # bounds the [rows, 256] histogram to 32 MiB of int32


def row_bases_for_widths(rows: torch.Tensor, widths: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Bases (uint8 [R]) of a uint8 [R, C] plane for each offset width, from one histogram pass."""
    if rows.dtype != torch.uint8 or rows.dim() != 2:
        raise TypeError(f"row_bases expects a uint8 [rows, columns] tensor, got {rows.dtype} {tuple(rows.shape)}")
    if rows.device.type == "cpu":
        return {w: torch.from_numpy(b) for w, b in row_bases_np(rows.numpy(), widths).items()}
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


def row_bases(rows: torch.Tensor, width: int) -> torch.Tensor:
    return row_bases_for_widths(rows, (width,))[width]


_FAST_RANGE = 16  # rows whose bytes span fewer values take the level-count path
_SCALES_PER_PASS = 1 << 20


def row_bases_np(rows: np.ndarray, widths: tuple[int, ...]) -> dict[int, np.ndarray]:
    """:func:`row_bases_for_widths` on a uint8 [R, C] numpy array, by whole-array byte passes.

    For a row of minimum ``m`` whose bytes span fewer than 16 values, ``le[k]`` (how many bytes are
    ``<= m + k``) for the few levels present gives every window count: the window at ``m + j`` holds
    ``le[j + 2**w - 1] - le[j - 1]``; windows starting below ``m - 2**w + 1`` or above the row's maximum
    hold nothing. Wider rows (rare: NaN bytes, zero rows beside normal ones) take the histogram path.
    """
    r, c = rows.shape
    out = {w: np.zeros(r, dtype=np.uint8) for w in widths}
    if c == 0 or r == 0:
        return out
    step = max(1, _SCALES_PER_PASS // c)
    count_t = np.int16 if c < 1 << 15 else np.int64
    cp = -(-c // 8) * 8

    def one(start: int) -> None:
        x = rows[start : start + step]
        lo, hi = _row_min_max(x)
        spread = hi - lo
        fast = spread < _FAST_RANGE
        levels = int(spread[fast].max()) + 1 if fast.any() else 0
        rel = np.full((x.shape[0], cp), 255, dtype=np.uint8)
        np.subtract(x, lo[:, None], out=rel[:, :c])
        # le[k] = bytes <= lo + k; below lo none, from the row's own maximum on all C
        le = [row_counts(rel <= k).astype(count_t) for k in range(levels - 1)]
        full = np.full(x.shape[0], c, dtype=count_t)
        lo16 = lo.astype(np.int16)
        for w in widths:
            span = 1 << w
            best_n = np.full(x.shape[0], -1, dtype=count_t)
            best_j = np.zeros(x.shape[0], dtype=np.int16)
            for j in range(-(span - 1), max(levels, 1)):
                top, below = j + span - 1, j - 1
                n = le[top] if top < len(le) else full
                if below >= 0:
                    n = n - (le[below] if below < len(le) else full)
                b_ok = (lo16 + j >= 0) & (lo16 + j <= 256 - span)
                better = b_ok & (n > best_n)  # strict: the smallest base wins ties
                best_n[better] = n[better]
                best_j[better] = j
            out[w][start : start + x.shape[0]] = (lo16 + best_j).astype(np.uint8)
        if not fast.all():
            slow = np.flatnonzero(~fast)
            got = _row_bases_torch(torch.from_numpy(np.ascontiguousarray(x[slow])), widths)
            for w in widths:
                out[w][start + slow] = got[w].numpy()

    map_spans(one, range(0, r, step))
    return out


def _row_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row minimum and maximum; narrow rows go column by column (numpy's row reductions are slow there)."""
    if x.shape[1] > 32:
        return x.min(axis=1), x.max(axis=1)
    lo, hi = x[:, 0].copy(), x[:, 0].copy()
    for i in range(1, x.shape[1]):
        np.minimum(lo, x[:, i], out=lo)
        np.maximum(hi, x[:, i], out=hi)
    return lo, hi
