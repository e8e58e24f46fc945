"""The consumers' epilogue of the engine's grouped GEMMs (``docs/moe-engine.md`` §4.6), shared by the FP4 x bf16 GEMM
(:mod:`~csf_kernels.moe.kernels.engine_gemm`) and the W4A8 one (:mod:`~csf_kernels.moe.kernels.engine_gemm_fp8`).

A consumer warpgroup holds a ``64 x TILE_N`` fp32 accumulator of ``wgmma.m64nN`` (swap-AB: weight rows are M,
routes N); thread ``t`` (warp ``t // 32``, lane ``l``) holds rows ``r0 = 16 (t // 32) + l // 4`` and ``r0 + 8`` of
its warpgroup's 64, its value ``4 c + i`` being row ``r0 + 8 (i // 2)``, route ``8 c + 2 (l % 4) + i % 2``. Two forms:

* :meth:`Epilogue.store`: the GEMM in bf16, through a shared subtile of ``(128 rows, 32 routes)`` stored by TMA
  (``out`` is M-major from the MMA's view: weight rows are contiguous), each value times ``g`` first if given;
  scattering (FC2, ``scatter``), the consumers store each slot's row of the subtile at its route instead, 16 bytes
  a thread (:mod:`~csf_kernels.moe.kernels.engine_routes`);
* :meth:`Epilogue.activation`: FC1's activation, W13's rows in engine order (``engine_panels.fc1_engine_rows``) so
  that rows ``r0`` and ``r0 + 8`` are output ``n``'s gate and up; bias first, then SiLU-and-mul or gpt-oss's
  clamped SwiGLU; bf16 stored straight to ``out [NX, R / 2]``;
* :meth:`Epilogue.partial`: a K split's float32 accumulator as it is (no global scale, bias or activation: the
  finishing kernels apply them to the sum of the splits) at its route's row of split ``s``'s partials.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup

from csf_kernels.moe.engine_rows import OUT_CHUNKS, STORE_THREADS, epi_routes
from csf_kernels.moe.engine_specs import ENGINE_TILE_M as TILE_M
from csf_kernels.moe.kernels import engine_routes as routes

__all__ = ["ACT_NONE", "ACT_SILU", "ACT_SWIGLU_OAI", "Epilogue", "asm_f32", "asm_u32"]

ACT_NONE, ACT_SILU, ACT_SWIGLU_OAI = 0, 1, 2  # the epilogue: the GEMM, or FC1's activation of it
SWIGLU_ALPHA = 1.702  # gpt-oss's clamped SwiGLU (csf_moe.reference)
SWIGLU_LIMIT = 7.0


def _inline_asm(dtype, out: str, asm: str, args):
    return dtype(
        llvm.inline_asm(
            dtype.mlir_type,
            [cutlass.Uint32(a).ir_value() for a in args],
            asm,
            out + ",r" * len(args),
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


def asm_u32(asm: str, *args) -> cutlass.Uint32:
    """``$0 = asm($1, ...)`` on 32-bit registers, no side effects."""
    return _inline_asm(cutlass.Uint32, "=r", asm, args)


def asm_f32(asm: str, *args) -> cutlass.Float32:
    """``$0 = asm($1, ...)``: 32-bit register inputs, a float32 result (the PTX may treat it as ``.b32``)."""
    return _inline_asm(cutlass.Float32, "=f", asm, args)


LOG2_E = 1.4426950408889634


def _sigmoid(x):
    """``1 / (1 + e^-x)`` by the SFU's ``ex2.approx`` and ``rcp.approx`` (about 2^-22 relative each, far below
    the bf16 rounding that follows): two instructions where the IEEE forms cost about 25 an output, a division's
    slow-path call among them, in an epilogue the tensor cores wait through. Infinities and NaN map as the exact
    form's: -inf -> 0, +inf -> 1, NaN -> NaN."""
    return cute.arch.rcp_approx(1.0 + cute.math.exp2(x * -LOG2_E, fastmath=True))


PARTIAL_FORMS = ("rows", "fc1")  # a split's partials: rows as they are (FC2), or W13's engine rows as [gate; up]


