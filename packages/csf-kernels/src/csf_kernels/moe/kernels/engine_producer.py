"""The producer side of the engine's grouped GEMMs (``docs/moe-engine.md`` §4.2-4.3), shared by the FP4 x bf16 GEMM
(:mod:`~csf_kernels.moe.kernels.engine_gemm`) and the W4A8 one (:mod:`~csf_kernels.moe.kernels.engine_gemm_fp8`):
the ring of stages, the units a launch walks, and warp 0's walk filling the ring by TMA.

A unit is (route block ``b``, 128-row tile ``tm``), ``u = b * tiles_m + tm``; CTA ``c`` walks ``u = c, c + G, ...``
below the units in use, and so do its consumers, in the same order. A stage is a K step's weight panel, scale bytes
and activation tile, all completing on the stage's mbarrier by their transaction bytes.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

__all__ = ["make_ring", "produce", "units_in_use"]


def make_ring(bars_ptr, stages: int, tx: int, producers: int = 1) -> pipeline.PipelineTmaAsync:
    """The ring's full/empty barriers (traced inline): ``producers`` arrivals a stage (the TMA thread, and any
    warp filling slots with its own stores), one arrival a consumer warp (8), ``tx`` bytes a stage."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=bars_ptr,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, producers),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 8),  # one arrival a consumer warp
        tx_count=tx,
        cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        defer_sync=True,
    )


def units_in_use(meta, block_expert, blocks_held, tiles_m):
    """Units of the blocks in use (traced inline): ``meta[0]`` (device data: a graph replays with new routings),
    never past the blocks the activations hold (``blocks_held``) or the block map."""
    blocks = cutlass.min(cutlass.max(meta[0], 0), cutlass.min(blocks_held, cute.size(block_expert)))
    return blocks * tiles_m


@cute.jit
def produce(ring, stages: cutlass.Constexpr, copies, block_expert, tiles_m, units, k_steps):
    """Warp 0's walk (traced inline): per unit and K step, acquire a stage and copy into it the weight panel
    (``copies[0]``: atom, global partition indexed ``(None, 0, tm, k, e)``, shared partition), the scale bytes
    (``copies[1]``, ``(None, tm, k, e)``; ``None`` where another warp fills the slots) and the activation tile
    (``copies[2]``, ``(None, b, k)``)."""
    tma_a, t_ag, t_as = copies[0]
    tma_b, t_bg, t_bs = copies[2]
    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
    u = cute.arch.block_idx()[0]
    while u < units:
        b = u // tiles_m
        tm = u - b * tiles_m
        # an expert id outside [0, E) lies outside the panels' TMA bounds: its tiles load as zeros, so a block the
        # alignment never fills (or a corrupt id) computes zeros and reads nothing out of bounds
        e = block_expert[b]
        for k in cutlass.range(k_steps, unroll=1):
            ring.producer_acquire(state)
            bar = ring.producer_get_barrier(state)
            cute.copy(tma_a, t_ag[(None, 0, tm, k, e)], t_as[(None, state.index)], tma_bar_ptr=bar)
            if cutlass.const_expr(copies[1] is not None):
                tma_s, t_sg, t_ss = copies[1]
                cute.copy(tma_s, t_sg[(None, tm, k, e)], t_ss[(None, state.index)], tma_bar_ptr=bar)
            cute.copy(tma_b, t_bg[(None, b, k)], t_bs[(None, state.index)], tma_bar_ptr=bar)
            ring.producer_commit(state)
            state.advance()
        u += cute.arch.grid_dim()[0]
    ring.producer_tail(state)
