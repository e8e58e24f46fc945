"""A bound fused MoE layer: plan + weights + caller-owned scratch -> ``run(hidden, topk_ids, topk_weights)``.

A call with T tokens runs the programs of the plan's bucket for T:

    align (1-2 launches) -> [expand scales into scratch] -> [relabel FC1's input] -> FC1 -> finish -> FC2
    -> combine

(one token: align is one small program that makes each route a block; a few tokens on the one-token tiles: the
GEMMs read the routes as blocks, :meth:`MoEPlan.reads_routes_as_blocks`, with no alignment (int64 ids: unless it
lists the routed experts whose scales the call expands; int32 ids list them themselves), and in buckets of such
calls FC2 finishes FC1 itself, ``BucketPlan.fc2_finishes_fc1``: FC1 -> FC2 -> combine).

What a call of an expanding bucket expands, and how, is the plan's decision (:class:`~csf_moe.plan.
ExpansionSchedule`, :meth:`~csf_moe.plan.MoEPlan.expansion_schedule`); the layer executes it:

* ``ROUTED_CHAINED`` (few routes per expert, both planes on the row-block expander with whole rows a warp, dependent
  launches on): the routed experts' planes on the current stream, W13's then W2's, which waits for W13's only
  before it exits (so they run side by side) and lets FC1 in only as its CTAs finish (``fc1_let_in``); FC1, a
  dependent launch of W2's, copies its first weight steps before it waits (``early_fc1``).
* ``ROUTED_FORKED`` (otherwise, or bound with ``chain_expansions=False``): W13's on the current stream beside W2's on
  the device's side stream (``csf_kernels.expand.layer``), forked after the align launches, joined before FC1.
* ``ALL_EXPERTS`` (from ``EXPAND_ALL_ROUTES_PER_EXPERT`` routes per expert): every expert's planes, forked at the
  call's start, W13's beside the alignment, the relabelling and W2's.
* ``FC1_ON_RECORDS`` (one-token calls, and routed calls whose FC1 programs run few K steps; int32 ids): FC1 reads
  W13's CSF records itself and W2's expansion is launched after it, waiting for FC1 only before it exits and letting
  FC2 in as its CTAs start, so no expansion stands before FC1; FC2 (finishing FC1) reads the expanded W2 plane.
* ``GIVEN_PLANES``: planes the caller expanded ahead of the call (below).

Under CUDA-graph capture the fork's and the join's edges into a dependent launch are dependent-launch edges too, so
each row-block expansion FC1 follows or joins lets it in only as its CTAs finish: FC1's programs let in beside an
expansion's CTAs are spread unevenly over the SMs and run slower (docs/perf-notes.md, "An expansion lets FC1 in
only as its CTAs finish").

A bucket that expands may instead read planes expanded ahead of the call (``scale_planes``, written by
:meth:`MoELayer.expansion_launches`, e.g. on a side stream by :mod:`csf_moe.prefetch`).

Bound with ``l2_resident_scales`` (``CSF_L2_SCALES``), a call that expands into the layer's planes runs with an L2
access policy window over them (``runtime.l2_residency``): the expansion's writes and the GEMMs' reads of the
planes (all of them where the planes fit L2's set-aside, a fraction otherwise) persist in L2 instead of going to DRAM
(opt in; not yet measured on a GPU).

Every launch goes on torch's current stream (an expansion on the side stream forked from it and joined
back) with arguments marshalled once per (T, input addresses), so a call allocates nothing but its output (or
nothing, given ``out``), and CUDA graphs capture it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import torch

from csf_kernels import runtime
from csf_kernels.expand.heuristics import expansion_engine
from csf_kernels.expand.launch import LETS_NEXT_IN, inline_expansion_launches
from csf_kernels.expand.layer import ForkJoin, side_stream
from csf_kernels.expand.specs import ROW_BLOCK_MAX_WHOLE_COLS
from csf_kernels.moe.launch import (
    Fc1Partials,
    align_launches,
    combine_launch,
    fc1_finish_launch,
    gemm_launch,
    relabel_launch,
)
from csf_kernels.moe.relabel import padded_k
from csf_kernels.moe.specs import ScaleRead, copies_weights_early, relabel_step
from csf_kernels.runtime import Launch, aligned, l2_residency
from csf_kernels.runtime import config as runtime_config
from csf_kernels.runtime.programs import ALIGNMENT

from .call_args import checked_output
from .plan import ExpansionSchedule, MoEPlan, PlaneExpansion
from .weights import MoEWeights

__all__ = ["MoELayer", "bind", "scale_planes_span", "scale_planes_window"]


def _view(scratch: torch.Tensor, region: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    offset, count = region
    item = torch.empty((), dtype=dtype).element_size()
    return scratch[offset : offset + count * item].view(dtype)


@dataclass(eq=False)
class MoELayer:
    plan: MoEPlan
    weights: MoEWeights
    scratch: torch.Tensor
    # a call expanding its routed experts' scales chains the two planes' expansions on the current stream where
    # it can (module docstring); False: fork and join them (A/B timing)
    chain_expansions: bool = True
    # behind chained expansions, FC1 copies its first weight steps before it waits for them (``EARLY``, where its
    # tiles are staged); False: it waits first (A/B timing)
    early_fc1: bool = True
    # behind chained expansions, W2's lets FC1 in as its CTAs finish their work ("end") or as they start ("start":
    # FC1's CTAs then sit on the SMs beside the expansions'; A/B timing; csf_kernels.expand.launch.LETS_NEXT_IN)
    fc1_let_in: str = "end"
    # the access policy window over the scratch's expanded scale planes, set for the calls that expand into them
    # (``l2_residency``; None: off, the default)
    l2_window: l2_residency.L2Window | None = None
    _bound: runtime.BindingCache = field(default_factory=runtime.BindingCache)

    def __post_init__(self) -> None:
        lay = self.plan.scratch
        s = self.scratch
        self.cursor = _view(s, lay.cursor, torch.int32)
        self.meta = _view(s, lay.meta, torch.int32)
        self.block_expert = _view(s, lay.block_expert, torch.int32)
        self.active_experts = _view(s, lay.active_experts, torch.int32)
        self.sorted_ids = _view(s, lay.sorted_ids, torch.int32)
        self.intermediate = _view(s, lay.intermediate, torch.bfloat16)
        self.fc2_out = _view(s, lay.fc2_out, torch.bfloat16)
        self.partials = _view(s, lay.partials, torch.float32)
        self.relabelled_input = _view(s, lay.relabelled_input, torch.bfloat16)
        geo = self.plan.geometry
        if s.is_cuda:
            side_stream(s.device)  # created at bind, never under a graph capture
        self.w13_plane = self.w2_plane = None
        if lay.w13_scales[1]:
            self.w13_plane = _view(s, lay.w13_scales, torch.uint8).view(geo.w13_scale_shape)
            self.w2_plane = _view(s, lay.w2_scales, torch.uint8).view(geo.w2_scale_shape)

    @property
    def planes(self) -> PlaneExpansion:
        """What this device makes of the planes' expansions (the schedule's facts beyond the geometry): whether
        each is a row-block dependent launch, the only kind that can wait for its predecessor only before it exits
        or let the next kernel in only as its CTAs finish; whether W13's rows fit a warp's image."""
        w13, w2 = self.weights.w13.inline, self.weights.w2.inline
        if self.w13_plane is None or w13 is None or w2 is None:
            return PlaneExpansion(w13_dependent=False, w2_dependent=False, w13_whole_rows=False, chain=False)
        pdl = runtime_config.pdl_enabled()
        return PlaneExpansion(
            w13_dependent=pdl and expansion_engine(w13, self.w13_plane) == "row_block",
            w2_dependent=pdl and expansion_engine(w2, self.w2_plane) == "row_block",
            w13_whole_rows=w13.geometry.cols <= ROW_BLOCK_MAX_WHOLE_COLS,
            chain=self.chain_expansions,
        )

    # ------------------------------------------------------------------------------------------------
    def expands(self, tokens: int) -> bool:
        """Whether a call with ``tokens`` tokens reads native scale planes expanded from the CSF records."""
        return self.plan.bucket_for(tokens).expand

    def expansion_launches(self, w13_plane: torch.Tensor, w2_plane: torch.Tensor) -> list[Launch]:
        """Expand every expert's scales into ``w13_plane`` / ``w2_plane`` (uint8, the geometry's native
        scale shapes): what a call given ``scale_planes`` reads."""
        geo = self.plan.geometry
        for name, plane, shape in (("w13", w13_plane, geo.w13_scale_shape), ("w2", w2_plane, geo.w2_scale_shape)):
            if plane.dtype != torch.uint8 or tuple(plane.shape) != tuple(shape) or not plane.is_contiguous():
                raise ValueError(f"{name} plane must be contiguous uint8 {tuple(shape)}, got {plane.dtype} "
                                 f"{tuple(plane.shape)}")  # fmt: skip
            if plane.device != self.scratch.device:
                raise ValueError(f"{name} plane is on {plane.device}, the layer on {self.scratch.device}")
        if self.weights.w13.inline is None:
            raise ValueError("expansion needs the CSF inline records: prepare the weights for an inline plan")
        return [*inline_expansion_launches(self.weights.w13.inline, w13_plane),
                *inline_expansion_launches(self.weights.w2.inline, w2_plane)]  # fmt: skip

    def run(
        self,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        out: torch.Tensor | None = None,
        scale_planes: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """bf16 [T, H] = sum_j topk_weights[:, j] * expert_{topk_ids[:, j]}(hidden_states). ``scale_planes``:
        (W13, W2) native planes already expanded (see :meth:`expansion_launches`), read instead of expanding
        in the call; only for token counts whose bucket expands."""
        t = hidden_states.shape[0]
        if scale_planes is not None and not (t and self.expands(t)):
            raise ValueError(f"scale_planes given for {t} tokens, whose bucket does not expand scales")
        out = checked_output(self.plan, hidden_states, topk_ids, topk_weights, out)
        if t == 0:
            return out
        if out.data_ptr() % ALIGNMENT:  # the programs assume 16-byte aligned operands
            return out.copy_(self.run(hidden_states, topk_ids, topk_weights, scale_planes=scale_planes))
        hidden_states, topk_ids, topk_weights = (aligned(a) for a in (hidden_states, topk_ids, topk_weights))
        planes = () if scale_planes is None else tuple(scale_planes)
        key = (t, topk_ids.dtype, hidden_states.data_ptr(), topk_ids.data_ptr(), topk_weights.data_ptr(),
               out.data_ptr(), *(p.data_ptr() for p in planes))  # fmt: skip
        per_call = (hidden_states, topk_ids, topk_weights, out)

        def bind_call():
            calls, fork = self._launches(*per_call, scale_planes=scale_planes)
            bound = [la.with_pointers(per_call + planes).bind(self.plan.geometry.name) for la in calls]
            side = () if fork is None else (side_stream(out.device),)
            if fork is not None:
                start, split, end = fork
                concurrent = ForkJoin(tuple(bound[start:split]), tuple(bound[split:end]), side[0])
                bound = [*bound[:start], concurrent, *bound[end:]]
            window = self.l2_window_for(t, scale_planes)
            if window is None:
                return tuple(bound)
            return (l2_residency.InL2Window(tuple(bound), window, side),)

        for launch in self._bound.get(key, bind_call):
            launch()
        return out

    __call__ = run

    # ------------------------------------------------------------------------------------------------
    def launches(self, hidden, topk_ids, topk_weights, out, scale_planes=None) -> list[Launch]:
        """The programs one call runs, in order (unbound: the runtime binds them; tests may interpret them)."""
        return self._launches(hidden, topk_ids, topk_weights, out, scale_planes)[0]

    def _launches(self, hidden, topk_ids, topk_weights, out, scale_planes=None):
        """(:meth:`launches`, the span ``(start, split, end)`` of them that :meth:`run` forks: ``[start, split)``
        on the current stream, ``[split, end)`` on the side stream, or None)."""
        plan, geo = self.plan, self.plan.geometry
        t = hidden.shape[0]
        bucket = plan.bucket_for(t)
        pairs = t * plan.top_k
        bm = bucket.config.bm
        blocks = bucket.max_blocks
        block_expert = self.block_expert[:blocks]
        sorted_ids = self.sorted_ids[: blocks * bm]
        routed = plan.reads_routes_as_blocks(t)  # the GEMMs read the routes as blocks
        # a call expanding its routed experts' scales needs them listed: a routed call's int32 ids are that list
        # (the expanders skip padding ids; an expert routed twice is written twice, the same bytes), otherwise
        # the alignment writes it
        expands_routed = bucket.expand and scale_planes is None and not plan.expands_all_experts(t)
        ids_list_experts = routed and topk_ids.dtype == torch.int32 and topk_ids.is_contiguous()
        active = topk_ids.view(-1) if ids_list_experts else self.active_experts[: min(geo.experts, pairs)]
        aligns = not routed or (expands_routed and not ids_list_experts)
        launches = (
            list(
                align_launches(
                    topk_ids,
                    num_experts=geo.experts,
                    bm=bm,
                    cursor=self.cursor,
                    block_expert=block_expert,
                    active_experts=active,
                    meta=self.meta,
                    sorted_ids=sorted_ids,
                )
            )
            if aligns
            else []
        )
        # relabelled buckets (wgmma programs copying their activations straight into the operand): FC1's input
        # copied into the relabelled K order first, FC2's written in it by the FC1 finish
        relabel = relabel_step(geo.fmt, bucket.config)
        x1 = hidden
        if relabel:
            x1 = self.relabelled_input[: t * padded_k(geo.hidden, geo.fmt)].view(t, -1)
            relabelling = [relabel_launch(hidden, x1, fmt=geo.fmt)]
        else:
            relabelling = []
        w13, w2 = self.weights.w13, self.weights.w2
        fork = None
        early = False  # FC1 right behind chained expansions copies its first weights before it waits
        schedule = plan.expansion_schedule(t, self.planes, ids_list_experts=ids_list_experts,
                                           planes_given=scale_planes is not None)  # fmt: skip
        records_fc1 = schedule is ExpansionSchedule.FC1_ON_RECORDS
        w13_lets, w2_lets = (("end" if dependent else "start") for dependent in
                             (self.planes.w13_dependent, self.planes.w2_dependent))  # fmt: skip
        w13_plane, w2_plane = self.w13_plane, self.w2_plane
        match schedule:
            case ExpansionSchedule.NONE:
                launches += relabelling
            case ExpansionSchedule.GIVEN_PLANES:
                w13_plane, w2_plane = scale_planes
                launches += relabelling
            case ExpansionSchedule.ALL_EXPERTS:  # W13's beside the alignment, the relabelling and W2's
                launches += relabelling + inline_expansion_launches(w2.inline, w2_plane, lets_next_in=w2_lets)
                split = len(launches)
                launches += inline_expansion_launches(w13.inline, w13_plane, lets_next_in=w13_lets)
                fork = (0, split, len(launches))
            case ExpansionSchedule.FC1_ON_RECORDS:  # W2's expansion follows FC1 (below)
                w13_plane = None
            case ExpansionSchedule.ROUTED_CHAINED:  # W2's waits last, beside W13's, and lets FC1 in as set
                launches += inline_expansion_launches(w13.inline, w13_plane, experts=active, lets_next_in="start")
                launches += inline_expansion_launches(
                    w2.inline, w2_plane, experts=active, wait="last", lets_next_in=self.fc1_let_in
                )
                early = self.early_fc1 and routed and copies_weights_early(bucket.config)
                launches += relabelling
            case ExpansionSchedule.ROUTED_FORKED:  # W13's on the current stream, W2's on the side stream
                start = len(launches)
                launches += inline_expansion_launches(w13.inline, w13_plane, experts=active, lets_next_in=w13_lets)
                split = len(launches)
                launches += inline_expansion_launches(w2.inline, w2_plane, experts=active, lets_next_in=w2_lets)
                fork = (start, split, len(launches))
                launches += relabelling
        if schedule is not ExpansionSchedule.NONE:  # the same operands, their scales read from the planes
            if not records_fc1:
                w13 = replace(w13, scales=w13_plane, inline=None)
            w2 = replace(w2, scales=w2_plane, inline=None)
        n_inter = padded_k(geo.intermediate, geo.fmt) if relabel else geo.intermediate
        inter = self.intermediate[: pairs * n_inter].view(pairs, n_inter)
        fc2 = self.fc2_out[: pairs * geo.hidden].view(pairs, geo.hidden)
        common = dict(
            fmt=geo.fmt,
            source=bucket.scale_read,
            activation=geo.activation,
            config=bucket.config,
            sorted_ids=sorted_ids,
            block_expert=block_expert,
            meta=self.meta,
            pairs=pairs,
            routed_ids=topk_ids if routed else None,
        )
        if not bucket.config.split_k:
            launches.append(gemm_launch(fc1=True, x=hidden, weights=w13, out=inter, x_row_div=plan.top_k, **common))
            launches.append(gemm_launch(fc1=False, x=inter, weights=w2, out=fc2, x_row_div=1, **common))
            launches.append(combine_launch(fc2, topk_ids, topk_weights, out, num_experts=geo.experts))
            return launches, fork
        s1, s2 = bucket.splits_fc1, bucket.splits_fc2
        part = self.partials
        if bucket.fc2_finishes_fc1:  # FC1's partials, then FC2's: FC2 reads the one and writes the other
            part2 = part[bucket.fc1_partials(plan.top_k, geo) :]
            fc1_source = {**common, "source": ScaleRead.RECORDS} if records_fc1 else common
            launches.append(gemm_launch(fc1=True, x=x1, weights=w13, out=inter, x_row_div=plan.top_k, splits=s1,
                                        part=part, early=early, **fc1_source))  # fmt: skip
            if records_fc1:  # beside FC1 (neither touches the other's data), completing after it
                launches += inline_expansion_launches(
                    self.weights.w2.inline, self.w2_plane, experts=active, wait="last", lets_next_in="start"
                )
            launches += [
                gemm_launch(fc1=False, x=inter, weights=w2, out=fc2, x_row_div=1, splits=s2, part=part2,
                            finish=Fc1Partials(part, s1, w13), **common),
                combine_launch(fc2, topk_ids, topk_weights, out, num_experts=geo.experts, part=part2, splits=s2,
                               fc2=w2),
            ]  # fmt: skip
            return launches, fork
        launches += [
            gemm_launch(fc1=True, x=x1, weights=w13, out=inter, x_row_div=plan.top_k, splits=s1, part=part,
                        early=early, **common),
            fc1_finish_launch(part, topk_ids, inter, fc1=w13, activation=geo.activation, splits=s1,
                              num_experts=geo.experts, relabel=relabel),
            gemm_launch(fc1=False, x=inter, weights=w2, out=fc2, x_row_div=1, splits=s2, part=part, **common),
            combine_launch(fc2, topk_ids, topk_weights, out, num_experts=geo.experts, part=part, splits=s2, fc2=w2),
        ]  # fmt: skip
        return launches, fork

    def l2_window_for(self, tokens: int, scale_planes=None) -> l2_residency.L2Window | None:
        """The L2 window a call with ``tokens`` tokens runs in: the layer's (if bound with one) where the call
        expands scales into the layer's own planes; planes given by the caller are the caller's to place."""
        if self.l2_window is None or scale_planes is not None or not self.expands(tokens):
            return None
        return self.l2_window


def bind(
    plan: MoEPlan,
    weights: MoEWeights,
    scratch: torch.Tensor,
    *,
    chain_expansions: bool = True,
    early_fc1: bool = True,
    fc1_let_in: str = "end",
    l2_resident_scales: bool = False,
) -> MoELayer:
    """Bind ``weights`` prepared for ``plan`` to caller-owned ``scratch`` (uint8, >= plan.scratch_bytes,
    on the weights' device; shareable by layers that run one after another). ``chain_expansions``,
    ``early_fc1``, ``fc1_let_in``: see :class:`MoELayer` (the defaults are what serving runs).
    ``l2_resident_scales``: the calls that expand scales keep the expanded planes in L2's persisting set-aside
    (:func:`scale_planes_window`; off by default: the engine adapters pass ``CSF_L2_SCALES``)."""
    if fc1_let_in not in LETS_NEXT_IN:
        raise ValueError(f"fc1_let_in must be one of {LETS_NEXT_IN}, got {fc1_let_in!r}")
    if scratch.dtype != torch.uint8 or scratch.dim() != 1 or not scratch.is_contiguous():
        raise ValueError("scratch must be a contiguous 1-D uint8 tensor")
    if scratch.numel() < plan.scratch_bytes:
        raise ValueError(f"scratch holds {scratch.numel()} bytes; the plan needs {plan.scratch_bytes}")
    if scratch.data_ptr() % 256:
        raise ValueError("scratch must be 256-byte aligned (as torch allocates it)")
    if scratch.device != weights.w13.values.device:
        raise ValueError(f"scratch is on {scratch.device}, the weights on {weights.w13.values.device}")
    needs_inline = plan.scale_source != "native"
    for name, op in (("w13", weights.w13), ("w2", weights.w2)):
        if needs_inline and op.inline is None:
            raise ValueError(f"{name}: the plan reads CSF scales; prepare the weights for this plan")
        if not needs_inline and op.scales is None:
            raise ValueError(f"{name}: the plan reads native scales; prepare the weights for this plan")
    runtime_programs = [runtime.program(s, geometry=plan.geometry.name) for s in plan.specs()]
    del runtime_programs  # resolved now, so a missing program fails at bind, not mid-forward
    window = scale_planes_window(plan, scratch) if l2_resident_scales else None
    if l2_resident_scales and window is None and scale_planes_span(plan) is not None:
        warnings.warn(
            f"{plan.geometry.name}: L2 residency asked for, but {scratch.device} keeps no persisting L2 lines (a MIG "
            "slice or an older GPU?): the expanded scale planes are read as without it",
            stacklevel=2,
        )
    return MoELayer(plan=plan, weights=weights, scratch=scratch, chain_expansions=chain_expansions, early_fc1=early_fc1,
                    fc1_let_in=fc1_let_in, l2_window=window)  # fmt: skip


def scale_planes_window(plan: MoEPlan, scratch: torch.Tensor) -> l2_residency.L2Window | None:
    """The L2 window over ``scratch``'s expanded scale planes (W13's, then W2's), with the set-aside for it raised
    on the scratch's device; None where the plan never expands or the device keeps no persisting lines."""
    span = scale_planes_span(plan)
    if span is None:
        return None
    start, end = span
    device = scratch.device.index if scratch.device.index is not None else torch.cuda.current_device()
    set_aside = l2_residency.reserve(device, end - start)
    max_window = l2_residency.limits(device).max_window_bytes
    return l2_residency.window_over(scratch.data_ptr() + start, end - start, set_aside, max_window)


def scale_planes_span(plan: MoEPlan) -> tuple[int, int] | None:
    """The byte range ``[start, end)`` of the scratch that the expanded W13 and W2 planes take (one run: W2's
    region follows W13's), or None where the plan never expands."""
    w13, w2 = plan.scratch.w13_scales, plan.scratch.w2_scales
    if not w13[1]:
        return None
    if w2[0] < w13[0] + w13[1]:
        raise ValueError(f"the scratch layout puts W2's plane {w2} before the end of W13's {w13}")
    return w13[0], w2[0] + w2[1]  # uint8 regions: their counts are bytes