class Epilogue:
    """The epilogue of one program: ``tile_n`` routes a block, ``act`` (``ACT_*``) with W13's ``bias``,
    ``scaled``: each value times a float32 ``g`` (NVFP4's global scale) before the bias, and ``scatter``: the plain
    form stores slot ``s``'s row at row ``sorted_ids[s]`` of ``out [pairs, R]`` (nothing for an empty slot).
    ``partial`` (:data:`PARTIAL_FORMS`, or ``None``): the program stores float32 partials instead
    (:meth:`partial`)."""

    def __init__(self, tile_n: int, act: int, bias: bool, scaled: bool, scatter: bool = False, partial=None):
        if act not in (ACT_NONE, ACT_SILU, ACT_SWIGLU_OAI) or (bias and act == ACT_NONE):
            raise ValueError(f"activation {act} (bias {bias}): a bias comes with a fused activation only")
        if scatter and act != ACT_NONE:
            raise ValueError(f"activation {act}: the scattering epilogue stores the plain GEMM only")
        if partial is not None and (partial not in PARTIAL_FORMS or act != ACT_NONE or scatter):
            raise ValueError(f"partials ({partial!r}) are one of {PARTIAL_FORMS}, of the plain gathered GEMM (no "
                             f"activation: the finish applies it; got {act}, scatter {scatter})")  # fmt: skip
        self.partial_form = partial
        self.tile_n = tile_n
        self.act = act
        self.bias = bias
        self.scaled = scaled
        self.scatter = scatter
        self.tile = (TILE_M, epi_routes(tile_n))
        if self.tile[1] % (STORE_THREADS // OUT_CHUNKS):
            raise ValueError(f"a subtile's {self.tile[1]} slots are not whole passes of the scattering threads")
        self.stages = 2

    @property
    def smem_bytes(self) -> int:
        """Shared memory of the bf16 subtiles (the plain form's; reserved for both)."""
        return self.tile[0] * self.tile[1] * 2 * self.stages

    def smem_layout(self, c_layout):
        """Host side: the shared subtiles' layout for ``out``'s layout enum."""
        bf16 = cutlass.BFloat16
        atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(c_layout, bf16, self.tile[0]), bf16)
        return cute.tile_to_shape(atom, (*self.tile, self.stages), order=(1, 0, 2))

    def partitions(self, tiled_mma, c_layout, s_c, acc, tidx):
        """Device side, once a kernel (traced inline): the register-to-shared copy of the accumulator and the
        store ring, as CUTLASS's Hopper persistent GEMM builds them. ``tidx``: the thread's index in the MMA plus
        128."""
        c_store = sm90_utils.sm90_get_smem_store_op(c_layout, elem_ty_d=cutlass.BFloat16, elem_ty_acc=cutlass.Float32)
        c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4), cutlass.BFloat16)
        r2s = cute.make_tiled_copy_S(c_store, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
        thr_r2s = r2s.get_slice(tidx - 128)
        rd_shape = cute.shape(thr_r2s.partition_S(s_c))
        return _Partitions(
            r2s=r2s,
            t_rs_s=thr_r2s.partition_D(s_c),
            t_rs_acc=r2s.retile(acc),
            t_rs_d=cute.make_rmem_tensor(cute.make_layout(rd_shape[:3]).shape, cutlass.Float32),
            t_rs_out=cute.make_rmem_tensor(cute.make_layout(rd_shape[:3]).shape, cutlass.BFloat16),
            bar=pipeline.NamedBarrier(barrier_id=1, num_threads=256),
            ring=pipeline.PipelineTmaStore.create(
                num_stages=self.stages, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 256)
            ),
        )

    @cute.jit
    def store(self, p, g, s_c, g_c, tma_c, tm, b, done, warp, scatter_to=None):
        """The plain form (traced inline): bf16 subtiles of ``(128 rows, 32 routes)`` of tile ``(tm, b)`` through
        the shared buffers (``done``: tiles this CTA stored before, the buffers' parity), stored by warp 4, or,
        scattering, by every consumer thread (``scatter_to``: ``(sorted_ids, out, epi_smem, t)``, ``t`` the
        thread's index among the consumers). ``p``: :meth:`partitions`."""
        if cutlass.const_expr(not self.scatter):
            g_c_tile = cute.zipped_divide(g_c[(None, None, tm, b)], self.tile)
            b_sd, b_gd = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(s_c, 0, 2), g_c_tile)
        subtiles = self.tile_n // self.tile[1]
        # locals: a value an `if` carries must not be an attribute of a Python object
        t_rs_d, t_rs_acc, t_rs_out, bar, ring = p.t_rs_d, p.t_rs_acc, p.t_rs_out, p.bar, p.ring
        ids = None
        if cutlass.const_expr(self.scatter):  # every subtile's route ids at once: one load latency, not one each
            ids = self._route_ids(scatter_to, b)
        per_sub = cute.size(t_rs_d)
        for e in cutlass.range_constexpr(subtiles):
            for v in cutlass.range_constexpr(per_sub):
                if cutlass.const_expr(self.scaled):
                    t_rs_d[v] = t_rs_acc[e * per_sub + v] * g
                else:
                    t_rs_d[v] = t_rs_acc[e * per_sub + v]
            t_rs_out.store(t_rs_d.load().to(cutlass.BFloat16))
            buf = (done * subtiles + e) % self.stages
            cute.copy(p.r2s, t_rs_out, p.t_rs_s[(None, None, None, buf)])
            cute.arch.fence_proxy("async.shared", space="cta")
            bar.arrive_and_wait()
            if cutlass.const_expr(self.scatter):
                self._scatter_subtile(s_c, scatter_to, ids, tm, e, buf)
            elif warp == 4:
                cute.copy(tma_c, b_sd[(None, buf)], b_gd[(None, e)])
                ring.producer_commit()
                ring.producer_acquire()
            # scattering, a thread's stores read their subtile's buffer before it writes the next subtile, which
            # lands in the other buffer; the barrier above that subtile then holds back every thread's write of this
            # buffer two subtiles on until all have read it: one barrier a subtile. The TMA store needs the second
            # (warp 4's wait for the store to have read the buffer)
            if cutlass.const_expr(not self.scatter):
                bar.arrive_and_wait()

    @cute.jit
    def _route_ids(self, scatter_to, b):
        """The route ids of the slots this thread stores in each of block ``b``'s subtiles (traced inline): slot
        ``t // 16 + 16 j`` of subtile ``e`` at ``e * passes + j``, loaded together before the first subtile."""
        sorted_ids, _, _, t = scatter_to
        per = STORE_THREADS // OUT_CHUNKS
        ids = cute.make_rmem_tensor((self.tile_n // per,), cutlass.Int32)
        for e in cutlass.range_constexpr(self.tile_n // self.tile[1]):
            for j in cutlass.range_constexpr(self.tile[1] // per):
                ids[e * (self.tile[1] // per) + j] = sorted_ids[b * self.tile_n + e * self.tile[1] + t // OUT_CHUNKS
                                                                + per * j]  # fmt: skip
        return ids

    @cute.jit
    def _scatter_subtile(self, s_c, scatter_to, ids, tm, e, buf):
        """FC2's subtile ``e`` to its routes' rows (the consumers, traced inline): 16 threads a slot, thread ``t``
        storing 16-byte chunk ``t % 16`` of slot ``t // 16``'s 128 outputs (then of 16 slots on) at row ``route``
        (``ids``: :meth:`_route_ids`) of ``out [pairs, R]``; a slot without a route and columns past ``R`` store
        nothing."""
        _, out, epi_smem, t = scatter_to
        per = STORE_THREADS // OUT_CHUNKS  # slots a pass of the consumers
        base = s_c.iterator.toint()
        rows = cute.size(out, mode=[0])
        columns = cute.size(out, mode=[1])
        c = t % OUT_CHUNKS
        column = tm * TILE_M + c * (routes.CHUNK_BYTES // 2)
        for j in cutlass.range_constexpr(self.tile[1] // per):
            n = t // OUT_CHUNKS + per * j
            route = ids[e * (self.tile[1] // per) + j]
            if (route >= 0) & (route < rows) & (column < columns):
                off = cute.crd2idx((c * (routes.CHUNK_BYTES // 2), n, buf), epi_smem.outer) * 2
                dst = out.iterator.toint() + (cutlass.Int64(route) * columns + column) * 2
                routes.store_chunk(routes.swizzle128(base + off), dst)

    @cute.jit
    def activation(self, acc, g, out, bias, block_expert, experts, b, tm, t, lane, row_block, r0):
        """FC1's activation from the accumulators (traced inline): a thread's rows ``r0`` and ``r0 + 8`` are the
        gate and the up row of one output column ``n``; its accumulator values ``4 c + i`` (``i``: column parity,
        then row + 8) are routes ``8 c + 2 q + (i % 2)`` of the block, each times ``g`` (if ``scaled``) before the
        bias. bf16 stores straight to ``out [NX, R / 2]``, past its end predicated off."""
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
        # the block's rows all lie in out (the layer's buffers hold every block) and so does column n, but for a
        # last tile of fewer than 64 outputs: test once a unit, not at each of the thread's 2 TILE_N / 8 stores
        if ((b + 1) * self.tile_n <= tokens) & (n < columns):
            self._activate(acc, g, gate_bias, up_bias, out, b, n, lane, tokens, columns, False)
        else:
            self._activate(acc, g, gate_bias, up_bias, out, b, n, lane, tokens, columns, True)

    @cute.jit
    def _activate(self, acc, g, gate_bias, up_bias, out, b, n, lane, tokens, columns, checked: cutlass.Constexpr):
        """The thread's outputs of column ``n`` (traced inline); ``checked``: each store predicated on its row and
        column lying in ``out``."""
        q = lane % 4
        for c in cutlass.range_constexpr(self.tile_n // 8):
            for i in cutlass.range_constexpr(2):
                gate = acc[4 * c + i]
                up = acc[4 * c + 2 + i]
                if cutlass.const_expr(self.scaled):
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
                if cutlass.const_expr(checked):
                    if token < tokens and n < columns:
                        out[(token, n)] = v.to(cutlass.BFloat16)
                else:
                    out[(token, n)] = v.to(cutlass.BFloat16)

    @cute.jit
    def partial(self, acc, part, sorted_ids, pairs, b, tm, s, t, lane, row_block, r0):
        """A K split's accumulator (traced inline) to ``part [splits * pairs, R]`` float32: slot ``i`` of block ``b``
        with route ``sorted_ids[b * TILE_N + i]`` in ``[0, pairs)`` to row ``s * pairs + route`` (nothing for an empty
        slot), weight row ``r`` to column ``r`` (``rows``) or, W13's engine rows (``fc1``: rows ``r0`` and ``r0 + 8``
        of the thread are output ``n``'s gate and up), gate ``n`` to column ``n`` and up ``n`` to ``R / 2 + n``: the
        order the finish (``kernels/fc1_finish.py``) reads. Rows past ``R`` store nothing."""
        columns = cute.size(part, mode=[1])
        q = lane % 4
        col0 = tm * TILE_M + r0  # rows: r0 and r0 + 8 as they are
        col8 = col0 + 8
        live0 = col0 < columns
        live8 = col8 < columns
        if cutlass.const_expr(self.partial_form == "fc1"):
            n = tm * (TILE_M // 2) + row_block * 32 + (t // 32) * 8 + lane // 4
            col0 = n
            col8 = columns // 2 + n
            live0 = n < columns // 2
            live8 = live0
        row0 = s * pairs
        for c in cutlass.range_constexpr(self.tile_n // 8):
            for i in cutlass.range_constexpr(2):
                route = sorted_ids[b * self.tile_n + 8 * c + 2 * q + i]
                if (route >= 0) & (route < pairs):
                    if live0:
                        part[(row0 + route, col0)] = acc[4 * c + i]
                    if live8:
                        part[(row0 + route, col8)] = acc[4 * c + 2 + i]


class _Partitions:
    """What :meth:`Epilogue.partitions` builds (device values of one kernel trace)."""

    def __init__(self, **parts):
        self.__dict__.update(parts)
