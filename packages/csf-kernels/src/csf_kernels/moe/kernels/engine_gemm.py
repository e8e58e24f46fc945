"""The engine's grouped FP4 x bf16 GEMM (``docs/moe-engine.md`` §4): persistent, warp-specialized, with the FP4
weights converted in the consumers' registers into wgmma A fragments.

    MXFP4: out[b * TILE_N + i, r] = sum_k x[b * TILE_N + i, k] * bf16(w[e_b, r, k] * 2 ** (s[e_b, r, k // 32] - 127))
    NVFP4: out[b * TILE_N + i, r] = g[e_b] * sum_k x[b * TILE_N + i, k] * (w[e_b, r, k] * e4m3(s[e_b, r, k // 16]))

for every route block ``b < meta[0]`` of ``TILE_N`` rows, ``e_b = block_expert[b]`` (blocks whose expert is outside
``[0, E)`` compute zeros; blocks past ``meta[0]`` are never stored). A dense GEMM is one expert and
``ceil(N / TILE_N)`` blocks. NVFP4's products are exact in bf16; its per-expert global scale ``g`` multiplies the
float32 accumulator in the epilogue, read once a tile.

Operands (CuTe DSL tensors, compact row-major): ``w_panel`` uint64 ``[E, steps, R / 64, 256]`` and ``s_panel``
(:mod:`csf_kernels.moe.engine_panels`: MXFP4 uint8 ``[E, steps, 2 R]``, NVFP4 the same bytes as uint32 ``[E, steps,
R]``, one word of four E4M3 bytes a row), ``x`` bf16 ``[NX, K]`` (rows in block order), ``out`` bf16 ``[NX, R]``,
``gscale`` float32 ``[E]`` (NVFP4; unread for MXFP4), ``block_expert`` int32 ``[max blocks]``, ``meta`` int32
(``meta[0]``: blocks in use); ``R`` a multiple of 64, ``K = 64 * steps``. Rows past ``NX`` read as zeros and are
never stored.

Roles, one CTA per SM walking units ``u = (block, 128-row tile)`` from its index by the grid's stride:

* warpgroup 0, warp 0: the producer. Per K step it copies the unit's weight panel (4 KB), scale bytes (256 B;
  NVFP4 512) and activation tile (``TILE_N x 64`` bf16, 128-byte swizzle) into one stage of a shared-memory ring by
  TMA, all completing on the stage's mbarrier. Gathering (FC1, ``io="gather"``), the tile's rows come from ``x
  [tokens, K]`` by 16-byte ``cp.async`` of all four producer warps (:mod:`~csf_kernels.moe.kernels.engine_routes`),
  each thread arriving on the stage's mbarrier once its copies land.
* warpgroups 1 and 2: the consumers, 64 weight rows each (swap-AB: weights are wgmma's M, routes its N). Per K
  slice of 16 a thread converts one word (eight E2M1 values, bits already placed by the panel) into its four bf16x2
  A registers (:mod:`~csf_kernels.moe.kernels.engine_convert`), then issues ``wgmma.m64n{TILE_N}k16`` with A from
  registers and B from the stage, one wgmma left in flight while the next slice converts.
* the epilogue: the consumers round the fp32 accumulators to bf16, ``stmatrix`` them into a shared subtile and warp
  4 stores it by TMA (``out`` is M-major from the MMA's view: weight rows are contiguous); scattering (FC2,
  ``io="scatter"``), the consumers store each slot's row of the subtile at its route, 16 bytes a thread.

Launched as a programmatic dependent launch (``pdl``), every thread waits for the predecessor
(``griddepcontrol.wait``) after the ring's set-up and before its first global read, then lets the successor launch.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from csf_kernels.moe.engine_panels import PANEL_WORDS as _PANEL_WORDS
from csf_kernels.moe.engine_panels import panel_scales
from csf_kernels.moe.engine_rows import GATHER_THREADS as _GATHERERS
from csf_kernels.moe.engine_rows import OUT_CHUNKS, STORE_THREADS, epi_routes
from csf_kernels.moe.engine_rows import ROW_CHUNKS as _ROW_CHUNKS
from csf_kernels.moe.engine_specs import ENGINE_IO as IO_MODES  # dense: x and out in block order
from csf_kernels.moe.engine_specs import ENGINE_TILE_K as TILE_K
from csf_kernels.moe.engine_specs import ENGINE_TILE_M as TILE_M
from csf_kernels.moe.kernels import engine_routes as routes
from csf_kernels.moe.kernels.engine_convert import E4M3_FACTOR_PTX, FACTOR_PTX, PAIR_PTX

__all__ = ["ACT_NONE", "ACT_SILU", "ACT_SWIGLU_OAI", "IO_MODES", "TILE_K", "TILE_M", "GroupedFp4Gemm"]

STEP_GROUP = 4  # K steps a consumer loop iteration: the wgmma pipeline drains once a group
ACT_NONE, ACT_SILU, ACT_SWIGLU_OAI = 0, 1, 2  # the epilogue: the GEMM, or FC1's activation of it
SWIGLU_ALPHA = 1.702  # gpt-oss's clamped SwiGLU (csf_moe.reference)
SWIGLU_LIMIT = 7.0
_SMEM_BYTES = 232448  # a block's dynamic shared memory on sm_90a


def _asm_u32(asm: str, *args) -> cutlass.Uint32:
    return cutlass.Uint32(
        llvm.inline_asm(
            cutlass.Uint32.mlir_type,
            [cutlass.Uint32(a).ir_value() for a in args],
            asm,
            "=r" + ",r" * len(args),
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


def _sigmoid(x):
    return 1.0 / (1.0 + cute.math.exp(-x, fastmath=False))


class GroupedFp4Gemm:
    """One compiled program: ``TILE_N`` routes a block (16 to 256), ``stages`` deep ring (default: as many as
    fit), ``act``: the epilogue stores the bf16 GEMM (``ACT_NONE``) or FC1's activation of it (``out`` then has
    ``R / 2`` columns; W13's rows in engine order, :func:`csf_kernels.moe.engine_panels.fc1_engine_rows`), adding
    ``bias`` (float32 ``[E, R]`` in engine row order) first; ``fmt`` the weights' format (``mxfp4``, ``nvfp4``);
    ``io`` (:data:`IO_MODES`): ``gather`` reads slot ``s``'s row of ``x [tokens, K]`` at token
    ``sorted_ids[s] // top_k`` (zeros for a slot without a route), ``scatter`` stores it to ``out [pairs, R]`` at row
    ``sorted_ids[s]`` (never for a slot without one).
    Call signature: ``(w_panel, s_panel, x, out, bias, gscale, block_expert, meta, sorted_ids, ctas, top_k, pdl,
    stream)``; ``bias`` is unread without it, ``gscale`` for MXFP4, ``sorted_ids`` and ``top_k`` in ``dense``
    mode; ``ctas`` persistent CTAs (the SM count); ``pdl`` 1 launches as a programmatic dependent launch (the
    program waits for its predecessor before it reads anything the predecessor may write)."""

    def __init__(
        self, tile_n: int = 256, stages: int = 0, act: int = ACT_NONE, bias: bool = False, fmt="mxfp4", io="dense"
    ):
        if tile_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"TILE_N must be 16, 32, 64, 128 or 256; got {tile_n}")
        if act not in (ACT_NONE, ACT_SILU, ACT_SWIGLU_OAI) or (bias and act == ACT_NONE):
            raise ValueError(f"activation {act} (bias {bias}): a bias comes with a fused activation only")
        if io not in IO_MODES or (io == "scatter" and act != ACT_NONE):
            raise ValueError(f"rows {io!r} (activation {act}): one of {IO_MODES}, scatter with no activation")
        self.io = io
        self.tile_n = tile_n
        self.act = act
        self.bias = bias
        self.fmt = fmt
        self.nvfp4 = fmt == "nvfp4"
        s_bytes = panel_scales(fmt).per_step * TILE_M  # a stage's scale bytes
        # NVFP4's panel is read as one uint32 a row (a TMA box of 512 uint8 would exceed the 256-element limit)
        self.s_dtype = cutlass.Uint32 if self.nvfp4 else cutlass.Uint8
        self.s_elems = s_bytes * 8 // self.s_dtype.width
        self.acc_dtype = cutlass.Float32
        self.atom_layout_mnk = (2, 1, 1)
        self.threads = 3 * 128
        self.epi_tile = (TILE_M, epi_routes(tile_n))  # a slot a lane of the store warp
        self.epi_stages = 2
        stage_bytes = TILE_M * TILE_K // 2 + s_bytes + tile_n * TILE_K * 2
        epi_bytes = self.epi_tile[0] * self.epi_tile[1] * 2 * self.epi_stages
        fit = (_SMEM_BYTES - 1024 - epi_bytes - 3 * 1024) // stage_bytes
        self.stages = stages or min(fit, 8)
        if not 2 <= self.stages <= fit:
            raise ValueError(f"{self.stages} stages of {stage_bytes} bytes do not fit shared memory ({fit} do)")
        # what the launch sizes its shared memory to, beside the barriers' few bytes and alignment (reports)
        self.ring_bytes = self.stages * stage_bytes + epi_bytes
        self.a_tx = TILE_M * TILE_K // 2
        self.s_tx = s_bytes
        self.b_tx = tile_n * TILE_K * 2

    @cute.jit
    def __call__(
        self,
        w_panel: cute.Tensor,
        s_panel: cute.Tensor,
        x: cute.Tensor,
        out: cute.Tensor,
        bias: cute.Tensor,
        gscale: cute.Tensor,
        block_expert: cute.Tensor,
        meta: cute.Tensor,
        sorted_ids: cute.Tensor,
        ctas: cutlass.Int32,
        top_k: cutlass.Int32,
        pdl: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        bf16 = cutlass.BFloat16
        # operand views: weights (256 words, row blocks, steps, experts), scales (2 R bytes or R words, steps,
        # experts), activations (NX, K) K-major, output (R, NX): rows contiguous (M-major C)
        m_a = cute.make_tensor(w_panel.iterator, cute.select(w_panel.layout, mode=[3, 2, 1, 0]))
        m_s = cute.make_tensor(s_panel.iterator, cute.select(s_panel.layout, mode=[2, 1, 0]))
        m_b = x
        m_c = cute.make_tensor(out.iterator, cute.select(out.layout, mode=[1, 0]))

        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            bf16,
            bf16,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K,
            self.acc_dtype,
            self.atom_layout_mnk,
            tiler_mn=(64, self.tile_n),
            a_source=warpgroup.OperandSource.RMEM,
        )

        a_smem = cute.make_layout((_PANEL_WORDS, 2, 1, 1, self.stages))
        s_smem = cute.make_layout((self.s_elems, 1, 1, self.stages))
        b_layout = cutlass.tensor_utils.LayoutEnum.ROW_MAJOR  # (N, K) with K contiguous
        b_atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(b_layout, bf16, TILE_K), bf16)
        b_smem = cute.tile_to_shape(b_atom, (self.tile_n, TILE_K, self.stages), order=(0, 1, 2))
        c_layout = cutlass.tensor_utils.LayoutEnum.from_tensor(m_c)
        c_atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(c_layout, bf16, self.epi_tile[0]), bf16
        )
        epi_smem = cute.tile_to_shape(c_atom, (*self.epi_tile, self.epi_stages), order=(1, 0, 2))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tma_m_a = cpasync.make_tiled_tma_atom(
            g2s, m_a, cute.slice_(a_smem, (None, None, None, None, 0)), (_PANEL_WORDS, 2, 1, 1)
        )
        tma_s, tma_m_s = cpasync.make_tiled_tma_atom(
            g2s, m_s, cute.slice_(s_smem, (None, None, None, 0)), (self.s_elems, 1, 1)
        )
        tma_b, tma_m_b = cpasync.make_tiled_tma_atom(
            g2s, m_b, cute.slice_(b_smem, (None, None, 0)), (self.tile_n, TILE_K)
        )  # gathering, unused: the producer warpgroup copies the routes' rows itself
        tma_c, tma_m_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), m_c, cute.slice_(epi_smem, (None, None, 0)), self.epi_tile
        )  # scattering, unused: the consumers store each slot's row at its route

        @cute.struct
        class SharedStorage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            s_a: cute.struct.Align[cute.struct.MemRange[cutlass.Uint64, cute.cosize(a_smem)], 1024]
            s_s: cute.struct.Align[cute.struct.MemRange[self.s_dtype, cute.cosize(s_smem)], 1024]
            s_b: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(b_smem)], 1024]
            s_c: cute.struct.Align[cute.struct.MemRange[bf16, cute.cosize(epi_smem)], 1024]
            tokens: cute.struct.MemRange[cutlass.Int32, self.tile_n]  # gathering: the unit's slots' token rows

        self.shared_storage = SharedStorage
        self.c_layout = c_layout
        kernel = self.kernel(
            tma_a, tma_m_a, tma_s, tma_m_s, tma_b, tma_m_b, tma_c, tma_m_c,
            tiled_mma, a_smem, s_smem, b_smem, epi_smem, block_expert, meta, x, out, bias, gscale, sorted_ids, top_k,
        )  # fmt: skip
        kernel.launch(
            grid=(ctas, 1, 1), block=[self.threads, 1, 1], cluster=(1, 1, 1), min_blocks_per_mp=1, stream=stream,
            use_pdl=cutlass.min(cutlass.max(pdl, 0), 1),
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        m_a: cute.Tensor,
        tma_s: cute.CopyAtom,
        m_s: cute.Tensor,
        tma_b: cute.CopyAtom,
        m_b: cute.Tensor,
        tma_c: cute.CopyAtom,
        m_c: cute.Tensor,
        tiled_mma: cute.TiledMma,
        a_smem: cute.Layout,
        s_smem: cute.Layout,
        b_smem: cute.ComposedLayout,
        epi_smem: cute.ComposedLayout,
        block_expert: cute.Tensor,
        meta: cute.Tensor,
        x: cute.Tensor,
        out: cute.Tensor,
        bias: cute.Tensor,
        gscale: cute.Tensor,
        sorted_ids: cute.Tensor,
        top_k: cutlass.Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_s)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # a stage is full once its TMA bytes land, and, gathering, once each producer thread's copies have (one
        # arrival each, besides the one that expects the TMA bytes)
        gather = self.io == "gather"
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bars.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1 + (_GATHERERS if gather else 0)),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 8),  # one arrival a consumer warp
            tx_count=self.a_tx + self.s_tx + (0 if gather else self.b_tx),
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
            defer_sync=True,
        )
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        s_a = storage.s_a.get_tensor(a_smem)
        s_s = storage.s_s.get_tensor(s_smem)
        s_b = storage.s_b.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        s_c = storage.s_c.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)

        g_a = cute.local_tile(m_a, (_PANEL_WORDS, 2, 1, 1), (None, None, None, None))  # (256, 2, 1, 1, 1, RT, KS, E)
        g_s = cute.local_tile(m_s, (self.s_elems, 1, 1), (None, None, None))  # (256 or 128, 1, 1, RT, KS, E)
        g_b = cute.local_tile(m_b, (self.tile_n, TILE_K), (None, None))  # (TN, 64, blocks, KS)
        g_c = cute.local_tile(m_c, (TILE_M, self.tile_n), (None, None))  # (128, TN, RT, blocks)
        one = cute.make_layout(1)
        t_as, t_ag = cpasync.tma_partition(tma_a, 0, one, cute.group_modes(s_a, 0, 4), cute.group_modes(g_a, 0, 4))
        t_ss, t_sg = cpasync.tma_partition(tma_s, 0, one, cute.group_modes(s_s, 0, 3), cute.group_modes(g_s, 0, 3))
        t_bs, t_bg = cpasync.tma_partition(tma_b, 0, one, cute.group_modes(s_b, 0, 2), cute.group_modes(g_b, 0, 2))
        k_steps = cute.size(g_b, mode=[3])
        tiles_m = cute.size(g_a, mode=[5])
        # a dependent launch starts beside its predecessor: nothing it may write (meta, block_expert, sorted_ids,
        # x) is read before this; the successor may launch now and waits for this grid in turn
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        # blocks in use (device data: a graph replays with new routings), never past the rows x (or, gathering,
        # the slots sorted_ids) holds
        held = cute.size(g_b, mode=[2])
        if cutlass.const_expr(self.io == "gather"):
            held = cute.size(sorted_ids) // self.tile_n
        blocks = cutlass.min(cutlass.max(meta[0], 0), cutlass.min(held, cute.size(block_expert)))
        units = blocks * tiles_m

        wg = cute.arch.make_warp_uniform(tidx // 128)
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg == 0:
            cute.arch.setmaxregister_decrease(40)
        if warp == 0:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            u = cute.arch.block_idx()[0]
            while u < units:
                b = u // tiles_m
                tm = u - b * tiles_m
                # an expert id outside [0, E) lies outside the panels' TMA bounds: its tiles load as zeros, so a
                # block the alignment never fills (or a corrupt id) computes zeros and reads nothing out of bounds
                e = block_expert[b]
                if cutlass.const_expr(gather):
                    self._unit_tokens(storage.tokens.get_tensor(cute.make_layout(self.tile_n)), sorted_ids, b, tidx,
                                      top_k, cute.size(x, mode=[0]))  # fmt: skip
                for k in cutlass.range(k_steps, unroll=1):
                    ring.producer_acquire(state)
                    bar = ring.producer_get_barrier(state)
                    cute.copy(tma_a, t_ag[(None, 0, tm, k, e)], t_as[(None, state.index)], tma_bar_ptr=bar)
                    cute.copy(tma_s, t_sg[(None, tm, k, e)], t_ss[(None, state.index)], tma_bar_ptr=bar)
                    if cutlass.const_expr(gather):
                        self._gather_stage(x, storage.tokens.data_ptr(), s_b, b_smem, tidx, k, state.index, bar)
                    else:
                        cute.copy(tma_b, t_bg[(None, b, k)], t_bs[(None, state.index)], tma_bar_ptr=bar)
                    ring.producer_commit(state)
                    state.advance()
                u += cute.arch.grid_dim()[0]
            ring.producer_tail(state)
        if cutlass.const_expr(gather):
            if (warp > 0) & (wg == 0):  # the other producer warps copy their share of each stage's rows
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                u = cute.arch.block_idx()[0]
                while u < units:
                    b = u // tiles_m
                    self._unit_tokens(storage.tokens.get_tensor(cute.make_layout(self.tile_n)), sorted_ids, b, tidx,
                                      top_k, cute.size(x, mode=[0]))  # fmt: skip
                    for k in cutlass.range(k_steps, unroll=1):
                        ring.sync_object_empty.wait(state.index, state.phase)
                        bar = ring.producer_get_barrier(state)
                        self._gather_stage(x, storage.tokens.data_ptr(), s_b, b_smem, tidx, k, state.index, bar)
                        state.advance()
                    u += cute.arch.grid_dim()[0]

        if wg > 0:
            cute.arch.setmaxregister_increase(232)
            self.consume(ring, tiled_mma, s_a, s_s, s_b, s_c, epi_smem, g_c, tma_c, tiles_m, units, k_steps, tidx,
                         warp, wg, out, bias, gscale, block_expert, sorted_ids, cute.size(m_a, mode=[3]))  # fmt: skip

    @cute.jit
    def _unit_tokens(self, table, sorted_ids, b, tidx, top_k, tokens):
        """Block ``b``'s slots' token rows into ``table`` (the producer warpgroup, traced inline), between two
        barriers of its warps: the previous unit's copies have read the old rows, and every warp sees the new."""
        producers = pipeline.NamedBarrier(barrier_id=2, num_threads=_GATHERERS)
        producers.arrive_and_wait()
        for j in cutlass.range_constexpr(-(-self.tile_n // _GATHERERS)):
            i = tidx + _GATHERERS * j
            if i < self.tile_n:
                table[i] = routes.route_token(sorted_ids[b * self.tile_n + i], top_k, tokens)
        producers.arrive_and_wait()

    @cute.jit
    def _gather_stage(self, x, table, s_b, b_smem, tidx, k, stage, bar):
        """FC1's B stage from its routes' rows (each producer thread, traced inline): thread ``t`` copies 16-byte
        chunk ``t % 8`` of rows ``t // 8 + 16 j`` of the block (a warp: four whole 128-byte rows an instruction) to
        its swizzled place, zeros for an empty slot, then arrives on the stage's mbarrier once they land."""
        chunk = tidx % _ROW_CHUNKS
        base = s_b.iterator.toint()
        tokens = cute.size(x, mode=[0])
        k_len = cute.size(x, mode=[1])
        rows = cute.make_tensor(table, cute.make_layout(self.tile_n))
        per = _GATHERERS // _ROW_CHUNKS  # rows an instruction of the warpgroup
        for j in cutlass.range_constexpr(-(-self.tile_n // per)):
            i = tidx // _ROW_CHUNKS + per * j
            if i < self.tile_n:
                token = rows[i]
                live = token < tokens
                column = k * TILE_K + chunk * (routes.CHUNK_BYTES // 2)
                src = x.iterator.toint() + (cutlass.Int64(cutlass.min(token, tokens - 1)) * k_len + column) * 2
                dst = routes.swizzle128(base + cute.crd2idx((i, chunk * (routes.CHUNK_BYTES // 2), stage),
                                                            b_smem.outer) * 2)  # fmt: skip
                routes.copy_chunk(dst, src, cutlass.Int32(live))
        cute.arch.cp_async_mbarrier_arrive_noinc(bar)

    @cute.jit
    def consume(
        self, ring, tiled_mma, s_a, s_s, s_b, s_c, epi_smem, g_c, tma_c, tiles_m, units, k_steps, tidx, warp, wg,
        out, bias, gscale, block_expert, sorted_ids, experts,
    ):  # fmt: skip
        t = tidx % 128
        row_block = wg - 1
        lane = t % 32
        r0 = row_block * 64 + (t // 32) * 16 + lane // 4  # this thread's rows in the tile: r0 and r0 + 8
        thr_mma = tiled_mma.get_slice(tidx - 128)
        t_cs_b = thr_mma.partition_B(s_b)
        t_cr_b = tiled_mma.make_fragment_B(t_cs_b)  # (MMA, MMA_N, MMA_K = 4, stages)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, self.tile_n)), self.acc_dtype)
        frag = [
            tiled_mma.make_fragment_A(thr_mma.partition_shape_A((TILE_M, 16))),
            tiled_mma.make_fragment_A(thr_mma.partition_shape_A((TILE_M, 16))),
        ]
        frag_words = [cute.recast_tensor(f, cutlass.Uint32) for f in frag]
        s_words = cute.recast_tensor(s_a, cutlass.Uint32)  # (512, 2, 1, 1, stages)
        words = cute.make_rmem_tensor((4,), cutlass.Uint32)

        # epilogue partitions (as CUTLASS's Hopper persistent GEMM)
        c_store = sm90_utils.sm90_get_smem_store_op(
            self.c_layout, elem_ty_d=cutlass.BFloat16, elem_ty_acc=self.acc_dtype
        )
        c_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(self.c_layout.is_m_major_c(), 4), cutlass.BFloat16
        )
        r2s = cute.make_tiled_copy_S(c_store, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
        thr_r2s = r2s.get_slice(tidx - 128)
        t_rs_s = thr_r2s.partition_D(s_c)
        t_rs_acc = r2s.retile(acc)
        rd_shape = cute.shape(thr_r2s.partition_S(s_c))
        t_rs_d = cute.make_rmem_tensor(cute.make_layout(rd_shape[:3]).shape, self.acc_dtype)
        t_rs_out = cute.make_rmem_tensor(cute.make_layout(rd_shape[:3]).shape, cutlass.BFloat16)
        per_sub = cute.size(t_rs_d)
        epi_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=256)
        store_ring = pipeline.PipelineTmaStore.create(
            num_stages=self.epi_stages, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 256)
        )

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        done = cutlass.Int32(0)  # tiles this CTA has stored: the epilogue's buffer parity
        u = cute.arch.block_idx()[0]
        while u < units:
            b = u // tiles_m
            tm = u - b * tiles_m
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            g_e = cutlass.Float32(1.0)  # NVFP4's global scale of the block's expert
            if cutlass.const_expr(self.nvfp4):
                g_e = self._global_scale(gscale, block_expert, b, experts)
            # STEP_GROUP steps a loop iteration: the pipeline drains (wait for zero wgmmas) once a group, at the
            # loop's back edge; the remainder steps run one a group
            groups = k_steps // STEP_GROUP
            for _ in cutlass.range(groups, unroll=1):
                for g in cutlass.range_constexpr(STEP_GROUP):
                    self._consumer_wait(ring, read)
                    self._mma_step(tiled_mma, acc, frag, frag_words, words, s_words, s_s, t_cr_b, read.index, t,
                                   row_block, r0, g == STEP_GROUP - 1)  # fmt: skip
                    if g > 0:  # the previous step's wgmmas completed (its stage is free)
                        ring.consumer_release(release)
                        release.advance()
                    read.advance()
                ring.consumer_release(release)
                release.advance()
            for _ in cutlass.range(k_steps - groups * STEP_GROUP, unroll=1):
                self._consumer_wait(ring, read)
                self._mma_step(tiled_mma, acc, frag, frag_words, words, s_words, s_s, t_cr_b, read.index, t,
                               row_block, r0, True)  # fmt: skip
                ring.consumer_release(release)
                release.advance()
                read.advance()

            if cutlass.const_expr(self.act == ACT_NONE):
                # epilogue: bf16 subtiles of (128 rows, 32 tokens) through shared memory, stored by TMA
                if cutlass.const_expr(self.io != "scatter"):
                    g_c_tile = cute.zipped_divide(g_c[(None, None, tm, b)], self.epi_tile)
                    b_sd, b_gd = cpasync.tma_partition(
                        tma_c, 0, cute.make_layout(1), cute.group_modes(s_c, 0, 2), g_c_tile
                    )
                subtiles = self.tile_n // self.epi_tile[1]
                for e in cutlass.range_constexpr(subtiles):
                    for v in cutlass.range_constexpr(per_sub):
                        if cutlass.const_expr(self.nvfp4):
                            t_rs_d[v] = t_rs_acc[e * per_sub + v] * g_e
                        else:
                            t_rs_d[v] = t_rs_acc[e * per_sub + v]
                    t_rs_out.store(t_rs_d.load().to(cutlass.BFloat16))
                    buf = (done * subtiles + e) % self.epi_stages
                    cute.copy(r2s, t_rs_out, t_rs_s[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    epi_bar.arrive_and_wait()
                    if cutlass.const_expr(self.io == "scatter"):
                        self._scatter_subtile(s_c, epi_smem, sorted_ids, out, b, tm, e, buf, tidx - 128)
                    elif warp == 4:
                        cute.copy(tma_c, b_sd[(None, buf)], b_gd[(None, e)])
                        store_ring.producer_commit()
                        store_ring.producer_acquire()
                    epi_bar.arrive_and_wait()
            else:
                self._activation_epilogue(acc, g_e, out, bias, block_expert, experts, b, tm, t, lane, row_block, r0)
            done += 1
            u += cute.arch.grid_dim()[0]
        store_ring.producer_tail()

    def _consumer_wait(self, ring, read):
        """Wait for a full stage (traced inline); gathering, its B rows were written by ``cp.async`` (the generic
        proxy), so fence them before wgmma reads the stage through the async proxy."""
        ring.consumer_wait(read)
        if self.io == "gather":
            cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def _scatter_subtile(self, s_c, epi_smem, sorted_ids, out, b, tm, e, buf, t):
        """FC2's subtile ``e`` of block ``b`` to its routes' rows (the consumers, traced inline): 16 threads a slot,
        thread ``t`` storing 16-byte chunk ``t % 16`` of slot ``t // 16``'s 128 outputs (then of 16 slots on) at
        row ``sorted_ids[slot]`` of ``out [pairs, R]``; a slot without a route and columns past ``R`` store
        nothing."""
        chunks = OUT_CHUNKS  # a slot's row in the subtile
        per = STORE_THREADS // chunks  # slots a pass of the consumers
        base = s_c.iterator.toint()
        rows = cute.size(out, mode=[0])
        columns = cute.size(out, mode=[1])
        c = t % chunks
        column = tm * TILE_M + c * (routes.CHUNK_BYTES // 2)
        for j in cutlass.range_constexpr(-(-self.epi_tile[1] // per)):
            n = t // chunks + per * j
            if n < self.epi_tile[1]:
                route = sorted_ids[b * self.tile_n + e * self.epi_tile[1] + n]
                if (route >= 0) & (route < rows) & (column < columns):
                    off = cute.crd2idx((c * (routes.CHUNK_BYTES // 2), n, buf), epi_smem.outer) * 2
                    dst = out.iterator.toint() + (cutlass.Int64(route) * columns + column) * 2
                    routes.store_chunk(routes.swizzle128(base + off), dst)

    def _mma_step(self, tiled_mma, acc, frag, frag_words, words, s_words, s_s, t_cr_b, stage, t, row_block, r0, last):
        """One K step of a consumer (traced inline): its four weight words and scale factors from the stage, then
        per K slice the conversion into A registers and the wgmma. One wgmma stays in flight while the next slice
        converts; the ``last`` step of a group waits for all (ptxas cannot prove a conversion safe across the
        loop's back edge and would serialize every wgmma of the loop otherwise)."""
        for i in range(4):
            words[i] = s_words[(t * 4 + i, row_block, 0, 0, stage)]
        if self.nvfp4:  # rows r0, r0 + 8: a word of four E4M3 bytes each, byte j for slice j
            s0 = s_s[(r0, 0, 0, stage)]
            s1 = s_s[(r0 + 8, 0, 0, stage)]
        else:
            f0a = _asm_u32(FACTOR_PTX, cutlass.Uint32(s_s[(2 * r0, 0, 0, stage)]))
            f0b = _asm_u32(FACTOR_PTX, cutlass.Uint32(s_s[(2 * r0 + 1, 0, 0, stage)]))
            f1a = _asm_u32(FACTOR_PTX, cutlass.Uint32(s_s[(2 * r0 + 16, 0, 0, stage)]))
            f1b = _asm_u32(FACTOR_PTX, cutlass.Uint32(s_s[(2 * r0 + 17, 0, 0, stage)]))
        for j in range(4):
            if self.nvfp4:
                f0 = _asm_u32(E4M3_FACTOR_PTX[j], s0)
                f1 = _asm_u32(E4M3_FACTOR_PTX[j], s1)
            else:
                f0 = f0a if j < 2 else f0b  # slices 0, 1: the step's first scale block
                f1 = f1a if j < 2 else f1b
            dst = frag_words[j % 2]
            dst[0] = _asm_u32(PAIR_PTX[0], words[j], f0)
            dst[1] = _asm_u32(PAIR_PTX[1], words[j], f1)
            dst[2] = _asm_u32(PAIR_PTX[2], words[j], f0)
            dst[3] = _asm_u32(PAIR_PTX[3], words[j], f1)
            warpgroup.fence()
            cute.gemm(tiled_mma, acc, frag[j % 2][(None, None, 0)], t_cr_b[(None, None, j, stage)], acc)
            warpgroup.commit_group()
            warpgroup.wait_group(0 if last and j == 3 else 1)

    @cute.jit
    def _global_scale(self, gscale, block_expert, b, experts):
        """NVFP4's global scale of block ``b``'s expert (1.0 for an invalid block, which computes zeros)."""
        e = block_expert[b]
        inside = cutlass.min(cutlass.max(e, 0), experts - 1)
        g = gscale[inside]
        if inside != e:
            g = cutlass.Float32(1.0)
        return g

    @cute.jit
    def _activation_epilogue(self, acc, g, out, bias, block_expert, experts, b, tm, t, lane, row_block, r0):
        """FC1's activation from the accumulators (traced inline): W13's rows are in engine order, so a thread's
        rows ``r0`` and ``r0 + 8`` are the gate and the up row of one output column ``n``; its accumulator values
        ``4 c + i`` (``i``: column parity, then row + 8) are routes ``8 c + 2 q + (i % 2)`` of the block, each
        times ``g`` (NVFP4's global scale) before the bias. bf16 stores straight to ``out [NX, R / 2]``, past its end
        predicated off."""
        e = block_expert[b]
        e = cutlass.min(cutlass.max(e, 0), experts - 1)  # an invalid block computes zeros; its bias index stays in
        rows = cute.size(bias, mode=[1])
        n = tm * (TILE_M // 2) + row_block * 32 + (t // 32) * 8 + lane // 4
        gate_bias = cutlass.Float32(0.0)
        up_bias = cutlass.Float32(0.0)
        if cutlass.const_expr(self.bias):
            gate_bias = bias[(e, cutlass.min(tm * TILE_M + r0, rows - 1))]
            up_bias = bias[(e, cutlass.min(tm * TILE_M + r0 + 8, rows - 1))]
        tokens = cute.size(out, mode=[0])
        columns = cute.size(out, mode=[1])
        q = lane % 4
        for c in cutlass.range_constexpr(self.tile_n // 8):
            for i in cutlass.range_constexpr(2):
                gate = acc[4 * c + i]
                up = acc[4 * c + 2 + i]
                if cutlass.const_expr(self.nvfp4):
                    gate = gate * g
                    up = up * g
                gate = gate + gate_bias
                up = up + up_bias
                if cutlass.const_expr(self.act == ACT_SILU):
                    v = gate * _sigmoid(gate) * up
                else:
                    gate = cutlass.min(gate, SWIGLU_LIMIT)
                    up = cutlass.min(cutlass.max(up, -SWIGLU_LIMIT), SWIGLU_LIMIT)
                    v = gate * _sigmoid(SWIGLU_ALPHA * gate) * (up + 1.0)
                token = b * self.tile_n + 8 * c + 2 * q + i
                if token < tokens and n < columns:
                    out[(token, n)] = v.to(cutlass.BFloat16)
