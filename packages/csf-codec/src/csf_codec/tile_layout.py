"""The inline CSF tile layout: the one place that says which plane row sits in which record slot.

A tile covers 128 rows x 4 scale columns (K = 128 weights per MXFP4 stage, 64 per NVFP4 stage). Its
128 rows are stored in *slot order*, the order in which a Hopper consumer warpgroup holds them in its
wgmma A-operand fragments when the weights are the A operand (M = weight rows):

    slot = 32 * warp + 4 * quad + 2 * half + pair           (warp 0..3, quad = lane // 4 in 0..7)
    row  = 64 * half + 16 * warp + quad + 8 * pair

``half`` picks the m64 sub-tile, ``pair`` the fragment's second row (+8). The four lanes of a quad share
rows, so each quad's four rows are four consecutive slots: a thread reads its rows' bases with one
32-bit load, its selectors with one 16/32/64-bit load, and a raw tile's native words as one 16-byte
load. Rows are tiled within *row groups* (by default one expert's N rows; W13 may be tiled as two
groups, gate and up, so that each half has its own 64-row tail); the last block of a group may be
partial (its padding slots read as zero). When the columns do not split into fours, the last column
tile is a *tail tile* of ``cols % 4`` columns with its own, smaller records, so a K tail costs only
what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from .errors import ShapeMismatchError

__all__ = ["TILE_COLS", "TILE_ROWS", "TILE_SCALES", "InlineGeometry", "row_to_slot", "slot_to_row"]

TILE_ROWS = 128
TILE_COLS = 4
TILE_SCALES = TILE_ROWS * TILE_COLS
MAX_ROW_GROUP = 1 << 20


def slot_to_row(slot: int) -> int:
    warp, quad, half, pair = slot >> 5, (slot >> 2) & 7, (slot >> 1) & 1, slot & 1
    return 64 * half + 16 * warp + quad + 8 * pair


def row_to_slot(row: int) -> int:
    half, warp, rest = row >> 6, (row >> 4) & 3, row & 15
    quad, pair = rest & 7, rest >> 3
    return 32 * warp + 4 * quad + 2 * half + pair


_SLOT_ROWS = tuple(slot_to_row(s) for s in range(TILE_ROWS))
assert sorted(_SLOT_ROWS) == list(range(TILE_ROWS))
assert all(row_to_slot(slot_to_row(s)) == s for s in range(TILE_ROWS))


@dataclass(frozen=True, kw_only=True)
class InlineGeometry:
    """How a plane of ``experts`` x ``rows`` x ``cols`` scales is cut into inline tiles."""

    experts: int
    rows: int  # N: rows per expert
    cols: int  # KB: scale columns
    row_group: int  # rows per tiling group; divides ``rows``

    @classmethod
    def for_shape(cls, shape: tuple[int, ...], row_group: int | None = None, *, name: str = "scales") -> InlineGeometry:
        if len(shape) not in (2, 3):
            raise ShapeMismatchError(name, f"a scale plane is [N, KB] or [E, N, KB]; got {shape}")
        e, n, c = (1, *shape) if len(shape) == 2 else shape
        g = n if row_group is None else int(row_group)
        if n and (g <= 0 or n % g):
            raise ShapeMismatchError(name, f"row group {g} does not divide the {n} rows per expert")
        if g >= MAX_ROW_GROUP:
            raise ShapeMismatchError(
                name, f"row group {g} exceeds the inline format's limit of {MAX_ROW_GROUP - 1} rows"
            )
        return cls(experts=e, rows=n, cols=c, row_group=g if n else 1)

    @property
    def groups(self) -> int:
        return self.experts * (self.rows // self.row_group) if self.rows else 0

    @property
    def blocks_per_group(self) -> int:
        return -(-self.row_group // TILE_ROWS)

    @property
    def row_blocks(self) -> int:
        return self.groups * self.blocks_per_group

    @property
    def col_tiles(self) -> int:
        return -(-self.cols // TILE_COLS)

    @property
    def tiles(self) -> int:
        return self.row_blocks * self.col_tiles

    @property
    def full_col_tiles(self) -> int:
        return self.cols // TILE_COLS

    @property
    def tail_cols(self) -> int:
        """Columns of the last, partial column tile (0 when the columns split evenly)."""
        return self.cols % TILE_COLS

    @cached_property
    def _block_rows_cpu(self) -> torch.Tensor:
        slot_rows = torch.tensor(_SLOT_ROWS, dtype=torch.int64)
        block = torch.arange(self.row_blocks, dtype=torch.int64)
        group, within = block // self.blocks_per_group, block % self.blocks_per_group
        local = within[:, None] * TILE_ROWS + slot_rows[None, :]
        rows = group[:, None] * self.row_group + local
        return torch.where(local < self.row_group, rows, torch.full_like(rows, -1))

    def block_rows(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """int64 [row_blocks, 128]: the flattened plane row of each slot, or -1 for padding."""
        return self._block_rows_cpu.to(device)
