"""Planning a layer on the engine's grouped GEMMs (:mod:`csf_moe.engine_layer`): ``plan(..., gemm="engine")``.

The engine layer picks its route-block size per call from the routes an expert gets (``engine_tile_n``, or
``w4a8_tile_n`` for W4A8) and launches align (1 or 2 programs), FC1's input pass where it reads block-order rows,
FC1 with its activation fused, FC2 (W4A8: FC2's input quantized first), and the combine; or, for few-token calls whose
units would leave SMs idle (:mod:`csf_moe.engine_split`), FC1's partials, their finish, FC2's partials and the
partial combine. :class:`EnginePlan` holds
what a served layer needs to know before its first call: the token buckets (the catalog's plus the engine's
CUDA-graph sizes), the block sizes each bucket's calls run, the scale source, the activations, the shared scratch
the calls carve their buffers from, and :meth:`EnginePlan.specs`, exactly the programs those calls launch, so a
frozen runtime resolves every one when the layer is bound (a missing one is an error naming it) and never later.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from csf_kernels.catalog import MoEGeometry, load_catalog
from csf_kernels.moe.engine_specs import (
    ENGINE_SPLIT_TILE_N,
    ENGINE_TILE_N,
    engine_combine_spec,
    engine_fc1_finish_spec,
    engine_gather_tokens_spec,
    engine_gemm_spec,
    engine_partial_combine_spec,
    engine_serves,
)
from csf_kernels.moe.launch import max_blocks_for
from csf_kernels.moe.specs import (
    ALIGN_CHUNK,
    COMBINE_TILE_TOKENS,
    align_routes_spec,
    align_scatters_in_plan,
    align_specs,
)
from csf_kernels.moe.w4a8_specs import (
    W4A8_FORMATS,
    W4A8_TILE_N,
    gather_fp8_spec,
    quantize_rows_fp8_spec,
    w4a8_gemm_spec,
    w4a8_serves,
)
from csf_kernels.runtime.programs import ProgramSpec

from .buckets import bucket_for
from .engine_layer import call_buffer_bytes, call_buffers, call_tile_n, fc1_rows_for
from .engine_split import call_splits

__all__ = [
    "ACTIVATIONS",
    "ENGINE_PLAN_SCALE_SOURCES",
    "GEMMS",
    "EngineBucket",
    "EnginePlan",
    "engine_plan",
]

GEMMS = ("triton", "engine")  # plan(..., gemm=): csf's Triton/Gluon layer (csf_moe.layer) or the engine's
# plan(..., activations=): what the GEMMs multiply the weights with: bf16 (W4A16), or E4M3 activations with one
# float32 scale a route (W4A8: vLLM's dynamic per-token FP8, csf_kernels.moe.fp8_activations; the engine only)
ACTIVATIONS = ("bf16", "fp8_per_token")
# the engine's scale sources: inline engine records decoded by the FP4 GEMM's producer warp, or scale panels (the
# only source of the W4A8 GEMM)
ENGINE_PLAN_SCALE_SOURCES = ("inline", "native")
_CONVENTION = {"fp8_per_token": "per_token"}  # the engine layer's name of each FP8 convention


@dataclass(frozen=True, kw_only=True)
class EngineBucket:
    smallest: int  # the token counts this bucket serves: smallest .. tokens
    tokens: int
    tile_ns: tuple[int, ...]  # the route-block sizes its calls run, smallest first


@dataclass(frozen=True, kw_only=True)
class EnginePlan:
    """A layer on the engine's grouped GEMMs (fused FC1 activation, the engine layer's defaults for each block
    size's schedule, FC1 rows, ragged blocks and CTAs an SM)."""

    geometry: MoEGeometry
    top_k: int
    max_tokens: int
    buckets: tuple[EngineBucket, ...]
    scale_source: str  # "inline" or "native" (ENGINE_PLAN_SCALE_SOURCES)
    activations: str  # "bf16" or "fp8_per_token" (ACTIVATIONS)
    scratch_bytes: int  # the shared scratch every call carves its buffers from (csf_moe.engine_layer.call_buffers)
    gemm: str = "engine"

    @property
    def fmt(self) -> str:
        return self.geometry.fmt.name

    @property
    def w4a8(self) -> bool:
        return self.activations != "bf16"

    @property
    def convention(self) -> str:
        """The engine layer's name of the activation convention (``EngineMoE(activations=...)``)."""
        return _CONVENTION.get(self.activations, "per_token")

    @property
    def max_pairs(self) -> int:
        return self.max_tokens * self.top_k

    def _tiles(self) -> tuple[int, ...]:
        return W4A8_TILE_N if self.w4a8 else ENGINE_TILE_N

    def tile_n(self, tokens: int) -> int:
        """Routes a block for a call of ``tokens`` tokens, as the engine layer chooses it."""
        return call_tile_n(tokens * self.top_k, self.geometry.experts, self.w4a8)

    def bucket_for(self, tokens: int) -> EngineBucket:
        return bucket_for(self.buckets, tokens, self.max_tokens, self.geometry.name)

    def splits(self, tokens: int) -> tuple[int, int]:
        """FC1's and FC2's K splits for a call of ``tokens`` tokens, as the engine layer's heuristic chooses them
        (``(1, 1)``: unsplit)."""
        g = self.geometry
        return call_splits(tokens, self.top_k, g.experts, g.hidden, g.intermediate, self.fmt, self.tile_n(tokens),
                           split_layer=not self.w4a8)  # fmt: skip

    def call_specs(self, tokens: int, ids64: bool) -> tuple[ProgramSpec, ...]:
        """The programs a call of ``tokens`` tokens launches, in order, with int64 (``ids64``) or int32 route ids
        (``EngineMoE.launches``; ``tests/moe/test_engine_plan.py`` holds the two together)."""
        g, bm = self.geometry, self.tile_n(tokens)
        pairs = tokens * self.top_k
        passes = not self.w4a8 and fc1_rows_for(bm, self.scale_source) == "pass"  # the token-order pass
        # the token-order pass and W4A8's gather read the routes' slots the alignment writes
        inverse = (passes or self.w4a8) and self.splits(tokens) == (1, 1)
        if tokens == 1 and max_blocks_for(pairs, g.experts, bm) >= pairs:  # each route a block of its own
            align = [align_routes_spec(bm, ids64, pairs, inverse=inverse)]
        else:
            align = align_specs(g.experts, bm, ids64, {align_scatters_in_plan(pairs)}, inverse=inverse)
        if self.splits(tokens) != (1, 1):
            source = self.scale_source
            body = [engine_gemm_spec(bm, None, False, self.fmt, source, "gather", partial="fc1"),
                    engine_fc1_finish_spec(g.activation, g.bias, self.fmt, ids64),
                    engine_gemm_spec(bm, None, False, self.fmt, source, "gather", partial="rows")]  # fmt: skip
            return (*align, *body, engine_partial_combine_spec(g.bias, self.fmt, ids64, tokens, self.top_k))
        if self.w4a8:
            fc2_in = quantize_rows_fp8_spec(self.convention)
            body = [gather_fp8_spec(self.convention), w4a8_gemm_spec(bm, g.activation, g.bias), fc2_in,
                    w4a8_gemm_spec(bm)]  # fmt: skip
        else:
            source = self.scale_source
            fc1 = engine_gemm_spec(bm, g.activation, g.bias, self.fmt, source, "dense" if passes else "gather")
            body = [engine_gather_tokens_spec()] if passes else []
            body += [fc1, engine_gemm_spec(bm, None, False, self.fmt, source, "scatter")]
        return (*align, *body, engine_combine_spec(ids64, g.bias, inverse=self.w4a8))

    def _breakpoints(self) -> set[int]:
        """Token counts ``t`` after which a call's programs may change (``t + 1`` runs others): a block size's
        last count, the last one-chunk alignment, the one-token alignment, the partial combine's last slot-tile
        count, and every count up to the last split call's."""
        e, k = self.geometry.experts, self.top_k
        points = {int(Fraction(t * e, k)) for t in self._tiles()}  # routes an expert t * E / k: the last at t
        return points | {ALIGN_CHUNK // k, 1, COMBINE_TILE_TOKENS} | set(range(1, self._last_split() + 1))

    def _last_split(self) -> int:
        """The largest token count that may split (0: none): split programs exist for the smallest blocks only,
        which calls run while an expert's routes are few, so the walk stops at the first count past them."""
        last = 0
        for t in range(1, self.max_tokens + 1):
            if self.tile_n(t) > max(ENGINE_SPLIT_TILE_N):
                break
            if self.splits(t) != (1, 1):
                last = t
        return last

    def specs(self) -> tuple[ProgramSpec, ...]:
        """Every program this plan's calls launch (1 to ``max_tokens`` tokens, int32 and int64 route ids), each once:
        what binding resolves from the AOT cache."""
        points = sorted(self._breakpoints())
        out: dict[str, ProgramSpec] = {}
        for b in self.buckets:
            counts = {b.smallest, b.tokens} | {t for p in points for t in (p, p + 1) if b.smallest <= t <= b.tokens}
            for t in sorted(counts):
                for ids64 in (False, True):
                    for s in self.call_specs(t, ids64):
                        out.setdefault(s.key, s)
        return tuple(out.values())

    def call_bytes(self, tokens: int) -> int:
        """Scratch bytes a call of ``tokens`` tokens carves (routing weights other than float32 included)."""
        g = self.geometry
        bm = self.tile_n(tokens)
        shapes = call_buffers(tokens, self.top_k, g.experts, g.hidden, g.intermediate, w4a8=self.w4a8,
                              fc1_rows="pass" if self.w4a8 else fc1_rows_for(bm, self.scale_source),
                              float_weights=True, splits=self.splits(tokens))  # fmt: skip
        return call_buffer_bytes(shapes)


def engine_plan(
    geometry: MoEGeometry,
    max_tokens: int,
    top_k: int,
    *,
    scale_source: str | None = None,
    activations: str = "bf16",
    buckets: tuple[int, ...] | None = None,
) -> EnginePlan:
    """The engine plan of ``geometry`` for up to ``max_tokens`` tokens (``csf_moe.plan(..., gemm="engine")``).
    ``scale_source``: ``inline`` (W4A16's default: engine records, the native planes released) or ``native``
    (scale panels; W4A8's only source). ``buckets`` defaults to the catalog's token buckets (plus ``max_tokens``)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
    w4a8 = activations != "bf16"
    if not engine_serves(geometry):
        raise ValueError(f"{geometry.name}: the engine GEMM serves MXFP4 and NVFP4 weights")
    if w4a8 and not w4a8_serves(geometry):
        raise ValueError(
            f"{geometry.name}: activations={activations!r} needs {W4A8_FORMATS} weights; {geometry.fmt.name}'s block "
            "factors do not fold into E4M3 (docs/moe-engine.md §8.1), so it stays W4A16 (activations='bf16')"
        )
    if scale_source is None:
        scale_source = "native" if w4a8 else "inline"
    if scale_source not in ENGINE_PLAN_SCALE_SOURCES:
        raise ValueError(f"the engine reads {ENGINE_PLAN_SCALE_SOURCES} scales, got scale_source={scale_source!r}")
    if w4a8 and scale_source != "native":
        raise ValueError("the W4A8 GEMM reads scale panels only (scale_source='native'): it has no inline source")
    for name, size in (("hidden", geometry.hidden), ("intermediate", geometry.intermediate)):
        if size % 64:
            raise ValueError(f"{geometry.name}: the engine needs the {name} size ({size}) in whole multiples of 64")
    sizes = sorted({t for t in (buckets or load_catalog().token_buckets) if t < max_tokens} | {max_tokens})
    draft = EnginePlan(geometry=geometry, top_k=top_k, max_tokens=max_tokens, buckets=(), scale_source=scale_source,
                       activations=activations, scratch_bytes=0)  # fmt: skip
    planned = []
    for smallest, t in zip([1] + [s + 1 for s in sizes[:-1]], sizes, strict=True):
        tiles = sorted({draft.tile_n(smallest), draft.tile_n(t)})
        tiles = tuple(x for x in draft._tiles() if tiles[0] <= x <= tiles[-1])  # the sizes between both ends
        planned.append(EngineBucket(smallest=smallest, tokens=t, tile_ns=tiles))
    # the largest call of each block size (a call's buffers grow with its tokens at one block size)
    counts = {max_tokens} | {p for p in draft._breakpoints() if 1 <= p <= max_tokens}
    scratch = max(draft.call_bytes(t) for t in counts)
    return EnginePlan(geometry=geometry, top_k=top_k, max_tokens=max_tokens, buckets=tuple(planned),
                      scale_source=scale_source, activations=activations, scratch_bytes=scratch)  # fmt: skip
