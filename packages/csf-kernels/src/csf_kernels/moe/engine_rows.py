"""Torch twin of the engine GEMM's routed rows (``docs/moe-engine.md`` §4.3, §4.6; the kernel side is
:mod:`csf_kernels.moe.kernels.engine_routes`): which row of ``x`` each slot fetches in FC1's producer and which
16-byte chunks each producer thread copies, which row of ``out`` each slot stores in FC2's epilogue and which
chunks each consumer thread stores, and the persistent walk over units, so the index math is tested on the CPU
without a GPU.

Slots are the alignment's block order: slot ``s = b * tile_n + i`` of block ``b < meta[0]`` holds ``sorted_ids[s]``,
a route ``t * top_k + j`` in ``[0, pairs)`` or a value outside it (an empty slot).
"""

from __future__ import annotations

import torch

from csf_kernels.moe.engine_specs import ENGINE_TILE_K, ENGINE_TILE_M

__all__ = [
    "CHUNK",
    "DECODER_WARPS",
    "GATHER_THREADS",
    "GATHER_WARPS",
    "OUT_CHUNKS",
    "ROW_CHUNKS",
    "STORE_THREADS",
    "epi_routes",
    "gather_chunks",
    "gathered_x",
    "scatter_chunks",
    "scattered_rows",
    "slot_tokens",
    "unit_walk",
]

CHUNK = 16  # bytes a copy: cp.async (FC1), a vector store (FC2)
# the producer warps gathering each B stage's rows, by scale source: the whole warpgroup, or warp 0 (the TMA warp)
# alone beside the inline source's decoder warps
GATHER_WARPS = {"native": (0, 1, 2, 3), "inline": (0,)}
GATHER_THREADS = 32 * len(GATHER_WARPS["native"])
# the inline source's decoder warps: records are dealt round-robin to producer warps 1-3, one warp a scheduler beside
# the consumers' eight (a lone decoder warp left its scheduler's two consumer warps short of issue slots, and each
# wgmma waits for its warpgroup's slowest warp)
DECODER_WARPS = (1, 2, 3)
ROW_CHUNKS = ENGINE_TILE_K * 2 // CHUNK  # chunks a slot's bf16 row of a stage
STORE_THREADS = 256  # the consumer warpgroups store FC2's rows
OUT_CHUNKS = ENGINE_TILE_M * 2 // CHUNK  # chunks a slot's bf16 row of an output tile
EPI_SLOTS = 32  # slots an epilogue subtile holds at most


def epi_routes(tile_n: int) -> int:
    """Slots an epilogue subtile holds."""
    return min(EPI_SLOTS, tile_n)


def gather_chunks(tile_n: int, thread: int, threads: int = GATHER_THREADS) -> list[tuple[int, int]]:
    """The (block row, 16-byte chunk) pairs gathering rank ``thread`` of ``threads`` copies each K step: chunk
    ``thread % 8`` of rows ``thread // 8 + (threads / 8) j`` (a warp covers four whole 128-byte rows an
    instruction)."""
    per = threads // ROW_CHUNKS
    return [(i, thread % ROW_CHUNKS) for i in range(thread // ROW_CHUNKS, tile_n, per)]


def scatter_chunks(tile_n: int, thread: int) -> list[tuple[int, int]]:
    """The (subtile slot, 16-byte chunk) pairs consumer thread ``thread`` stores per epilogue subtile: chunk
    ``thread % 16`` of slots ``thread // 16 + 16 j`` (16 threads a slot's 256-byte row)."""
    per = STORE_THREADS // OUT_CHUNKS
    return [(n, thread % OUT_CHUNKS) for n in range(thread // OUT_CHUNKS, epi_routes(tile_n), per)]


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
    """FC2's epilogue into ``out [pairs, R]``: per subtile of :func:`epi_routes` slots, each slot's row at its route,
    an empty slot storing nothing. Returns how many times each row of ``out`` was stored."""
    stores = torch.zeros(out.shape[0], dtype=torch.int64)
    epi_n = epi_routes(tile_n)
    for b in range(blocks):
        for e in range(tile_n // epi_n):
            for n in range(epi_n):
                slot = b * tile_n + e * epi_n + n
                route = int(sorted_ids[slot])
                if 0 <= route < out.shape[0]:
                    out[route] = y_slots[slot]
                    stores[route] += 1
    return stores


def unit_walk(blocks: int, tiles_m: int, ctas: int) -> list[list[tuple[int, int]]]:
    """The units ``(block, row tile)`` each persistent CTA takes: ``u = cta, cta + ctas, ...`` below
    ``blocks * tiles_m``."""
    return [[divmod(u, tiles_m) for u in range(c, blocks * tiles_m, ctas)] for c in range(ctas)]
