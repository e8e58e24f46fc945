"""The fused-MoE program family: its kernels, tile configurations and the specs a geometry needs.

Shapes (K, N, experts, record sizes) are runtime arguments, so one program serves every geometry of a
format, activation and tile configuration; the catalog only decides which of those combinations exist.
Nothing here imports triton.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from csf_codec import ScaleFormat
from csf_codec.inline import DELTA_BITS
from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.relabel import k_step
from csf_kernels.runtime.programs import ProgramSpec, TritonFamily

__all__ = [
    "DECODE",
    "DECODE_MMA_SYNC",
    "DECODE_NARROW",
    "DECODE_TRITON",
    "DECODE_WIDE",
    "DECODE_WIDEST",
    "MOE_ALIGN_COUNT",
    "MOE_ALIGN_PLAN",
    "MOE_ALIGN_ROUTES",
    "MOE_ALIGN_SCATTER",
    "MOE_COMBINE",
    "MOE_FC1_FINISH",
    "MOE_GEMM",
    "MOE_GEMM_DECODE",
    "PREFILL",
    "GemmConfig",
    "ScaleRead",
    "align_count_programs",
    "align_count_spec",
    "align_forms",
    "align_plan_spec",
    "align_routes_spec",
    "align_scatter_spec",
    "align_scatters_in_plan",
    "align_specs",
    "combine_columns",
    "combine_slot_tiles",
    "combine_slots",
    "combine_spec",
    "copies_weights_early",
    "experts_bins",
    "fc1_finish_spec",
    "gemm_spec",
    "moe_geometry_specs",
    "relabel_spec",
    "relabel_step",
    "routes_as_blocks",
]

MOE_ALIGN_PLAN = TritonFamily(
    kernel="moe.align_plan",
    version=4,  # 3: beyond one chunk, sums the count programs' rows; 4: route_slots (INV)
    module="csf_kernels.moe.kernels.align",
    function="moe_align_plan",
    signature="SIGNATURE_PLAN",
    num_warps=8,
)
MOE_ALIGN_COUNT = TritonFamily(
    kernel="moe.align_count",
    version=1,
    module="csf_kernels.moe.kernels.align",
    function="moe_align_count",
    signature="SIGNATURE_COUNT",
    num_warps=8,
)
MOE_ALIGN_ROUTES = TritonFamily(
    kernel="moe.align_routes",
    version=2,  # 2: route_slots (INV)
    module="csf_kernels.moe.kernels.align",
    function="moe_align_routes",
    signature="SIGNATURE_ROUTES",
    num_warps=1,
)
MOE_ALIGN_SCATTER = TritonFamily(
    kernel="moe.align_scatter",
    version=2,  # 2: route_slots (INV)
    module="csf_kernels.moe.kernels.align",
    function="moe_align_scatter",
    signature="SIGNATURE_SCATTER",
    num_warps=4,
)
MOE_GEMM = TritonFamily(
    kernel="moe.gemm", version=2, module="csf_kernels.moe.kernels.gemm", function="moe_gemm", num_warps=4
)
# the split-K decode tiles with explicit register layouts (Gluon): the DECODE config's engine on GPUs
MOE_GEMM_DECODE = TritonFamily(
    kernel="moe.gemm_decode",
    version=2,
    module="csf_kernels.moe.kernels.gemm_decode",
    function="moe_gemm_decode",
    num_warps=4,
    gluon=True,
)
MOE_COMBINE = TritonFamily(
    kernel="moe.combine", version=1, module="csf_kernels.moe.kernels.combine", function="moe_combine", num_warps=4
)
MOE_FC1_FINISH = TritonFamily(
    kernel="moe.fc1_finish",
    version=1,
    module="csf_kernels.moe.kernels.fc1_finish",
    function="moe_fc1_finish",
    num_warps=4,
)
MOE_RELABEL = TritonFamily(
    kernel="moe.relabel", version=1, module="csf_kernels.moe.kernels.relabel", function="moe_relabel", num_warps=4
)
RELABEL_COLUMNS = 1024

# every program of the layer is a programmatic dependent launch (kernels/pdl.py): each waits for the kernel
# before it, so a call's launches overlap their predecessors' tails instead of queueing behind them
MOE_PDL = 1


class ScaleRead(enum.Enum):
    """How a GEMM program reads its scales (the kernel's SRC constant). Where they are *stored* is another matter:
    a layer storing CSF reads ``PLANE`` from a plane it expanded into scratch, or ``RECORDS`` itself."""

    PLANE = 0  # a native-layout scale plane: the model's own, or one expanded from CSF into scratch
    RECORDS = 1  # the CSF inline tile records, decoded in the GEMM's stages


ALIGN_CHUNK = 1024
ALIGN_COUNT_CHUNKS = 4  # chunks a count program (kernels/align.py's PLAN_CHUNKS)
SCATTER_CHUNK = 256
COMBINE_COLUMNS = 1024
# calls of up to this many tokens combine a token's slots as one [TK, 256] tile (32 registers a thread at 16
# slots): faster where tokens are few, slower past them (docs/perf-notes.md, "The combine takes a token's slots")
COMBINE_TILE_TOKENS = 32
COMBINE_TILE_COLUMNS = 256
FINISH_COLUMNS = 512


@dataclass(frozen=True, kw_only=True)
class GemmConfig:
    """One tile configuration of the grouped GEMM: routes per block (bm) and weight rows per program."""

    name: str
    bm: int
    bn: int
    num_warps: int
    num_stages: int
    split_k: bool  # K split over programs, float32 partials finished by separate kernels
    prefetch: bool = False  # load the next K step's weights before converting this one's (Triton engine)
    # "triton": moe_gemm (any tile shape; runs in Triton's CPU interpreter); "gluon": moe_gemm_decode
    # (split-K tiles of 64 rows on 4 warps, weights dequantized in registers; GPUs only)
    engine: str = "triton"
    # gluon only: operands of this many K steps in flight through shared memory (1: each step's loaded into
    # registers as it comes), whether a step's scale bytes are loaded one step early (native scales only),
    # and ptxas's register caps for native-scale and inline-record programs (None: its own choice)
    word_stages: int = 1
    ahead: bool = False
    max_registers: int | None = None
    inline_max_registers: int | None = None
    # gluon only: "mma_sync" (both operands in registers, 8 or 16 routes) or "wgmma" (the weights in
    # registers, the block's activations in shared memory: 16, 32 or 64 routes; 64 rows, or 128 on 8 warps
    # for native scales)
    mma: str = "mma_sync"
    # wgmma only: the activations are stored in the weights' relabelled K order, so the programs copy them
    # straight into the operand (the layer relabels FC1's input and the FC1 finish writes FC2's so)
    relabelled: bool = False
    # gluon mma.sync 8-route blocks only: calls of up to ROUTED_TOKENS tokens read their routes as blocks
    # straight from the route ids, no alignment (:func:`routes_as_blocks`). A field, not an identity with
    # DECODE_NARROW, so a plan's configs keep their path whatever the module settings are when it launches
    routed: bool = False

    def __post_init__(self):
        if self.engine not in ("triton", "gluon"):
            raise ValueError(f"unknown GEMM engine {self.engine!r}: expected 'triton' or 'gluon'")
        if self.mma not in ("mma_sync", "wgmma") or (self.mma == "wgmma" and self.engine != "gluon"):
            raise ValueError(f"unknown MMA {self.mma!r}: the gluon engine runs 'mma_sync' or 'wgmma'")
        routes = (8, 16) if self.mma == "mma_sync" else (16, 32, 64)
        rows = {(64, 4)} if self.mma == "mma_sync" else {(64, 4), (128, 8)}  # 16 rows a warp
        if self.engine == "gluon" and (
            self.bm not in routes
            or (self.bn, self.num_warps) not in rows
            or (self.split_k, self.prefetch) != (True, False)
        ):
            raise ValueError(
                f"the gluon decode GEMM on {self.mma} runs split-K tiles of {', '.join(map(str, routes))} routes"
                f" x {' or '.join(f'{n} rows on {w} warps' for n, w in sorted(rows))}, without prefetch"
            )
        if self.relabelled and (self.mma != "wgmma" or self.word_stages < 2):
            raise ValueError("relabelled activations feed staged wgmma programs (word_stages >= 2)")
        if self.routed and (self.engine, self.mma, self.bm) != ("gluon", "mma_sync", 8):
            raise ValueError("routes are read as blocks by the gluon mma.sync programs of 8-route blocks only")
        caps = (self.max_registers, self.inline_max_registers)
        if self.word_stages < 1 or (
            self.engine != "gluon" and (self.word_stages != 1 or self.ahead or caps != (None, None))
        ):
            raise ValueError("word_stages (>= 1), ahead and register caps configure the gluon decode GEMM only")

    def register_cap(self, source: ScaleRead) -> int | None:
        """ptxas's register cap for this config's programs reading their scales as ``source`` says."""
        return self.max_registers if source is ScaleRead.PLANE else self.inline_max_registers

    def tiled_rows(self, n_out: int, fc1: bool) -> int:
        """Rows the programs tile for an operand of ``n_out`` outputs (FC1: N gate/up row pairs). The Gluon
        program writes split-K partials only, so it tiles FC1's gate and up rows alike (2N); the Triton one
        pairs each gate row with its up row in one program for the fused activation (N)."""
        return 2 * n_out if fc1 and self.engine == "gluon" else n_out

    def row_tiles(self, n_out: int, fc1: bool) -> int:
        """Programs along the rows of an operand of ``n_out`` outputs."""
        return -(-self.tiled_rows(n_out, fc1) // self.bn)


# decode: few routes per expert, memory bound (the MMA's N is the routes); prefill: compute bound. Each config
# is the measured fastest for its routes per expert (docs/perf-notes.md, "Fused MoE"; the sweeps behind each choice
# are in docs/archive/perf-log.md). The decode tiles are Gluon programs staging three K steps of weights and
# activations through shared memory by cp.async, with the scale bytes a step ahead; DECODE_TRITON remains for
# Triton's CPU interpreter and side-by-side sweeps. 8-route mma.sync blocks serve up to 4 routes per expert, where
# wgmma blocks lose to them; reading inline records a step ahead takes more registers, capped at 72 without spills
# so that 7 programs still fit an SM.
DECODE_NARROW = GemmConfig(
    name="decode", bm=8, bn=64, num_warps=4, num_stages=1, split_k=True, engine="gluon", word_stages=3, ahead=True,
    routed=True, inline_max_registers=72,
)  # fmt: skip
# The wgmma blocks (above 4 routes per expert) read activations stored in the weights' relabelled K order
# (``relabelled``: csf_kernels.moe.relabel), copied by cp.async straight into their operand stages: 16-route blocks
# at 5-8 routes per expert, 32-route blocks at 9-64, 64-route blocks above (measured fastest at each, up to 1024
# routes per expert, against mma.sync blocks and the prefill tiles; docs/perf-notes.md, "The tile follows the routes
# per expert").
DECODE = GemmConfig(
    name="decode", bm=16, bn=64, num_warps=4, num_stages=1, split_k=True, engine="gluon", word_stages=3,
    ahead=True, mma="wgmma", relabelled=True,
)  # fmt: skip
DECODE_WIDE = replace(DECODE, bm=32)
DECODE_WIDEST = replace(DECODE, bm=64)
# the mma.sync form of 16-route blocks (72 registers: 7 programs per SM); sweeps only
DECODE_MMA_SYNC = replace(DECODE, mma="mma_sync", relabelled=False, max_registers=72)
DECODE_TRITON = GemmConfig(name="decode", bm=16, bn=64, num_warps=4, num_stages=1, split_k=True)
PREFILL = GemmConfig(name="prefill", bm=64, bn=64, num_warps=4, num_stages=3, split_k=False)
CONFIGS = (DECODE_NARROW, DECODE, DECODE_WIDE, DECODE_WIDEST, PREFILL)


def experts_bins(num_experts: int) -> int:
    """Histogram bins of the align kernel: a power of two above E (the last bin takes invalid ids)."""
    p = 16
    while p <= num_experts:
        p *= 2
    return p


def align_plan_spec(num_experts: int, bm: int, ids64: bool, *, scatter: bool = False, inverse: bool = False
                    ) -> ProgramSpec:  # fmt: skip
    """The align plan program; ``scatter``: it also scatters the routes (calls of at most
    ``ALIGN_CHUNK`` routes: :func:`align_scatters_in_plan`), so no scatter program runs; ``inverse``: the
    scattering program also writes each route's slot (the engine's gather pass reads them)."""
    return ProgramSpec.of(
        MOE_ALIGN_PLAN.kernel,
        MOE_ALIGN_PLAN.version,
        IDS64=int(ids64),
        EP=experts_bins(num_experts),
        BM=bm,
        CH=ALIGN_CHUNK,
        SCATTER=int(scatter),
        INV=int(scatter and inverse),
        PDL=MOE_PDL,
        num_warps=MOE_ALIGN_PLAN.num_warps,
    )


def align_routes_spec(bm: int, ids64: bool, top_k: int, *, inverse: bool = False) -> ProgramSpec:
    """The alignment of one-token calls (``top_k`` routes, each a block of its own: kernels/align.py);
    ``inverse``: each route's slot written too."""
    return ProgramSpec.of(
        MOE_ALIGN_ROUTES.kernel,
        MOE_ALIGN_ROUTES.version,
        IDS64=int(ids64),
        P=max(32, 1 << (top_k - 1).bit_length()),  # a warp's lanes, each a route
        BM=bm,
        INV=int(inverse),
        PDL=MOE_PDL,
        num_warps=MOE_ALIGN_ROUTES.num_warps,
    )


