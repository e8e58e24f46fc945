"""The MoE layer on the engine's grouped GEMMs (``docs/moe-engine.md``), MXFP4 or NVFP4 (per-expert global scales
applied in the GEMMs' epilogues), native scale panels or inline engine records (a producer warp decodes them into
the same scale slots: the same output bits). Planned by ``csf_moe.plan(..., gemm="engine")``
(:mod:`csf_moe.engine_plan`), its weights built from a serving engine's parameters by
:func:`csf_moe.engine_prepare.prepare_engine_weights` and bound by :func:`bind_engine` (:class:`EngineLayer`, what the
serving adapters run where ``CSF_MOE_ENGINE`` / ``CSF_MOE_W4A8`` is set); ``bench_moe`` times it as the ``engine``
arm (``engine_unfused``: the activation as its own pass) beside today's layer and the peer.

A call: align the routes into blocks of ``bm`` routes per expert (the alignment programs of today's layer); FC1 as a
grouped GEMM whose producer fetches each slot's token row of ``x`` itself and whose epilogue adds W13's bias and
applies the activation into ``[slots, N]`` (bf16; or, unfused, the GEMM ``[slots, 2N]`` then an activation pass);
FC2 as a grouped GEMM whose epilogue stores each slot's row at its route, ``[pairs, H]``; then the top-k weighted
sum with FC2's bias, reading a token's ``k`` rows in order. Few-token calls whose GEMM units would leave SMs idle
split K instead (:mod:`csf_moe.engine_split`): both GEMMs store float32 partials that FC1's finish and the partial
combine reduce. Routes of experts outside ``[0, E)`` join no block and contribute nothing. The GEMMs and the Triton
passes launch as programmatic dependent launches where the runtime allows (each waits for its predecessor before
reading). Every buffer is allocated when a token count is bound, or carved from a caller's scratch
(:func:`call_buffers`: what a served layer does, its layers sharing one); a bound call allocates nothing and follows
new routings as device data, so CUDA graphs capture it.

**W4A8** (issue 47; ``engine_weights(..., w4a8=True)``, MXFP4 only): the alignment also writes each route's slot
(``route_slots``), a gather program reads each token's row of ``x`` once and stores it quantized to E4M3 at its routes'
slots with one float32 scale (vLLM's dynamic per-token FP8, ``csf_kernels.moe.fp8_activations``), both GEMMs run on
FP8 tensor cores (:mod:`csf_kernels.moe.kernels.engine_gemm_fp8`) over block-order rows, FC2's input is FC1's bf16
output quantized the same way where it lies (row by row in block order), and the combine reads FC2's block-order rows
through each route's slot. The float32 reference of exactly these operands is
:func:`csf_moe.w4a8_reference.w4a8_moe_reference` (it quantizes FC1's float32 output; the layer rounds it to bf16
first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_kernels import runtime
from csf_kernels.moe.engine import (
    act_launch,
    combine_launch,
    fc1_finish_launch,
    gather_tokens_launch,
    grouped_fp4_gemm_launch,
    partial_combine_launch,
)
from csf_kernels.moe.engine_inline import InlineScales, inline_scales
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel, fc1_engine_rows
from csf_kernels.moe.engine_specs import (
    ENGINE_FC1_ROWS,
    ENGINE_FORMATS,
    ENGINE_SCALE_SOURCES,
    ENGINE_SCHEDULES,
    engine_tile_n,
)
from csf_kernels.moe.launch import align_launches, max_blocks_for, wide_row_tiles
from csf_kernels.moe.specs import experts_bins
from csf_kernels.moe.w4a8 import gather_fp8_launch, grouped_w4a8_gemm_launch, quantize_rows_fp8_launch
from csf_kernels.moe.w4a8_panels import w4a8_bases, w4a8_tile_flags, w4a8_weight_panel
from csf_kernels.moe.w4a8_specs import W4A8_FORMATS, W4A8_GEMM_CONVENTIONS, w4a8_tile_n
from csf_kernels.runtime import aligned
from csf_kernels.runtime.programs import ALIGNMENT

from .call_args import checked_output
from .engine_split import call_splits, finish_bias, splits_option
from .reference import QuantizedExperts

__all__ = [
    "EngineLayer",
    "EngineMoE",
    "EngineWeights",
    "bind_engine",
    "call_buffer_bytes",
    "call_buffers",
    "call_tile_n",
    "engine_weights",
    "fc1_rows_for",
]


@dataclass(frozen=True, eq=False)
class EngineWeights:
    """One layer's experts as the engine reads them: weight panels of W13 (rows in the activation's layout) and
    W2, their scales (scale panels, or inline engine records of the same rows), float32 biases, NVFP4's float32
    global scales."""

    w13: torch.Tensor  # uint64 [E, H / 64, 2N / 64, 256]
    s13: torch.Tensor | InlineScales  # panel uint8 [E, H / 64, 2N b]: b scale bytes a row a step (MXFP4 2, NVFP4 4)
    w2: torch.Tensor  # uint64 [E, N / 64, H / 64, 256]
    s2: torch.Tensor | InlineScales  # panel uint8 [E, N / 64, H b]
    b13: torch.Tensor | None
    b2: torch.Tensor | None
    activation: str
    fused: bool  # W13's rows (and b13) in engine order: FC1's epilogue applies the activation
    fmt: str = "mxfp4"
    g13: torch.Tensor | None = None  # NVFP4: float32 [E]
    g2: torch.Tensor | None = None
    w4a8: bool = False  # W4A8 panels (csf_kernels.moe.w4a8_panels) with the row data below
    base13: torch.Tensor | None = None  # W4A8: uint8 [E, 2N] row bases
    base2: torch.Tensor | None = None  # uint8 [E, H]
    flags13: torch.Tensor | None = None  # W4A8: uint8 [E, ceil(2N / 128)] folded tiles
    flags2: torch.Tensor | None = None
    wide13: torch.Tensor | None = None  # MXFP4: uint8 [E, 2N / 64] row blocks whose pairs take two multiplies
    wide2: torch.Tensor | None = None  # uint8 [E, H / 64]

    @property
    def scale_source(self) -> str:
        return "inline" if isinstance(self.s13, InlineScales) else "native"

    @property
    def experts(self) -> int:
        return self.w13.shape[0]

    def scale_bytes(self) -> dict[str, int]:
        """Bytes the layer's scales take as held here (``stored``: inline engine records, or scale panels with W4A8's
        row bases and fold flags) and as the native planes of the same rows (``native``)."""
        stored = native = 0
        for fc in ("13", "2"):
            s = getattr(self, "s" + fc)
            rows = self.w13.shape[2] * 64 if fc == "13" else self.w2.shape[2] * 64
            k = self.w13.shape[1] * 64 if fc == "13" else self.w2.shape[1] * 64
            native += self.experts * rows * (k // (16 if self.fmt == "nvfp4" else 32))
            stored += s.nbytes if isinstance(s, InlineScales) else s.numel() * s.element_size()
            for extra in (getattr(self, "base" + fc), getattr(self, "flags" + fc)):
                stored += 0 if extra is None else extra.numel()
        return {"stored": stored, "native": native}

    @property
    def hidden(self) -> int:
        return self.w2.shape[2] * 64

    @property
    def inter(self) -> int:
        return self.w2.shape[1] * 64


def _panels(values: torch.Tensor, scales: torch.Tensor, fmt: str, w4a8: bool, source: str, name: str):
    """The weight panel (W4A8's or the FP4 engine's) and the scales as ``source`` serves them (inline: records
    encoded here, at load)."""
    panel = w4a8_weight_panel if w4a8 else engine_weight_panel
    w = torch.stack([panel(values[e]) for e in range(values.shape[0])])
    if source == "inline":
        return w, inline_scales(scales.contiguous(), fmt, name=name)
    s = torch.stack([engine_scale_panel(scales[e], fmt) for e in range(scales.shape[0])])
    return w, s


def _global_scale(g: torch.Tensor | None, experts: int, name: str) -> torch.Tensor:
    if g is None:
        raise ValueError(f"NVFP4 experts need {name} (float32 per expert)")
    g = g.to(torch.float32).reshape(-1)
    if g.numel() != experts:
        raise ValueError(f"{name}: {g.numel()} values for {experts} experts")
    return g.contiguous()


def engine_weights(
    experts: QuantizedExperts, activation: str, *, fused: bool = True, w4a8: bool = False, scale_source: str = "native"
) -> EngineWeights:
    """Panels of MXFP4 or NVFP4 experts (on their device; NVFP4's global scales passed through); W13 rows as
    ``activation`` reads them (``csf_moe.reference``), rearranged into engine order where FC1's epilogue applies the
    activation (``fused``). ``w4a8``: W4A8 panels, row bases and fold flags for the FP8 GEMMs (MXFP4 only: NVFP4's
    block factors do not fold into E4M3, ``docs/moe-engine.md`` §8.1). ``scale_source`` ``inline``: each scale
    plane is encoded into engine records over the same rows (checked by decoding them back), which the FP4 GEMMs
    decode in a producer warp."""
    fmt = experts.fmt
    if fmt not in ENGINE_FORMATS:
        raise NotImplementedError(f"the engine layer serves {ENGINE_FORMATS} weights; got {fmt}")
    if w4a8 and fmt not in W4A8_FORMATS:
        raise NotImplementedError(f"W4A8 serves {W4A8_FORMATS} weights exactly; {fmt} stays W4A16 (its block "
                                  "factors do not fold into E4M3)")  # fmt: skip
    if scale_source not in ENGINE_SCALE_SOURCES:
        raise ValueError(f"scale_source must be one of {ENGINE_SCALE_SOURCES}; got {scale_source!r}")
    if w4a8 and scale_source != "native":
        raise NotImplementedError("the W4A8 GEMM reads scale panels only; inline engine records serve the FP4 GEMM")
    for name, t in (("W13", experts.w13), ("W2", experts.w2)):
        if t.shape[1] % 64 or (2 * t.shape[2]) % 64:
            raise ValueError(f"{name} {tuple(t.shape)}: the engine needs rows and K in whole multiples of 64")
    nv = fmt == "nvfp4"
    g13 = _global_scale(experts.w13_global_scale, experts.experts, "w13_global_scale") if nv else None
    g2 = _global_scale(experts.w2_global_scale, experts.experts, "w2_global_scale") if nv else None
    v13, sc13, b13 = experts.w13, experts.w13_scale, experts.b13
    if fused:
        perm = fc1_engine_rows(v13.shape[1] // 2, interleaved=activation == "swiglu_oai").to(v13.device)
        v13, sc13 = v13[:, perm], sc13[:, perm]
        b13 = None if b13 is None else b13[:, perm]
    w13, s13 = _panels(v13, sc13, fmt, w4a8, scale_source, "w13_scale")
    w2, s2 = _panels(experts.w2, experts.w2_scale, fmt, w4a8, scale_source, "w2_scale")
    b13 = None if b13 is None else b13.float().contiguous()
    b2 = None if experts.b2 is None else experts.b2.float().contiguous()
    rows = {}
    if fmt == "mxfp4" and not w4a8:  # the rows as the panels hold them (W13 in engine order)
        rows["wide13"], rows["wide2"] = wide_row_tiles(sc13), wide_row_tiles(experts.w2_scale)
    if w4a8:
        for name, sc in (("13", sc13), ("2", experts.w2_scale)):
            bases = w4a8_bases(sc)
            rows["base" + name], rows["flags" + name] = bases.contiguous(), w4a8_tile_flags(sc, bases).contiguous()
    return EngineWeights(w13=w13, s13=s13, w2=w2, s2=s2, b13=b13, b2=b2, activation=activation, fused=fused, fmt=fmt,
                         g13=g13, g2=g2, w4a8=w4a8, **rows)  # fmt: skip


_ALIGN = 256  # every buffer carved from a caller's scratch starts 256-byte aligned
# block sizes from which FC1 reads its rows from the gather pass, by scale source (run 309, H100: 0.79x the layer's
# time at gpt-oss 8192 tokens, 0.92x Qwen3, 0.94x gpt-oss 2048; at 16-32-route blocks within 3% either way;
# docs/moe-engine.md §4.11). Inline programs gather with warp 0 alone beside the decoder warps: at 32-route blocks
# that took 1.16x the gather pass's layer (run 317: DS4.1-TP4 2048 tokens, Qwen3-30B 512)
PASS_FROM_TILE_N = {"native": 64, "inline": 32}


def fc1_rows_for(bm: int, scale_source: str = "native") -> str:
    """How FC1 gets its rows at ``bm`` routes a block with ``scale_source`` scales: from the gather pass by TMA
    tiles at large blocks, where the producer warps' per-row copies cost more than the pass, else gathered by its
    producer warps."""
    return "pass" if bm >= PASS_FROM_TILE_N[scale_source] else "producer"


class EngineMoE:
    """The engine layer of one set of weights; :meth:`call` binds a token count's buffers and launches. W4A8
    weights quantize the activations by ``activations`` (``per_token``: the convention the FP8 GEMM applies).
    ``schedule``: the FP4 GEMMs' consumer schedule (``csf_kernels.moe.engine_specs.ENGINE_SCHEDULES``) where the
    cache holds it for the call's block size, else that size's default; ``None``: the default everywhere.
    ``fc1_rows``: how FC1 gets its routes' rows (``ENGINE_FC1_ROWS``: its producer warps gather them, or a gather
    pass writes them in block order first); ``None``: :func:`fc1_rows_for`'s choice for the call's block size.
    ``ragged``: the FP4 GEMMs' ragged level where the cache holds it (0: whole blocks; 1: a block whose live routes
    lie in its first half runs that half; 2: also its first quarter that quarter; ``None``: the size's default).
    ``ctas_per_sm``: 1 or 2 CTAs an SM where built (``None``:
    the size's default).
    ``one_multiply`` (MXFP4): row blocks whose scale bytes allow it convert with one multiply a pair (the same
    bits); False: two everywhere. ``block_fill``: a block is the smallest program tile holding this fraction of an
    expert's mean routes (1: the mean, as the peer sizes its ``block_m``; 0.5: half of it, so an expert's routes
    spill into more, smaller blocks and its tail pads less); the same bits whatever the size. ``splits``: K splits
    of few-token calls (:mod:`csf_moe.engine_split`; ``None``: the heuristic, 1: never, a count or an ``(fc1,
    fc2)`` pair: forced where the call's block size has split programs, refused where K cannot make it); split
    GEMMs run their block size's default schedule and CTAs an SM."""

    def __init__(
        self, weights: EngineWeights, top_k: int, *, activations: str = "per_token", schedule: str | None = None,
        fc1_rows: str | None = None, ragged: int | bool | None = None, ctas_per_sm: int | None = None,
        one_multiply: bool = True, block_fill: float = 1.0, splits: int | tuple[int, int] | None = None,
    ):  # fmt: skip
        if not 0 < block_fill <= 1:
            raise ValueError(f"block_fill is a fraction of an expert's mean routes in (0, 1]; got {block_fill!r}")
        if weights.w4a8 and activations not in W4A8_GEMM_CONVENTIONS:
            raise NotImplementedError(f"the W4A8 GEMM applies {W4A8_GEMM_CONVENTIONS} activation scales; "
                                      f"{activations!r} (MXFP8's per-k32 promotion) is not built")  # fmt: skip
        if schedule is not None and (weights.w4a8 or schedule not in ENGINE_SCHEDULES):
            raise ValueError(f"schedule {schedule!r}: the FP4 GEMMs' are {ENGINE_SCHEDULES} (W4A8 has its own)")
        if fc1_rows is not None and (weights.w4a8 or fc1_rows not in ENGINE_FC1_ROWS):
            raise ValueError(f"fc1_rows {fc1_rows!r}: the FP4 FC1's are {ENGINE_FC1_ROWS} (W4A8 always passes)")
        self.weights = weights
        self.top_k = top_k
        self.block_fill = block_fill
        self.fc1_rows = fc1_rows
        self.ragged = ragged
        self.ctas_per_sm = ctas_per_sm
        self.one_multiply = one_multiply
        self.activations = activations
        self.schedule = schedule
        self.splits = splits_option(splits)
        # FC1's finish reads W13's bias as [gate; up] columns (made once here, never per call)
        self._finish_b13 = finish_bias(weights.b13) if weights.fused and weights.b13 is not None else None

    def _gemm(self, fc: str, x: dict, out, block_expert, meta, bm, **epilogue) -> runtime.Launch:
        """FC1 (``fc`` ``"13"``) or FC2's grouped GEMM of ``x`` (``{"x": bf16}``, or W4A8's ``{"xq": E4M3 bytes,
        "xscale": per-route scales}``) into ``out``; ``epilogue``: the FP4 GEMM's activation, bias and row mode."""
        w = self.weights
        panels = (getattr(w, "w" + fc), getattr(w, "s" + fc))
        if w.w4a8:
            rows = (getattr(w, "base" + fc), getattr(w, "flags" + fc))
            return grouped_w4a8_gemm_launch(*panels, *rows, x["xq"], x["xscale"], out, block_expert, meta,
                                            tile_n=bm, **epilogue)  # fmt: skip
        return grouped_fp4_gemm_launch(*panels, x["x"], out, block_expert, meta, tile_n=bm, fmt=w.fmt,
                                       global_scale=getattr(w, "g" + fc), schedule=self.schedule,
                                       ragged=self.ragged, ctas_per_sm=self.ctas_per_sm,
                                       wide=getattr(w, "wide" + fc) if self.one_multiply else None,
                                       **epilogue)  # fmt: skip

    def _fc1(self, x, h, a, block_expert, meta, bm, rows) -> list:
        """FC1 and its activation: one GEMM whose epilogue activates, or the GEMM then the activation pass; ``rows``:
        the FP4 GEMM's gather of its routes' rows of ``x`` (W4A8's input is gathered already)."""
        w = self.weights
        if w.fused:
            return [self._gemm("13", x, a, block_expert, meta, bm, activation=w.activation, bias=w.b13, **rows)]
        return [
            self._gemm("13", x, h, block_expert, meta, bm, **rows),
            act_launch(h, block_expert, meta, w.b13, a, num_experts=w.experts, bm=bm, activation=w.activation),
        ]

    def tile_n(self, tokens: int) -> int:
        """Routes a block for a call of ``tokens`` tokens: the smallest program tile holding ``block_fill`` of an
        expert's mean routes."""
        return call_tile_n(tokens * self.top_k, self.weights.experts, self.weights.w4a8, self.block_fill)

    def call_splits(self, tokens: int) -> tuple[int, int]:
        """FC1's and FC2's K splits for a call of ``tokens`` tokens (``(1, 1)``: the unsplit layer)."""
        w = self.weights
        return call_splits(tokens, self.top_k, w.experts, w.hidden, w.inter, w.fmt, self.tile_n(tokens),
                           want=self.splits, split_layer=w.fused and not w.w4a8)  # fmt: skip

    def _split_body(self, x, topk_ids, weights32, out, buf, splits, bm) -> list:
        """A split call's GEMMs and finishing kernels (after the alignment): FC1's partials, its finish into FC2's
        route-order input, FC2's partials over those rows, the partial combine (:mod:`csf_moe.engine_split`)."""
        w = self.weights
        tokens = x.shape[0]
        common = dict(block_expert=buf["block_expert"], meta=buf["meta"], tile_n=bm, fmt=w.fmt, io="gather",
                      sorted_ids=buf["sorted_ids"])  # fmt: skip

        def gemm(fc, rows, out, **kw):
            wide = getattr(w, "wide" + fc) if self.one_multiply else None
            return grouped_fp4_gemm_launch(getattr(w, "w" + fc), getattr(w, "s" + fc), rows, out,
                                           global_scale=getattr(w, "g" + fc), wide=wide, **common, **kw)  # fmt: skip

        finish = dict(splits=splits[0], activation=w.activation, bias=self._finish_b13, global_scale=w.g13,
                      num_experts=w.experts)  # fmt: skip
        ids = topk_ids.view(tokens, self.top_k)
        combine = dict(splits=splits[1], num_experts=w.experts)
        return [
            gemm("13", x, buf["part1"], top_k=self.top_k, partial="fc1", splits=splits[0]),
            fc1_finish_launch(buf["part1"], ids.reshape(-1), buf["a"], **finish),
            gemm("2", buf["a"], buf["part2"], top_k=1, partial="rows", splits=splits[1]),
            partial_combine_launch(buf["part2"], w.b2, w.g2, ids, weights32, out, **combine),
        ]

    def call(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, *,
        scratch: torch.Tensor | None = None, name: str = "engine layer",
    ):  # fmt: skip
        """A zero-argument function running the layer on ``x`` into ``out`` with these routes (their values may
        change between runs; their shapes may not), its buffers allocated now, or (``scratch``: uint8, at least
        :func:`call_buffer_bytes` for the call, 256-byte aligned) carved from that caller-owned buffer, which layers
        that run one after another may share. ``name``: what a missing program's error says it was for."""
        launches, keep = self.launches(x, topk_ids, topk_weights, out, scratch=scratch)
        weights32 = keep[-1]
        bound = [launch.bind(name) for launch in launches]

        def run() -> torch.Tensor:
            if weights32 is not topk_weights:
                weights32.copy_(topk_weights)
            for launch in bound:
                launch()
            return out

        run.buffers = keep  # alive as long as the function
        run.launches = tuple(zip((launch.spec.kernel for launch in launches), bound, strict=True))
        return run

    def launches(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, *,
        scratch: torch.Tensor | None = None,
    ) -> tuple[list[runtime.Launch], tuple]:  # fmt: skip
        """The programs a call runs, in order, unbound, and the buffers they use (the float32 routing weights last):
        what :meth:`call` binds."""
        w = self.weights
        tokens = x.shape[0]
        pairs = tokens * self.top_k
        experts = w.experts
        bm = self.tile_n(tokens)
        splits = self.call_splits(tokens)
        fc1_rows = "pass" if w.w4a8 else (self.fc1_rows or fc1_rows_for(bm, w.scale_source))
        shapes = call_buffers(tokens, self.top_k, experts, w.hidden, w.inter, w4a8=w.w4a8, fused=w.fused,
                              fc1_rows=fc1_rows, float_weights=topk_weights.dtype != torch.float32,
                              block_fill=self.block_fill, splits=splits)  # fmt: skip
        buf = _carve(shapes, x.device, scratch)
        cursor, block_expert, active, meta, sorted_ids = (buf[k] for k in ("cursor", "block_expert", "active",
                                                                            "meta", "sorted_ids"))  # fmt: skip
        h, a = buf.get("h"), buf["a"]
        weights32 = buf["weights32"].copy_(topk_weights) if "weights32" in buf else topk_weights
        scratch_views = dict(
            cursor=cursor, block_expert=block_expert, active_experts=active, meta=meta, sorted_ids=sorted_ids
        )
        if splits != (1, 1):
            launches = [
                *align_launches(topk_ids, num_experts=experts, bm=bm, **scratch_views),
                *self._split_body(x, topk_ids, weights32, out, buf, splits, bm),
            ]
            keep = (cursor, block_expert, active, meta, sorted_ids, buf["part1"], a, buf["part2"], weights32)
            return launches, keep
        if w.w4a8:
            # FC1's input quantized by token at the routes' slots (the alignment writes them), FC2's quantized where
            # it lies, the GEMMs over block-order rows, the combine finding FC2's rows through the same slots
            by_slot = scratch_views["route_slots"] = buf["route_slots"]
            y = buf["y"]
            x1 = {"xq": buf["xq1"], "xscale": buf["xscale1"]}
            x2 = {"xq": buf["xq2"], "xscale": buf["xscale2"]}
            conv = self.activations
            fc1_in = [gather_fp8_launch(x, by_slot, x1["xq"], x1["xscale"], top_k=self.top_k, convention=conv)]
            fc2_in = [quantize_rows_fp8_launch(a, meta, x2["xq"], x2["xscale"], bm=bm, convention=conv)]
            gather, scatter = {}, {}
        else:
            # FC1's producer gathers its routes' rows of x (or reads them from a gather pass); FC2's epilogue stores
            # each slot's row at its route
            by_slot = None
            y = buf["y"]  # a token's k rows contiguous
            x2 = {"x": a}
            fc2_in = []
            if fc1_rows == "pass":
                x1 = {"x": buf["xs"]}
                scratch_views["route_slots"] = buf["route_slots"]  # the alignment writes each route's slot
                fc1_in = [gather_tokens_launch(x, buf["route_slots"], x1["x"], top_k=self.top_k)]
                gather = dict(sorted_ids=sorted_ids, pairs=pairs)  # block-order rows; the ids tell live slots
            else:
                x1, fc1_in = {"x": x}, []
                gather = dict(io="gather", sorted_ids=sorted_ids, top_k=self.top_k)
            scatter = dict(io="scatter", sorted_ids=sorted_ids)
        launches = [
            *align_launches(topk_ids, num_experts=experts, bm=bm, **scratch_views),
            *fc1_in,
            *self._fc1(x1, h, a, block_expert, meta, bm, gather),
            *fc2_in,
            self._gemm("2", x2, y, block_expert, meta, bm, **scatter),
            combine_launch(
                y, w.b2, topk_ids.view(tokens, self.top_k), weights32, out, num_experts=experts, inverse=by_slot
            ),
        ]
        keep = (cursor, block_expert, active, meta, sorted_ids, buf.get("route_slots"), x1, x2, h, a, y, weights32)
        return launches, keep


class EngineLayer:
    """A served engine layer: an :class:`EngineMoE` bound to an engine plan (``csf_moe.plan(..., gemm="engine")``)
    and a caller-owned scratch that layers running one after another may share (:func:`bind_engine`). :meth:`run`
    is :meth:`csf_moe.MoELayer.run`'s: a call binds its launches once per (token count, route id dtype, operand
    addresses) and allocates nothing but its output (nothing given ``out``), so CUDA graphs capture it."""

    def __init__(self, plan, weights: EngineWeights, scratch: torch.Tensor):
        self.plan = plan
        self.weights = weights
        self.scratch = scratch
        self.moe = EngineMoE(weights, plan.top_k, activations=plan.convention)
        self._bound = runtime.BindingCache()

    def expands(self, tokens: int) -> bool:
        """Never: the engine's GEMMs read scale panels or decode their records themselves (no expansion)."""
        return False

    def run(
        self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """bf16 [T, H] = sum_j topk_weights[:, j] * expert_{topk_ids[:, j]}(hidden_states), T up to the plan's
        ``max_tokens``."""
        geo = self.plan.geometry
        t = hidden_states.shape[0]
        out = checked_output(self.plan, hidden_states, topk_ids, topk_weights, out)
        if t == 0:
            return out
        if out.data_ptr() % ALIGNMENT:  # the programs assume 16-byte aligned operands
            return out.copy_(self.run(hidden_states, topk_ids, topk_weights))
        x, ids, w = (aligned(a) for a in (hidden_states, topk_ids, topk_weights))
        key = (t, ids.dtype, w.dtype, x.data_ptr(), ids.data_ptr(), w.data_ptr(), out.data_ptr())

        def bind_call():
            return (self.moe.call(x, ids, w, out, scratch=self.scratch, name=geo.name),)

        for call in self._bound.get(key, bind_call):
            call()
        return out

    __call__ = run


def bind_engine(plan, weights: EngineWeights, scratch: torch.Tensor) -> EngineLayer:
    """Bind ``weights`` prepared for the engine ``plan`` (:func:`csf_moe.engine_prepare.prepare_engine_weights`) to
    caller-owned ``scratch`` (uint8, >= ``plan.scratch_bytes``, on the weights' device, 256-byte aligned; shareable by
    layers that run one after another). Every program of ``plan.specs()`` is resolved now, so a frozen runtime fails
    here, naming the first program the AOT cache lacks, never mid-forward."""
    geo = plan.geometry
    if scratch.dtype != torch.uint8 or scratch.dim() != 1 or not scratch.is_contiguous():
        raise ValueError("scratch must be a contiguous 1-D uint8 tensor")
    if scratch.numel() < plan.scratch_bytes:
        raise ValueError(f"scratch holds {scratch.numel()} bytes; the plan needs {plan.scratch_bytes}")
    if scratch.data_ptr() % _ALIGN:
        raise ValueError("scratch must be 256-byte aligned (as torch allocates it)")
    if scratch.device != weights.w13.device:
        raise ValueError(f"scratch is on {scratch.device}, the weights on {weights.w13.device}")
    want = (geo.fmt.name, plan.w4a8, plan.scale_source, geo.experts, geo.hidden, geo.intermediate, geo.activation,
            True)  # fmt: skip
    got = (weights.fmt, weights.w4a8, weights.scale_source, weights.experts, weights.hidden, weights.inter,
           weights.activation, weights.fused)  # fmt: skip
    if got != want:
        raise ValueError(f"weights (fmt, w4a8, scale source, experts, hidden, inter, activation, fused) {got} were not "
                         f"prepared for the plan's {want}")  # fmt: skip
    for spec in plan.specs():  # resolved now: a missing program fails at bind, not mid-forward
        runtime.program(spec, geometry=geo.name)
    return EngineLayer(plan, weights, scratch)


def call_tile_n(pairs: int, experts: int, w4a8: bool, block_fill: float = 1.0) -> int:
    """Routes a block for a call of ``pairs`` routes over ``experts``: the smallest program tile holding
    ``block_fill`` of an expert's mean routes."""
    return (w4a8_tile_n if w4a8 else engine_tile_n)(pairs / experts * block_fill)


def call_buffers(
    tokens: int,
    top_k: int,
    experts: int,
    hidden: int,
    inter: int,
    *,
    w4a8: bool,
    fused: bool = True,
    fc1_rows: str = "producer",
    float_weights: bool = False,
    block_fill: float = 1.0,
    splits: tuple[int, int] = (1, 1),
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The buffers a call of ``tokens`` tokens uses, in carving order: name -> (shape, dtype). ``fc1_rows``
    ``"pass"``: FC1's block-order input rows and each route's slot (W4A8 always stores them quantized there);
    ``float_weights``: the routing weights come in another dtype and are copied to float32 first; ``block_fill``: as
    :class:`EngineMoE`'s; ``splits``: FC1's and FC2's K splits (a split call's partials, and FC2's input at the
    routes' rows)."""
    pairs = tokens * top_k
    bm = call_tile_n(pairs, experts, w4a8, block_fill)
    blocks = max_blocks_for(pairs, experts, bm)
    slots = blocks * bm
    i32, bf16, u8, f32 = torch.int32, torch.bfloat16, torch.uint8, torch.float32
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "cursor": ((experts_bins(experts),), i32),
        "block_expert": ((blocks,), i32),
        "active": ((min(pairs, experts),), i32),
        "meta": ((4,), i32),
        "sorted_ids": ((slots,), i32),
    }
    if splits != (1, 1):  # csf_moe.engine_split
        out |= {"part1": ((splits[0] * pairs, 2 * inter), f32), "a": ((pairs, inter), bf16),
                "part2": ((splits[1] * pairs, hidden), f32)}  # fmt: skip
        if float_weights:
            out["weights32"] = ((tokens, top_k), f32)
        return out
    if not fused:
        out["h"] = ((slots, 2 * inter), bf16)
    out["a"] = ((slots, inter), bf16)
    if w4a8:
        out |= {"route_slots": ((pairs,), i32), "y": ((slots, hidden), bf16), "xq1": ((slots, hidden), u8),
                "xscale1": ((slots,), f32), "xq2": ((slots, inter), u8), "xscale2": ((slots,), f32)}  # fmt: skip
    else:
        out["y"] = ((pairs, hidden), bf16)
        if fc1_rows == "pass":  # the pass reads each route's slot
            out["route_slots"] = ((pairs,), i32)
            out["xs"] = ((slots, hidden), bf16)
    if float_weights:
        out["weights32"] = ((tokens, top_k), f32)
    return out


def call_buffer_bytes(shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> int:
    """Bytes of scratch that :func:`call_buffers`' buffers take carved one after another, each 256-byte aligned."""
    total = 0
    for shape, dtype in shapes.values():
        total += _aligned_bytes(shape, dtype)
    return total


def _aligned_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        n *= d
    return -(-n // _ALIGN) * _ALIGN


def _carve(shapes, device, scratch: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The buffers, allocated now or (``scratch``) views of the caller's buffer, one after another."""
    if scratch is None:
        return {name: torch.empty(shape, dtype=dtype, device=device) for name, (shape, dtype) in shapes.items()}
    if scratch.dtype != torch.uint8 or scratch.dim() != 1 or scratch.data_ptr() % _ALIGN:
        raise ValueError("scratch must be a 1-D uint8 tensor, 256-byte aligned")
    need = call_buffer_bytes(shapes)
    if scratch.numel() < need:
        raise ValueError(f"scratch holds {scratch.numel()} bytes; this call needs {need}")
    out, offset = {}, 0
    for name, (shape, dtype) in shapes.items():
        count = 1
        for d in shape:
            count *= d
        size = count * torch.empty((), dtype=dtype).element_size()
        out[name] = scratch[offset : offset + size].view(dtype).view(shape)
        offset += _aligned_bytes(shape, dtype)
    return out
