"""Ping-pong consumers of the engine's grouped FP4 x bf16 GEMM (``docs/moe-engine.md`` §4.13; CUTLASS's
``KernelTmaWarpSpecializedPingpong`` adapted to the swap-AB mixed-input kernel): schedule ``pingpong``, for 128- and
256-route blocks.

The cooperative consumers (:mod:`~csf_kernels.moe.kernels.engine_gemm`) split a unit ``(b, tm)`` by rows: warpgroup
``wg`` owns row block ``wg - 1`` (64 rows) of all ``TILE_N`` routes, both wait on and release the same stages, and
both run the epilogue at once, so the tensor pipe idles through every epilogue. Here a unit is ``(b, tm, h)``: all
128 rows of tile ``tm`` and half ``h`` of block ``b``'s routes (``H = TILE_N / 2``; the producers see it as block
``2 b + h`` of ``H`` routes). Warpgroup ``1 + h`` computes every unit of half ``h`` of its CTA's walk alone, so the
two alternate along the walk, and one's epilogue runs while the other's wgmmas do.

Per K slice of 16 a thread converts its words of both row blocks (rows ``r0``, ``r0 + 8`` of row block 0 and the
same of row block 1: the cooperative warpgroups' words and scale slots) and issues ``wgmma.m64nHk16`` twice, one a row
block, into two ``64 x H`` accumulators (``H / 2`` registers each: 128 at 256 routes, as the cooperative ``64 x 256``)
as one commit group; the slice schedule's order (one group in flight while the next slice converts), whose two A
register sets a row block leave room beside the accumulators where ``stage``'s eight would not. Each output element
adds the same products in the same K order as the cooperative program: the same bits (as the ragged loops' narrower
MMAs already rely on).

The ring: each stage is consumed by one warpgroup (its empty barrier counts 4 warps); a warpgroup's read and
release states skip the other's unit's ``k_steps`` stages. An mbarrier's wait names a phase by its parity only: it
is right only while the barrier has completed the phase before (else the one before that, complete, answers at once
or a phase two back is taken for it). A cooperative consumer waits on every stage in order, so it always has; a
ping-pong warpgroup skips the other's stages, so nothing in the ring shows it that the stage ``stages`` back was
filled: warpgroup 2's first wait (stage ``k_steps``, phase ``k_steps // stages``) passed at once on the barrier's
phase 0 and it read and released stages warpgroup 1 owned (run 322's fault at 45 K steps and 9 stages). So the K
loops are ordered as CUTLASS's pingpong orders them (its "math barrier"): a warpgroup starts a unit's first wait
only once the other has passed every wait of its unit before (named barriers ``PINGPONG_ORDER_BARRIER + h``, 256
threads: warpgroup ``1 + h`` arrives after its K loop, the other syncs before its next one), so every stage before
a wait's was filled and every parity names the phase meant. The K loops no longer overlap (the arrival follows the
last step's drain); each epilogue still runs beside the other warpgroup's K loop.

Ragged levels apply within the half (its live extent: ``n{H / 2}``, ``n{H / 4}`` loops as built), and a half with no
live routes runs no wgmma: it waits for and releases its stages, into which the producer copied nothing
(:mod:`~csf_kernels.moe.kernels.engine_producer`), and stores what a zero accumulator stores (the cooperative ragged
program's dead slots: zeros, or the activation of the bias).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import warpgroup

from csf_kernels.moe.engine_specs import ENGINE_TILE_K as TILE_K
from csf_kernels.moe.engine_specs import ENGINE_TILE_M as TILE_M
from csf_kernels.moe.kernels.engine_epilogue import ACT_NONE, PINGPONG_ORDER_BARRIER
from csf_kernels.moe.kernels.engine_mainloop import SLICES, STEP_GROUP

__all__ = ["PINGPONG_TILE_N", "PingpongConsumers"]

PINGPONG_TILE_N = (128, 256)  # block sizes built with ping-pong consumers (a unit: 64 or 128 routes)


@cute.jit
def _skip(state, n):
    """``state`` advanced by ``n`` stages (the other warpgroup's unit)."""
    at = state.index + n
    flips = (at // state.stages) & 1
    return pipeline.PipelineState(state.stages, state.count + n, at % state.stages, state.phase ^ flips)


class PingpongConsumers:
    """The ping-pong consumers of one program (its configuration read as attributes: the DSL carries no Python
    object through a dynamic loop): ``routes`` a unit (half a block), ``stages`` the ring's depth, ``step`` and
    ``step_one`` the slice schedule's conversions (:class:`~csf_kernels.moe.kernels.engine_mainloop.ConsumerStep`:
    two multiplies a pair, and one, MXFP4, for tiles whose two row blocks are both flagged), ``ragged`` the level,
    ``epilogue`` (built ``pingpong``), ``facts`` (built with ``halves`` 2), ``act``, ``io``, ``nvfp4``."""

    def __init__(self, routes, stages, step, step_one, ragged, epilogue, facts, act, io, nvfp4):
        if step.schedule != "slice":
            raise ValueError("the ping-pong consumers convert a slice at a time")
        self.routes = routes
        self.stages = stages
        self.step = step
        self.step_one = step_one
        self.ragged = ragged
        self.epilogue = epilogue
        self.facts = facts
        self.act = act
        self.io = io
        self.nvfp4 = nvfp4

    @cute.jit
    def consume(
        self, ring, mmas, s_a, s_s, s_b, s_c, epi_smem, c_layout, g_c, tma_c, tiles_m, units, k_steps, tidx, warp,
        wg, out, bias, s_facts, block_expert, sorted_ids, experts,
    ):  # fmt: skip
        """Warpgroup ``wg`` (1 or 2): half ``wg - 1`` of every unit its CTA walks (traced inline). ``mmas``: the
        ``n{H}``, ``n{H / 2}`` and ``n{H / 4}`` tiled MMAs (two warpgroups' layout: a thread's row block ``rb`` is
        the MMA's thread ``t + 128 rb``)."""
        tiled_mma, half_mma, quarter_mma = mmas
        # set once, outside the unit loop: else the flag stays a run-time predicate of every wgmma (run 310)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        t = tidx % 128
        lane = t % 32
        h = wg - 1
        r0 = (t // 32) * 16 + lane // 4  # the thread's rows of row block 0: r0, r0 + 8; of row block 1: + 64
        thr0 = tiled_mma.get_slice(t)
        thr1 = tiled_mma.get_slice(t + 128)
        t_cr_b = tiled_mma.make_fragment_B(thr0.partition_B(s_b))  # (MMA, MMA_N, MMA_K = 4, stages)
        acc0 = cute.make_rmem_tensor(thr0.partition_shape_C((TILE_M, self.routes)), cutlass.Float32)
        acc1 = cute.make_rmem_tensor(thr1.partition_shape_C((TILE_M, self.routes)), cutlass.Float32)
        frags = (self.step.fragments(tiled_mma, thr0, TILE_M), self.step.fragments(tiled_mma, thr1, TILE_M))
        s_words = cute.recast_tensor(s_a, cutlass.Uint32)  # (512, 2, 1, 1, stages)
        words = cute.make_rmem_tensor((2 * SLICES,), cutlass.Uint32)
        epi = (
            self.epilogue.partitions(tiled_mma, c_layout, s_c, acc0, t + 128, wg),
            self.epilogue.partitions(tiled_mma, c_layout, s_c, acc1, t + 256, wg),
        )
        whole = (tiled_mma, acc0, acc1, t_cr_b)
        half, quarter = whole, whole
        if cutlass.const_expr(self.ragged > 0):
            half = _part_operands(half_mma, self.routes // 2, self.stages, s_b, acc0, acc1, t)
        if cutlass.const_expr(self.ragged > 1):
            quarter = _part_operands(quarter_mma, self.routes // 4, self.stages, s_b, acc0, acc1, t)

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if h > 0:  # half 1's stages follow half 0's in each unit
            read = _skip(read, k_steps)
            release = _skip(release, k_steps)
        done = cutlass.Int32(0)  # units this warpgroup has stored: its epilogue buffers' parity
        # the K loops' order (module docstring): warpgroup 1 + h arrives on PINGPONG_ORDER_BARRIER + h once its K
        # loop has passed every wait, the other syncs on it before its next K loop's first wait
        after_mine = pipeline.NamedBarrier(barrier_id=PINGPONG_ORDER_BARRIER + h, num_threads=256)
        after_other = pipeline.NamedBarrier(barrier_id=PINGPONG_ORDER_BARRIER + 1 - h, num_threads=256)
        first = cute.arch.block_idx()[0]
        u = first
        while u < units:
            b = u // tiles_m
            tm = u - b * tiles_m
            bh = b * 2 + h  # the half as the producers see it: a block of H routes
            acc0.fill(0.0)
            acc1.fill(0.0)
            if (h > 0) | (u != first):  # the other's K loop before this one has passed its waits
                after_other.arrive_and_wait()
            self.step.wait(ring, read)
            extent, one0, g_e = self.facts.read(s_facts[(None, read.index)], 0)
            _, one1, _ = self.facts.read(s_facts[(None, read.index)], 1)
            one = one0 & one1  # the two-multiply form is exact for every row block; one multiply needs both flagged
            common = (words, s_words, s_s, t, r0)
            if cutlass.const_expr(self.ragged > 0):
                if extent == 0:  # an expert's tail block's empty half: no wgmma
                    read, release = self._pass(ring, read, release, k_steps)
                else:
                    read, release = self._ragged(ring, read, release, k_steps, extent, (whole, half, quarter), frags,
                                                 common, one)  # fmt: skip
            else:
                read, release = self._k_loop(ring, read, release, k_steps, whole, frags, common, one)
            # this K loop's waits have passed: the other's next K loop may start (warpgroup 2 signals only where
            # warpgroup 1 has a next unit to sync on it: no arrival is left pending at exit)
            if (h == 0) | (u + cute.arch.grid_dim()[0] < units):
                after_mine.arrive()

            if cutlass.const_expr(self.act == ACT_NONE):
                scatter_to = (sorted_ids, out, epi_smem, t) if self.io == "scatter" else None
                self.epilogue.store(epi, g_e, s_c, g_c, tma_c, tm, bh, done, warp, scatter_to)
            else:
                self.epilogue.activation(acc0, g_e, out, bias, block_expert, experts, bh, tm, t, lane, 0, r0)
                self.epilogue.activation(acc1, g_e, out, bias, block_expert, experts, bh, tm, t, lane, 1, r0 + 64)
            done += 1
            read = _skip(read, k_steps)  # the other warpgroup's half
            release = _skip(release, k_steps)
            u += cute.arch.grid_dim()[0]
        epi[0].ring.producer_tail()

    @cute.jit
    def _ragged(self, ring, read, release, k_steps, extent, parts, frags, common, one):
        """A half with live routes (traced inline): the narrowest loop holding its extent."""
        whole, half, quarter = parts
        if cutlass.const_expr(self.ragged > 1):
            if extent <= self.routes // 4:
                read, release = self._k_loop(ring, read, release, k_steps, quarter, frags, common, one)
            elif extent <= self.routes // 2:
                read, release = self._k_loop(ring, read, release, k_steps, half, frags, common, one)
            else:
                read, release = self._k_loop(ring, read, release, k_steps, whole, frags, common, one)
        else:
            if extent <= self.routes // 2:
                read, release = self._k_loop(ring, read, release, k_steps, half, frags, common, one)
            else:
                read, release = self._k_loop(ring, read, release, k_steps, whole, frags, common, one)
        return read, release

    @cute.jit
    def _pass(self, ring, read, release, k_steps):
        """An empty half's stages: each waited for (its producers' arrivals: the gathering warps' zero-filled rows
        and the decoder's slots land in it) and released at once."""
        for _ in cutlass.range(k_steps, unroll=1):
            ring.consumer_wait(read)
            ring.consumer_release(release)
            read.advance()
            release.advance()
        return read, release

    @cute.jit
    def _k_loop(self, ring, read, release, k_steps, operands, frags, common, one):
        """A unit's K loop (traced inline): MXFP4 tiles whose row blocks are both flagged take one multiply a pair."""
        if cutlass.const_expr(self.nvfp4):
            read, release = self._steps(False, ring, read, release, k_steps, operands, frags, common)
        else:
            if one:
                read, release = self._steps(True, ring, read, release, k_steps, operands, frags, common)
            else:
                read, release = self._steps(False, ring, read, release, k_steps, operands, frags, common)
        return read, release

    @cute.jit
    def _steps(self, one: cutlass.Constexpr, ring, read, release, k_steps, operands, frags, common):
        """The K steps of the slice schedule (``ConsumerStep.k_loop``'s order): ``STEP_GROUP`` a loop iteration,
        draining at each group's last slice, then the remainder a step an iteration, each drained; a stage is
        released once the next step's first wait has retired its wgmmas. ``one``: the one-multiply conversion."""
        groups = k_steps // STEP_GROUP
        for _ in cutlass.range(groups, unroll=1):
            for g in cutlass.range_constexpr(STEP_GROUP):
                self.step.wait(ring, read)
                self._step(one, operands, frags, common, read.index, g == STEP_GROUP - 1)
                if g > 0:  # the previous step's wgmmas completed (its stage is free)
                    ring.consumer_release(release)
                    release.advance()
                read.advance()
            ring.consumer_release(release)
            release.advance()
        for _ in cutlass.range(k_steps - groups * STEP_GROUP, unroll=1):
            self.step.wait(ring, read)
            self._step(one, operands, frags, common, read.index, True)
            ring.consumer_release(release)
            release.advance()
            read.advance()
        return read, release

    @cute.jit
    def _step(self, one: cutlass.Constexpr, operands, frags, common, stage, last: cutlass.Constexpr):
        """One K step of both row blocks (traced inline): the thread's four words and scale factors of each, then per
        slice both conversions, both wgmmas as one commit group, and a wait for one group left in flight (none at a
        ``last`` step's last slice)."""
        step = self.step_one if one else self.step
        mma, acc0, acc1, t_cr_b = operands
        words, s_words, s_s, t, r0 = common
        (frag0, words0), (frag1, words1) = frags
        for rb in cutlass.range_constexpr(2):
            for i in cutlass.range_constexpr(SLICES):
                words[rb * SLICES + i] = s_words[(t * 4 + i, rb, 0, 0, stage)]
        scales0 = step._scales(s_s, stage, r0)
        scales1 = step._scales(s_s, stage, r0 + 64)
        for j in cutlass.range_constexpr(SLICES):
            step._convert(words0[j % 2][0], words[j], *step._slice_factors(scales0, j))
            step._convert(words1[j % 2][0], words[SLICES + j], *step._slice_factors(scales1, j))
            warpgroup.fence()
            cute.gemm(mma, acc0, frag0[j % 2][0][(None, None, 0)], t_cr_b[(None, None, j, stage)], acc0)
            cute.gemm(mma, acc1, frag1[j % 2][0][(None, None, 0)], t_cr_b[(None, None, j, stage)], acc1)
            warpgroup.commit_group()
            warpgroup.wait_group(0 if last and j == SLICES - 1 else 1)


def _part_operands(mma, routes: int, stages: int, s_b, acc0, acc1, t):
    """Device side (traced inline): the operands of a unit's first ``routes`` routes: the MMA, each row block's
    accumulator view (its first registers: value ``4 c + i`` is route ``8 c + ...``) and B's first ``routes`` rows
    of each stage. Every wgmma adds to the zeroed unit."""
    mma.set(warpgroup.Field.ACCUMULATE, True)
    thr0 = mma.get_slice(t)
    thr1 = mma.get_slice(t + 128)
    s_b_part = cute.local_tile(s_b, (routes, TILE_K, stages), (0, 0, 0))
    t_cr_b = mma.make_fragment_B(thr0.partition_B(s_b_part))
    part0 = cute.make_tensor(acc0.iterator, cute.make_layout(thr0.partition_shape_C((TILE_M, routes))))
    part1 = cute.make_tensor(acc1.iterator, cute.make_layout(thr1.partition_shape_C((TILE_M, routes))))
    return mma, part0, part1, t_cr_b
