"""The MoE engine's programs (``docs/moe-engine.md``): CuTe DSL, built ahead of time into shared objects.

The grouped FP4 x bf16 GEMM (:mod:`csf_kernels.moe.kernels.engine_gemm`) serves route blocks of any expert and, with
one expert, a dense GEMM; one program per route-block size, weight format (a fact of its spec: the scale panel's
bytes and conversion, NVFP4's global scale), scale source (``SRC``: ``native`` panels, or ``inline`` engine records
a producer warp decodes) and row mode (``IO``: FC1 gathers its routes' rows of ``x``, FC2 scatters its output to its
routes' rows), every shape at run time. K-split programs (fact ``PART``: few-token calls whose units leave SMs idle,
``docs/moe-engine.md`` §4.6) store float32 partials that the finish (FC1) and the partial combine (FC2) sum.
"""

from __future__ import annotations

import math

from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.engine_panels import ENGINE_SCALES, PANEL_STEP_K, ROW_BLOCK
from csf_kernels.moe.specs import (
    MOE_PDL,
    align_forms,
    align_routes_spec,
    align_specs,
    combine_slot_tiles,
    combine_slots,
    combine_spec,
    fc1_finish_spec,
)
from csf_kernels.runtime.programs import ProgramSpec, TritonFamily

__all__ = [
    "ENGINE_ACT",
    "ENGINE_COMBINE",
    "ENGINE_FC1_ROWS",
    "ENGINE_FORMATS",
    "ENGINE_GATHER_TOKENS",
    "ENGINE_GEMM",
    "ENGINE_GEMM_VERSION",
    "ENGINE_IO",
    "ENGINE_PAIRED_BY_DEFAULT",
    "ENGINE_PAIRED_TILE_N",
    "ENGINE_PARTIAL_FORMS",
    "ENGINE_PROBES",
    "ENGINE_PROBE_TILE_N",
    "ENGINE_RAGGED_LEVELS",
    "ENGINE_RAGGED_TILE_N",
    "ENGINE_SCALE_SOURCES",
    "ENGINE_SCHEDULES",
    "ENGINE_SPLIT_TILE_N",
    "ENGINE_STAGE_TILE_N",
    "ENGINE_TILE_K",
    "ENGINE_TILE_M",
    "ENGINE_TILE_N",
    "ENGINE_TRANSFORM_RAGGED",
    "ENGINE_TRANSFORM_TILE_N",
    "INLINE_MAX_COL_TILES",
    "engine_act_spec",
    "engine_combine_spec",
    "engine_fc1_finish_spec",
    "engine_gather_tokens_spec",
    "engine_gemm_spec",
    "engine_geometry_specs",
    "engine_occupancies",
    "engine_occupancy",
    "engine_partial_combine_spec",
    "engine_probe_specs",
    "engine_ragged",
    "engine_schedule",
    "engine_schedule_serves",
    "engine_schedules",
    "engine_serves",
    "engine_specs",
    "engine_split_finish_specs",
    "engine_split_steps",
    "engine_tile_n",
]

