"""The per-row base byte: the one place that decides it.

A row's base for offset width ``w`` is the smallest ``b`` in ``[0, 256 - 2**w]`` that maximises how many
of the row's scale bytes lie in the window ``[b, b + 2**w - 1]``. Keeping the window inside the byte
range means decoders add offsets to bases without carries or wrap-around. The rule depends only on the
row's own bytes, so slicing rows (tensor parallelism along N) never changes a row's base.
"""

from __future__ import annotations

import torch

__all__ = ["row_bases", "row_bases_for_widths"]

_ROWS_PER_CHUNK = 1 << 15  # bounds the [rows, 256] histogram to 32 MiB of int32


def row_bases_for_widths(rows: torch.Tensor, widths: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Bases (uint8 [R]) of a uint8 [R, C] plane for each offset width, from one histogram pass."""
    if rows.dtype != torch.uint8 or rows.dim() != 2:
        raise TypeError(f"row_bases expects a uint8 [rows, columns] tensor, got {rows.dtype} {tuple(rows.shape)}")
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
