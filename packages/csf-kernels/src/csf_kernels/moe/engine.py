"""Host API of the MoE engine's programs (``docs/moe-engine.md``): shapes checked, launches built, nothing compiled
while frozen (the programs come from the AOT cache like every other)."""

from __future__ import annotations

import torch

from csf_kernels import runtime
from csf_kernels.moe.engine_inline import InlineScales
from csf_kernels.moe.engine_panels import PANEL_STEP_K, ROW_BLOCK, panel_scales
from csf_kernels.moe.engine_specs import (
    ENGINE_IO,
    ENGINE_PARTIAL_FORMS,
    ENGINE_TILE_M,
    ENGINE_TILE_N,
    engine_act_spec,
    engine_combine_spec,
    engine_fc1_finish_spec,
    engine_gather_tokens_spec,
    engine_gemm_spec,
    engine_occupancy,
    engine_partial_combine_spec,
    engine_ragged,
    engine_schedule,
    engine_split_steps,
)
from csf_kernels.runtime import config as runtime_config
from csf_kernels.runtime.device import num_sms

__all__ = [
    "act_launch",
    "combine_launch",
    "dense_fp4_gemm_launch",
    "fc1_finish_launch",
    "gather_tokens_launch",
    "grouped_fp4_gemm_launch",
    "partial_combine_launch",
]