ENGINE_GEMM = "moe.engine_gemm"
# 3: the per-expert global scale argument (NVFP4); 4: sorted_ids, top_k, pdl (IO modes); 5: IO modes beside the
# inline scale source (its gather spares the decoder warp), PDL in the shared producer code; 6: the pairs argument
# (live route ids, for ragged blocks); 7: the split_steps argument (K-split programs, fact PART)
ENGINE_GEMM_VERSION = 7
ENGINE_IO = ("dense", "gather", "scatter")  # kernels.engine_gemm.IO_MODES (that module imports cutlass)
ENGINE_FORMATS = tuple(ENGINE_SCALES)  # weight formats the GEMM serves
ENGINE_TILE_N = (16, 32, 64, 128, 256)  # routes a block: the programs the cache holds
ENGINE_TILE_M = 2 * ROW_BLOCK  # weight rows a CTA tile: two consumer warpgroups of a row block each
ENGINE_TILE_K = PANEL_STEP_K  # K a stage: one panel step
# how FC1 gets its routes' rows of x: its producer warps gather them by cp.async ("producer"), or a gather pass
# writes them in block order, token by token through the alignment's route slots, and FC1 reads them by TMA tiles
# ("pass"; docs/moe-engine.md §4.11)
ENGINE_FC1_ROWS = ("producer", "pass")
ENGINE_SCALE_SOURCES = ("native", "inline")  # scale panels by TMA, or engine records decoded by a producer warp
# the consumers' wgmma schedule (moe/kernels/engine_mainloop.py): a K slice or a stage a commit group, or A from the
# bf16 tiles producer warps 1-3 convert (moe/kernels/engine_transform.py); the same bits
ENGINE_SCHEDULES = ("slice", "stage", "transform")
# block sizes whose stage is latency-bound (four m64nNk16 wgmmas of a few clocks each): built with both schedules and
# served by "stage" (docs/moe-engine.md §4.9); larger blocks are MMA-bound and keep "slice"
ENGINE_STAGE_TILE_N = (16, 32, 64)
# block sizes built with transform warps (kernels.engine_transform: producer warps 1-3, or 2-3 beside an inline
# decoder, convert each stage's weights into a bf16 A tile in shared memory, the consumers' wgmmas read A from there)
# beside "slice", which stays the default until a GPU run measures it (issue 46 asks both measured;
# docs/moe-engine.md §4.4, §7)
ENGINE_TRANSFORM_TILE_N = (64, 128, 256)
ENGINE_TRANSFORM_RAGGED = 1  # the default ragged level only, to keep the cache's growth small
# block sizes built ragged (a block whose live routes lie in its first half runs that half only, level 1; at level 2
# one whose live routes lie in its first quarter runs that quarter; docs/moe-engine.md §4.12), beside the whole-block
# programs (level 0); level 1 serves them by default: level 2 has not run on a GPU yet (next-run319.sh measures it);
# the kernels (kernels.engine_gemm) read these, this module does not import cutlass
ENGINE_RAGGED_TILE_N = (128, 256)
ENGINE_RAGGED_LEVELS = (0, 2, 1)  # the default last
# block sizes built to run two CTAs an SM (fact OCC=2) with the size's default schedule (docs/moe-engine.md §4.9); of
# these, the sizes two CTAs serve by default, measured (runs 312-313), whose one-CTA programs of that schedule are
# not built; a size added to the first keeps both until measured
ENGINE_PAIRED_TILE_N = (16, 32, 64)
ENGINE_PAIRED_BY_DEFAULT = (16, 32, 64)
INLINE_MAX_COL_TILES = 128  # records a row block the inline decoder's offset table holds (K <= 16384 MXFP4)
# K splits (kernels.engine_work): block sizes built with partial programs (few-token calls run 16-route blocks; 32
# covers a call whose routes land a few to an expert), the partials' forms (W13's engine rows as [gate; up] columns
# for FC1's finish, rows as they are for FC2's combine), and K steps an engine record covers (four scale columns:
# MXFP4's 32-K blocks two steps, NVFP4's 16-K blocks one): a split starts at a whole record, so the inline decoder
# starts a unit at one, and native programs split alike (the same partial bits from either source)
ENGINE_SPLIT_TILE_N = (16, 32)
# bound probes (fact PROBE; diagnostic programs, never served, their outputs wrong by design: kernels.engine_mainloop):
# the MXFP4 dense GEMM's loop without the conversion ("noconvert", today's register-A structure) and with A from
# shared memory ("ss", a transform warpgroup's consumers), at every block size with its default schedule and
# occupancy, whole blocks (docs/moe-engine.md §7: what a transform warpgroup could gain, measured before it is built)
ENGINE_PROBES = ("noconvert", "ss")
ENGINE_PROBE_TILE_N = ENGINE_TILE_N
ENGINE_PARTIAL_FORMS = ("fc1", "rows")
ENGINE_RECORD_STEPS = {"mxfp4": 2, "nvfp4": 1}


_GLUE = "csf_kernels.moe.kernels.engine_glue"
ENGINE_ACT = TritonFamily(
    kernel="moe.engine_act", version=1, module=_GLUE, function="engine_act", signature="SIGNATURE_ACT", num_warps=4
)
ENGINE_GATHER_TOKENS = TritonFamily(
    kernel="moe.engine_gather_tokens", version=1, module=_GLUE, function="engine_gather_tokens",
    signature="SIGNATURE_GATHER_TOKENS", num_warps=8,
)  # fmt: skip
ENGINE_COMBINE = TritonFamily(
    kernel="moe.engine_combine", version=3, module=_GLUE, function="engine_combine", signature="SIGNATURE_COMBINE",
    num_warps=4,
)  # fmt: skip
ACT_COLUMNS = 1024
GATHER_COLUMNS = 1024
GATHER_TOKENS = 8  # tokens a token-order gather program: 16 KB read, four 16-byte loads a thread, top_k stores each
COMBINE_COLUMNS = 1024
ACTIVATIONS = {"silu": 0, "swiglu_oai": 1}


