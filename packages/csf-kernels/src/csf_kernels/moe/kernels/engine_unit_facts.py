"""What the consumers of the engine's grouped GEMM need to know about a unit before its first wgmma, published by the
producer warp (``docs/moe-engine.md`` §7).

A unit's consumers used to read these themselves at its start: the block's route ids (its live extent, for ragged
blocks), the block's expert and then its row blocks' one-multiply flags (MXFP4) or its global scale (NVFP4): two
dependent L2 reads, a few thousand cycles before the first wgmma, every unit. The producer warp reaches a unit a ring's
depth of stages earlier: it reads them there, where the latency hides under the consumers' MMAs, and writes one word a
fact into the unit's first stage's slot (``FACT_WORDS`` Int32 a stage) before it arrives on that stage's full barrier,
whose arrival releases them; a consumer reads them after its wait on the stage, which acquires them. A stage's slot is
reused only once the stage is, so the ring's own barriers order every write and read.

Word 0: the live extent (one past the block's last live slot; ``TILE_N`` where every block is whole) in bits 0-15,
row block 0's one-multiply flag in bit 16, row block 1's in bit 17. Word 1: NVFP4's global scale of the block's expert
(float32 bits; 1.0 for an invalid block).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

__all__ = ["FACT_WORDS", "UnitFacts", "live_extent"]

FACT_WORDS = 2


@cute.jit
def live_extent(sorted_ids, pairs, b, tile_n: cutlass.Constexpr, lane):
    """One past block ``b``'s last live slot (a route id in ``[0, pairs)``; 0 for none), computed by a whole warp
    from ``sorted_ids`` (traced inline): ``tile_n / 32`` loads a lane and a ballot each. ``pairs`` 0 (no route ids:
    a dense GEMM) reads nothing and is the whole block."""
    extent = cutlass.Int32(tile_n)
    if pairs > 0:
        extent = cutlass.Int32(0)
        for j in cutlass.range_constexpr(tile_n // 32):
            route = sorted_ids[b * tile_n + j * 32 + lane]
            live = cute.arch.vote_ballot_sync((route >= 0) & (route < pairs))
            if live != 0:
                extent = cutlass.Int32(j * 32 + 32) - cutlass.Int32(cute.arch.clz(live))
    return extent


class UnitFacts:
    """The facts of one program (its configuration read as attributes: the DSL carries no Python object through a
    dynamic loop): ``tile_n`` routes a unit, ``ragged`` whether the extent is needed, ``nvfp4`` the format."""

    def __init__(self, tile_n: int, ragged: bool, nvfp4: bool):
        self.tile_n = tile_n
        self.ragged = ragged
        self.nvfp4 = nvfp4

    @cute.jit
    def publish(self, slot, operands, b, tm, lane):
        """The producer warp, all 32 lanes (traced inline): unit ``(b, tm)``'s facts into ``slot`` (Int32
        ``[FACT_WORDS]``, its first stage's), by lane 0, then a warp barrier, so that the warp's arrival on the
        stage's full barrier releases them. ``operands``: ``(sorted_ids, pairs, block_expert, wide, gscale,
        experts)``. Returns the live extent (warp-uniform)."""
        sorted_ids, pairs, block_expert, wide, gscale, experts = operands
        extent = cutlass.Int32(self.tile_n)
        if cutlass.const_expr(self.ragged):
            extent = live_extent(sorted_ids, pairs, b, self.tile_n, lane)
        e = block_expert[b]
        inside = cutlass.min(cutlass.max(e, 0), experts - 1)
        word0 = extent
        g = cutlass.Float32(1.0)
        if cutlass.const_expr(self.nvfp4):
            g = gscale[inside]
            if inside != e:
                g = cutlass.Float32(1.0)
        else:
            # a 64-row block takes one multiply a pair unless a scale byte there is 129..254
            blocks = cute.size(wide, mode=[1])
            for rb in cutlass.range_constexpr(2):
                if wide[(inside, cutlass.min(tm * 2 + rb, blocks - 1))] == 0:
                    word0 = word0 | cutlass.Int32(1 << (16 + rb))
        if lane == 0:
            slot[0] = word0
            cute.recast_tensor(slot, cutlass.Float32)[1] = g
        cute.arch.sync_warp()
        return extent

    @cute.jit
    def read(self, slot, row_block):
        """A consumer thread (traced inline), after its wait on the unit's first stage: (extent, this warpgroup's
        one-multiply flag, NVFP4's global scale)."""
        word0 = slot[0]
        extent = word0 & 0xFFFF
        one = ((word0 >> (16 + row_block)) & 1) != 0
        g = cutlass.Float32(1.0)
        if cutlass.const_expr(self.nvfp4):
            g = cute.recast_tensor(slot, cutlass.Float32)[1]
        return extent, one, g