def align_scatters_in_plan(pairs: int) -> bool:
    """Whether a call of ``pairs`` routes is aligned by the plan program alone (one chunk of routes)."""
    return pairs <= ALIGN_CHUNK


def align_forms(max_pairs: int | float) -> set[bool]:
    """How calls of 1 to ``max_pairs`` routes align: True, the plan program scatters too (one chunk of
    routes); False, a scatter program follows it (:func:`align_scatter_spec`)."""
    return {align_scatters_in_plan(1), align_scatters_in_plan(max_pairs)}


def align_count_spec(num_experts: int, ids64: bool) -> ProgramSpec:
    """The count programs of calls over ``ALIGN_CHUNK`` routes (before the plan program; kernels/align.py)."""
    return ProgramSpec.of(
        MOE_ALIGN_COUNT.kernel,
        MOE_ALIGN_COUNT.version,
        IDS64=int(ids64),
        EP=experts_bins(num_experts),
        CH=ALIGN_CHUNK,
        PDL=MOE_PDL,
        num_warps=MOE_ALIGN_COUNT.num_warps,
    )


def align_count_programs(pairs: int) -> int:
    """Count programs of a call of ``pairs`` routes: one a ``ALIGN_COUNT_CHUNKS`` chunks of routes."""
    return -(-pairs // (ALIGN_COUNT_CHUNKS * ALIGN_CHUNK))


def align_specs(num_experts: int, bm: int, ids64: bool, forms, *, inverse: bool = False) -> list[ProgramSpec]:
    """The align programs of calls in ``forms`` (:func:`align_forms`) at ``bm`` routes a block, in launch order
    (not the one-token form, :func:`align_routes_spec`): True, the plan program alone; False, the count programs,
    the plan, the scatter. ``inverse``: the scattering program writes each route's slot too."""
    specs = []
    for scatter in sorted(forms, reverse=True):
        if scatter:
            specs.append(align_plan_spec(num_experts, bm, ids64, scatter=True, inverse=inverse))
        else:
            specs += [align_count_spec(num_experts, ids64), align_plan_spec(num_experts, bm, ids64),
                      align_scatter_spec(ids64, inverse=inverse)]  # fmt: skip
    return specs


def align_scatter_spec(ids64: bool, *, inverse: bool = False) -> ProgramSpec:
    """The scatter program of calls over ``ALIGN_CHUNK`` routes; ``inverse``: each route's slot written too."""
    return ProgramSpec.of(
        MOE_ALIGN_SCATTER.kernel,
        MOE_ALIGN_SCATTER.version,
        IDS64=int(ids64),
        CH=SCATTER_CHUNK,
        INV=int(inverse),
        PDL=MOE_PDL,
        num_warps=MOE_ALIGN_SCATTER.num_warps,
    )


def combine_slots(tokens: int, top_k: int) -> int:
    """The combine program's slot tile for a call of ``tokens`` tokens: ``top_k`` padded to a power of two
    up to ``COMBINE_TILE_TOKENS`` tokens, else 0 (slots walked in order; see kernels/moe_combine.py)."""
    return 1 << max(0, top_k - 1).bit_length() if tokens <= COMBINE_TILE_TOKENS else 0


def combine_slot_tiles(max_tokens: int | float, top_k: int) -> set[int]:
    """The slot tiles calls of 1 to ``max_tokens`` tokens combine with (plans and the catalog build these)."""
    return {combine_slots(1, top_k), combine_slots(max_tokens, top_k)}


def combine_columns(slots: int) -> int:
    """Output columns per combine program of slot tile ``slots``."""
    return COMBINE_TILE_COLUMNS if slots else COMBINE_COLUMNS


def combine_spec(
    ids64: bool, *, slots: int, partial: bool = False, bias: bool = False, gscale: bool = False
) -> ProgramSpec:
    """The combine program; ``slots``: its slot tile (:func:`combine_slots`)."""
    return ProgramSpec.of(
        MOE_COMBINE.kernel,
        MOE_COMBINE.version,
        IDS64=int(ids64),
        PARTIAL=int(partial),
        HAS_BIAS=int(partial and bias),
        HAS_GSCALE=int(partial and gscale),
        BH=combine_columns(slots),
        TK=slots,
        PDL=MOE_PDL,
        num_warps=MOE_COMBINE.num_warps,
    )


def relabel_spec(fmt: ScaleFormat) -> ProgramSpec:
    """The program copying FC1's input into the relabelled K order of ``fmt``'s decode GEMM steps."""
    return ProgramSpec.of(
        MOE_RELABEL.kernel,
        MOE_RELABEL.version,
        STEP=k_step(fmt),
        BLOCK=RELABEL_COLUMNS,
        PDL=MOE_PDL,
        num_warps=MOE_RELABEL.num_warps,
    )


def relabel_step(fmt: ScaleFormat, config: GemmConfig) -> int:
    """The K step whose relabelled order ``config``'s programs read activations in (0: the natural order)."""
    return k_step(fmt) if config.relabelled else 0


def fc1_finish_spec(ids64: bool, *, activation: str, bias: bool, gscale: bool, relabel: int = 0) -> ProgramSpec:
    return ProgramSpec.of(
        MOE_FC1_FINISH.kernel,
        MOE_FC1_FINISH.version,
        IDS64=int(ids64),
        ACT=int(activation == "swiglu_oai"),
        HAS_BIAS=int(bias),
        HAS_GSCALE=int(gscale),
        BH=FINISH_COLUMNS,
        PDL=MOE_PDL,
        RELABEL=relabel,
        num_warps=MOE_FC1_FINISH.num_warps,
    )


def gemm_spec(
    fmt: ScaleFormat,
    source: ScaleRead,
    *,
    fc1: bool,
    activation: str,
    bias: bool,
    config: GemmConfig,
    routed: bool = False,
    ids64: bool = False,
    finishes_fc1: bool = False,
    early: bool = False,
) -> ProgramSpec:
    """The grouped GEMM for one format, scale read (:class:`ScaleRead`), stage and tile config; ``routed``:
    a few-token call's routes as blocks read straight from its route ids (int64 with ``ids64``), no alignment
    (:func:`routes_as_blocks`); ``finishes_fc1``: a routed FC2 that finishes FC1 from its partials itself
    (``activation``, ``bias``: FC1's), :func:`fc2_finishes_fc1`; ``early``: a routed FC1 reading a plane
    expanded by the chained expansions just before it, which copies its first weights before it waits
    (``moe_gemm_decode``'s ``EARLY``)."""
    if routed and not routes_as_blocks(config):
        raise ValueError(f"config {config.name} (bm {config.bm}, {config.engine}) does not read routes as blocks")
    if finishes_fc1 and (fc1 or not routed):
        raise ValueError("only a routed FC2 finishes FC1 itself")
    if early and not (fc1 and routed and source is ScaleRead.PLANE and copies_weights_early(config)):
        raise ValueError("only a routed, staged FC1 reading a native plane copies its weights early")
    if not isinstance(source, ScaleRead):
        raise TypeError(f"source must be a ScaleRead, got {source!r}")
    if activation not in ("silu", "swiglu_oai"):
        raise ValueError(f"unknown MoE activation {activation!r}: expected 'silu' or 'swiglu_oai'")
    if config.engine == "gluon":  # split-K partials of every row (FC1: gate and up alike): one program for both
        return ProgramSpec.of(
            MOE_GEMM_DECODE.kernel,
            MOE_GEMM_DECODE.version,
            FMT=0 if fmt.name == "mxfp4" else 1,
            SRC=source.value,
            DB=DELTA_BITS[fmt.name] if source is ScaleRead.RECORDS else 0,
            BM=config.bm,
            BN=config.bn,
            STAGES=config.word_stages,
            AHEAD=int(config.ahead and source is ScaleRead.PLANE),
            PDL=MOE_PDL,
            WG=int(config.mma == "wgmma"),
            XR=int(config.relabelled),
            ROUTED=int(routed),
            IDS64=int(routed and ids64),
            FIN=(1 + int(activation == "swiglu_oai")) if finishes_fc1 else 0,
            FIN_BIAS=int(finishes_fc1 and bias),
            FIN_GSCALE=int(finishes_fc1 and fmt.name == "nvfp4"),
            EARLY=int(early),
            num_warps=config.num_warps,
            **({"maxnreg": cap} if (cap := config.register_cap(source)) else {}),
        )
    return ProgramSpec.of(
        MOE_GEMM.kernel,
        MOE_GEMM.version,
        FMT=0 if fmt.name == "mxfp4" else 1,
        SRC=source.value,
        FC1=int(fc1),
        ACT=int(activation == "swiglu_oai") if fc1 and not config.split_k else 0,
        HAS_BIAS=int(bias and not config.split_k),
        HAS_GSCALE=int(fmt.name == "nvfp4" and not config.split_k),
        DB=DELTA_BITS[fmt.name] if source is ScaleRead.RECORDS else 0,
        ASM=1,
        PREFETCH=int(config.prefetch),
        SPLIT=int(config.split_k),
        BM=config.bm,
        BN=config.bn,
        PDL=MOE_PDL,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


# K steps of a routed FC2 program's split that FC1's finish fused into it holds (kernels/moe_fc1_finish_gluon.py)
FIN_STEPS = 8


def copies_weights_early(config: GemmConfig) -> bool:
    """Whether a routed FC1 on ``config`` can copy its first weight steps before it waits for its predecessor
    (``moe_gemm_decode``'s ``EARLY``, behind chained expansions): routed, staged tiles reading their activations
    in the natural order."""
    return routes_as_blocks(config) and config.word_stages > 1 and not config.relabelled


def routes_as_blocks(config: GemmConfig) -> bool:
    """Whether calls of up to :data:`ROUTED_TOKENS` tokens on ``config`` skip the alignment, each route a block
    read from the route ids (the catalog's one-token tiles: :data:`DECODE_NARROW`)."""
    return config.routed


def moe_geometry_specs(geo: MoEGeometry) -> list[ProgramSpec]:
    """Every MoE program a geometry may run: both stages, both scale sources, both tile configs, and
    the align / combine programs for int32 and int64 route ids."""
    specs = []
    for config in CONFIGS:
        # prefill tiles always read a native plane (an inline plan expands first: see csf_moe.plan)
        for source in ScaleRead if config.split_k else (ScaleRead.PLANE,):
            for fc1 in (True, False):
                specs.append(
                    gemm_spec(geo.fmt, source, fc1=fc1, activation=geo.activation, bias=geo.bias, config=config)
                )
            if routes_as_blocks(config):
                for ids64 in (False, True):
                    specs.append(gemm_spec(geo.fmt, source, fc1=True, activation=geo.activation, bias=geo.bias,
                                           config=config, routed=True, ids64=ids64))  # fmt: skip
                    specs.append(gemm_spec(geo.fmt, source, fc1=False, activation=geo.activation, bias=geo.bias,
                                           config=config, routed=True, ids64=ids64, finishes_fc1=True))  # fmt: skip
                    if source is ScaleRead.PLANE and copies_weights_early(config):  # behind chained expansions
                        specs.append(gemm_spec(geo.fmt, source, fc1=True, activation=geo.activation, bias=geo.bias,
                                               config=config, routed=True, ids64=ids64, early=True))  # fmt: skip
        for ids64 in (False, True):
            specs += align_specs(geo.experts, config.bm, ids64, align_forms(math.inf))
            specs.append(align_routes_spec(config.bm, ids64, geo.top_k))
    gscale = geo.fmt.name == "nvfp4"
    for ids64 in (False, True):
        specs += [
            *(combine_spec(ids64, slots=slots) for slots in combine_slot_tiles(math.inf, geo.top_k)),
            *(
                combine_spec(ids64, slots=slots, partial=True, bias=geo.bias, gscale=gscale)
                for slots in combine_slot_tiles(math.inf, geo.top_k)
            ),
            *(
                fc1_finish_spec(ids64, activation=geo.activation, bias=geo.bias, gscale=gscale, relabel=relabel)
                for relabel in {relabel_step(geo.fmt, c) for c in CONFIGS if c.split_k}
            ),
        ]
    if any(c.relabelled for c in CONFIGS):
        specs.append(relabel_spec(geo.fmt))
    return specs