def engine_split_steps(k_steps: int, splits: int, fmt: str) -> int:
    """K steps a split for ``splits`` K splits of ``k_steps`` steps of ``fmt`` weights: whole records a split, the
    last split the rest. A count the steps cannot make (a split left empty, or fewer splits than asked once each
    starts at a whole record) is refused with the counts that can."""
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ValueError(f"K splits must be a positive int; got {splits!r}")
    per = ENGINE_RECORD_STEPS[fmt]
    if splits == 1:
        return k_steps
    step = -(-k_steps // splits)
    step = -(-step // per) * per
    if -(-k_steps // step) != splits:
        can = sorted({-(-k_steps // (per * m)) for m in range(1, -(-k_steps // per) + 1)})
        raise ValueError(f"{splits} K splits of {k_steps} {fmt} K steps (whole records of {per} steps a split) are "
                         f"not possible: {can} are")  # fmt: skip
    return step


def engine_serves(geo: MoEGeometry) -> bool:
    """Whether the engine serves a geometry: MXFP4 or NVFP4 weights."""
    return geo.fmt.name in ENGINE_FORMATS


def engine_tile_n(routes_per_expert: float) -> int:
    """Routes a block for a call: the smallest program tile holding the mean routes of an expert (the largest past
    it), as the peer picks its ``block_m``."""
    fits = [t for t in ENGINE_TILE_N if t >= routes_per_expert]
    return min(fits) if fits else max(ENGINE_TILE_N)


def engine_act_spec(bm: int, activation: str, bias: bool) -> ProgramSpec:
    return ProgramSpec.of(ENGINE_ACT.kernel, ENGINE_ACT.version, BM=bm, BN=ACT_COLUMNS, ACT=ACTIVATIONS[activation],
                          HAS_BIAS=int(bias), PDL=MOE_PDL, num_warps=ENGINE_ACT.num_warps)  # fmt: skip


def engine_gather_tokens_spec() -> ProgramSpec:
    """The gather pass (:data:`ENGINE_FC1_ROWS` ``"pass"``): FC1's input in block order, written token by token through
    the alignment's route slots."""
    return ProgramSpec.of(ENGINE_GATHER_TOKENS.kernel, ENGINE_GATHER_TOKENS.version, RT=GATHER_TOKENS,
                          BH=GATHER_COLUMNS, PDL=MOE_PDL, num_warps=ENGINE_GATHER_TOKENS.num_warps)  # fmt: skip


def engine_combine_spec(ids64: bool, bias: bool, inverse: bool = False) -> ProgramSpec:
    """The combine over FC2's rows at their routes, or (``inverse``: W4A8's block-order FC2) in slot order through
    each route's slot."""
    return ProgramSpec.of(ENGINE_COMBINE.kernel, ENGINE_COMBINE.version, IDS64=int(ids64), HAS_BIAS=int(bias),
                          INV=int(inverse), BH=COMBINE_COLUMNS, PDL=MOE_PDL,
                          num_warps=ENGINE_COMBINE.num_warps)  # fmt: skip


def engine_geometry_specs(geo: MoEGeometry) -> list[ProgramSpec]:
    """The engine layer's programs for a geometry: its alignment at every block size, FC1 with its activation
    fused (gathering its rows, or reading them from the gather pass, also built), the activation pass of the
    unfused arm, the combine; the plain, gathering and scattering GEMMs serve every geometry (:func:`engine_specs`)."""
    if not engine_serves(geo):
        return []
    specs = []
    for bm in ENGINE_TILE_N:
        for ids64 in (False, True):
            for inverse in (False, True):  # the token-order gather pass reads the routes' slots
                specs += align_specs(geo.experts, bm, ids64, align_forms(math.inf), inverse=inverse)
            if bm == min(ENGINE_TILE_N):  # one-token calls, should one pass
                specs.append(align_routes_spec(bm, ids64, geo.top_k, inverse=True))
        specs.append(engine_act_spec(bm, geo.activation, geo.bias))
        for scales in ENGINE_SCALE_SOURCES:  # FC1 gathering its rows or reading them gathered, its activation fused
            for schedule in engine_schedules(bm):
                for io in ("gather", "dense"):
                    if not engine_schedule_serves(schedule, scales, io):
                        continue
                    for ragged in engine_raggeds(bm, schedule):
                        for occ in engine_occupancies(bm, schedule):
                            specs.append(engine_gemm_spec(bm, geo.activation, geo.bias, geo.fmt.name, scales, io,
                                                          schedule, ragged, occ))  # fmt: skip
    for ids64 in (False, True):
        specs.append(engine_combine_spec(ids64, geo.bias))
        specs += engine_split_finish_specs(geo, ids64)
    specs.append(engine_gather_tokens_spec())
    return specs


def engine_fc1_finish_spec(activation: str, bias: bool, fmt: str, ids64: bool) -> ProgramSpec:
    """A split FC1's finish: the partials summed in split order, global scale (NVFP4), bias and the activation, into
    FC2's input at the routes' rows (``kernels/fc1_finish.py``)."""
    return fc1_finish_spec(ids64, activation=activation, bias=bias, gscale=fmt == "nvfp4")


def engine_partial_combine_spec(bias: bool, fmt: str, ids64: bool, tokens: int | float, top_k: int) -> ProgramSpec:
    """A split FC2's combine for calls of ``tokens`` tokens: the partials summed in split order, global scale
    (NVFP4), bias, the routes' weights (``kernels/combine.py``)."""
    return combine_spec(ids64, slots=combine_slots(tokens, top_k), partial=True, bias=bias, gscale=fmt == "nvfp4")


def engine_split_finish_specs(geo: MoEGeometry, ids64: bool) -> list[ProgramSpec]:
    """What finishes a split layer's partials at every token count: FC1's finish and the partial combine."""
    fmt = geo.fmt.name
    combines = [
        combine_spec(ids64, slots=slots, partial=True, bias=geo.bias, gscale=fmt == "nvfp4")
        for slots in sorted(combine_slot_tiles(math.inf, geo.top_k))
    ]
    return [engine_fc1_finish_spec(geo.activation, geo.bias, fmt, ids64), *combines]


def engine_schedules(tile_n: int) -> tuple[str, ...]:
    """The consumer schedules the AOT cache holds for ``tile_n`` routes a block (the default last)."""
    transform = ("transform",) if tile_n in ENGINE_TRANSFORM_TILE_N else ()
    if tile_n in ENGINE_STAGE_TILE_N:
        return ("slice", *transform, "stage")
    return (*transform, "slice")


def engine_schedule_serves(schedule: str, scales: str, io: str) -> bool:
    """Whether ``schedule``'s programs exist for a scale source and row mode: transform warps are producer warps,
    which gathered rows (their row copies) already hold."""
    return schedule != "transform" or io != "gather"


def engine_occupancies(tile_n: int, schedule: str) -> tuple[int, ...]:
    """The CTAs an SM the AOT cache holds ``tile_n``'s programs of ``schedule`` for (the default last)."""
    if tile_n not in ENGINE_PAIRED_TILE_N or schedule != engine_schedule(tile_n):
        return (1,)
    return (2,) if tile_n in ENGINE_PAIRED_BY_DEFAULT else (2, 1)


def engine_occupancy(tile_n: int, schedule: str, want: int | None = None) -> int:
    """CTAs an SM serving ``tile_n`` routes under ``schedule``: ``want`` where the cache holds it, else the
    default (two at :data:`ENGINE_PAIRED_BY_DEFAULT` with their default schedule, else one)."""
    if want not in (None, 1, 2):
        raise ValueError(f"the engine GEMM runs 1 or 2 CTAs an SM; got {want!r}")
    built = engine_occupancies(tile_n, schedule)
    return want if want in built else built[-1]


def engine_raggeds(tile_n: int, schedule: str | None = None) -> tuple[int, ...]:
    """The ragged levels the AOT cache holds ``tile_n``'s programs of ``schedule`` (``None``: the size's default) of
    (0: whole blocks only; 1: the half loop; 2: the half and quarter loops; the default last). Transform programs hold
    :data:`ENGINE_TRANSFORM_RAGGED` only."""
    if schedule == "transform":
        return (ENGINE_TRANSFORM_RAGGED,) if tile_n in ENGINE_RAGGED_TILE_N else (0,)
    return ENGINE_RAGGED_LEVELS if tile_n in ENGINE_RAGGED_TILE_N else (0,)


def engine_ragged(tile_n: int, want: int | bool | None = None, schedule: str | None = None) -> int:
    """The ragged level ``tile_n`` routes a block run at under ``schedule``: ``want`` (``True``: 1, ``False``: 0)
    where the cache holds it, else the size's default."""
    built = engine_raggeds(tile_n, schedule)
    return int(want) if want is not None and int(want) in built else built[-1]


def engine_schedule(tile_n: int, want: str | None = None, scales: str = "native", io: str = "dense") -> str:
    """The schedule serving ``tile_n`` routes a block (of a ``scales`` source and ``io`` row mode): ``want`` where
    the cache holds it for that size and those operands (:func:`engine_schedule_serves`), else the default
    (``stage`` at :data:`ENGINE_STAGE_TILE_N`, ``slice`` above)."""
    if want is not None and want not in ENGINE_SCHEDULES:
        raise ValueError(f"the engine GEMM's schedules are {ENGINE_SCHEDULES}; got {want!r}")
    built = [s for s in engine_schedules(tile_n) if engine_schedule_serves(s, scales, io)]
    return want if want in built else built[-1]


def engine_gemm_spec(
    tile_n: int,
    activation: str | None = None,
    bias: bool = False,
    fmt: str = "mxfp4",
    scales: str = "native",
    io: str = "dense",
    schedule: str | None = None,
    ragged: int | bool | None = None,
    ctas_per_sm: int | None = None,
    partial: str | None = None,
    probe: str | None = None,
) -> ProgramSpec:
    """The grouped GEMM for ``tile_n`` routes a block of ``fmt`` weights; ``activation``: FC1's, fused into its
    epilogue (with W13's ``bias``), else the plain bf16 GEMM; ``scales``: where its scale slots come from (an
    inline program carries the fact ``SRC``); ``io``: rows in block order (``dense``), FC1's input gathered by
    route (``gather``) or FC2's output scattered to routes (``scatter``, no activation); ``schedule``: its
    consumers' (:data:`ENGINE_SCHEDULES`; ``None``: :func:`engine_schedule`'s default; ``stage`` programs carry
    the fact ``SCHED``, ``slice`` ones keep their earlier identity); ``ragged``: a block whose live routes lie in
    its first half runs that half only (``None``: :func:`engine_ragged`'s default; ragged programs carry ``RAG``);
    ``ctas_per_sm``: 1 or 2 (``None``: :func:`engine_occupancy`'s default; two-CTA programs carry ``OCC``);
    ``partial`` (:data:`ENGINE_PARTIAL_FORMS`, at :data:`ENGINE_SPLIT_TILE_N`): K splits storing float32 partials
    (gathering, no activation or bias, whole blocks; fact ``PART``); ``probe``
    (:data:`ENGINE_PROBES`, at :data:`ENGINE_PROBE_TILE_N`): a diagnostic program of the MXFP4 native dense GEMM
    without an activation at the size's defaults (fact ``PROBE``; never served: its outputs are wrong by design)."""
    if tile_n not in ENGINE_TILE_N:
        raise ValueError(f"the engine GEMM is built for {ENGINE_TILE_N} routes a block; got {tile_n}")
    if bias and activation is None:
        raise ValueError("the engine GEMM adds a bias only with a fused activation")
    if fmt not in ENGINE_FORMATS:
        raise ValueError(f"the engine GEMM serves {ENGINE_FORMATS} weights; got {fmt!r}")
    if scales not in ENGINE_SCALE_SOURCES:
        raise ValueError(f"the engine GEMM reads {ENGINE_SCALE_SOURCES} scales; got {scales!r}")
    if io not in ENGINE_IO or (io == "scatter" and activation is not None):
        raise ValueError(f"the engine GEMM's rows are one of {ENGINE_IO} (scatter without activation); got {io!r}")
    schedule = engine_schedule(tile_n) if schedule is None else schedule
    if schedule not in ENGINE_SCHEDULES:
        raise ValueError(f"the engine GEMM's schedules are {ENGINE_SCHEDULES}; got {schedule!r}")
    if schedule == "transform" and (
        tile_n not in ENGINE_TRANSFORM_TILE_N or not engine_schedule_serves(schedule, scales, io) or partial is not None
    ):
        raise ValueError(f"transform warps are built at {ENGINE_TRANSFORM_TILE_N} routes a block, rows not gathered, "
                         f"no K splits; got {tile_n}, rows {io!r}, partial {partial!r}")  # fmt: skip
    ragged = engine_ragged(tile_n, None, schedule) if ragged is None else int(ragged)
    if ragged not in engine_raggeds(tile_n, schedule):
        raise ValueError(f"ragged blocks are built for {ENGINE_RAGGED_TILE_N} routes a block (levels "
                         f"{engine_raggeds(tile_n, schedule)} under {schedule!r}); got level {ragged} at "
                         f"{tile_n}")  # fmt: skip
    act = 0 if activation is None else 1 + ACTIVATIONS[activation]
    source = {} if scales == "native" else {"SRC": scales}
    sched = {} if schedule == "slice" else {"SCHED": schedule}
    rag = {"RAG": ragged} if ragged else {}
    ctas_per_sm = engine_occupancy(tile_n, schedule) if ctas_per_sm is None else ctas_per_sm
    if ctas_per_sm not in engine_occupancies(tile_n, schedule):
        raise ValueError(f"the engine GEMM for {tile_n} routes a block under {schedule!r} is built for "
                         f"{engine_occupancies(tile_n, schedule)} CTAs an SM; got {ctas_per_sm}")  # fmt: skip
    occ = {"OCC": 2} if ctas_per_sm == 2 else {}
    part = {}
    if partial is not None:
        if partial not in ENGINE_PARTIAL_FORMS or tile_n not in ENGINE_SPLIT_TILE_N:
            raise ValueError(f"K-split partials are built as {ENGINE_PARTIAL_FORMS} at {ENGINE_SPLIT_TILE_N} routes a "
                             f"block; got {partial!r} at {tile_n}")  # fmt: skip
        if io != "gather" or activation is not None or ragged:
            raise ValueError(f"K-split partials come from gathering programs of whole blocks without an activation; "
                             f"got rows {io!r}, activation {activation!r}, ragged {ragged}")  # fmt: skip
        part = {"PART": partial}
    diag = {}
    if probe is not None:
        if probe not in ENGINE_PROBES or tile_n not in ENGINE_PROBE_TILE_N:
            raise ValueError(f"probes {ENGINE_PROBES} are built at {ENGINE_PROBE_TILE_N} routes a block; got "
                             f"{probe!r} at {tile_n}")  # fmt: skip
        defaults = schedule == engine_schedule(tile_n) and ctas_per_sm == engine_occupancy(tile_n, schedule)
        if (fmt, scales, io, activation, rag, part) != ("mxfp4", "native", "dense", None, {}, {}) or not defaults:
            raise ValueError("probes are of the MXFP4 native dense GEMM without an activation, at the size's "
                             "default schedule and occupancy, whole blocks")  # fmt: skip
        diag = {"PROBE": probe}
    return ProgramSpec.of(ENGINE_GEMM, ENGINE_GEMM_VERSION, TN=tile_n, ACT=act, BIAS=int(bias), FMT=fmt, IO=io,
                          **source, **sched, **rag, **occ, **part, **diag)  # fmt: skip


def engine_probe_specs() -> list[ProgramSpec]:
    """The bound probes the AOT cache holds (``benchmarks/bench_engine.py`` times them beside the GEMM they probe)."""
    return [engine_gemm_spec(tn, ragged=0, probe=p) for p in ENGINE_PROBES for tn in ENGINE_PROBE_TILE_N]


def engine_specs(formats=ENGINE_FORMATS) -> list[ProgramSpec]:
    """Every engine GEMM without an activation the AOT cache holds for weights of ``formats``, of both scale sources,
    in each row mode (the dense GEMM, FC1 gathering (the unfused arm) and FC2 scattering), each schedule built for
    the block size (transform warps at 64 to 256 routes, rows not gathered), whole-block and (128
    and 256 routes) ragged, one and (16-64 routes) two CTAs an SM, and the K-split partial programs (they take every
    shape and split count at run time)."""
    plain = [
        engine_gemm_spec(tn, fmt=fmt, scales=scales, io=io, schedule=schedule, ragged=ragged, ctas_per_sm=occ)
        for fmt in formats
        for scales in ENGINE_SCALE_SOURCES
        for io in ENGINE_IO
        for tn in ENGINE_TILE_N
        for schedule in engine_schedules(tn)
        if engine_schedule_serves(schedule, scales, io)
        for ragged in engine_raggeds(tn, schedule)
        for occ in engine_occupancies(tn, schedule)
    ]
    split = [  # the size's default schedule and occupancy
        engine_gemm_spec(tn, fmt=fmt, scales=scales, io="gather", partial=form)
        for fmt in formats
        for scales in ENGINE_SCALE_SOURCES
        for tn in ENGINE_SPLIT_TILE_N
        for form in ENGINE_PARTIAL_FORMS
    ]
    return plain + split
