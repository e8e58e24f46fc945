"""The engine's grouped W4A8 GEMM (issue 47, ``docs/moe-engine.md`` §4.7): MXFP4 weights converted exactly into E4M3
wgmma A registers, E4M3 activations with a float32 scale a route (vLLM's dynamic per-token FP8), FP8 tensor cores.

    out[n, r] = xs[n] * 2 ** (b[e, r] - 127) * sum_k e4m3(x[n, k]) * e2m1(w[e, r, k]) * 2 ** (s[e, r, k/32] - b[e, r])

for rows ``n`` of every route block below ``meta[0]``, ``e`` the block's expert, ``b`` the row bases (blocks of
experts outside ``[0, E)`` compute zeros; blocks past ``meta[0]`` are never stored). The structure is the FP4 x
bf16 engine's (:mod:`~csf_kernels.moe.kernels.engine_gemm`: persistent CTAs over (block, 128-row tile) units,
producer warp 0 filling a TMA ring, two consumer warpgroups of 64 weight rows, swap-AB) with these differences:

* a stage is 128 K (two panel steps: 8 KB of weights, 512 scale bytes, ``TILE_N x 128`` E4M3 bytes, 128-byte
  swizzle), one promotion interval: Hopper's FP8 wgmma accumulates with limited precision, so every tile's partial
  sums join the float32 accumulator at least every 128 K;
* per k32 slice (one MXFP4 block) a thread converts two panel words into its four E4M3 A registers through its two
  rows' tables (:mod:`~csf_kernels.moe.kernels.w4a8_convert`: one ``prmt`` and the sign bits a register), the
  offset ``d = s - base`` folded into the bytes; ``wgmma.m64nNk32`` e4m3 x e4m3 -> f32 with A from registers;
* **folded tiles** (the weight prep's flag: every block of the tile's rows has ``FOLD_MIN <= d <= FOLD_MAX``): the
  stage's four wgmmas accumulate into a second accumulator, added to the first once a stage;
* **promoted tiles**: every block converts with ``d = 0`` (the E2M1 values) and its k32 partial is scaled by
  ``2 ** d`` into the first accumulator (one FMA pass a k32, the pipeline drained each time: rare tiles);
* the epilogue multiplies row ``r`` by ``2 ** (base - 127)`` and route ``n`` by its activation scale, then stores
  as the FP4 engine does (:mod:`~csf_kernels.moe.kernels.engine_epilogue`: bf16 by TMA, or FC1's activation).

Operands: ``w_panel`` uint64 ``[E, KS, R / 64, 256]`` (:func:`csf_kernels.moe.w4a8_panels.w4a8_weight_panel`,
``KS = K / 64``), ``s_panel`` uint8 ``[E, KS, 2 R]`` (the MXFP4 scale panel), ``bases`` uint8 ``[E, R]``, ``flags``
uint8 ``[E, ceil(R / 128)]``, ``x`` uint8 ``[NX, K]`` (E4M3 bytes, rows in block order), ``xscale`` float32
``[NX]``, ``out`` bf16 ``[NX, R]`` (or ``R / 2`` with a fused activation), ``bias`` float32 ``[E, R]``,
``block_expert`` int32, ``meta`` int32. K past the last whole stage and rows past ``R`` read as zeros.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from csf_kernels.moe.engine_panels import PANEL_STEP_K, PANEL_WORDS
from csf_kernels.moe.engine_specs import ENGINE_TILE_M as TILE_M
from csf_kernels.moe.kernels.engine_epilogue import ACT_NONE, Epilogue, asm_f32, asm_u32
from csf_kernels.moe.kernels.engine_producer import make_ring, produce, units_in_use
from csf_kernels.moe.kernels.w4a8_convert import (
    E4M3_LUT,
    GROUP_PTX,
    LUT_BIAS,
    PLAIN_TABLE,
    PROMOTION_FACTOR_PTX,
    ROW_FACTOR_PTX,
)
from csf_kernels.moe.w4a8_specs import W4A8_TILE_N

__all__ = ["STAGE_K", "W4A8_TILE_N", "GroupedW4A8Gemm"]

STAGE_K = 128  # K a stage: four k32 wgmmas, two panel steps, the promotion interval
SUBSTEPS = STAGE_K // PANEL_STEP_K
_SMEM_BYTES = 232448  # a block's dynamic shared memory on sm_90a
_S_BYTES = 2 * TILE_M * SUBSTEPS  # a stage's E8M0 bytes: two a row a panel step


class GroupedW4A8Gemm:
    """One compiled program: ``tile_n`` routes a block, ``stages`` deep ring (default: as many as fit, at most 8),
    ``act`` and ``bias`` as :class:`~csf_kernels.moe.kernels.engine_epilogue.Epilogue`. Call signature:
    ``(w_panel, s_panel, bases, flags, x, xscale, out, bias, block_expert, meta, ctas, stream)``."""

    def __init__(self, tile_n: int = 128, stages: int = 0, act: int = ACT_NONE, bias: bool = False):
        if tile_n not in W4A8_TILE_N:
            raise ValueError(f"the W4A8 GEMM takes {W4A8_TILE_N} routes a block; got {tile_n}")
        self.epilogue = Epilogue(tile_n, act, bias, scaled=False)  # validates act and bias
        self.tile_n = tile_n
        self.act = act
        self.bias = bias
        self.threads = 3 * 128
        stage_bytes = TILE_M * STAGE_K // 2 + _S_BYTES + tile_n * STAGE_K
        fit = (_SMEM_BYTES - 1024 - self.epilogue.smem_bytes - 3 * 1024) // stage_bytes
        self.stages = stages or min(fit, 8)
        if not 2 <= self.stages <= fit:
            raise ValueError(f"{self.stages} stages of {stage_bytes} bytes do not fit shared memory ({fit} do)")
        self.ring_bytes = self.stages * stage_bytes + self.epilogue.smem_bytes
        self.tx = stage_bytes

    @cute.jit
    def __call__(
        self,
        w_panel: cute.Tensor,
        s_panel: cute.Tensor,
        bases: cute.Tensor,
        flags: cute.Tensor,
        x: cute.Tensor,
        xscale: cute.Tensor,
        out: cute.Tensor,
        bias: cute.Tensor,
        block_expert: cute.Tensor,
        meta: cute.Tensor,
        ctas: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        fp8 = cutlass.Float8E4M3FN
        # views: weights (256 words, row blocks, steps, experts), scales (2 R bytes, steps, experts), activations
        # (NX, K) K-major as E4M3, output (R, NX): rows contiguous (M-major C)
        m_a = cute.make_tensor(w_panel.iterator, cute.select(w_panel.layout, mode=[3, 2, 1, 0]))
        m_s = cute.make_tensor(s_panel.iterator, cute.select(s_panel.layout, mode=[2, 1, 0]))
        m_b = cute.make_tensor(cute.recast_ptr(x.iterator, dtype=fp8), x.layout)
        m_c = cute.make_tensor(out.iterator, cute.select(out.layout, mode=[1, 0]))

        # two MMAs, one zeroing its accumulator first: the field is set once, outside the branches that use it
        tiled_mma, mma_zero = (
            sm90_utils.make_trivial_tiled_mma(
                fp8,
                fp8,
                cute.nvgpu.OperandMajorMode.K,
                cute.nvgpu.OperandMajorMode.K,
                cutlass.Float32,
                (2, 1, 1),
                tiler_mn=(64, self.tile_n),
                a_source=warpgroup.OperandSource.RMEM,
            )
            for _ in range(2)
        )

        a_smem = cute.make_layout((PANEL_WORDS, 2, SUBSTEPS, 1, self.stages))
        s_smem = cute.make_layout((_S_BYTES // SUBSTEPS, SUBSTEPS, 1, self.stages))
        b_layout = cutlass.tensor_utils.LayoutEnum.ROW_MAJOR  # (N, K) with K contiguous
        b_atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(b_layout, fp8, STAGE_K), fp8)
        b_smem = cute.tile_to_shape(b_atom, (self.tile_n, STAGE_K, self.stages), order=(0, 1, 2))
        c_layout = cutlass.tensor_utils.LayoutEnum.from_tensor(m_c)
        epi_smem = self.epilogue.smem_layout(c_layout)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tma_m_a = cpasync.make_tiled_tma_atom(
            g2s, m_a, cute.slice_(a_smem, (None, None, None, None, 0)), (PANEL_WORDS, 2, SUBSTEPS, 1)
        )
        tma_s, tma_m_s = cpasync.make_tiled_tma_atom(
            g2s, m_s, cute.slice_(s_smem, (None, None, None, 0)), (_S_BYTES // SUBSTEPS, SUBSTEPS, 1)
        )
        tma_b, tma_m_b = cpasync.make_tiled_tma_atom(
            g2s, m_b, cute.slice_(b_smem, (None, None, 0)), (self.tile_n, STAGE_K)
        )
        tma_c, tma_m_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), m_c, cute.slice_(epi_smem, (None, None, 0)), self.epilogue.tile
        )

        @cute.struct
        class SharedStorage:
            bars: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            lut: cute.struct.Align[cute.struct.MemRange[cutlass.Uint32, 2 * len(E4M3_LUT)], 16]
            s_a: cute.struct.Align[cute.struct.MemRange[cutlass.Uint64, cute.cosize(a_smem)], 1024]
            s_s: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cute.cosize(s_smem)], 1024]
            s_b: cute.struct.Align[cute.struct.MemRange[fp8, cute.cosize(b_smem)], 1024]
            s_c: cute.struct.Align[cute.struct.MemRange[cutlass.BFloat16, cute.cosize(epi_smem)], 1024]

        self.shared_storage = SharedStorage
        self.c_layout = c_layout
        kernel = self.kernel(
            tma_a, tma_m_a, tma_s, tma_m_s, tma_b, tma_m_b, tma_c, tma_m_c,
            tiled_mma, mma_zero, a_smem, s_smem, b_smem, epi_smem, bases, flags, xscale, block_expert, meta, out, bias,
        )  # fmt: skip
        kernel.launch(
            grid=(ctas, 1, 1), block=[self.threads, 1, 1], cluster=(1, 1, 1), min_blocks_per_mp=1, stream=stream
        )

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
        mma_zero: cute.TiledMma,
        a_smem: cute.Layout,
        s_smem: cute.Layout,
        b_smem: cute.ComposedLayout,
        epi_smem: cute.ComposedLayout,
        bases: cute.Tensor,
        flags: cute.Tensor,
        xscale: cute.Tensor,
        block_expert: cute.Tensor,
        meta: cute.Tensor,
        out: cute.Tensor,
        bias: cute.Tensor,
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
        ring = make_ring(storage.bars.data_ptr(), self.stages, self.tx)
        # the conversion tables, written before the barrier that publishes the ring's initialization
        lut = storage.lut.get_tensor(cute.make_layout(2 * len(E4M3_LUT)))
        for i in cutlass.range_constexpr(2 * len(E4M3_LUT)):
            if tidx == i:
                lut[i] = cutlass.Uint32(E4M3_LUT[i // 2][i % 2])
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        s_a = storage.s_a.get_tensor(a_smem)
        s_s = storage.s_s.get_tensor(s_smem)
        s_b = storage.s_b.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        s_c = storage.s_c.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)

        tile_a = (PANEL_WORDS, 2, SUBSTEPS, 1)
        g_a = cute.local_tile(m_a, tile_a, (None, None, None, None))  # (256, 2, 2, 1, 1, RT, KS / 2, E)
        g_s = cute.local_tile(m_s, (_S_BYTES // SUBSTEPS, SUBSTEPS, 1), (None, None, None))  # (256, 2, 1, RT, ., E)
        g_b = cute.local_tile(m_b, (self.tile_n, STAGE_K), (None, None))  # (TN, 128, blocks, K / 128)
        g_c = cute.local_tile(m_c, (TILE_M, self.tile_n), (None, None))  # (128, TN, RT, blocks)
        one = cute.make_layout(1)
        t_as, t_ag = cpasync.tma_partition(tma_a, 0, one, cute.group_modes(s_a, 0, 4), cute.group_modes(g_a, 0, 4))
        t_ss, t_sg = cpasync.tma_partition(tma_s, 0, one, cute.group_modes(s_s, 0, 3), cute.group_modes(g_s, 0, 3))
        t_bs, t_bg = cpasync.tma_partition(tma_b, 0, one, cute.group_modes(s_b, 0, 2), cute.group_modes(g_b, 0, 2))
        k_steps = cute.size(g_b, mode=[3])
        tiles_m = cute.size(g_a, mode=[5])
        units = units_in_use(meta, block_expert, cute.size(g_b, mode=[2]), tiles_m)

        wg = cute.arch.make_warp_uniform(tidx // 128)
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg == 0:
            cute.arch.setmaxregister_decrease(40)
        if warp == 0:
            copies = ((tma_a, t_ag, t_as), (tma_s, t_sg, t_ss), (tma_b, t_bg, t_bs))
            produce(ring, self.stages, copies, block_expert, tiles_m, units, k_steps)

        if wg > 0:
            cute.arch.setmaxregister_increase(232)
            self.consume(ring, tiled_mma, mma_zero, lut, s_a, s_s, s_b, s_c, g_c, tma_c, tiles_m, units, k_steps, tidx,
                         warp, wg, bases, flags, xscale, out, bias, block_expert, cute.size(m_a, mode=[3]))  # fmt: skip

    @cute.jit
    def consume(
        self, ring, tiled_mma, mma_zero, lut, s_a, s_s, s_b, s_c, g_c, tma_c, tiles_m, units, k_steps, tidx, warp, wg,
        bases, flags, xscale, out, bias, block_expert, experts,
    ):  # fmt: skip
        t = tidx % 128
        row_block = wg - 1
        lane = t % 32
        r0 = row_block * 64 + (t // 32) * 16 + lane // 4  # this thread's rows in the tile: r0 and r0 + 8
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        mma_zero.set(warpgroup.Field.ACCUMULATE, False)
        mmas = (mma_zero, tiled_mma)
        thr_mma = tiled_mma.get_slice(tidx - 128)
        t_cr_b = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))  # (MMA, MMA_N, MMA_K = 4, stages)
        acc_shape = thr_mma.partition_shape_C((TILE_M, self.tile_n))
        acc = cute.make_rmem_tensor(acc_shape, cutlass.Float32)
        part = cute.make_rmem_tensor(acc_shape, cutlass.Float32)  # a stage's (or a promoted k32's) partial sums
        frag = [
            tiled_mma.make_fragment_A(thr_mma.partition_shape_A((TILE_M, 32))),
            tiled_mma.make_fragment_A(thr_mma.partition_shape_A((TILE_M, 32))),
        ]
        frag_words = [cute.recast_tensor(f, cutlass.Uint32) for f in frag]
        s_words = cute.recast_tensor(s_a, cutlass.Uint32)  # (512, 2, 2, 1, stages)
        words = cute.make_rmem_tensor((4 * SUBSTEPS,), cutlass.Uint32)
        epi = self.epilogue.partitions(tiled_mma, self.c_layout, s_c, acc, tidx)

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        done = cutlass.Int32(0)  # tiles this CTA has stored: the epilogue's buffer parity
        rows = cute.size(bases, mode=[1])
        u = cute.arch.block_idx()[0]
        while u < units:
            b = u // tiles_m
            tm = u - b * tiles_m
            e = cutlass.min(cutlass.max(block_expert[b], 0), experts - 1)  # an invalid block computes zeros
            folds = flags[(e, tm)] != 0
            base0 = cutlass.Int32(bases[(e, cutlass.min(tm * TILE_M + r0, rows - 1))])
            base1 = cutlass.Int32(bases[(e, cutlass.min(tm * TILE_M + r0 + 8, rows - 1))])
            acc.fill(0.0)
            for _ in cutlass.range(k_steps, unroll=1):
                ring.consumer_wait(read)
                for i in cutlass.range_constexpr(4 * SUBSTEPS):
                    words[i] = s_words[(t * 4 + i % 4, row_block, i // 4, 0, read.index)]
                if folds:
                    self._folded_stage(mmas, acc, part, frag, frag_words, words, lut, s_s, t_cr_b, read.index,
                                       r0, LUT_BIAS - base0, LUT_BIAS - base1)  # fmt: skip
                else:
                    self._promoted_stage(mma_zero, acc, part, frag, frag_words, words, s_s, t_cr_b, read.index, r0,
                                         base0, base1)  # fmt: skip
                ring.consumer_release(read)
                read.advance()

            self._scale(acc, xscale, b, lane, base0, base1)
            if cutlass.const_expr(self.act == ACT_NONE):
                self.epilogue.store(epi, cutlass.Float32(1.0), s_c, g_c, tma_c, tm, b, done, warp)
            else:
                self.epilogue.activation(acc, cutlass.Float32(1.0), out, bias, block_expert, experts, b, tm, t, lane,
                                         row_block, r0)  # fmt: skip
            done += 1
            u += cute.arch.grid_dim()[0]
        epi.ring.producer_tail()

    def _slice_scales(self, s_s, stage, r0, j):
        """E8M0 bytes of k32 slice ``j``'s block in rows ``r0`` and ``r0 + 8`` (traced inline)."""
        h, blk = j // SUBSTEPS, j % SUBSTEPS
        s0 = cutlass.Int32(s_s[(2 * r0 + blk, h, 0, stage)])
        s1 = cutlass.Int32(s_s[(2 * (r0 + 8) + blk, h, 0, stage)])
        return s0, s1

    def _convert(self, frag_words, words, j, t0, t1):
        """Slice ``j``'s A registers from its two words through the rows' tables ``t0``, ``t1`` ((lo, hi) each)."""
        dst = frag_words[j % 2]
        wa = words[(j // SUBSTEPS) * 4 + 2 * (j % SUBSTEPS)]  # registers 0, 1: k = 4q .. 4q + 3
        wb = words[(j // SUBSTEPS) * 4 + 2 * (j % SUBSTEPS) + 1]  # registers 2, 3: k + 16
        dst[0] = asm_u32(GROUP_PTX[0], wa, *t0)
        dst[1] = asm_u32(GROUP_PTX[1], wa, *t1)
        dst[2] = asm_u32(GROUP_PTX[0], wb, *t0)
        dst[3] = asm_u32(GROUP_PTX[1], wb, *t1)

    def _folded_stage(self, mmas, acc, part, frag, frag_words, words, lut, s_s, t_cr_b, stage, r0, kb0, kb1):
        """A folded tile's stage (traced inline): four k32 wgmmas into ``part`` (one in flight while the next slice
        converts; the last waits for all), then ``acc += part``."""
        for j in range(4):
            s0, s1 = self._slice_scales(s_s, stage, r0, j)
            i0 = (s0 + kb0) & 15
            i1 = (s1 + kb1) & 15
            self._convert(frag_words, words, j, (lut[2 * i0], lut[2 * i0 + 1]), (lut[2 * i1], lut[2 * i1 + 1]))
            warpgroup.fence()
            cute.gemm(mmas[min(j, 1)], part, frag[j % 2][(None, None, 0)], t_cr_b[(None, None, j, stage)], part)
            warpgroup.commit_group()
            warpgroup.wait_group(0 if j == 3 else 1)
        for i in range(cute.size(acc)):
            acc[i] = acc[i] + part[i]

    def _promoted_stage(self, mma_zero, acc, part, frag, frag_words, words, s_s, t_cr_b, stage, r0, base0, base1):
        """A promoted tile's stage (traced inline): per k32, the E2M1 values' wgmma into ``part``, then ``acc +=
        part * 2 ** (s - base)`` per row."""
        plain = (cutlass.Uint32(PLAIN_TABLE[0]), cutlass.Uint32(PLAIN_TABLE[1]))
        for j in range(4):
            s0, s1 = self._slice_scales(s_s, stage, r0, j)
            f0 = asm_f32(PROMOTION_FACTOR_PTX, s0, base0)
            f1 = asm_f32(PROMOTION_FACTOR_PTX, s1, base1)
            self._convert(frag_words, words, j, plain, plain)
            warpgroup.fence()
            cute.gemm(mma_zero, part, frag[j % 2][(None, None, 0)], t_cr_b[(None, None, j, stage)], part)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            for i in range(cute.size(acc)):
                acc[i] = part[i] * (f0 if i % 4 < 2 else f1) + acc[i]

    def _scale(self, acc, xscale, b, lane, base0, base1):
        """The epilogue's factors (traced inline): value ``4 c + i`` is row ``r0 + 8 (i // 2)`` (times ``2 ** (base
        - 127)``) and route ``8 c + 2 q + i % 2`` (times its activation scale)."""
        rf0 = asm_f32(ROW_FACTOR_PTX, base0)
        rf1 = asm_f32(ROW_FACTOR_PTX, base1)
        q = lane % 4
        last = cute.size(xscale) - 1  # a last block past NX (a dense call's) reads its last scale, never stored
        for c in range(self.tile_n // 8):
            for i in range(2):
                xs = xscale[cutlass.min(b * self.tile_n + 8 * c + 2 * q + i, last)]
                acc[4 * c + i] = acc[4 * c + i] * (rf0 * xs)
                acc[4 * c + 2 + i] = acc[4 * c + 2 + i] * (rf1 * xs)
