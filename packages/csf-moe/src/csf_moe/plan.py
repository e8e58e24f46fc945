"""Planning a fused MoE layer: which programs run at which token counts, and how much scratch they need.

A plan is computed from the geometry alone, without compiling or touching a GPU. Token counts are
served by *buckets* (the catalog's token buckets up to ``max_tokens``): a call with T tokens runs the
programs of the smallest bucket >= T. Each bucket fixes its GEMM tile configuration (decode for few
routes per expert, prefill above), how its GEMMs read scales (:class:`ScaleRead`: a native-layout plane, or
the CSF records themselves) and, where it expands CSF into scratch planes first, its calls'
:class:`ExpansionSchedule` (:meth:`MoEPlan.expansion_schedule`), which the bound layer executes.

Vocabulary: a plan's ``scale_source`` is how the layer *stores* and *uses* scales: "native" (the model's
planes), "expanded" (CSF stored, expanded into scratch planes before every call) or "inline" (CSF stored,
each bucket reading records or expanding as planned).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from csf_kernels.catalog import MoEGeometry, load_catalog
from csf_kernels.moe import heuristics as moe_heuristics
from csf_kernels.moe.heuristics import (
    decode_config_for,
    fc2_finishes_fc1,
    split_count,
)
from csf_kernels.moe.launch import max_blocks_for
from csf_kernels.moe.relabel import k_step, padded_k
from csf_kernels.moe.specs import (
    PREFILL,
    GemmConfig,
    ScaleRead,
    align_forms,
    align_routes_spec,
    align_specs,
    combine_slot_tiles,
    combine_spec,
    copies_weights_early,
    experts_bins,
    fc1_finish_spec,
    gemm_spec,
    relabel_spec,
    relabel_step,
    routes_as_blocks,
)
from csf_kernels.runtime.programs import ProgramSpec

from .buckets import bucket_for
from .engine_plan import ACTIVATIONS, GEMMS, EnginePlan, engine_plan

__all__ = [
    "SCALE_SOURCES",
    "BucketPlan",
    "ExpansionSchedule",
    "MoEPlan",
    "PlaneExpansion",
    "ScaleRead",
    "ScratchLayout",
    "plan",
]

SCALE_SOURCES = ("native", "expanded", "inline")  # a plan's scale_source (module docstring)


class ExpansionSchedule(enum.Enum):
    """How a call of an expanding bucket gets its native-layout scale planes (csf_moe.layer runs each)."""

    NONE = "none"  # the bucket does not expand: its GEMMs read the stored planes or the CSF records
    GIVEN_PLANES = "given_planes"  # the caller expanded them ahead of the call (csf_moe.prefetch)
    ALL_EXPERTS = "all_experts"  # every expert's, forked at the call's start: W13's beside the alignment
    ROUTED_CHAINED = "routed_chained"  # the routed experts', both on the current stream, W2's beside W13's
    ROUTED_FORKED = "routed_forked"  # the routed experts', W2's forked onto the side stream
    FC1_ON_RECORDS = "fc1_on_records"  # only W2's, launched after FC1, which reads W13's records itself


@dataclass(frozen=True, kw_only=True)
class PlaneExpansion:
    """What a bound layer's device makes of its two planes' expansions (the facts a schedule needs that the
    geometry alone does not give)."""

    w13_dependent: bool  # W13's is a row-block dependent launch: it can wait last and let the next kernel in at its end
    w2_dependent: bool
    w13_whole_rows: bool  # W13's rows fit one warp's image (expand.specs.ROW_BLOCK_MAX_WHOLE_COLS)
    chain: bool = True  # chain the routed experts' expansions where both can (False: always fork; A/B timing)

    @property
    def chains(self) -> bool:
        return self.chain and self.w13_whole_rows and self.w13_dependent and self.w2_dependent


# routes per expert (T * k / E) up to which the decode tile configurations run (their wgmma blocks measured
# faster than the prefill tiles at every count up to this; docs/perf-notes.md, "The tile follows the routes per
# expert"); the prefill tiles above.
DECODE_ROUTES_PER_EXPERT = 1024
# tokens above which an inline plan expands its routed experts' scales once per call and runs the GEMMs on native-
# layout planes: 0, since the expansion measures faster than records read in the GEMM at every token count
# (docs/perf-notes.md, "Inline plans expand scales; the GEMM reads a native-layout plane").
INLINE_TOKEN_LIMIT = 0
# tokens up to which an inline plan's expanding routed calls (FC2 finishing FC1, int32 route ids) run FC1 on
# W13's records and expand only W2's scales, beside FC1, so that no expansion stands before FC1 (measured faster
# at one token on every catalog geometry; docs/perf-notes.md, "Except where FC1 runs few K steps").
FC1_RECORDS_TOKENS = 1
# ... and in the routed buckets past it whose FC1 programs each run at most this many K steps: the records'
# decode adds work to every step, while the W13 expansion it replaces costs about the same whatever the steps, so
# it pays only where FC1's programs are short (same section).
FC1_RECORDS_STEPS = 8
# routes per expert (T * k / E) from which an expanding call expands every expert's scales, concurrently with
# the routing's alignment (nothing to wait for), instead of the routed experts' after it: from 2 routes per
# expert on, 86% or more of the experts are routed anyway (uniform routing).
EXPAND_ALL_ROUTES_PER_EXPERT = 2
_ALIGN = 256


@dataclass(frozen=True, kw_only=True)
class BucketPlan:
    tokens: int  # the largest token count this bucket serves
    config: GemmConfig
    expand: bool  # expand CSF scales into scratch planes before the GEMMs
    scale_read: ScaleRead  # how its GEMMs read scales
    max_blocks: int
    splits_fc1: int = 1  # K splits of split-K configs (float32 partials in scratch)
    splits_fc2: int = 1
    # its calls of up to this many tokens read their routes as blocks (moe_heuristics.ROUTED_TOKENS when planned, on
    # tiles that can; 0: none), decided here so that later module settings change no bound layer
    routed_tokens: int = 0
    # every call's FC2 programs finish FC1 from its partials themselves (all routed): no finishing kernel, FC1's
    # and FC2's partials side by side in scratch (moe_heuristics.fc2_finishes_fc1)
    fc2_finishes_fc1: bool = False
    # its expanding routed calls of up to this many tokens with int32 ids run FC1 on W13's records and expand W2's
    # scales beside it (csf_moe.layer; FC1_RECORDS_TOKENS, FC1_RECORDS_STEPS; 0: none); FC2 reads an expanded plane
    fc1_records_tokens: int = 0

    def __post_init__(self):
        if self.fc1_records_tokens < 0 or self.fc1_records_tokens > max(self.tokens, 0):
            raise ValueError(f"fc1_records_tokens={self.fc1_records_tokens} must lie in [0, {self.tokens}]")
        if self.fc1_records_tokens and not (self.expand and self.fc2_finishes_fc1):
            raise ValueError("FC1 reads records beside W2's expansion only in expanding buckets whose FC2 finishes FC1")

    @property
    def fc1_reads_records(self) -> bool:
        """Whether any of its calls run FC1 on W13's records (``fc1_records_tokens``)."""
        return self.fc1_records_tokens > 0

    def fc1_partials(self, top_k: int, geometry: MoEGeometry) -> int:
        """float32 values of FC1's partials, at the start of the partials region (FC2's follow them when FC2
        finishes FC1; otherwise they overwrite them)."""
        return self.tokens * top_k * self.splits_fc1 * 2 * geometry.intermediate

    def partials(self, top_k: int, geometry: MoEGeometry) -> int:
        """float32 values of the partials region this bucket's calls use."""
        fc1 = self.fc1_partials(top_k, geometry)
        fc2 = self.tokens * top_k * self.splits_fc2 * geometry.hidden
        return fc1 + fc2 if self.fc2_finishes_fc1 else max(fc1, fc2)


