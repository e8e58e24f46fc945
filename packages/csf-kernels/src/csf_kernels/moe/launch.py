"""Host side of the fused-MoE programs: argument marshalling for align, grouped GEMM and combine.

The narrow interface csf-moe builds on: each function returns a :class:`Launch` (a program spec, its
grid and its arguments in signature order); :meth:`Launch.bind` resolves the program through the AOT
runtime. Nothing here allocates on the device except, once, a 16-byte placeholder for absent inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec import InlineScales, ScaleFormat
from csf_kernels.moe.relabel import k_step, padded_k
from csf_kernels.moe.specs import (
    DECODE,
    FIN_STEPS,
    FINISH_COLUMNS,
    RELABEL_COLUMNS,
    SCATTER_CHUNK,
    GemmConfig,
    ScaleRead,
    align_count_programs,
    align_count_spec,
    align_plan_spec,
    align_routes_spec,
    align_scatter_spec,
    align_scatters_in_plan,
    combine_columns,
    combine_slots,
    combine_spec,
    fc1_finish_spec,
    gemm_spec,
    relabel_spec,
)
from csf_kernels.runtime import Launch, aligned, placeholder

__all__ = [
    "WIDE_TILE_ROWS",
    "Fc1Partials",
    "GemmOperand",
    "Launch",
    "align_launches",
    "combine_launch",
    "fc1_finish_launch",
    "gemm_launch",
    "max_blocks_for",
    "relabel_launch",
    "wide_row_tiles",
]


def _ids64(topk_ids: torch.Tensor) -> bool:
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if not topk_ids.is_contiguous():
        raise ValueError("topk_ids must be contiguous")
    return topk_ids.dtype == torch.int64


def align_launches(
    topk_ids: torch.Tensor,
    *,
    num_experts: int,
    bm: int,
    cursor: torch.Tensor,
    block_expert: torch.Tensor,
    active_experts: torch.Tensor,
    meta: torch.Tensor,
    sorted_ids: torch.Tensor,
    route_slots: torch.Tensor | None = None,
) -> list[Launch]:
    """Group ``topk_ids`` [T, k] into blocks of ``bm`` routes per expert (see kernels/align.py); one
    token's routes, each a block of its own.

    The scratch views are int32: ``cursor`` [bins], ``block_expert`` [max_blocks], ``active_experts``
    [max_active], ``meta`` [>= 1], ``sorted_ids`` [max_blocks * bm]; ``route_slots`` [>= T * k], if given, gets
    each route's slot (-1: the route joins no block)."""
    ids64 = _ids64(topk_ids)
    pairs = topk_ids.numel()
    max_blocks = block_expert.numel()
    if sorted_ids.numel() < max_blocks * bm:
        raise ValueError(f"sorted_ids holds {sorted_ids.numel()} routes, {max_blocks} blocks of {bm} need more")
    if max_blocks < max_blocks_for(pairs, num_experts, bm):
        raise ValueError(f"{max_blocks} blocks cannot hold {pairs} routes over {num_experts} experts")
    inverse = route_slots is not None
    if inverse and (route_slots.dtype != torch.int32 or route_slots.numel() < pairs):
        raise ValueError(f"route_slots must be int32 with {pairs} entries at least")
    slots_arg = route_slots if inverse else placeholder(topk_ids.device)
    if topk_ids.dim() == 2 and topk_ids.shape[0] == 1 and max_blocks >= pairs:
        args = (topk_ids, block_expert, active_experts, meta, sorted_ids, slots_arg, pairs, num_experts,
                active_experts.numel())  # fmt: skip
        return [Launch(align_routes_spec(bm, ids64, pairs, inverse=inverse), (1,), args)]
    scatter_here = align_scatters_in_plan(pairs)
    plan = align_plan_spec(num_experts, bm, ids64, scatter=scatter_here, inverse=inverse)
    bins = plan.fact["EP"]
    if cursor.numel() < bins:
        raise ValueError(f"cursor needs {bins} entries")
    plan_args = (topk_ids, cursor, block_expert, active_experts, meta, sorted_ids, slots_arg, pairs, num_experts,
                 active_experts.numel())  # fmt: skip
    if scatter_here:
        return [Launch(plan, (1,), plan_args)]
    counters = align_count_programs(pairs)
    if sorted_ids.numel() < counters * bins:  # the count programs' rows are written at its start
        raise ValueError(f"sorted_ids holds {sorted_ids.numel()} routes, fewer than the {counters} x {bins} counts "
                         f"of {pairs} routes")  # fmt: skip
    scatter_args = (topk_ids, cursor, sorted_ids, slots_arg, pairs, num_experts)
    return [
        Launch(align_count_spec(num_experts, ids64), (counters,), (topk_ids, sorted_ids, pairs, num_experts)),
        Launch(plan, (1,), plan_args),
        Launch(align_scatter_spec(ids64, inverse=inverse), (-(-pairs // SCATTER_CHUNK),), scatter_args),
    ]


def max_blocks_for(pairs: int, num_experts: int, bm: int) -> int:
    """Blocks the align step may use: every full block, plus one partial block per active expert."""
    return pairs // bm + min(pairs, num_experts)


@dataclass(frozen=True, eq=False)
class GemmOperand:
    """One expert weight stack as a GEMM reads it: packed FP4 values [E, R, K/2], and either the native
    scale plane [E, R, C] or its inline CSF storage; NVFP4's global scales [E] and optional bias [E, R]."""

    values: torch.Tensor
    scales: torch.Tensor | None = None
    inline: InlineScales | None = None
    global_scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    # MXFP4: uint8 [E, ceil(R / 64)], 1 where a 64-row tile's scales hold E8M0 bytes 129..254 (scales of
    # 4 and more), which the decode GEMM converts with two multiplies per weight pair instead of one
    # (exact either way); see :func:`wide_row_tiles`. Unused for NVFP4 (always two).
    wide_tiles: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class Fc1Partials:
    """What a routed FC2 that finishes FC1 itself reads (``gemm_launch``'s ``finish``): FC1's float32 partials
    [splits, pairs, 2N] and its operand (bias, global scales)."""

    part: torch.Tensor
    splits: int
    fc1: GemmOperand


WIDE_TILE_ROWS = DECODE.bn  # flags per 64-row tile (a 128-row wgmma program ORs its two: _wide_rows)


def wide_row_tiles(plane: torch.Tensor) -> torch.Tensor:
    """uint8 [E, ceil(R / 64)] of an E8M0 scale plane [E, R, C]: 1 where a tile of 64 rows holds a byte in
    129..254 (a scale the decode GEMM's one-multiply conversion cannot take), else 0."""
    e, r, _ = plane.shape
    wide = ((plane > 128) & (plane < 255)).any(-1)
    wide = torch.nn.functional.pad(wide, (0, -r % WIDE_TILE_ROWS))
    return wide.view(e, -1, WIDE_TILE_ROWS).any(-1).to(torch.uint8).contiguous()


def _inline_array(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An inline-CSF array as the GEMM reads it: 16-byte aligned, within 32-bit offsets (empty: a placeholder)."""
    if t.numel() == 0:
        return placeholder(device)
    if t.numel() >= 1 << 31:
        raise ValueError(f"a {t.numel()}-byte inline array exceeds the GEMM's 32-bit record offsets")
    return aligned(t)


def _programs_stay_in_blocks(n_out: int, offset: int, row_group: int, bn: int) -> bool:
    """Whether every program's rows [offset + n0, offset + n0 + bn) that exist lie in one inline row block
    (the GEMM decodes one record per program and column tile)."""
    for n0 in range(0, n_out, bn):
        first, last = offset + n0, offset + min(n0 + bn, n_out) - 1
        if (first // row_group, first % row_group // 128) != (last // row_group, last % row_group // 128):
            return False
    return True


def gemm_launch(
    *,
    fmt: ScaleFormat,
    source: ScaleRead,
    fc1: bool,
    activation: str,
    config: GemmConfig,
    x: torch.Tensor,
    weights: GemmOperand,
    out: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    meta: torch.Tensor,
    pairs: int,
    x_row_div: int,
    splits: int = 1,
    part: torch.Tensor | None = None,
    routed_ids: torch.Tensor | None = None,
    finish: Fc1Partials | None = None,
    early: bool = False,
) -> Launch:
    """FC1 (``fc1``: gate/up -> activation, out [pairs, N]) or FC2 (out [pairs, H]) over aligned blocks, or
    (``routed_ids``: a few-token call's route ids [T, k], configs with ``moe_specs.routes_as_blocks``) over its
    routes, each a block, with no alignment (``sorted_ids``, ``block_expert`` and ``meta`` unused).

    Split-K configs write float32 partials ``part`` [splits, pairs, R] instead (finished by
    :func:`fc1_finish_launch` or :func:`combine_launch`), and ``out`` is unused. ``finish`` (a routed FC2,
    ``moe_heuristics.fc2_finishes_fc1``): FC1's partials, finished by this program for its K range instead of read
    from ``x`` (which is unused), so no finishing kernel runs between the GEMMs. ``early``: a routed FC1 right
    after chained expansions (``moe_specs.gemm_spec``)."""
    values = weights.values
    dev = values.device
    e, r, k2 = values.shape
    k = 2 * k2
    n_out = r // 2 if fc1 else r
    rows = config.tiled_rows(n_out, fc1)  # the programs' n_out
    cols = fmt.scale_columns(k)
    kx = padded_k(k, fmt) if config.relabelled else k  # relabelled rows: whole K steps (csf_kernels.moe.relabel)
    if r * k2 >= 1 << 33:  # the GEMMs address an expert's FP4 words with 32-bit offsets (fp4_words' panels)
        raise ValueError(f"an expert of {r} x {k2} FP4 bytes exceeds the GEMMs' 32-bit word offsets")
    if x.dtype != torch.bfloat16 or x.shape[-1] != kx or not x.is_contiguous():
        raise ValueError(f"GEMM input must be contiguous bf16 [*, {kx}], got {x.dtype} {tuple(x.shape)}")
    if not config.split_k and (out.dtype != torch.bfloat16 or out.shape[-1] != n_out or not out.is_contiguous()):
        raise ValueError(f"GEMM output must be contiguous bf16 [*, {n_out}], got {out.dtype} {tuple(out.shape)}")
    ph = placeholder(dev)
    inline_args = (ph, ph, ph, ph, ph, ph, 1, 1, 1, 0, 0, 0)
    scales = ph
    if source is ScaleRead.PLANE:
        if weights.scales is None or tuple(weights.scales.shape) != (e, r, cols):
            raise ValueError(f"native scales must be [{e}, {r}, {cols}]")
        scales = weights.scales
    else:
        il = weights.inline
        if il is None or tuple(il.shape) != (e, r, cols) or il.fmt.name != fmt.name:
            raise ValueError(f"inline scales must describe a {fmt.name} [{e}, {r}, {cols}] plane")
        geo = il.geometry
        for offset in (0, n_out) if fc1 and config.engine == "triton" else (0,):
            if not _programs_stay_in_blocks(rows, offset, geo.row_group, config.bn):
                raise ValueError(
                    f"inline scales with row group {geo.row_group}: {config.bn}-row programs at rows {offset}.. "
                    f"would straddle 128-row blocks (tile W13 as gate/up groups: row_group={n_out})"
                )
        inline_args = (
            _inline_array(il.base_ref, dev),
            _inline_array(il.base_delta, dev),
            _inline_array(il.records, dev),
            _inline_array(il.raw, dev),
            _inline_array(il.tail, dev),
            _inline_array(il.tail_raw, dev),
            geo.row_group,
            geo.blocks_per_group,
            geo.full_col_tiles,
            il.record_bytes,
            il.tail_record_bytes,
            geo.tail_cols,
        )
    has_g = fmt.name == "nvfp4"
    if has_g and (weights.global_scale is None or weights.global_scale.shape != (e,)):
        raise ValueError(f"NVFP4 weights need float32 global scales [{e}]")
    bias = weights.bias
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (e, r)):
        raise ValueError(f"bias must be float32 [{e}, {r}]")
    wide = weights.wide_tiles
    if fmt.name == "mxfp4":
        if wide is None or wide.dtype != torch.uint8 or tuple(wide.shape) != (e, -(-r // WIDE_TILE_ROWS)):
            raise ValueError(f"MXFP4 operands need wide_tiles uint8 [{e}, {-(-r // WIDE_TILE_ROWS)}] (wide_row_tiles)")
        wide = aligned(wide)
    else:
        wide = ph
    routed = routed_ids is not None
    if routed and (routed_ids.dim() != 2 or routed_ids.numel() != pairs):
        raise ValueError(f"routes as blocks: {pairs} route ids [T, k] expected, got {tuple(routed_ids.shape)}")
    fin_args = (ph, ph, ph, 0)
    if finish is not None:
        fin_args = _finish_args(finish, routed, fc1, e, k, pairs, ph)
    spec = gemm_spec(fmt, source, fc1=fc1, activation=activation,
                     bias=(finish.fc1 if finish is not None else weights).bias is not None, config=config,
                     routed=routed, ids64=routed and _ids64(routed_ids), finishes_fc1=finish is not None,
                     early=early)  # fmt: skip
    steps = -(-k // k_step(fmt))
    per_split = -(-steps // splits)
    if finish is not None and per_split > FIN_STEPS:
        raise ValueError(f"FC2 finishing FC1 holds {FIN_STEPS} K steps a split, not {per_split}")
    if config.split_k:
        if part is None or part.dtype != torch.float32 or part.numel() < splits * pairs * r:
            raise ValueError(f"split-K needs float32 partials for {splits} x {pairs} x {r}")
    elif splits != 1:
        raise ValueError(f"config {config.name} does not split K")
    if -(-steps // per_split) != splits:
        raise ValueError(f"{splits} splits of {steps} K steps leave some empty (use moe_heuristics.split_count)")
    if routed:
        block_expert = aligned(routed_ids)
    grid = (pairs if routed else block_expert.numel(), config.row_tiles(n_out, fc1), splits)
    base, delta, records, raw, tail, tail_raw, row_group, bpg, full_tiles, s, s_tail, tc = inline_args
    args = (
        x, values, scales, wide, base, delta, records, raw, tail, tail_raw,
        weights.global_scale if has_g else ph, bias if bias is not None else ph, out,
        part if part is not None else ph, sorted_ids, block_expert, meta, pairs, x_row_div, rows, k, cols,
        row_group, bpg, full_tiles, s, s_tail, tc, per_split,
    )  # fmt: skip
    if config.engine == "gluon":
        args += (e, *fin_args)  # num_experts: the range of valid route ids (ROUTED); FIN's inputs
    # decode programs reading records: the largest shared-memory carveout, or the driver may fit fewer of them on
    # an SM than their registers allow and run a one-token FC1 in two waves (docs/perf-notes.md, "Except where FC1
    # runs few K steps"); native programs measure no different with it, so they keep the driver's choice
    return Launch(spec, grid, args, prefer_shared=source is ScaleRead.RECORDS and config.engine == "gluon")


def _finish_args(finish: Fc1Partials, routed: bool, fc1: bool, e: int, k: int, pairs: int, ph: torch.Tensor):
    """FIN's runtime arguments (fin_part, fin_bias, fin_gscale, fin_splits), checked against FC2's shape."""
    w1 = finish.fc1
    if fc1 or not routed:
        raise ValueError("only a routed FC2 finishes FC1 itself")
    if w1.values.shape[0] != e or w1.values.shape[1] != 2 * k:
        raise ValueError(f"FC1 operand {tuple(w1.values.shape)} does not feed an FC2 of K = {k} over {e} experts")
    if finish.part.dtype != torch.float32 or finish.part.numel() < finish.splits * pairs * 2 * k:
        raise ValueError(f"FC1 partials must be float32 with {finish.splits} x {pairs} x {2 * k} values")
    if w1.bias is not None and (w1.bias.dtype != torch.float32 or tuple(w1.bias.shape) != (e, 2 * k)):
        raise ValueError(f"FC1 bias must be float32 [{e}, {2 * k}]")
    return (finish.part, ph if w1.bias is None else w1.bias,
            ph if w1.global_scale is None else w1.global_scale, finish.splits)  # fmt: skip


def combine_launch(
    y: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    out: torch.Tensor,
    *,
    num_experts: int,
    part: torch.Tensor | None = None,
    splits: int = 1,
    fc2: GemmOperand | None = None,
) -> Launch:
    """out [T, H] bf16 = sum over slots of topk_weights * y [T * k, H] (padding slots skipped).

    With ``part`` (float32 [splits, T * k, H], a split-K FC2's partials) the partials are summed first
    and FC2's global scale and bias (from ``fc2``) applied here."""
    ids64 = _ids64(topk_ids)
    t, k = topk_ids.shape
    h = out.shape[-1]
    if topk_weights.dtype != torch.float32 or topk_weights.shape != topk_ids.shape or not topk_weights.is_contiguous():
        raise ValueError(f"topk_weights must be contiguous float32 {tuple(topk_ids.shape)}, got "
                         f"{topk_weights.dtype} {tuple(topk_weights.shape)}")  # fmt: skip
    if y.shape[-1] != h or y.numel() < t * k * h or out.shape[0] != t:
        raise ValueError("combine: y, out and topk_ids do not describe the same tokens")
    ph = placeholder(out.device)
    partial = part is not None
    if partial and part.numel() < splits * t * k * h:
        raise ValueError(f"combine: partials hold {part.numel()} values, {splits} x {t * k} x {h} needed")
    bias = fc2.bias if partial and fc2 is not None else None
    gscale = fc2.global_scale if partial and fc2 is not None else None
    slots = combine_slots(t, k)
    spec = combine_spec(ids64, slots=slots, partial=partial, bias=bias is not None, gscale=gscale is not None)
    args = (
        y, part if partial else ph, gscale if gscale is not None else ph, bias if bias is not None else ph,
        topk_ids, topk_weights, out, h, k, num_experts, splits, t * k,
    )  # fmt: skip
    return Launch(spec, (t, -(-h // combine_columns(slots))), args)


def fc1_finish_launch(
    part: torch.Tensor,
    topk_ids: torch.Tensor,
    out: torch.Tensor,
    *,
    fc1: GemmOperand,
    activation: str,
    splits: int,
    num_experts: int,
    relabel: int = 0,
) -> Launch:
    """Sum a split-K FC1's float32 partials [splits, pairs, 2N], apply global scale, bias and the
    activation, store bf16 ``out`` [pairs, N]; with ``relabel`` (a K step: ``moe_specs.relabel_step``)
    ``out`` is [pairs, NP] in that step's relabelled order (NP = N in whole steps, csf_kernels.moe.relabel)."""
    ids64 = _ids64(topk_ids)
    pairs = topk_ids.numel()
    n = fc1.values.shape[1] // 2
    width = -(-n // relabel) * relabel if relabel else n
    if out.dtype != torch.bfloat16 or out.shape[-1] != width or out.numel() < pairs * width:
        raise ValueError(f"fc1_finish: out must be bf16 [{pairs}, {width}], got {out.dtype} {tuple(out.shape)}")
    if part.dtype != torch.float32 or part.numel() < splits * pairs * 2 * n:
        raise ValueError(f"fc1_finish: partials must be float32 with {splits} x {pairs} x {2 * n} values")
    ph = placeholder(out.device)
    spec = fc1_finish_spec(
        ids64, activation=activation, bias=fc1.bias is not None, gscale=fc1.global_scale is not None, relabel=relabel
    )
    args = (
        part, topk_ids, fc1.global_scale if fc1.global_scale is not None else ph,
        fc1.bias if fc1.bias is not None else ph, out, pairs, n, splits, num_experts,
    )  # fmt: skip
    return Launch(spec, (pairs, -(-width // FINISH_COLUMNS)), args)


def relabel_launch(x: torch.Tensor, out: torch.Tensor, *, fmt: ScaleFormat) -> Launch:
    """``x`` [T, K] bf16 -> ``out`` [T, KP] in ``fmt``'s relabelled K order (csf_kernels.moe.relabel)."""
    t, k = x.shape
    kp = padded_k(k, fmt)
    if x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(f"relabel: x must be contiguous bf16, got {x.dtype}")
    if out.dtype != torch.bfloat16 or tuple(out.shape) != (t, kp) or not out.is_contiguous():
        raise ValueError(f"relabel: out must be contiguous bf16 [{t}, {kp}], got {out.dtype} {tuple(out.shape)}")
    return Launch(relabel_spec(fmt), (t, -(-kp // RELABEL_COLUMNS)), (x, out, k, kp))