def grouped_fp4_gemm_launch(
    w_panel: torch.Tensor,
    s_panel: torch.Tensor | InlineScales,
    x: torch.Tensor,
    out: torch.Tensor,
    block_expert: torch.Tensor,
    meta: torch.Tensor,
    *,
    tile_n: int,
    activation: str | None = None,
    bias: torch.Tensor | None = None,
    fmt: str = "mxfp4",
    global_scale: torch.Tensor | None = None,
    schedule: str | None = None,
    io: str = "dense",
    sorted_ids: torch.Tensor | None = None,
    top_k: int = 1,
    pairs: int | None = None,
    ragged: int | bool | None = None,
    ctas_per_sm: int | None = None,
    wide: torch.Tensor | None = None,
    max_ctas: int | None = None,
    partial: str | None = None,
    splits: int = 1,
    probe: str | None = None,
) -> runtime.Launch:
    """Route block ``b < meta[0]`` (rows ``b * tile_n ..`` of ``x`` and ``out``) times expert ``block_expert[b]``:
    ``out[row, r] = x[row, :] . bf16(w[e, r, :] * scale)`` over panels from :mod:`csf_kernels.moe.engine_panels`
    (``w_panel`` uint64 ``[E, K / 64, R / 64, 256]``, ``s_panel`` uint8 ``[E, K / 64, b R]``, ``b`` 2 for
    ``fmt`` MXFP4, 4 for NVFP4), ``x`` bf16 ``[NX, K]``, ``out`` bf16 ``[NX, R]``, ``block_expert`` int32 ``[max
    blocks]``, ``meta`` int32 (device data, so a captured graph replays with new routings). Blocks of experts outside
    ``[0, E)`` compute zeros. NVFP4 needs ``global_scale`` (float32 ``[E]``): each output times its expert's.

    ``activation`` (FC1): the epilogue applies it, ``bias`` (float32 ``[E, R]``) added first, and ``out`` has
    ``R / 2`` columns; W13's rows must then be in engine order (:func:`~csf_kernels.moe.engine_panels.
    fc1_engine_rows`), the bias too.

    ``s_panel`` may instead be the plane's :class:`~csf_kernels.moe.engine_inline.InlineScales` (engine records of
    the same rows): the inline program decodes them into the same scale slots, so the output is the same bits.

    ``schedule``: the consumers' wgmma schedule (:data:`~csf_kernels.moe.engine_specs.ENGINE_SCHEDULES`), where the
    cache holds it for ``tile_n``, else the size's default (:func:`~csf_kernels.moe.engine_specs.engine_schedule`):
    the same output bits either way.

    ``io`` places the rows by the alignment's ``sorted_ids`` (int32 ``[slots]``, slot ``s`` holding route
    ``t * top_k + j`` or a value outside ``[0, pairs)``): ``gather`` (FC1) reads slot ``s``'s row of ``x [tokens,
    K]`` at token ``sorted_ids[s] // top_k`` (zeros without a route; ``out`` has ``slots`` rows), ``scatter`` (FC2)
    stores it to row ``sorted_ids[s]`` of ``out [pairs, R]`` (nothing without a route; ``x`` has ``slots`` rows).
    ``dense`` rows may come with the alignment's ``sorted_ids`` and ``pairs`` too (FC1 reading rows a gather pass
    wrote): they only tell which slots are live.

    ``ragged`` (:data:`~csf_kernels.moe.engine_specs.ENGINE_RAGGED_TILE_N`; ``None``: the size's default, level 1;
    ``True``: 1, ``False``: 0): a block whose live slots (route ids in ``[0, pairs)``) all lie in its first half
    multiplies that half only, at level 2 one whose live slots lie in its first quarter that quarter; its other
    rows store the GEMM of nothing (zeros, or the activation of the bias) where the whole block would store the GEMM
    of its zero rows, which differ only where a weight is NaN or infinite. Without route ids every block is whole.

    ``ctas_per_sm`` (``None``: :func:`~csf_kernels.moe.engine_specs.engine_occupancy`'s default, two at 16-64
    routes a block): 2 runs the program built for two CTAs an SM where the cache holds it, launched on twice the
    SMs' count; the same bits. ``max_ctas`` caps the persistent grid (SMs left to a concurrent stream; a CTA then
    walks more units): the same bits.

    ``wide`` (MXFP4): uint8 ``[E, R / 64]`` from :func:`csf_kernels.moe.launch.wide_row_tiles` of the rows as the
    panel holds them: a 64-row block flagged 0 converts each pair with one multiply (its E8M0 bytes are all <= 128
    or 255), 1 with two; ``None``: two everywhere. The same bits either way.

    ``partial`` (:data:`~csf_kernels.moe.engine_specs.ENGINE_PARTIAL_FORMS`; ``io="gather"``, no activation or bias):
    ``splits`` K splits (whole engine records each: :func:`~csf_kernels.moe.engine_specs.engine_split_steps`), each
    unit's float32 accumulator, unscaled, to ``out`` float32 ``[splits * pairs, R]`` (``pairs = tokens * top_k``),
    row ``s * pairs + route``: W13's engine rows as ``[gate; up]`` columns (``"fc1"``, what
    :func:`fc1_finish_launch` reads) or rows as they are (``"rows"``, :func:`partial_combine_launch`'s); slots
    without a route store nothing. Split ``s``'s partial is the bits the same program stores at one split on that K
    range alone, from either scale source.

    ``probe``: a diagnostic program in the GEMM's place (:func:`dense_fp4_gemm_launch`; wrong outputs by design).

    The launch is a programmatic dependent one where the runtime's PDL setting allows."""
    if tile_n not in ENGINE_TILE_N:
        raise ValueError(f"tile_n must be one of {ENGINE_TILE_N}; got {tile_n}")
    if io not in ENGINE_IO:
        raise ValueError(f"io must be one of {ENGINE_IO}; got {io!r}")
    per_step = panel_scales(fmt).per_step
    if x.dtype != torch.bfloat16 or x.dim() != 2 or out.dim() != 2:
        raise TypeError("x and out must be 2-D (x bf16)")
    if partial is None and out.dtype != torch.bfloat16:
        raise TypeError(f"out must be bf16 (float32 partials need partial=); got {out.dtype}")
    if block_expert.dtype != torch.int32 or meta.dtype != torch.int32 or block_expert.dim() != 1 or meta.numel() < 1:
        raise TypeError("block_expert and meta must be int32 vectors (meta holds at least the block count)")
    rows_x, k = x.shape
    experts, steps, blocks = w_panel.shape[:3]
    rows = blocks * ROW_BLOCK
    if bias is not None and (activation is None or bias.dtype != torch.float32 or bias.shape != (experts, rows)):
        raise ValueError(f"bias must be float32 [{experts}, {rows}] and come with an activation")
    out_cols = rows if activation is None else rows // 2
    if partial is not None:
        if partial not in ENGINE_PARTIAL_FORMS or io != "gather" or activation is not None or bias is not None:
            raise ValueError(f"partials ({partial!r}) are one of {ENGINE_PARTIAL_FORMS}, from gathering GEMMs with no "
                             f"activation or bias; got io {io!r}, activation {activation!r}")  # fmt: skip
        if out.dtype != torch.float32:
            raise TypeError(f"partials are float32; got out {out.dtype}")
        split_steps = engine_split_steps(steps, splits, fmt)
    elif splits != 1:
        raise ValueError(f"{splits} K splits need a partial program (partial='fc1' or 'rows')")
    else:
        split_steps = steps
    if io == "dense" and sorted_ids is not None:  # route ids beside block-order rows: live slots only
        if sorted_ids.dtype != torch.int32 or sorted_ids.shape != (rows_x,):
            raise TypeError(f"dense: sorted_ids must be int32 [{rows_x}] (x's slots) where given")
        if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
            raise ValueError(f"dense: sorted_ids come with the route count pairs >= 1; got {pairs!r}")
        slots = rows_x
    else:
        slots = _check_routes(io, sorted_ids, rows_x, out.shape[0], top_k, activation)
        if io == "dense":
            sorted_ids, pairs = block_expert, 0  # unread: every block whole
        else:  # a live route id is below the routes x (gather) or out (scatter) holds
            pairs = rows_x * top_k if io == "gather" else out.shape[0]
    out_rows = out.shape[0] if io == "scatter" else slots
    if partial is not None:
        out_rows = splits * pairs
    if out.shape != (out_rows, out_cols) or k != steps * PANEL_STEP_K:
        raise ValueError(
            f"shapes disagree: x {tuple(x.shape)}, out {tuple(out.shape)}, weight panel {tuple(w_panel.shape)} "
            "(K = 64 x steps, R = 64 x row blocks)"
        )
    inline = isinstance(s_panel, InlineScales)
    if inline:
        if (s_panel.fmt, s_panel.experts, s_panel.rows, s_panel.k) != (fmt, experts, rows, k):
            raise ValueError(
                f"inline scales of {s_panel.fmt} [{s_panel.experts}, {s_panel.rows}] at K = {s_panel.k} do not fit "
                f"{fmt} weights [{experts}, {rows}] at K = {k}"
            )
    elif s_panel.dtype != torch.uint8 or tuple(s_panel.shape) != (experts, steps, per_step * rows):
        raise ValueError(
            f"{fmt} scale panel {s_panel.dtype} {tuple(s_panel.shape)} is not uint8 [{experts}, {steps}, "
            f"{per_step * rows}]"
        )
    nv = fmt == "nvfp4"
    if nv != (global_scale is not None):
        raise ValueError(f"{fmt} weights take {'a' if nv else 'no'} global scale")
    if nv and (global_scale.dtype != torch.float32 or tuple(global_scale.shape) != (experts,)):
        raise ValueError(f"global_scale must be float32 [{experts}]; got {global_scale.dtype} "
                         f"{tuple(global_scale.shape)}")  # fmt: skip
    units = -(-rows // ENGINE_TILE_M) * min(block_expert.numel(), -(-slots // tile_n)) * splits
    sched = engine_schedule(tile_n, schedule)
    occ = engine_occupancy(tile_n, sched, ctas_per_sm)
    ctas = max(1, min(occ * num_sms(x.device), units))
    if max_ctas is not None:
        if max_ctas < 1:
            raise ValueError(f"max_ctas must be at least 1; got {max_ctas}")
        ctas = min(ctas, max_ctas)
    source = "inline" if inline else "native"
    whole = partial is not None or probe is not None
    spec = engine_gemm_spec(tile_n, activation, bias is not None, fmt, source, io, sched,
                            0 if whole else engine_ragged(tile_n, ragged), occ, partial, probe)  # fmt: skip
    b = bias if bias is not None else _unread(x.device)
    g = global_scale if nv else _unread(x.device)[0]
    if inline:
        s = s_panel.tensors()
    else:
        s = (s_panel.view(torch.uint32) if nv else s_panel,)  # NVFP4: one word of four E4M3 bytes a row a step
    blocks = -(-rows // ROW_BLOCK)
    if wide is None:
        wide = _all_wide(w_panel.device, experts, blocks)
    elif wide.dtype != torch.uint8 or tuple(wide.shape) != (experts, blocks):
        raise ValueError(f"wide must be uint8 [{experts}, {blocks}] (64-row blocks); got {wide.dtype} "
                         f"{tuple(wide.shape)}")  # fmt: skip
    pdl = int(runtime_config.pdl_enabled())
    args = (w_panel, *s, x, out, b, g, block_expert, meta, sorted_ids, wide, ctas, top_k, pairs, split_steps, pdl)
    return runtime.Launch(spec, (ctas, 1, 1), args)


_ALL_WIDE: dict[tuple[torch.device, int, int], torch.Tensor] = {}


def _all_wide(device: torch.device, experts: int, blocks: int) -> torch.Tensor:
    """uint8 ones [E, R / 64], one a shape and device: every block converts with two multiplies (or NVFP4, where
    it is never read)."""
    key = (device, experts, blocks)
    if key not in _ALL_WIDE:
        _ALL_WIDE[key] = torch.ones(experts, blocks, dtype=torch.uint8, device=device)
    return _ALL_WIDE[key]


def _check_routes(io, sorted_ids, rows_x, rows_out, top_k, activation) -> int:
    """The slots a launch's blocks hold (rows of x or out in block order), its route arguments checked."""
    if io == "dense":
        return rows_x
    if sorted_ids is None or sorted_ids.dtype != torch.int32 or sorted_ids.dim() != 1:
        raise TypeError(f"{io}: sorted_ids must be an int32 vector (the alignment's slots)")
    if io == "gather" and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"gather: top_k must be a positive int; got {top_k!r}")
    if io == "scatter" and (activation is not None or rows_x != sorted_ids.numel()):
        raise ValueError(f"scatter: x must hold the {sorted_ids.numel()} slots in block order (got {rows_x} rows) "
                         "and the GEMM take no activation")  # fmt: skip
    return sorted_ids.numel()


_UNREAD: dict[torch.device, torch.Tensor] = {}


def _unread(device: torch.device) -> torch.Tensor:
    """The float32 [1, 4] stand-in for a GEMM's bias or (its row) global scale where it has none (never read)."""
    if device not in _UNREAD:
        _UNREAD[device] = torch.zeros(1, 4, dtype=torch.float32, device=device)
    return _UNREAD[device]


def dense_fp4_gemm_launch(
    w_panel: torch.Tensor, s_panel: torch.Tensor, x: torch.Tensor, out: torch.Tensor, *, tile_n: int = 256,
    fmt: str = "mxfp4", global_scale: torch.Tensor | None = None, probe: str | None = None,
) -> runtime.Launch:  # fmt: skip
    """``out[n, r] = x[n, :] . bf16(w[r, :] * scale)``: the grouped GEMM with one expert (``w_panel`` ``[K / 64,
    R / 64, 256]``, ``s_panel`` ``[K / 64, b R]``, NVFP4's ``global_scale`` float32 ``[1]``) and ``ceil(N /
    tile_n)`` blocks. The block map it makes lives as long as the launch.

    ``probe`` (:data:`~csf_kernels.moe.engine_specs.ENGINE_PROBES`, MXFP4): launch that diagnostic program of the
    GEMM instead (whole blocks); its ``out`` is wrong by design: for timing beside the GEMM only."""
    n = x.shape[0]
    blocks = max(1, -(-n // tile_n))
    block_expert = torch.zeros(blocks, dtype=torch.int32, device=x.device)
    meta = torch.tensor([blocks], dtype=torch.int32, device=x.device)
    return grouped_fp4_gemm_launch(w_panel[None], s_panel[None], x, out, block_expert, meta, tile_n=tile_n,
                                   fmt=fmt, global_scale=global_scale, probe=probe)  # fmt: skip


def gather_tokens_launch(x: torch.Tensor, route_slots: torch.Tensor, xs: torch.Tensor, *, top_k: int) -> runtime.Launch:
    """FC1's input in block order, token by token: ``xs[route_slots[t * top_k + j]] = x[t]`` for each route with a
    slot in ``[0, slots)`` (``route_slots``: int32 ``[T * top_k]``, the alignment's inverse, -1 for none). Each row
    of ``x`` is read once; other slots are left as they are: a slot's row reaches only that slot's outputs, which
    nothing reads."""
    slots, hidden = xs.shape
    if x.dtype != torch.bfloat16 or xs.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != hidden:
        raise TypeError(f"gather: x must be bf16 [T, {hidden}] like xs's columns; got {x.dtype} {tuple(x.shape)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"gather: top_k must be a positive int; got {top_k!r}")
    tokens = x.shape[0]
    if route_slots.dtype != torch.int32 or route_slots.numel() < tokens * top_k:
        raise ValueError(f"gather: route_slots must be int32 with {tokens * top_k} entries at least")
    spec = engine_gather_tokens_spec()
    grid = (-(-tokens // spec.fact["RT"]), -(-hidden // spec.fact["BH"]))
    return runtime.Launch(spec, grid, (x, route_slots, xs, tokens, hidden, top_k, slots))


def act_launch(
    h: torch.Tensor, block_expert: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor, *,
    num_experts: int, bm: int, activation: str,
) -> runtime.Launch:  # fmt: skip
    """FC2's input ``a [slots, N]`` from FC1's ``h [slots, 2N]`` (bias, then the activation)."""
    inter = a.shape[1]
    if h.shape != (a.shape[0], 2 * inter) or block_expert.numel() * bm < a.shape[0]:
        raise ValueError(f"activation: h {tuple(h.shape)}, a {tuple(a.shape)}, {block_expert.numel()} blocks")
    spec = engine_act_spec(bm, activation, bias is not None)
    grid = (a.shape[0], -(-inter // spec.fact["BN"]))
    b = bias if bias is not None else runtime.placeholder(h.device)
    return runtime.Launch(spec, grid, (h, block_expert, meta, b, a, inter, num_experts))


def combine_launch(
    y: torch.Tensor, bias: torch.Tensor | None, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
    out: torch.Tensor, *, num_experts: int, inverse: torch.Tensor | None = None,
) -> runtime.Launch:  # fmt: skip
    """``out[t] = sum_j w[t, j] * (y[t k + j] + b2[e_j])`` over ``y [pairs, H]`` (FC2's rows at their routes), ``j``
    in order; routes of experts outside [0, E) are skipped (their rows are never stored). With ``inverse`` (int32
    ``[pairs]``, each route's slot: W4A8's FC2 stores in block order), ``y [slots, H]`` and route ``r``'s row is
    ``y[inverse[r]]``."""
    tokens, top_k = topk_ids.shape
    hidden = out.shape[1]
    if topk_weights.dtype != torch.float32 or topk_weights.shape != topk_ids.shape:
        raise ValueError("combine: topk_weights must be float32 like topk_ids' shape")
    if inverse is not None and (inverse.dtype != torch.int32 or inverse.shape != (tokens * top_k,)):
        raise ValueError(f"combine: inverse must be int32 [{tokens * top_k}] (each route's slot)")
    y_rows = y.shape[0] if inverse is not None else tokens * top_k
    if y.dim() != 2 or y.shape != (y_rows, hidden) or out.shape[0] != tokens:
        raise ValueError(f"combine: y {tuple(y.shape)} must hold the {tokens * top_k} routes' rows of out "
                         f"{tuple(out.shape)}")  # fmt: skip
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_ids.is_contiguous():
        raise TypeError("topk_ids must be contiguous int32 or int64")
    spec = engine_combine_spec(topk_ids.dtype == torch.int64, bias is not None, inverse is not None)
    grid = (tokens, -(-hidden // spec.fact["BH"]))
    b = bias if bias is not None else runtime.placeholder(y.device)
    inv = inverse if inverse is not None else runtime.placeholder(y.device)
    return runtime.Launch(spec, grid, (y, inv, b, topk_ids, topk_weights, out, hidden, top_k, num_experts))


def fc1_finish_launch(
    part: torch.Tensor, topk_ids: torch.Tensor, out: torch.Tensor, *, splits: int, activation: str,
    bias: torch.Tensor | None, global_scale: torch.Tensor | None, num_experts: int,
) -> runtime.Launch:  # fmt: skip
    """A split FC1's finish: ``out [pairs, N]`` bf16 (FC2's input, a route's row at its index) = the activation of
    ``sum_s part[s * pairs + route]`` (float32 ``[splits * pairs, 2N]``, ``[gate; up]`` columns:
    ``grouped_fp4_gemm_launch(partial="fc1")``) times NVFP4's ``global_scale`` plus ``bias`` (float32 ``[E, 2N]`` in
    the same ``[gate; up]`` order), splits summed in order; routes of experts outside ``[0, E)`` are skipped."""
    pairs = topk_ids.numel()
    n = out.shape[1]
    if part.dtype != torch.float32 or part.shape != (splits * pairs, 2 * n):
        raise ValueError(f"fc1 finish: partials must be float32 [{splits} x {pairs}, {2 * n}]; got {part.dtype} "
                         f"{tuple(part.shape)}")  # fmt: skip
    if out.dtype != torch.bfloat16 or out.shape[0] != pairs:
        raise ValueError(f"fc1 finish: out must be bf16 [{pairs}, N]; got {out.dtype} {tuple(out.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (num_experts, 2 * n)):
        raise ValueError(f"fc1 finish: bias must be float32 [{num_experts}, {2 * n}] ([gate; up])")
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_ids.is_contiguous():
        raise TypeError("topk_ids must be contiguous int32 or int64")
    fmt = "nvfp4" if global_scale is not None else "mxfp4"
    spec = engine_fc1_finish_spec(activation, bias is not None, fmt, topk_ids.dtype == torch.int64)
    ph = runtime.placeholder(out.device)
    g = global_scale if global_scale is not None else ph
    args = (part, topk_ids, g, bias if bias is not None else ph, out, pairs, n, splits, num_experts)
    return runtime.Launch(spec, (pairs, -(-n // spec.fact["BH"])), args)


def partial_combine_launch(
    part: torch.Tensor, bias: torch.Tensor | None, global_scale: torch.Tensor | None, topk_ids: torch.Tensor,
    topk_weights: torch.Tensor, out: torch.Tensor, *, splits: int, num_experts: int,
) -> runtime.Launch:  # fmt: skip
    """A split FC2's combine: ``out[t] = sum_j w[t, j] * (g[e_j] * sum_s part[s * pairs + t k + j] + b2[e_j])`` over
    the partials (float32 ``[splits * pairs, H]``, ``grouped_fp4_gemm_launch(partial="rows")``), splits and then
    ``j`` in order; routes of experts outside ``[0, E)`` are skipped."""
    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    hidden = out.shape[1]
    if part.dtype != torch.float32 or part.shape != (splits * pairs, hidden):
        raise ValueError(f"combine: partials must be float32 [{splits} x {pairs}, {hidden}]; got {part.dtype} "
                         f"{tuple(part.shape)}")  # fmt: skip
    if topk_weights.dtype != torch.float32 or topk_weights.shape != topk_ids.shape or out.shape[0] != tokens:
        raise ValueError("combine: topk_weights must be float32 like topk_ids, out a row a token")
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_ids.is_contiguous():
        raise TypeError("topk_ids must be contiguous int32 or int64")
    fmt = "nvfp4" if global_scale is not None else "mxfp4"
    spec = engine_partial_combine_spec(bias is not None, fmt, topk_ids.dtype == torch.int64, tokens, top_k)
    ph = runtime.placeholder(out.device)
    args = (out, part, global_scale if global_scale is not None else ph, bias if bias is not None else ph, topk_ids,
            topk_weights, out, hidden, top_k, num_experts, splits, pairs)  # fmt: skip
    return runtime.Launch(spec, (tokens, -(-hidden // spec.fact["BH"])), args)
