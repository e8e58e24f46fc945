"""The producer side of the engine's grouped GEMMs (``docs/moe-engine.md`` §4.2-4.3), shared by the FP4 x bf16 GEMM
(:mod:`~csf_kernels.moe.kernels.engine_gemm`) and the W4A8 one (:mod:`~csf_kernels.moe.kernels.engine_gemm_fp8`):
the ring of stages, the units a launch walks (after the predecessor's writes, PDL), and warp 0's walk filling the
ring by TMA, its activation copy optionally a route gather (:class:`RowGather`).

A unit is (route block ``b``, 128-row tile ``tm``), ``u = b * tiles_m + tm``, or in a split program (block, tile, K
split) (:mod:`~csf_kernels.moe.kernels.engine_work`, the one map every role reads); CTA ``c`` walks ``u = c, c + G,
...`` below the units in use, and so do its consumers, in the same order. A stage is a K step's weight panel, scale
bytes and activation tile, all completing on the stage's mbarrier by their transaction bytes (a gathered tile: by the
gathering threads' arrivals once their ``cp.async`` copies land).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

from csf_kernels.moe.engine_rows import ROW_CHUNKS
from csf_kernels.moe.engine_specs import ENGINE_TILE_K as TILE_K
from csf_kernels.moe.kernels import engine_routes as routes
from csf_kernels.moe.kernels.engine_work import UnitWork

__all__ = ["GATHER_BARRIER", "UNROLLED_COPIES", "RowGather", "make_ring", "produce", "units_in_use"]

GATHER_BARRIER = 2  # the gathering warps' named barrier (the epilogue's is 1)
UNROLLED_COPIES = 8  # a gathering thread's copies a stage unrolled up to this many, else a loop


CONSUMER_WARPS = 8  # both consumer warpgroups' warps: each releases a ring stage (and an A tile) once


def _power_of_two(slots: int) -> int:
    if slots < 1 or slots & (slots - 1):
        raise ValueError(f"a ring of {slots} slots: slots and phases go by mask and shift, so a power of two")
    return slots.bit_length() - 1


def ring_slot(count, slots: int):
    """Slot ``count % slots`` of a ring of a power-of-two ``slots``, for a ``count`` that never goes negative (a mask:
    a signed ``%`` costs fix-up instructions on every use)."""
    _power_of_two(slots)
    return count & (slots - 1)


def ring_phase(count, slots: int):
    """The phase parity of slot ``ring_slot(count, slots)``'s ``count // slots``-th use (by shift, as ``ring_slot``)."""
    return (count >> _power_of_two(slots)) & 1


