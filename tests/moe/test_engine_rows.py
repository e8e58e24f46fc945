"""The torch twin of the engine GEMM's routed rows (``csf_kernels.moe.engine_rows``) on hand-made slots: what FC1's
producer threads fetch and FC2's consumer threads store, empty and out-of-range slots inert (CPU)."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.moe.engine_rows import (
    DECODER_WARPS,
    GATHER_WARPS,
    OUT_CHUNKS,
    ROW_CHUNKS,
    STORE_THREADS,
    epi_routes,
    gather_chunks,
    gathered_x,
    scatter_chunks,
    scattered_rows,
    slot_tokens,
    unit_walk,
)


def test_slot_tokens_send_every_empty_or_foreign_slot_past_x():
    tokens, top_k = 5, 3  # 15 routes
    ids = torch.tensor([0, 2, 3, 14, 15, -1, 1 << 30, -(1 << 31), 7], dtype=torch.int32)
    assert slot_tokens(ids, top_k, tokens).tolist() == [0, 0, 1, 4, 5, 5, 5, 5, 2]


def test_gathered_x_is_block_order_with_zero_rows():
    x = torch.arange(4 * 3, dtype=torch.float32).view(4, 3) + 1
    ids = torch.tensor([5, 0, 8, 8, 1, 6, 8, 8, 99, 99], dtype=torch.int32)  # top-2 of 4 tokens: 8 routes
    xs = gathered_x(x, ids, blocks=2, tile_n=4, top_k=2)
    assert xs.shape == (8, 3)
    assert torch.equal(xs[[0, 1, 4, 5]], x[[2, 0, 0, 3]])
    assert not xs[[2, 3, 6, 7]].any()  # sentinel slots: zeros; slots of unused blocks are never fetched


@pytest.mark.parametrize("source", sorted(GATHER_WARPS))
def test_threads_copy_every_chunk_of_a_stage_and_a_subtile_once_at_every_tile_size(source):
    threads = 32 * len(GATHER_WARPS[source])  # inline: warp 0 alone (warps 1-3 decode records)
    assert GATHER_WARPS[source][0] == 0
    assert not set(GATHER_WARPS[source]) & set(DECODER_WARPS) or source == "native"
    for tile_n in (16, 32, 64, 128, 256):
        got = sorted(rc for t in range(threads) for rc in gather_chunks(tile_n, t, threads))
        assert got == [(i, c) for i in range(tile_n) for c in range(ROW_CHUNKS)]  # each row's 128 bytes, once
        for w in range(threads // 32):  # each gathering warp: four whole rows an instruction
            warp = [rc for t in range(32 * w, 32 * w + 32) for rc in gather_chunks(tile_n, t, threads)[:1]]
            assert sorted({i for i, _ in warp}) == [4 * w + r for r in range(4)] and len(set(warp)) == 32
        stored = sorted(nc for t in range(STORE_THREADS) for nc in scatter_chunks(tile_n, t))
        assert stored == [(n, c) for n in range(epi_routes(tile_n)) for c in range(OUT_CHUNKS)]
        assert tile_n % epi_routes(tile_n) == 0


def test_scatter_stores_each_route_once_and_nothing_for_empty_slots():
    pairs, tile_n = 6, 16
    ids = torch.full((3 * tile_n,), pairs, dtype=torch.int32)  # the alignment's sentinel
    ids[[0, 3, 17, 18, 40]] = torch.tensor([4, 0, 5, 1, 2], dtype=torch.int32)
    ids[20], ids[21] = -1, pairs + 9  # out of range either side: stored nowhere
    y_slots = torch.arange(3 * tile_n, dtype=torch.float32)[:, None].expand(-1, 2).contiguous()
    out = torch.full((pairs, 2), float("nan"))
    stores = scattered_rows(y_slots, ids, blocks=2, tile_n=tile_n, out=out)  # block 2 unused: slot 40 stays out
    assert stores.tolist() == [1, 1, 0, 0, 1, 1]
    assert out[:, 0].nan_to_num(-1).tolist() == [3, 18, -1, -1, 0, 17]


def test_unit_walk_takes_every_unit_once_whatever_the_grid():
    for blocks, tiles_m, ctas in [(0, 3, 4), (1, 45, 132), (37, 23, 132), (300, 2, 7)]:
        walked = [u for cta in unit_walk(blocks, tiles_m, ctas) for u in cta]
        assert sorted(walked) == [(b, t) for b in range(blocks) for t in range(tiles_m)]