@dataclass(frozen=True, kw_only=True)
class ScratchLayout:
    """Byte offsets of each region in the caller-owned scratch (256-byte aligned)."""

    cursor: tuple[int, int]  # (offset, int32 count)
    meta: tuple[int, int]
    block_expert: tuple[int, int]
    active_experts: tuple[int, int]
    sorted_ids: tuple[int, int]
    intermediate: tuple[int, int]  # (offset, bf16 count): [pairs, N] (relabelled buckets: N in whole K steps)
    fc2_out: tuple[int, int]  # [pairs, H]
    partials: tuple[int, int]  # (offset, float32 count): split-K partials, FC1's then FC2's (BucketPlan.partials)
    w13_scales: tuple[int, int]  # (offset, bytes): the expanded W13 plane, or (0, 0)
    w2_scales: tuple[int, int]
    relabelled_input: tuple[int, int] = (0, 0)  # bf16 [tokens, H in whole K steps] for relabelled buckets
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class MoEPlan:
    geometry: MoEGeometry
    top_k: int
    max_tokens: int
    scale_source: str  # "native", "expanded" or "inline"
    inline_token_limit: int
    fc1_records_tokens: int
    fc1_records_steps: int
    expand_all_routes_per_expert: int
    buckets: tuple[BucketPlan, ...]
    scratch: ScratchLayout

    @property
    def scratch_bytes(self) -> int:
        return self.scratch.nbytes

    @property
    def max_pairs(self) -> int:
        return self.max_tokens * self.top_k

    def expands_all_experts(self, tokens: int) -> bool:
        """Whether an expanding call of ``tokens`` tokens expands every expert's scales, concurrently with the
        routing's alignment, rather than the routed experts' after it (routes per expert over the model's experts:
        an expert-parallel rank gets about 1/ep of the routes for 1/ep of the experts)."""
        return tokens * self.top_k >= self.expand_all_routes_per_expert * self.geometry.global_experts

    def expansion_schedule(
        self, tokens: int, planes: PlaneExpansion, *, ids_list_experts: bool, planes_given: bool = False
    ) -> ExpansionSchedule:
        """The schedule a call of ``tokens`` tokens runs. ``ids_list_experts``: its route ids (int32, contiguous,
        read as blocks) list the routed experts themselves; ``planes_given``: the caller expanded the planes."""
        bucket = self.bucket_for(tokens)
        if not bucket.expand:
            return ExpansionSchedule.NONE
        if planes_given:
            return ExpansionSchedule.GIVEN_PLANES
        if self.expands_all_experts(tokens):
            return ExpansionSchedule.ALL_EXPERTS
        # FC1 on W13's records needs W2's expansion to wait for FC1 only before it exits (a dependent launch)
        if tokens <= bucket.fc1_records_tokens and ids_list_experts and planes.w2_dependent:
            return ExpansionSchedule.FC1_ON_RECORDS
        return ExpansionSchedule.ROUTED_CHAINED if planes.chains else ExpansionSchedule.ROUTED_FORKED

    def reads_routes_as_blocks(self, tokens: int) -> bool:
        """Whether a call of ``tokens`` tokens has its GEMMs read its route ids as blocks, with no alignment (up
        to ``moe_heuristics.ROUTED_TOKENS`` tokens, on the one-token tiles; one that expands its routed experts' scales
        from int64 route ids still aligns, for the list of experts to expand: int32 ids are that list)."""
        return tokens <= self.bucket_for(tokens).routed_tokens

    def bucket_for(self, tokens: int) -> BucketPlan:
        return bucket_for(self.buckets, tokens, self.max_tokens, self.geometry.name)

    def specs(self) -> tuple[ProgramSpec, ...]:
        """Every program this plan may launch (all in the AOT catalog for catalog geometries)."""
        g = self.geometry
        out: dict[str, ProgramSpec] = {}
        for b in self.buckets:
            for fc1 in (True, False):
                s = gemm_spec(g.fmt, b.scale_read, fc1=fc1, activation=g.activation, bias=g.bias, config=b.config)
                out[s.key] = s
            if b.routed_tokens:
                for ids64 in (False, True):
                    s = gemm_spec(g.fmt, b.scale_read, fc1=True, activation=g.activation, bias=g.bias,
                                  config=b.config, routed=True, ids64=ids64)  # fmt: skip
                    out[s.key] = s
                    if b.fc2_finishes_fc1:
                        s = gemm_spec(g.fmt, b.scale_read, fc1=False, activation=g.activation, bias=g.bias,
                                      config=b.config, routed=True, ids64=ids64, finishes_fc1=True)  # fmt: skip
                        out[s.key] = s
                    if b.fc1_reads_records and not ids64:  # FC1 on W13's records, W2 expanded beside it (layer)
                        s = gemm_spec(g.fmt, ScaleRead.RECORDS, fc1=True, activation=g.activation, bias=g.bias,
                                      config=b.config, routed=True)  # fmt: skip
                        out[s.key] = s
                    if b.expand and copies_weights_early(b.config):  # FC1 behind chained expansions (layer)
                        s = gemm_spec(g.fmt, b.scale_read, fc1=True, activation=g.activation, bias=g.bias,
                                      config=b.config, routed=True, ids64=ids64, early=True)  # fmt: skip
                        out[s.key] = s
            for ids64 in (False, True):
                # what the bucket's calls (up to its size) align and combine with
                for s in align_specs(g.experts, b.config.bm, ids64, align_forms(b.tokens * g.top_k)):
                    out[s.key] = s
                if b is self.buckets[0]:  # the bucket one-token calls run in: their routes align as blocks
                    s = align_routes_spec(b.config.bm, ids64, g.top_k)
                    out[s.key] = s
                gscale = g.fmt.name == "nvfp4"
                for s in (
                    *(
                        combine_spec(ids64, slots=slots, partial=b.config.split_k, bias=g.bias, gscale=gscale)
                        for slots in combine_slot_tiles(b.tokens, g.top_k)
                    ),
                    fc1_finish_spec(ids64, activation=g.activation, bias=g.bias, gscale=gscale,
                                    relabel=relabel_step(g.fmt, b.config)),
                ):  # fmt: skip
                    out[s.key] = s
            if b.config.relabelled:
                s = relabel_spec(g.fmt)
                out[s.key] = s
        return tuple(out.values())


