"""Host API of W4A8's programs (issue 47): shapes checked, launches built; the programs come from the AOT cache."""

from __future__ import annotations

import torch

from csf_kernels import runtime
from csf_kernels.moe.engine_panels import PANEL_STEP_K, ROW_BLOCK
from csf_kernels.moe.fp8_activations import MX_BLOCK
from csf_kernels.moe.w4a8_operands import TILE_ROWS
from csf_kernels.moe.w4a8_specs import GATHER_FP8_COLUMNS, W4A8_TILE_N, gather_fp8_spec, w4a8_gemm_spec
from csf_kernels.runtime.device import num_sms

__all__ = ["gather_fp8_launch", "grouped_w4a8_gemm_launch"]


def gather_fp8_launch(
    x: torch.Tensor, sorted_ids: torch.Tensor, meta: torch.Tensor, xq: torch.Tensor, xscale: torch.Tensor,
    inverse: torch.Tensor, *, top_k: int, bm: int, convention: str,
) -> runtime.Launch:  # fmt: skip
    """FC1's input in block order as FP8: ``xq`` uint8 ``[slots, H]`` (E4M3 bytes) with ``xscale`` float32 ``[slots]``
    (``per_token``) or uint8 ``[slots, H / 32]`` (``mxfp8``, E8M0), and each route's slot in ``inverse [pairs]``."""
    slots, hidden = xq.shape
    pairs = inverse.numel()
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != hidden or xq.dtype != torch.uint8:
        raise TypeError(f"gather: x must be bf16 [T, {hidden}] and xq uint8 [slots, {hidden}]")
    if sorted_ids.numel() != slots or pairs != x.shape[0] * top_k or hidden % MX_BLOCK:
        raise ValueError(f"gather: x {tuple(x.shape)}, xq {tuple(xq.shape)}, {sorted_ids.numel()} slots, {pairs} "
                         f"routes of top-{top_k} disagree (H must be a multiple of {MX_BLOCK})")  # fmt: skip
    spec = gather_fp8_spec(bm, convention)
    if convention == "per_token":
        want, grid = (torch.float32, (slots,)), (slots,)
    else:
        want, grid = (torch.uint8, (slots, hidden // MX_BLOCK)), (slots, -(-hidden // GATHER_FP8_COLUMNS["mxfp8"]))
    if (xscale.dtype, tuple(xscale.shape)) != want:
        raise ValueError(f"gather: {convention} scales must be {want[0]} {list(want[1])}; got {xscale.dtype} "
                         f"{list(xscale.shape)}")  # fmt: skip
    args = (x, sorted_ids, meta, xq, xscale, inverse, hidden, top_k, pairs)
    return runtime.Launch(spec, grid, args)


def grouped_w4a8_gemm_launch(
    w_panel: torch.Tensor, s_panel: torch.Tensor, bases: torch.Tensor, flags: torch.Tensor, xq: torch.Tensor,
    xscale: torch.Tensor, out: torch.Tensor, block_expert: torch.Tensor, meta: torch.Tensor, *, tile_n: int,
    activation: str | None = None, bias: torch.Tensor | None = None,
) -> runtime.Launch:  # fmt: skip
    """Route block ``b < meta[0]`` (rows ``b * tile_n ..`` of ``xq`` and ``out``) times expert ``block_expert[b]`` on
    FP8 tensor cores: ``out[row, r] = xscale[row] * 2 ** (bases[e, r] - 127) * (e4m3(xq[row]) . w4a8(w[e, r]))``
    (:mod:`csf_kernels.moe.kernels.engine_gemm_fp8`): ``w_panel`` uint64 ``[E, K / 64, R / 64, 256]``
    (:func:`csf_kernels.moe.w4a8_panels.w4a8_weight_panel`), ``s_panel`` uint8 ``[E, K / 64, 2 R]`` (the MXFP4 scale
    panel), ``bases`` uint8 ``[E, R]``, ``flags`` uint8 ``[E, ceil(R / 128)]`` (:mod:`~csf_kernels.moe.w4a8_panels`),
    ``xq`` uint8 ``[NX, K]`` E4M3 bytes with per-token ``xscale`` float32 ``[NX]``, ``out`` bf16 ``[NX, R]``.
    ``activation`` and ``bias`` as :func:`csf_kernels.moe.engine.grouped_fp4_gemm_launch` (``out`` ``[NX, R / 2]``,
    W13's rows in engine order)."""
    if tile_n not in W4A8_TILE_N:
        raise ValueError(f"tile_n must be one of {W4A8_TILE_N}; got {tile_n}")
    if xq.dtype != torch.uint8 or xq.dim() != 2 or out.dtype != torch.bfloat16 or out.dim() != 2:
        raise TypeError("xq must be 2-D uint8 (E4M3 bytes) and out 2-D bf16")
    if block_expert.dtype != torch.int32 or meta.dtype != torch.int32 or block_expert.dim() != 1 or meta.numel() < 1:
        raise TypeError("block_expert and meta must be int32 vectors (meta holds at least the block count)")
    rows_x, k = xq.shape
    experts, steps, blocks = w_panel.shape[:3]
    rows = blocks * ROW_BLOCK
    if w_panel.dtype != torch.uint64 or w_panel.dim() != 4 or k != steps * PANEL_STEP_K:
        raise ValueError(f"weight panel {w_panel.dtype} {tuple(w_panel.shape)} and xq {tuple(xq.shape)} disagree "
                         "(uint64 [E, K / 64, R / 64, 256])")  # fmt: skip
    wants = {
        "s_panel": (s_panel, torch.uint8, (experts, steps, 2 * rows)),
        "bases": (bases, torch.uint8, (experts, rows)),
        "flags": (flags, torch.uint8, (experts, -(-rows // TILE_ROWS))),
        "xscale": (xscale, torch.float32, (rows_x,)),
    }
    for name, (t, dtype, shape) in wants.items():
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {dtype} {list(shape)}; got {t.dtype} {list(t.shape)}")
    if bias is not None and (activation is None or bias.dtype != torch.float32 or bias.shape != (experts, rows)):
        raise ValueError(f"bias must be float32 [{experts}, {rows}] and come with an activation")
    out_cols = rows if activation is None else rows // 2
    if out.shape != (rows_x, out_cols):
        raise ValueError(f"out {tuple(out.shape)} must be [{rows_x}, {out_cols}]")
    units = -(-rows // TILE_ROWS) * min(block_expert.numel(), -(-rows_x // tile_n))
    ctas = max(1, min(num_sms(xq.device), units))
    spec = w4a8_gemm_spec(tile_n, activation, bias is not None)
    b = bias if bias is not None else torch.zeros(1, 4, dtype=torch.float32, device=xq.device)
    args = (w_panel, s_panel, bases, flags, xq, xscale, out, b, block_expert, meta, ctas)
    return runtime.Launch(spec, (ctas, 1, 1), args)
