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
  TMA, all completing on the stage's mbarrier (:mod:`~csf_kernels.moe.kernels.engine_producer`). Gathering (FC1,
  ``io="gather"``), the tile's rows come from ``x [tokens, K]`` by 16-byte ``cp.async`` of the gathering producer
  warps (:class:`~csf_kernels.moe.kernels.engine_producer.RowGather`: warps 0-3, or warp 0 alone beside the inline
  source's decoder warps 1-3), each thread arriving on the stage's mbarrier once its copies land.
* inline scales: producer warps decode engine records into the scale slots
  (:mod:`~csf_kernels.moe.kernels.engine_record_decoder`), records dealt round-robin to warps 1-3, the 32 lanes
  of a record's warp arriving on each of its stages' mbarriers.
* warp 0 also publishes each unit's facts (its live extent, one-multiply flags, NVFP4's global scale) into the
  unit's first stage's slot (:mod:`~csf_kernels.moe.kernels.engine_unit_facts`), so the consumers start a unit on
  a shared-memory read instead of two dependent L2 reads.
* warpgroups 1 and 2: the consumers, 64 weight rows each (swap-AB: weights are wgmma's M, routes its N). Per K
  slice of 16 a thread converts one word (eight E2M1 values, bits already placed by the panel) into its four bf16x2
  A registers (:mod:`~csf_kernels.moe.kernels.engine_convert`), then issues ``wgmma.m64n{TILE_N}k16`` with A from
  registers and B from the stage; the program's schedule (:mod:`~csf_kernels.moe.kernels.engine_mainloop`) either
  leaves one wgmma in flight while the next slice converts (``slice``) or issues a stage's four at once and
  converts the next stage under them (``stage``). Schedule ``transform`` (64 to 256 routes a block, rows not
  gathered) gives producer warps 1-3 (inline scales: 2-3, warp 1 decoding the records) the conversion of each stage's
  weights into a bf16 A tile in shared memory (:mod:`~csf_kernels.moe.kernels.engine_transform`); the consumers then
  issue the stage schedule's wgmmas with A from shared memory and convert nothing.
* the epilogue (:mod:`~csf_kernels.moe.kernels.engine_epilogue`): the consumers round the fp32 accumulators to bf16,
  ``stmatrix`` them into a shared subtile and warp 4 stores it by TMA (``out`` is M-major from the MMA's view:
  weight rows are contiguous); scattering (FC2, ``io="scatter"``), the consumers store each slot's row of the
  subtile at its route, 16 bytes a thread.
* K splits (``partial``, few-token calls whose units would leave SMs idle; ``docs/moe-engine.md`` §4.6): a unit is a
  (block, tile, K split) (:mod:`~csf_kernels.moe.kernels.engine_work`, ``split_steps`` K steps a split, a run-time
  argument) and its float32 accumulator goes as it is to its routes' rows of split ``s``'s partials, ``out``
  float32 ``[splits * pairs, R]``, which the finishing kernels sum in split order.

Launched as a programmatic dependent launch (``pdl``), every thread waits for the predecessor
(``griddepcontrol.wait``) after the ring's set-up and before its first global read, then lets the successor launch.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from csf_kernels.moe.engine_panels import PANEL_WORDS as _PANEL_WORDS
from csf_kernels.moe.engine_panels import panel_scales
from csf_kernels.moe.engine_rows import DECODER_WARPS, GATHER_WARPS
from csf_kernels.moe.engine_specs import ENGINE_IO as IO_MODES  # dense: x and out in block order
from csf_kernels.moe.engine_specs import ENGINE_PAIRED_TILE_N as PAIRED_TILE_N
from csf_kernels.moe.engine_specs import ENGINE_RAGGED_LEVELS, ENGINE_RAGGED_TILE_N, engine_schedule_serves
from csf_kernels.moe.engine_specs import ENGINE_TILE_K as TILE_K
from csf_kernels.moe.engine_specs import ENGINE_TILE_M as TILE_M
from csf_kernels.moe.engine_specs import ENGINE_TRANSFORM_TILE_N as TRANSFORM_TILE_N
from csf_kernels.moe.kernels.engine_epilogue import ACT_NONE, ACT_SILU, ACT_SWIGLU_OAI, PARTIAL_FORMS, Epilogue
from csf_kernels.moe.kernels.engine_mainloop import PROBES, ConsumerStep
from csf_kernels.moe.kernels.engine_mainloop import SCHEDULES as _STEP_SCHEDULES
from csf_kernels.moe.kernels.engine_producer import CONSUMER_WARPS, RowGather, make_ring, produce, units_in_use
from csf_kernels.moe.kernels.engine_record_decoder import (
    DECODER_ARRIVALS,
    OFFSET_TABLE,
    RECORD_BYTES,
    RecordDecoderWarp,
    decoder_bytes,
)
from csf_kernels.moe.kernels.engine_record_lanes import RECORD_SLOTS
from csf_kernels.moe.kernels.engine_transform import (
    A_TILES,
    TRANSFORM_DECODER_WARPS,
    TRANSFORM_REGISTERS,
    SharedATiles,
    TransformWarps,
    transform_warps,
)
from csf_kernels.moe.kernels.engine_unit_facts import FACT_WORDS, UnitFacts
from csf_kernels.moe.kernels.engine_work import UnitWork

__all__ = [
    "ACT_NONE",
    "ACT_SILU",
    "ACT_SWIGLU_OAI",
    "IO_MODES",
    "PAIRED_TILE_N",
    "PARTIAL_FORMS",
    "PROBES",
    "RAGGED_LEVELS",
    "RAGGED_TILE_N",
    "SCALE_SOURCES",
    "SCHEDULES",
    "TILE_K",
    "TILE_M",
    "GroupedFp4Gemm",
]

_SMEM_BYTES = 232448  # a block's dynamic shared memory on sm_90a
SCALE_SOURCES = ("native", "inline")  # scale panels copied by TMA, or engine records decoded by producer warps
# the consumers' schedules: both warpgroups on every unit, a K slice or a stage a commit group (engine_mainloop), or
# A tiles from transform warps (engine_transform; TRANSFORM_TILE_N only)
SCHEDULES = (*_STEP_SCHEDULES, "transform")
# block sizes whose blocks may run part of their routes (engine_specs, which the catalog reads without cutlass): a
# block whose live slots all lie in its first half issues wgmma.m64n{TILE_N / 2} on them only, in its first quarter
# (ragged level 2) m64n{TILE_N / 4} (an expert's last block is its tail: up to half the padded work at 2048-8192)
RAGGED_TILE_N = ENGINE_RAGGED_TILE_N
RAGGED_LEVELS = tuple(sorted(ENGINE_RAGGED_LEVELS))  # whole blocks; the half loop; the half and the quarter loops
# PAIRED_TILE_N: block sizes that may run two CTAs an SM (their rings and epilogues fit twice; their stage-schedule
# consumers name at most ~80 registers): twice the resident warps to hide the small blocks' latency (§4.9)


class GroupedFp4Gemm:
    """One compiled program: ``TILE_N`` routes a block (16 to 256), ``stages`` deep ring (default: as many as
    fit), ``act``: the epilogue stores the bf16 GEMM (``ACT_NONE``) or FC1's activation of it (``out`` then has
    ``R / 2`` columns; W13's rows in engine order, :func:`csf_kernels.moe.engine_panels.fc1_engine_rows`), adding
    ``bias`` (float32 ``[E, R]`` in engine row order) first; ``fmt`` the weights' format (``mxfp4``, ``nvfp4``);
    ``io`` (:data:`IO_MODES`): ``gather`` reads slot ``s``'s row of ``x [tokens, K]`` at token
    ``sorted_ids[s] // top_k`` (zeros for a slot without a route), ``scatter`` stores it to ``out [pairs, R]`` at row
    ``sorted_ids[s]`` (never for a slot without one); ``schedule``: the consumers' wgmma schedule
    (:data:`SCHEDULES`; the same output bits either way).
    ``partial`` (:data:`PARTIAL_FORMS`; gathering, no activation or bias, whole blocks): the program's units are K
    splits of ``split_steps`` K steps, each storing its float32 accumulator unscaled to ``out`` float32 ``[splits *
    pairs, R]`` (split ``s``, route ``r``: row ``s * pairs + r``), W13's engine rows as ``[gate; up]`` columns
    (``"fc1"``) or rows as they are (``"rows"``); NVFP4's global scale, bias and activation are the finish's.
    Call signature: ``(w_panel, s_panel, x, out, bias, gscale, block_expert, meta, sorted_ids, wide, ctas, top_k,
    pairs, split_steps, pdl, stream)``; ``bias`` is unread without it, ``gscale`` for MXFP4 and partials,
    ``sorted_ids`` and ``top_k`` in ``dense`` mode, ``split_steps`` unsplit; ``ctas`` persistent CTAs (the SM
    count); ``pdl`` 1 launches as a programmatic dependent launch (the program waits for its predecessor before it
    reads anything the predecessor may write).

    ``scales="inline"``: the scales come from engine records (``csf_codec.engine_records``) that the decoder warps
    decode into the same slots (:mod:`~csf_kernels.moe.kernels.engine_record_decoder`); compile :meth:`call_inline`,
    whose arguments replace ``s_panel`` by the plane's ``base_ref`` (uint8 ``[RB]``), ``base_delta`` (uint8
    ``[RB, 64]`` MXFP4, ``[RB, 128]`` NVFP4), ``block_start`` (int32 ``[RB]``: 16-byte units), ``record_units``
    (uint8 ``[RB, tiles]``) and ``body`` (uint8), the records of W's rows in this program's row order, one row
    group an expert (``RB = E * ceil(R / 128)``).

    ``probe`` (:data:`PROBES`; diagnostic programs, never served, their outputs wrong by design): ``noconvert`` feeds
    the placed words to wgmma unconverted, ``ss`` runs each stage's wgmmas with A from one of two unwritten bf16
    tiles in shared memory (the ring one or two stages shorter for them): what the loop costs without the conversion,
    in today's structure and in a transform warpgroup's (``docs/moe-engine.md`` §7). MXFP4, native scales, dense
    rows, no activation, whole blocks."""

    def __init__(
        self, tile_n: int = 256, stages: int = 0, act: int = ACT_NONE, bias: bool = False, fmt="mxfp4",
        scales: str = "native", io: str = "dense", schedule: str = "slice", ragged: bool = False,
        ctas_per_sm: int = 1, partial: str | None = None, probe: str | None = None,
    ):  # fmt: skip
        if tile_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"TILE_N must be 16, 32, 64, 128 or 256; got {tile_n}")
        if io not in IO_MODES or (io == "scatter" and act != ACT_NONE):
            raise ValueError(f"rows {io!r} (activation {act}): one of {IO_MODES}, scatter with no activation")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedules {SCHEDULES}; got {schedule!r}")
        transform = schedule == "transform"
        if transform and (
            tile_n not in TRANSFORM_TILE_N or ctas_per_sm != 1 or partial is not None
            or not engine_schedule_serves(schedule, scales, io)
        ):  # fmt: skip
            raise ValueError(f"transform warps are built at {TRANSFORM_TILE_N} routes a block, one CTA an SM, rows "
                             f"not gathered (producer warps convert), no K splits; got {tile_n} x {ctas_per_sm}, rows "
                             f"{io!r}, partial {partial!r}")  # fmt: skip
        self.transform = transform
        if partial is not None and (io != "gather" or int(ragged)):
            raise ValueError(f"partials ({partial!r}) come from gathering programs of whole blocks; got rows {io!r}, "
                             f"ragged {ragged}")  # fmt: skip
        if probe is not None and (
            probe not in PROBES
            or (fmt, scales, io, act, int(ragged), partial) != ("mxfp4", "native", "dense", ACT_NONE, 0, None)
            or transform
        ):
            raise ValueError(f"probes {PROBES} are built for MXFP4 native dense GEMMs without an activation, whole "
                             f"blocks; got {probe!r}")  # fmt: skip
        self.probe = probe
        # validates act, bias and the partials' form
        self.epilogue = Epilogue(tile_n, act, bias, scaled=fmt == "nvfp4", scatter=io == "scatter", partial=partial)
        self.partial = partial
        # a split program's units are K splits of whole blocks; before the gather, which walks the same units
        self.work = UnitWork(partial is not None)
        if scales not in SCALE_SOURCES:
            raise ValueError(f"scale source must be one of {SCALE_SOURCES}; got {scales!r}")
        self.scales = scales
        self.inline = scales == "inline"
        self.io = io
        # inline: the decoder warps (one beside transform warps, whose stages' MMAs are long enough for it)
        self.decoders = (TRANSFORM_DECODER_WARPS if transform else DECODER_WARPS) if self.inline else ()
        self.transform_warps = transform_warps(self.inline) if transform else ()
        self.gather = RowGather(tile_n, GATHER_WARPS[scales], self.work) if io == "gather" else None
        self.schedule = schedule
        # probe ss: A from shared memory, no register hazard, a stage's wgmmas a commit group
        step_schedule = "stage" if probe == "ss" else schedule
        # gathered stages are fenced before wgmma reads them
        self.tiles = SharedATiles(len(self.transform_warps)) if transform else None
        if transform:  # the transform warpgroup converts; the consumers issue a stage's wgmmas a commit group
            step_schedule = "stage"
        self.step = ConsumerStep(step_schedule, fmt == "nvfp4", gathered=io == "gather", probe=probe, tiles=self.tiles)
        # MXFP4 row blocks flagged neither wide (no E8M0 byte in 129..254) convert with one multiply a pair (a probe
        # converts nothing: one loop)
        self.step_one = (
            None if fmt == "nvfp4" else ConsumerStep(step_schedule, False, io == "gather", one_multiply=True)
        )
        if probe is not None or transform:  # the consumers convert nothing: one loop
            self.step_one = self.step
        ragged = int(ragged)
        if ragged not in RAGGED_LEVELS or (ragged and tile_n not in RAGGED_TILE_N):
            raise ValueError(f"ragged levels {RAGGED_LEVELS} are built for {RAGGED_TILE_N} routes a block (0 for any); "
                             f"got {ragged} at {tile_n}")  # fmt: skip
        self.ragged = ragged
        self.facts = UnitFacts(tile_n, ragged > 0, fmt == "nvfp4")
        self.transformer = None
        if transform:  # its conversions are the other schedules' (the same bits)
            one = None if fmt == "nvfp4" else ConsumerStep("stage", False, one_multiply=True)
            self.transformer = TransformWarps(self.transform_warps, ConsumerStep("stage", fmt == "nvfp4"), one,
                                              fmt == "nvfp4", self.tiles, self.facts, self.work)  # fmt: skip
        if ctas_per_sm not in (1, 2) or (ctas_per_sm == 2 and tile_n not in PAIRED_TILE_N):
            raise ValueError(
                f"two CTAs an SM are built for {PAIRED_TILE_N} routes a block; got {tile_n} x {ctas_per_sm}"
            )
        self.ctas_per_sm = ctas_per_sm
        # registers a consumer thread after setmaxnreg: one CTA an SM gives them all it can (232); two share the
        # SM's 65,536 at 80 a thread at launch: 128 producers at 40 and 256 consumers at 96 (29,696 <= 384 x 80)
        # with transform warps the producers keep 56 (the conversion's fragments) and the consumers 224
        self.consumer_registers = 224 if transform else 232 if ctas_per_sm == 1 else 96
        self.producer_registers = TRANSFORM_REGISTERS if transform else 40
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
        self.epi_tile = self.epilogue.tile
        stage_bytes = TILE_M * TILE_K // 2 + s_bytes + tile_n * TILE_K * 2
        epi_bytes = self.epilogue.smem_bytes
        dec_bytes = decoder_bytes(len(self.decoders)) if self.inline else 0
        self.a_tiles = A_TILES if transform or probe == "ss" else 0  # bf16 A tiles the wgmmas read
        dec_bytes += self.a_tiles * (TILE_M * TILE_K * 2 + 16)  # and their barriers
        fit = ((_SMEM_BYTES // ctas_per_sm) - 1024 - epi_bytes - 3 * 1024 - dec_bytes) // stage_bytes
        self.stages = stages or min(fit, 8)
        if not 2 <= self.stages <= fit:
            raise ValueError(f"{self.stages} stages of {stage_bytes} bytes do not fit shared memory ({fit} do)")
        # what the launch sizes its shared memory to, beside the barriers' few bytes and alignment (reports)
        self.ring_bytes = self.stages * stage_bytes + epi_bytes + dec_bytes
        self.a_tx = TILE_M * TILE_K // 2
        self.s_tx = 0 if self.inline else s_bytes  # inline: the decoder warp's stores and arrivals, not bytes
        self.b_tx = 0 if self.gather else tile_n * TILE_K * 2  # gathering: the gatherers' arrivals, not bytes

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
        wide: cute.Tensor,
        ctas: cutlass.Int32,
        top_k: cutlass.Int32,
        pairs: cutlass.Int32,
        split_steps: cutlass.Int32,
        pdl: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        if cutlass.const_expr(self.inline):
            raise TypeError("an inline-scale program is compiled through GroupedFp4Gemm.call_inline")
        routes = (sorted_ids, top_k, pairs, split_steps, pdl)
        self._launch(w_panel, s_panel, None, x, out, bias, gscale, wide, block_expert, meta, routes, ctas, stream)

    @cute.jit
    def call_inline(
        self,
        w_panel: cute.Tensor,
        base_ref: cute.Tensor,
        base_delta: cute.Tensor,
        block_start: cute.Tensor,
        record_units: cute.Tensor,
        body: cute.Tensor,
        x: cute.Tensor,
        out: cute.Tensor,
        bias: cute.Tensor,
        gscale: cute.Tensor,
        block_expert: cute.Tensor,
        meta: cute.Tensor,
        sorted_ids: cute.Tensor,
        wide: cute.Tensor,
        ctas: cutlass.Int32,
        top_k: cutlass.Int32,
        pairs: cutlass.Int32,
        split_steps: cutlass.Int32,
        pdl: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        if cutlass.const_expr(not self.inline):
            raise TypeError("GroupedFp4Gemm.call_inline needs scales='inline'")
        records = (base_ref, base_delta, block_start, record_units, body)
        routes = (sorted_ids, top_k, pairs, split_steps, pdl)
        self._launch(w_panel, None, records, x, out, bias, gscale, wide, block_expert, meta, routes, ctas, stream)

    def _launch(self, w_panel, s_panel, records, x, out, bias, gscale, wide, block_expert, meta, routes, ctas, stream):
        """Both entry points' host side (traced inline): views, the MMA, TMA atoms, shared storage, the launch.
        ``s_panel`` for native scales, else ``records``; ``routes``: ``(sorted_ids, top_k, pairs, split_steps,
        pdl)``."""
        bf16 = cutlass.BFloat16
        # operand views: weights (256 words, row blocks, steps, experts), scales (2 R bytes or R words, steps,
        # experts), activations (NX, K) K-major, output (R, NX): rows contiguous (M-major C)
        m_a = cute.make_tensor(w_panel.iterator, cute.select(w_panel.layout, mode=[3, 2, 1, 0]))
        if self.inline:  # the scale TMA's arguments are unused: the weights' stand in
            m_s = None
        else:
            m_s = cute.make_tensor(s_panel.iterator, cute.select(s_panel.layout, mode=[2, 1, 0]))
        m_b = x
        m_c = None  # partials: stored by the consumers, no TMA
        c_layout = cutlass.tensor_utils.LayoutEnum.COL_MAJOR  # the subtiles' (unused by partials), M-major
        if cutlass.const_expr(self.partial is None):
            m_c = cute.make_tensor(out.iterator, cute.select(out.layout, mode=[1, 0]))
            c_layout = cutlass.tensor_utils.LayoutEnum.from_tensor(m_c)

        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            bf16,
            bf16,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K,
            self.acc_dtype,
            self.atom_layout_mnk,
            tiler_mn=(64, self.tile_n),
            a_source=warpgroup.OperandSource.SMEM if self.a_tiles else warpgroup.OperandSource.RMEM,
        )
        # the transform warps write A as the register-A MMA's fragments hold it (the SS MMA reads that layout)
        rs_mma = tiled_mma
        if cutlass.const_expr(self.transform):
            rs_mma = self._part_mma(self.tile_n, warpgroup.OperandSource.RMEM)
        # ragged: the MMAs of a block's first half and quarter (each accumulator the first half or quarter of the full
        # one's registers)
        half_mma, quarter_mma = tiled_mma, tiled_mma
        if cutlass.const_expr(self.ragged > 0):
            half_mma = self._part_mma(self.tile_n // 2)
        if cutlass.const_expr(self.ragged > 1):
            quarter_mma = self._part_mma(self.tile_n // 4)

        a_smem = cute.make_layout((_PANEL_WORDS, 2, 1, 1, self.stages))
        s_smem = cute.make_layout((self.s_elems, 1, 1, self.stages))
        b_layout = cutlass.tensor_utils.LayoutEnum.ROW_MAJOR  # (N, K) with K contiguous
        b_atom = warpgroup.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(b_layout, bf16, TILE_K), bf16)
        b_smem = cute.tile_to_shape(b_atom, (self.tile_n, TILE_K, self.stages), order=(0, 1, 2))
        epi_smem = self.epilogue.smem_layout(c_layout)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tma_m_a = cpasync.make_tiled_tma_atom(
            g2s, m_a, cute.slice_(a_smem, (None, None, None, None, 0)), (_PANEL_WORDS, 2, 1, 1)
        )
        if self.inline:
            tma_s, tma_m_s = tma_a, tma_m_a
        else:
            tma_s, tma_m_s = cpasync.make_tiled_tma_atom(
                g2s, m_s, cute.slice_(s_smem, (None, None, None, 0)), (self.s_elems, 1, 1)
            )
        tma_b, tma_m_b = cpasync.make_tiled_tma_atom(
            g2s, m_b, cute.slice_(b_smem, (None, None, 0)), (self.tile_n, TILE_K)
        )  # gathering, unused: the producer warps copy the routes' rows themselves
        tma_c, tma_m_c = tma_a, tma_m_a  # partials: unused stand-ins
        if cutlass.const_expr(self.partial is None):
            tma_c, tma_m_c = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), m_c, cute.slice_(epi_smem, (None, None, 0)), self.epi_tile
            )  # scattering, unused: the consumers store each slot's row at its route

        # the bf16 A tiles (TILE_M x TILE_K, K-major, 128-byte swizzle) of a transform warpgroup or the ss probe
        at_smem = cute.tile_to_shape(b_atom, (TILE_M, TILE_K, max(self.a_tiles, 1)), order=(0, 1, 2))
        self.shared_storage = _shared_storage(
            self.stages, self.s_dtype, self.inline, cute.cosize(a_smem), cute.cosize(s_smem), cute.cosize(b_smem),
            cute.cosize(epi_smem), self.tile_n if self.gather else 0, len(self.decoders),
            cute.cosize(at_smem) if self.a_tiles else 0, 2 * A_TILES if self.transform else 0,
        )  # fmt: skip
        self.c_layout = c_layout
        records = records if self.inline else (block_expert,) * 5  # native: placeholders, never read
        sorted_ids, top_k, pairs, split_steps, pdl = routes
        kernel = self.kernel(
            tma_a, tma_m_a, tma_s, tma_m_s, tma_b, tma_m_b, tma_c, tma_m_c,
            tiled_mma, (half_mma, quarter_mma, rs_mma), a_smem, s_smem, b_smem, epi_smem, at_smem, block_expert, meta,
            x, out, bias, gscale, sorted_ids, wide, top_k, pairs, split_steps, *records,
        )  # fmt: skip
        kernel.launch(
            grid=(ctas, 1, 1), block=[self.threads, 1, 1], cluster=(1, 1, 1), min_blocks_per_mp=self.ctas_per_sm,
            stream=stream,
            # the whole carveout for shared memory, stated: else the DSL asks a device for it (none where we build)
            preferred_smem_carveout=100 if self.ctas_per_sm > 1 else None,
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
        part_mmas: tuple,
        a_smem: cute.Layout,
        s_smem: cute.Layout,
        b_smem: cute.ComposedLayout,
        epi_smem: cute.ComposedLayout,
        at_smem: cute.ComposedLayout,
        block_expert: cute.Tensor,
        meta: cute.Tensor,
        x: cute.Tensor,
        out: cute.Tensor,
        bias: cute.Tensor,
        gscale: cute.Tensor,
        sorted_ids: cute.Tensor,
        wide: cute.Tensor,
        top_k: cutlass.Int32,
        pairs: cutlass.Int32,
        split_steps: cutlass.Int32,
        base_ref: cute.Tensor,
        base_delta: cute.Tensor,
        block_start: cute.Tensor,
        record_units: cute.Tensor,
        body: cute.Tensor,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            if cutlass.const_expr(not self.inline):
                cpasync.prefetch_descriptor(tma_s)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        # a stage's arrivals: the TMA thread's (which expects the bytes), the lanes of the inline decoder warp that
        # decoded its record, and the gathering threads' once their copies land
        producers = 1 + DECODER_ARRIVALS * self.inline + (self.gather.threads if self.gather else 0)
        # a stage's consumer warps: both warpgroups', and the transform warps, which release it once they have read
        # its weights and scales
        ring = make_ring(storage.bars.data_ptr(), self.stages, self.a_tx + self.s_tx + self.b_tx, producers,
                         CONSUMER_WARPS + len(self.transform_warps))  # fmt: skip
        decoder = None  # this warp's rank among the decoder warps, when it is one
        if cutlass.const_expr(self.inline):
            rank = warp - self.decoders[0]
            decoder = (rank >= 0) & (rank < len(self.decoders))
            if decoder:
                with cute.arch.elect_one():
                    for i in cutlass.range_constexpr(RECORD_SLOTS):
                        cute.arch.mbarrier_init(storage.rec_bars.data_ptr() + rank * RECORD_SLOTS + i, 1)
                cute.arch.mbarrier_init_fence()
        a_bars = None  # the A tiles' full and empty barriers (transform warpgroup)
        if cutlass.const_expr(self.transform):
            a_bars = storage.a_bars.data_ptr()
            if warp == self.transform_warps[0]:
                with cute.arch.elect_one():
                    self.tiles.init(a_bars)
        pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

        s_a = storage.s_a.get_tensor(a_smem)
        s_s = storage.s_s.get_tensor(s_smem)
        s_b = storage.s_b.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        s_c = storage.s_c.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)
        s_at = None
        if cutlass.const_expr(self.a_tiles > 0):
            s_at = storage.s_at.get_tensor(at_smem.outer, swizzle=at_smem.inner)

        g_a = cute.local_tile(m_a, (_PANEL_WORDS, 2, 1, 1), (None, None, None, None))  # (256, 2, 1, 1, 1, RT, KS, E)
        g_b = cute.local_tile(m_b, (self.tile_n, TILE_K), (None, None))  # (TN, 64, blocks, KS)
        g_c = None  # partials: the consumers store them
        if cutlass.const_expr(self.partial is None):
            g_c = cute.local_tile(m_c, (TILE_M, self.tile_n), (None, None))  # (128, TN, RT, blocks)
        one = cute.make_layout(1)
        t_as, t_ag = cpasync.tma_partition(tma_a, 0, one, cute.group_modes(s_a, 0, 4), cute.group_modes(g_a, 0, 4))
        scale_copy = None  # inline: no scale TMA, the decoder warp fills the scale slots
        if cutlass.const_expr(not self.inline):
            g_s = cute.local_tile(m_s, (self.s_elems, 1, 1), (None, None, None))  # (256 or 128, 1, 1, RT, KS, E)
            t_ss, t_sg = cpasync.tma_partition(tma_s, 0, one, cute.group_modes(s_s, 0, 3), cute.group_modes(g_s, 0, 3))
            scale_copy = (tma_s, t_sg, t_ss)
        t_bs, t_bg = cpasync.tma_partition(tma_b, 0, one, cute.group_modes(s_b, 0, 2), cute.group_modes(g_b, 0, 2))
        k_steps = cute.size(g_b, mode=[3])
        tiles_m = cute.size(g_a, mode=[5])
        # blocks the activations hold: x's rows in block order, or, gathering, the slots sorted_ids holds
        held = cute.size(g_b, mode=[2])
        if cutlass.const_expr(self.gather is not None):
            held = cute.size(sorted_ids) // self.tile_n
        units = self.work.units(units_in_use(meta, block_expert, held, tiles_m), k_steps, split_steps)

        wg = cute.arch.make_warp_uniform(tidx // 128)
        pipeline_init_wait(cluster_shape_mn=(1, 1))

        if wg == 0:
            cute.arch.setmaxregister_decrease(self.producer_registers)
        # gathering: the operands of the routes' rows (self.gather is read where used: the DSL carries no Python
        # object through a dynamic branch)
        rows = None
        if cutlass.const_expr(self.gather is not None):
            table = storage.tokens.get_tensor(cute.make_layout(self.tile_n))
            rows = (x, sorted_ids, top_k, table, s_b, b_smem, self.gather.rank(tidx))
        s_facts = storage.facts.get_tensor(cute.make_layout((FACT_WORDS, self.stages)))
        if warp == 0:
            copies = ((tma_a, t_ag, t_as), scale_copy, (tma_b, t_bg, t_bs))
            facts = (self.facts, s_facts, (sorted_ids, pairs, block_expert, wide, gscale, cute.size(m_a, mode=[3])))
            produce(ring, self.stages, copies, block_expert, tiles_m, units, k_steps, self.gather, rows, facts,
                    self.work, split_steps)  # fmt: skip
        if cutlass.const_expr(self.gather is not None):
            if (warp > 0) & self.gather.gathers(warp):  # the other gathering warps copy their share of each stage
                self.gather.walk(ring, self.stages, rows, tiles_m, units, k_steps, split_steps)
        if cutlass.const_expr(self.inline):
            if decoder:  # the warp's own staging slots, barriers, decoded tile and offset table
                dec = RecordDecoderWarp(self.nvfp4, self.stages, len(self.decoders), self.work)
                s_rec = cute.make_tensor(storage.rec_stage.data_ptr() + rank * (dec.slots * RECORD_BYTES),
                                         cute.make_layout((RECORD_BYTES, dec.slots)))  # fmt: skip
                s_tile = cute.make_tensor(storage.rec_tile.data_ptr() + rank * 128, cute.make_layout(128))
                s_offs = cute.make_tensor(storage.rec_offs.data_ptr() + rank * OFFSET_TABLE,
                                          cute.make_layout(OFFSET_TABLE))  # fmt: skip
                dec.run(
                    ring, s_s, storage.rec_bars.data_ptr() + rank * dec.slots, s_rec, s_tile, s_offs,
                    base_ref, base_delta, block_start, record_units, body, block_expert, units, tiles_m, k_steps,
                    cute.size(m_a, mode=[1]) * (TILE_M // 2), cute.size(m_a, mode=[3]), rank, split_steps,
                )  # fmt: skip

        if cutlass.const_expr(self.transform):
            if (warp >= self.transform_warps[0]) & (warp <= self.transform_warps[-1]):
                self.transformer.run(ring, self.stages, a_bars, part_mmas[2], s_a, s_s, s_at, s_facts, units, tiles_m,
                                     k_steps, split_steps, warp, tidx % 32)  # fmt: skip
        if wg > 0:
            cute.arch.setmaxregister_increase(self.consumer_registers)
            self.consume(ring, (tiled_mma, *part_mmas[:2]), s_a, s_s, s_b, s_c, epi_smem, g_c, tma_c, tiles_m, units,
                         (k_steps, split_steps, pairs), tidx, warp, wg, out, bias, s_facts, block_expert, sorted_ids,
                         cute.size(m_a, mode=[3]), (s_at, a_bars))  # fmt: skip

    @cute.jit
    def consume(
        self, ring, mmas, s_a, s_s, s_b, s_c, epi_smem, g_c, tma_c, tiles_m, units, k_extent, tidx, warp, wg,
        out, bias, s_facts, block_expert, sorted_ids, experts, a_tiles,
    ):  # fmt: skip
        tiled_mma, half_mma, quarter_mma = mmas
        k_steps, split_steps, pairs = k_extent
        t = tidx % 128
        row_block = wg - 1
        lane = t % 32
        r0 = row_block * 64 + (t // 32) * 16 + lane // 4  # this thread's rows in the tile: r0 and r0 + 8
        thr_mma = tiled_mma.get_slice(tidx - 128)
        t_cs_b = thr_mma.partition_B(s_b)
        t_cr_b = tiled_mma.make_fragment_B(t_cs_b)  # (MMA, MMA_N, MMA_K = 4, stages)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, self.tile_n)), self.acc_dtype)
        if cutlass.const_expr(self.a_tiles > 0):  # A's fragments: descriptors of the shared tiles, their barriers
            s_at, a_bars = a_tiles
            frags = (tiled_mma.make_fragment_A(thr_mma.partition_A(s_at)), a_bars)
        else:
            frags = self.step.fragments(tiled_mma, thr_mma, TILE_M)
        s_words = cute.recast_tensor(s_a, cutlass.Uint32)  # (512, 2, 1, 1, stages)
        words = cute.make_rmem_tensor((4,), cutlass.Uint32)

        epi = None  # partials: stored from the accumulators
        if cutlass.const_expr(self.partial is None):
            epi = self.epilogue.partitions(tiled_mma, self.c_layout, s_c, acc, tidx)
        half, quarter = None, None
        if cutlass.const_expr(self.ragged > 0):
            half = self._part_operands(half_mma, self.tile_n // 2, s_b, acc, tidx)
        if cutlass.const_expr(self.ragged > 1):
            quarter = self._part_operands(quarter_mma, self.tile_n // 4, s_b, acc, tidx)

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        done = cutlass.Int32(0)  # tiles this CTA has stored: the epilogue's buffer parity
        u = cute.arch.block_idx()[0]
        while u < units:
            b, tm, s, _, steps = self.work.unit(u, tiles_m, k_steps, split_steps)
            acc.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            # the unit's facts, published by the producer into its first stage's slot (engine_unit_facts): its live
            # extent, this warpgroup's one-multiply flag (MXFP4), NVFP4's global scale of the block's expert
            self.step.wait(ring, read)
            extent, one, g_e = self.facts.read(s_facts[(None, read.index)], row_block)
            operands = (tiled_mma, acc, frags, words, s_words, s_s, t_cr_b, t, row_block, r0)
            half_operands, quarter_operands = operands, operands
            if cutlass.const_expr(self.ragged > 0):
                half_operands = (half_mma, half[0], frags, words, s_words, s_s, half[1], t, row_block, r0)
            if cutlass.const_expr(self.ragged > 1):
                quarter_operands = (quarter_mma, quarter[0], frags, words, s_words, s_s, quarter[1], t, row_block, r0)
            if cutlass.const_expr(self.ragged > 1):
                if extent <= self.tile_n // 4:
                    read, release = self._k_loop(ring, read, release, steps, quarter_operands, one)
                elif extent <= self.tile_n // 2:
                    read, release = self._k_loop(ring, read, release, steps, half_operands, one)
                else:
                    read, release = self._k_loop(ring, read, release, steps, operands, one)
            elif cutlass.const_expr(self.ragged > 0):
                if extent <= self.tile_n // 2:
                    read, release = self._k_loop(ring, read, release, steps, half_operands, one)
                else:
                    read, release = self._k_loop(ring, read, release, steps, operands, one)
            else:
                read, release = self._k_loop(ring, read, release, steps, operands, one)

            if cutlass.const_expr(self.partial is not None):
                self.epilogue.partial(acc, out, sorted_ids, pairs, b, tm, s, t, lane, row_block, r0)
            elif cutlass.const_expr(self.act == ACT_NONE):
                scatter_to = (sorted_ids, out, epi_smem, tidx - 128) if self.io == "scatter" else None
                self.epilogue.store(epi, g_e, s_c, g_c, tma_c, tm, b, done, warp, scatter_to)
            else:
                self.epilogue.activation(acc, g_e, out, bias, block_expert, experts, b, tm, t, lane, row_block, r0)
            done += 1
            u += cute.arch.grid_dim()[0]
        if cutlass.const_expr(self.partial is None):
            epi.ring.producer_tail()

    @cute.jit
    def _k_loop(self, ring, read, release, k_steps, operands, one):
        """A unit's K loop (traced inline): MXFP4 row blocks flagged ``one`` take one multiply a pair (consumers that
        convert nothing, a probe's or a transform's, have one loop)."""
        if cutlass.const_expr(self.nvfp4 or self.probe is not None or self.transform):
            read, release = self.step.k_loop(ring, read, release, k_steps, operands)
        else:
            if one:
                read, release = self.step_one.k_loop(ring, read, release, k_steps, operands)
            else:
                read, release = self.step.k_loop(ring, read, release, k_steps, operands)
        return read, release

    def _part_mma(self, routes: int, a_source=None):
        """Host side: the MMA of a block's first ``routes`` routes (traced inline), A from registers or (A tiles)
        shared memory unless ``a_source`` says."""
        bf16 = cutlass.BFloat16
        if a_source is None:
            a_source = warpgroup.OperandSource.SMEM if self.a_tiles else warpgroup.OperandSource.RMEM
        return sm90_utils.make_trivial_tiled_mma(
            bf16, bf16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, self.acc_dtype,
            self.atom_layout_mnk, tiler_mn=(64, routes), a_source=a_source,
        )  # fmt: skip

    def _part_operands(self, mma, routes: int, s_b, acc, tidx):
        """Device side (traced inline): the accumulator and B fragments of a block's first ``routes`` routes: B's
        first ``routes`` rows of each stage, the first ``routes / TILE_N`` of the accumulator's registers (value
        ``4 c + i`` is route ``8 c + ...``: the first routes come first). Every wgmma adds to the zeroed unit."""
        mma.set(warpgroup.Field.ACCUMULATE, True)
        thr = mma.get_slice(tidx - 128)
        s_b_part = cute.local_tile(s_b, (routes, TILE_K, self.stages), (0, 0, 0))
        t_cr_b = mma.make_fragment_B(thr.partition_B(s_b_part))
        acc_part = cute.make_tensor(acc.iterator, cute.make_layout(thr.partition_shape_C((TILE_M, routes))))
        return acc_part, t_cr_b


def _shared_storage(
    stages, s_dtype, inline, a_words, s_elems, b_elems, c_elems, gathered, decoders, a_tile_elems=0, a_bars=0
):
    """The CTA's shared memory: the ring's barriers and stages, the epilogue's subtiles, for inline scales each of
    the ``decoders`` decoder warps' staging barriers, staging slots, decoded tile and record offsets, gathering,
    the unit's ``gathered`` slots' token rows, and (transform warpgroup, probe ``ss``) ``a_tile_elems`` bf16
    elements of A tiles with ``a_bars`` mbarriers."""
    mem, align = cute.struct.MemRange, cute.struct.Align
    fields = {
        "bars": mem[cutlass.Int64, stages * 2],
        "s_a": align[mem[cutlass.Uint64, a_words], 1024],
        "s_s": align[mem[s_dtype, s_elems], 1024],
        "s_b": align[mem[cutlass.BFloat16, b_elems], 1024],
        "s_c": align[mem[cutlass.BFloat16, c_elems], 1024],
        "facts": mem[cutlass.Int32, FACT_WORDS * stages],
    }
    if inline:
        fields |= {
            "rec_bars": mem[cutlass.Int64, decoders * RECORD_SLOTS],
            "rec_stage": align[mem[cutlass.Uint8, decoders * RECORD_SLOTS * RECORD_BYTES], 128],
            "rec_tile": align[mem[cutlass.Uint32, decoders * 128], 128],
            "rec_offs": align[mem[cutlass.Int32, decoders * OFFSET_TABLE], 128],
        }
    if gathered:
        fields["tokens"] = mem[cutlass.Int32, gathered]
    if a_tile_elems:
        fields["s_at"] = align[mem[cutlass.BFloat16, a_tile_elems], 1024]
    if a_bars:
        fields["a_bars"] = mem[cutlass.Int64, a_bars]
    return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
