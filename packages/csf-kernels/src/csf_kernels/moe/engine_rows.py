"""Torch twin of the engine GEMM's routed rows (``docs/moe-engine.md`` §4.3, §4.6; the kernel side is
:mod:`csf_kernels.moe.kernels.engine_routes`): which row of ``x`` each slot's lane fetches in FC1's producer, which
row of ``out`` each slot's lane stores in FC2's epilogue, and the persistent walk over units, so the index math is
tested on the CPU without a GPU.

Slots are the alignment's block order: slot ``s = b * tile_n + i`` of block ``b < meta[0]`` holds ``sorted_ids[s]``,
a route ``t * top_k + j`` in ``[0, pairs)`` or a value outside it (an empty slot).
"""

from __future__ import annotations

import torch

__all__ = ["LANES", "epi_routes", "gathered_x", "lane_rows", "scattered_rows", "slot_tokens", "unit_walk"]

LANES = 32  # the producer warp (FC1) and the epilogue's store warp (FC2)


def epi_routes(tile_n: int) -> int:
    """Slots an epilogue subtile holds (one a lane of the store warp)."""
    return min(LANES, tile_n)


def lane_rows(tile_n: int, lane: int) -> list[int]:
    """The block rows lane ``lane`` fetches each K step (FC1's producer: ``lane + 32 j``)."""
    return list(range(lane, tile_n, LANES))


def slot_tokens(sorted_ids: torch.Tensor, top_k: int, tokens: int) -> torch.Tensor:
    """Each slot's token row (``route // top_k``), or ``tokens`` (past ``x``: TMA loads zeros) for an empty slot:
    ``engine_routes.route_token``."""
    ids = sorted_ids.to(torch.int64)
    token = ids.clamp(min=0) // top_k
    return torch.where((ids < 0) | (token >= tokens), torch.full_like(token, tokens), token)


def gathered_x(x: torch.Tensor, sorted_ids: torch.Tensor, blocks: int, tile_n: int, top_k: int) -> torch.Tensor:
    """FC1's B operand of blocks ``[0, blocks)`` as its stages hold it, ``[blocks * tile_n, K]``: slot ``s``'s token
    row of ``x``, zeros for an empty slot."""
    tokens = x.shape[0]
    rows = slot_tokens(sorted_ids[: blocks * tile_n], top_k, tokens)
    padded = torch.cat([x, x.new_zeros(1, x.shape[1])])  # the out-of-bounds row TMA fills with zeros
    return padded[rows]


def scattered_rows(
    y_slots: torch.Tensor, sorted_ids: torch.Tensor, blocks: int, tile_n: int, out: torch.Tensor
) -> torch.Tensor:
    """FC2's epilogue into ``out [pairs, R]``: per subtile of :func:`epi_routes` slots, lane ``l`` stores slot
    ``l``'s row at its route, an empty slot storing nothing. Returns how many times each row of ``out`` was
    stored."""
    stores = torch.zeros(out.shape[0], dtype=torch.int64)
    epi_n = epi_routes(tile_n)
    for b in range(blocks):
        for e in range(tile_n // epi_n):
            for lane in range(epi_n):
                slot = b * tile_n + e * epi_n + lane
                route = int(sorted_ids[slot])
                if 0 <= route < out.shape[0]:
                    out[route] = y_slots[slot]
                    stores[route] += 1
    return stores


def unit_walk(blocks: int, tiles_m: int, ctas: int) -> list[list[tuple[int, int]]]:
    """The units ``(block, row tile)`` each persistent CTA takes: ``u = cta, cta + ctas, ...`` below
    ``blocks * tiles_m``."""
    return [[divmod(u, tiles_m) for u in range(c, blocks * tiles_m, ctas)] for c in range(ctas)]