def make_ring(
    bars_ptr, stages: int, tx: int, producers: int = 1, consumers: int = CONSUMER_WARPS
) -> pipeline.PipelineTmaAsync:
    """The ring's full/empty barriers (traced inline): ``producers`` arrivals a stage (the TMA thread, and any
    thread filling slots with its own stores or copies), one arrival a consumer warp (``consumers``: the
    consumer warpgroups' :data:`CONSUMER_WARPS`, and any transform warp), ``tx`` bytes a stage."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=bars_ptr,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, producers),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumers),  # one arrival a consumer warp
        tx_count=tx,
        cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        defer_sync=True,
    )


def units_in_use(meta, block_expert, blocks_held, tiles_m):
    """Units of the blocks in use (traced inline, by every thread): ``meta[0]`` (device data: a graph replays with
    new routings), never past the blocks the activations hold (``blocks_held``) or the block map.

    A programmatic dependent launch starts beside its predecessor: this waits for it (``griddepcontrol.wait``, a
    no-op in a plain launch) before the first read of anything it may write (meta, the block map, the routes, the
    activations), then lets the successor launch; the successor waits for this grid in turn."""
    cute.arch.griddepcontrol_wait()
    cute.arch.griddepcontrol_launch_dependents()
    blocks = cutlass.min(cutlass.max(meta[0], 0), cutlass.min(blocks_held, cute.size(block_expert)))
    return blocks * tiles_m


class RowGather:
    """FC1's activation copy by route (``io="gather"``): the B stage's ``tile_n`` rows come from ``x [tokens, K]``,
    slot ``s`` taking token ``sorted_ids[s] // top_k``'s row (zeros for an empty slot), by 16-byte ``cp.async`` of
    the producer warps ``warps`` (warp 0, the TMA warp, among them). Gathering rank ``g`` copies chunk ``g % 8`` of
    block rows ``g // 8 + (threads / 8) j`` (a warp: four whole 128-byte rows an instruction) to its swizzled place
    (:mod:`~csf_kernels.moe.kernels.engine_routes`), then arrives on the stage's mbarrier once they land: the stage
    counts ``threads`` arrivals beside the TMA thread's. A unit's slots' token rows go to a shared table first.

    ``operands`` (device values of one trace): ``(x, sorted_ids, top_k, table, s_b, b_smem, rank)``: the shared
    table (int32 ``[tile_n]``), the B stages (tensor and composed layout) and this thread's gathering rank.
    ``work``: the program's :class:`UnitWork` (``None``: unsplit)."""

    def __init__(self, tile_n: int, warps: tuple[int, ...], work: UnitWork | None = None):
        if 0 not in warps or not set(warps) <= {0, 1, 2, 3}:
            raise ValueError(f"the gathering warps are producer warps, warp 0 among them; got {warps}")
        self.tile_n = tile_n  # a stage's routes
        self.warps = tuple(sorted(warps))
        self.threads = 32 * len(self.warps)
        self.work = UnitWork(False) if work is None else work

    def gathers(self, warp):
        """Whether ``warp`` (warp-uniform) gathers (traced inline)."""
        hit = warp == self.warps[0]
        for w in self.warps[1:]:
            hit = hit | (warp == w)
        return hit

    def rank(self, tidx):
        """A gathering thread's rank in ``[0, threads)`` (traced inline): its place among the gathering warps."""
        r = tidx
        for w in range(4):
            if w not in self.warps:
                r = r - 32 * cutlass.Int32(tidx >= 32 * (w + 1))
        return r

    @cute.jit
    def unit(self, operands, b):
        """Block ``b``'s slots' token rows into the table, between two barriers of the gathering warps: the previous
        unit's copies have read the old rows, and every gathering warp sees the new."""
        x, sorted_ids, top_k, table, _, _, rank = operands
        tokens = cute.size(x, mode=[0])
        gatherers = pipeline.NamedBarrier(barrier_id=GATHER_BARRIER, num_threads=self.threads)
        gatherers.arrive_and_wait()
        for j in cutlass.range_constexpr(-(-self.tile_n // self.threads)):
            i = rank + self.threads * j
            if i < self.tile_n:
                table[i] = routes.route_token(sorted_ids[b * self.tile_n + i], top_k, tokens)
        gatherers.arrive_and_wait()

    @cute.jit
    def stage(self, operands, k, index, bar):
        """K step ``k``'s B rows into ring stage ``index``, then this thread's arrival on ``bar`` once they land."""
        x, _, _, table, s_b, b_smem, rank = operands
        chunk = rank % ROW_CHUNKS
        base = s_b.iterator.toint()
        tokens = cute.size(x, mode=[0])
        k_len = cute.size(x, mode=[1])
        per = self.threads // ROW_CHUNKS  # rows an instruction of the gathering warps
        copies = -(-self.tile_n // per)
        if cutlass.const_expr(copies <= UNROLLED_COPIES):
            for j in cutlass.range_constexpr(copies):
                self._copy(x, table, tokens, k_len, base, b_smem, k, index, rank // ROW_CHUNKS + per * j, chunk)
        else:  # a lone gathering warp at large blocks: a loop, within the producers' 40 registers
            for j in cutlass.range(copies, unroll=1):
                self._copy(x, table, tokens, k_len, base, b_smem, k, index, rank // ROW_CHUNKS + per * j, chunk)
        cute.arch.cp_async_mbarrier_arrive_noinc(bar)

    @cute.jit
    def _copy(self, x, table, tokens, k_len, base, b_smem, k, index, i, chunk):
        """Chunk ``chunk`` of block row ``i``'s K step ``k`` into ring stage ``index`` (zeros for an empty slot)."""
        if i < self.tile_n:
            token = table[i]
            live = token < tokens
            column = k * TILE_K + chunk * (routes.CHUNK_BYTES // 2)
            src = x.iterator.toint() + (cutlass.Int64(cutlass.min(token, tokens - 1)) * k_len + column) * 2
            dst = routes.swizzle128(base + cute.crd2idx((i, chunk * (routes.CHUNK_BYTES // 2), index),
                                                        b_smem.outer) * 2)  # fmt: skip
            routes.copy_chunk(dst, src, cutlass.Int32(live))

    @cute.jit
    def walk(self, ring, stages: cutlass.Constexpr, operands, tiles_m, units, k_steps, split_steps):
        """A gathering warp other than warp 0 (traced inline): its share of every stage warp 0 fills, in warp 0's
        order, each stage once it is empty."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
        u = cute.arch.block_idx()[0]
        while u < units:
            b, _, _, k0, steps = self.work.unit(u, tiles_m, k_steps, split_steps)
            self.unit(operands, b)
            for k in cutlass.range(k0, k0 + steps, unroll=1):
                ring.sync_object_empty.wait(state.index, state.phase)
                self.stage(operands, k, state.index, ring.producer_get_barrier(state))
                state.advance()
            u += cute.arch.grid_dim()[0]


def produce(ring, stages: int, copies, block_expert, tiles_m, units, k_steps, gather=None, operands=None,
            facts=None, work=None, split_steps=None):  # fmt: skip
    """Warp 0's walk (traced inline): per unit and K step, acquire a stage and copy into it the weight panel
    (``copies[0]``: atom, global partition indexed ``(None, 0, tm, k, e)``, shared partition), the scale bytes
    (``copies[1]``, ``(None, tm, k, e)``; ``None`` where another warp fills the slots) and the activation tile
    (``copies[2]``, ``(None, b, k)``; or, with a :class:`RowGather` and its ``operands``, warp 0's share of the
    routes' rows). ``facts``: ``(UnitFacts, slots, operands)``: each unit's facts into its first stage's slot
    (``slots`` Int32 ``[FACT_WORDS, stages]``) before the warp arrives on it
    (:mod:`~csf_kernels.moe.kernels.engine_unit_facts`). ``work``: the program's :class:`UnitWork` (``None``:
    unsplit) and ``split_steps`` its K steps a split."""
    publisher = None if facts is None else facts[0]
    work = UnitWork(False) if work is None else work
    split_steps = k_steps if split_steps is None else split_steps
    _Producer(stages, gather, publisher, work).walk(ring, copies, block_expert, tiles_m, units, k_steps, operands,
                                                    None if facts is None else facts[1:], split_steps)  # fmt: skip


class _Producer:
    """Warp 0's walk of one program (its configuration read as attributes: the DSL carries no Python object
    through a dynamic loop)."""

    def __init__(self, stages: int, gather: RowGather | None, facts=None, work: UnitWork | None = None):
        self.stages = stages
        self.gather = gather
        self.facts = facts
        self.work = UnitWork(False) if work is None else work

    @cute.jit
    def walk(self, ring, copies, block_expert, tiles_m, units, k_steps, operands, facts, split_steps):
        lane = cute.arch.lane_idx()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        u = cute.arch.block_idx()[0]
        while u < units:
            b, tm, _, k0, steps = self.work.unit(u, tiles_m, k_steps, split_steps)
            # an expert id outside [0, E) lies outside the panels' TMA bounds: its tiles load as zeros, so a block
            # the alignment never fills (or a corrupt id) computes zeros and reads nothing out of bounds
            e = block_expert[b]
            state = self._unit(ring, state, copies, b, tm, e, k0, steps, operands, facts, lane)
            u += cute.arch.grid_dim()[0]
        ring.producer_tail(state)

    @cute.jit
    def _unit(self, ring, state, copies, b, tm, e, k0, steps, operands, facts, lane):
        """Unit ``(b, tm)``'s stages, K steps ``k0`` to ``k0 + steps`` (the weight panel, scales and activation tile
        of each), from ``state`` on; returns the state past them."""
        if cutlass.const_expr(self.gather is not None):
            self.gather.unit(operands, b)
        if cutlass.const_expr(self.facts is not None):  # into the unit's first stage, once it is free
            slots, fact_operands = facts
            ring.sync_object_empty.wait(state.index, state.phase)
            self.facts.publish(slots[(None, state.index)], fact_operands, b, tm, lane)
        tma_a, t_ag, t_as = copies[0]
        for k in cutlass.range(k0, k0 + steps, unroll=1):
            ring.producer_acquire(state)
            bar = ring.producer_get_barrier(state)
            cute.copy(tma_a, t_ag[(None, 0, tm, k, e)], t_as[(None, state.index)], tma_bar_ptr=bar)
            if cutlass.const_expr(copies[1] is not None):
                tma_s, t_sg, t_ss = copies[1]
                cute.copy(tma_s, t_sg[(None, tm, k, e)], t_ss[(None, state.index)], tma_bar_ptr=bar)
            if cutlass.const_expr(self.gather is None):
                tma_b, t_bg, t_bs = copies[2]
                cute.copy(tma_b, t_bg[(None, b, k)], t_bs[(None, state.index)], tma_bar_ptr=bar)
            else:
                self.gather.stage(operands, k, state.index, bar)
            ring.producer_commit(state)
            state.advance()
        return state