def _layout(geo: MoEGeometry, max_tokens: int, top_k: int, expand: bool, partials: int, configs) -> ScratchLayout:
    max_pairs = max_tokens * top_k
    offset = 0

    def region(count: int, itemsize: int) -> tuple[int, int]:
        nonlocal offset
        start = offset
        offset += -(-count * itemsize // _ALIGN) * _ALIGN
        return (start, count)

    max_blocks = max(max_blocks_for(max_pairs, geo.experts, c.bm) for c in configs)
    max_routes = max(max_blocks_for(max_pairs, geo.experts, c.bm) * c.bm for c in configs)
    cursor = region(experts_bins(geo.experts), 4)
    meta = region(4, 4)
    block_expert = region(max_blocks, 4)
    active = region(min(geo.experts, max_pairs), 4)
    sorted_ids = region(max_routes, 4)
    relabelled = any(c.relabelled for c in configs)
    inter = region(max_pairs * (padded_k(geo.intermediate, geo.fmt) if relabelled else geo.intermediate), 2)
    fc2 = region(max_pairs * geo.hidden, 2)
    part = region(partials, 4)
    w13 = region(_numel(geo.w13_scale_shape), 1) if expand else (0, 0)
    w2 = region(_numel(geo.w2_scale_shape), 1) if expand else (0, 0)
    x_r = region(max_tokens * padded_k(geo.hidden, geo.fmt), 2) if relabelled else (0, 0)
    return ScratchLayout(
        cursor=cursor,
        meta=meta,
        block_expert=block_expert,
        active_experts=active,
        sorted_ids=sorted_ids,
        intermediate=inter,
        fc2_out=fc2,
        partials=part,
        w13_scales=w13,
        w2_scales=w2,
        relabelled_input=x_r,
        nbytes=offset,
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan(
    geometry: MoEGeometry,
    max_tokens: int,
    top_k: int | None = None,
    quant_mode: str | None = None,
    *,
    gemm: str = "triton",
    activations: str = "bf16",
    scale_source: str | None = None,
    inline_token_limit: int = INLINE_TOKEN_LIMIT,
    fc1_records_tokens: int = FC1_RECORDS_TOKENS,
    fc1_records_steps: int = FC1_RECORDS_STEPS,
    expand_all_routes_per_expert: int = EXPAND_ALL_ROUTES_PER_EXPERT,
    decode_routes_per_expert: int = DECODE_ROUTES_PER_EXPERT,
    buckets: tuple[int, ...] | None = None,
    decode_config: GemmConfig | None = None,
    prefill_config: GemmConfig = PREFILL,
) -> MoEPlan | EnginePlan:
    """Plan a layer of ``geometry`` (a catalog entry, see ``csf_kernels.catalog``) for up to
    ``max_tokens`` tokens. ``quant_mode`` ('mxfp4' / 'nvfp4') and ``top_k`` must agree with the
    geometry when given.

    ``gemm``: ``"triton"`` (the default: csf's Triton/Gluon layer, :class:`MoEPlan`, bound by
    :func:`csf_moe.bind`) or ``"engine"`` (the CuTe DSL grouped GEMMs: a :class:`csf_moe.engine_plan.EnginePlan`,
    bound by :func:`csf_moe.engine_layer.bind_engine`; only ``scale_source`` ``inline`` / ``native`` and
    ``buckets`` apply to it). ``activations``: ``"bf16"`` (W4A16) or ``"fp8_per_token"`` (W4A8, MXFP4 on the
    engine only). ``scale_source`` defaults to ``"inline"`` (W4A8: ``"native"``, scale panels).

    ``fc1_records_tokens``, ``fc1_records_steps``: see ``FC1_RECORDS_TOKENS`` (0: never) and
    ``FC1_RECORDS_STEPS`` (0: by tokens only); ``expand_all_routes_per_expert``: see
    ``EXPAND_ALL_ROUTES_PER_EXPERT``. ``buckets``
    defaults to the catalog's token buckets (plus ``max_tokens``). ``decode_config`` fixes the decode
    buckets' tiles (default: by routes per expert, see ``csf_kernels.moe.specs.decode_config_for``)."""
    top_k = geometry.top_k if top_k is None else int(top_k)
    if quant_mode is not None and quant_mode != geometry.fmt.name:
        raise ValueError(f"quant_mode {quant_mode!r} does not match the geometry's format {geometry.fmt.name!r}")
    if gemm not in GEMMS:
        raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
    if gemm == "engine":
        triton_only = {
            "inline_token_limit": inline_token_limit != INLINE_TOKEN_LIMIT,
            "fc1_records_tokens": fc1_records_tokens != FC1_RECORDS_TOKENS,
            "fc1_records_steps": fc1_records_steps != FC1_RECORDS_STEPS,
            "expand_all_routes_per_expert": expand_all_routes_per_expert != EXPAND_ALL_ROUTES_PER_EXPERT,
            "decode_routes_per_expert": decode_routes_per_expert != DECODE_ROUTES_PER_EXPERT,
            "decode_config": decode_config is not None,
            "prefill_config": prefill_config != PREFILL,
        }
        given = sorted(name for name, changed in triton_only.items() if changed)
        if given:
            raise ValueError(f"{', '.join(given)}: options of the Triton layer's plan, not of gemm='engine'")
        if not 0 < top_k <= geometry.global_experts:
            raise ValueError(f"top_k={top_k} must lie in [1, {geometry.global_experts}]")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        return engine_plan(geometry, max_tokens, top_k, scale_source=scale_source, activations=activations,
                           buckets=buckets)  # fmt: skip
    if activations != "bf16":
        raise ValueError(
            f"activations={activations!r} (W4A8) runs on the engine's FP8 GEMM only: plan it with gemm='engine'; "
            "the Triton layer multiplies bf16 activations"
        )
    if scale_source is None:
        scale_source = "inline"
    if scale_source not in SCALE_SOURCES:
        raise ValueError(f"scale_source must be one of {SCALE_SOURCES}, got {scale_source!r}")
    if not 0 < top_k <= geometry.global_experts:
        raise ValueError(f"top_k={top_k} must lie in [1, {geometry.global_experts}]")
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if expand_all_routes_per_expert <= 0:
        raise ValueError(f"expand_all_routes_per_expert must be positive, got {expand_all_routes_per_expert}")
    if geometry.hidden % 32 or geometry.intermediate % 32:
        raise ValueError(
            f"{geometry.name}: hidden ({geometry.hidden}) and intermediate ({geometry.intermediate}) sizes must be "
            "multiples of 32 (the GEMM programs are compiled for 16-byte aligned rows)"
        )
    sizes = sorted({t for t in (buckets or load_catalog().token_buckets) if t < max_tokens} | {max_tokens})
    # tiles follow the routes per expert, which an expert-parallel rank shares with the whole layer (about 1/ep of
    # the routes for 1/ep of the experts); the blocks and scratch take every route as local (the worst case)
    density = geometry.global_experts
    plans = []
    for smallest, t in zip([1] + [s + 1 for s in sizes[:-1]], sizes, strict=True):  # each bucket's calls
        if t * top_k <= decode_routes_per_expert * density:
            config = decode_config or decode_config_for(t * top_k, density)
        else:
            config = prefill_config
        expand = scale_source == "expanded" or (
            scale_source == "inline" and (t > inline_token_limit or not config.split_k)
        )
        read = ScaleRead.RECORDS if scale_source == "inline" and not expand else ScaleRead.PLANE
        blocks = max_blocks_for(t * top_k, geometry.experts, config.bm)
        s1 = s2 = 1
        fin = False
        if config.split_k:
            steps = {k: -(-k // k_step(geometry.fmt)) for k in (geometry.hidden, geometry.intermediate)}
            s1 = split_count(blocks * config.row_tiles(geometry.intermediate, fc1=True), steps[geometry.hidden])
            s2 = split_count(blocks * config.row_tiles(geometry.hidden, fc1=False), steps[geometry.intermediate])
            fin = fc2_finishes_fc1(config, t, s2, steps[geometry.intermediate])
        routed = (
            moe_heuristics.ROUTED_TOKENS if routes_as_blocks(config) and smallest <= moe_heuristics.ROUTED_TOKENS else 0
        )
        fc1_records = 0
        if scale_source == "inline" and expand and fin and routed > 0 and fc1_records_tokens > 0:
            short = 0 < -(-steps[geometry.hidden] // s1) <= fc1_records_steps  # each FC1 program's K steps
            if short:
                fc1_records = min(t, routed)
            elif smallest <= fc1_records_tokens:
                fc1_records = min(t, fc1_records_tokens)
        plans.append(
            BucketPlan(
                tokens=t,
                config=config,
                expand=expand,
                scale_read=read,
                max_blocks=blocks,
                splits_fc1=s1,
                splits_fc2=s2,
                routed_tokens=routed,
                fc2_finishes_fc1=fin,
                fc1_records_tokens=fc1_records,
            )
        )
    expands = any(b.expand for b in plans)
    partials = max([b.partials(top_k, geometry) for b in plans if b.config.split_k] + [0])
    return MoEPlan(
        geometry=geometry,
        top_k=top_k,
        max_tokens=max_tokens,
        scale_source=scale_source,
        inline_token_limit=inline_token_limit,
        fc1_records_tokens=fc1_records_tokens,
        fc1_records_steps=fc1_records_steps,
        expand_all_routes_per_expert=expand_all_routes_per_expert,
        buckets=tuple(plans),
        scratch=_layout(geometry, max_tokens, top_k, expands, partials, {b.config for b in plans} | {prefill_config}),
    )
