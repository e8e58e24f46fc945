"""Host API of W4A8's programs (issue 47): shapes checked, launches built; the programs come from the AOT cache."""

from __future__ import annotations

import torch

from csf_kernels import runtime
from csf_kernels.moe.engine_panels import PANEL_STEP_K, ROW_BLOCK
from csf_kernels.moe.fp8_activations import MX_BLOCK
from csf_kernels.moe.w4a8_operands import TILE_ROWS
from csf_kernels.moe.w4a8_specs import (
    FP8_COLUMNS,
    W4A8_TILE_N,
    gather_fp8_spec,
    quantize_rows_fp8_spec,
    w4a8_gemm_spec,
)
from csf_kernels.runtime.device import num_sms

__all__ = ["gather_fp8_launch", "grouped_w4a8_gemm_launch", "quantize_rows_fp8_launch"]


def _fp8_operands(what: str, rows_in: torch.Tensor, xq: torch.Tensor, xscale: torch.Tensor, convention: str):
    """``xq``'s (slots, columns) once checked against the bf16 rows it quantizes and the convention's scales."""
    slots, hidden = xq.shape
    if rows_in.dtype != torch.bfloat16 or rows_in.dim() != 2 or rows_in.shape[1] != hidden or xq.dtype != torch.uint8:
        raise TypeError(f"{what}: the rows must be bf16 [n, {hidden}] and xq uint8 [slots, {hidden}]; got "
                        f"{rows_in.dtype} {tuple(rows_in.shape)} and {xq.dtype}")  # fmt: skip
    if hidden % MX_BLOCK:
        raise ValueError(f"{what}: {hidden} columns are not a multiple of {MX_BLOCK}")
    if not (rows_in.is_contiguous() and xq.is_contiguous() and xscale.is_contiguous()):
        raise ValueError(f"{what}: the rows, xq and xscale must be contiguous (the programs step rows by {hidden})")
    if convention == "per_token":
        want = (torch.float32, (slots,))
    elif convention == "mxfp8":
        want = (torch.uint8, (slots, hidden // MX_BLOCK))
    else:
        raise ValueError(f"{what}: unknown activation convention {convention!r}")
    if (xscale.dtype, tuple(xscale.shape)) != want:
        raise ValueError(f"{what}: {convention} scales must be {want[0]} {list(want[1])}; got {xscale.dtype} "
                         f"{list(xscale.shape)}")  # fmt: skip
    return slots, hidden


def gather_fp8_launch(
    x: torch.Tensor, route_slots: torch.Tensor, xq: torch.Tensor, xscale: torch.Tensor, *, top_k: int,
    convention: str,
) -> runtime.Launch:  # fmt: skip
    """FC1's input in block order as FP8, token by token: ``xq[s]`` uint8 ``[slots, H]`` (E4M3 bytes) and its scale
    ``xscale[s]`` (float32 ``[slots]``, ``per_token``; uint8 ``[slots, H / 32]``, ``mxfp8``: E8M0) quantize ``x[t]``
    for each route ``t * top_k + j`` with a slot ``s = route_slots[t * top_k + j]`` in ``[0, slots)``
    (``route_slots``: int32 ``[T * top_k]``, the alignment's inverse, -1 for none). Each row of ``x`` is read and
    quantized once; slots without a route are left as they are (``docs/moe-engine.md`` §8.2: nothing reads them)."""
    slots, hidden = _fp8_operands("gather", x, xq, xscale, convention)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"gather: top_k must be a positive int; got {top_k!r}")
    tokens = x.shape[0]
    if route_slots.dtype != torch.int32 or route_slots.numel() < tokens * top_k or not route_slots.is_contiguous():
        raise ValueError(f"gather: route_slots must be contiguous int32 with {tokens * top_k} entries at least")
    spec = gather_fp8_spec(convention)
    grid = (-(-tokens // spec.fact["RT"]),)
    if convention == "mxfp8":
        grid += (-(-hidden // FP8_COLUMNS[convention]),)
    return runtime.Launch(spec, grid, (x, route_slots, xq, xscale, tokens, hidden, top_k, slots))


def quantize_rows_fp8_launch(
    a: torch.Tensor, meta: torch.Tensor, xq: torch.Tensor, xscale: torch.Tensor, *, bm: int, convention: str
) -> runtime.Launch:
    """FC2's input as FP8 where it lies: row ``s`` of ``a`` (bf16 ``[slots, N]``, FC1's output in block order)
    quantized into ``xq[s]`` and ``xscale[s]`` (as :func:`gather_fp8_launch`'s) for the rows of the blocks in use,
    ``s < meta[0] * bm`` (device data); the rows past them are left as they are."""
    slots, hidden = _fp8_operands("quantize", a, xq, xscale, convention)
    if a.shape[0] != slots:
        raise ValueError(f"quantize: a has {a.shape[0]} rows, xq {slots}")
    if meta.dtype != torch.int32 or meta.numel() < 1:
        raise TypeError("quantize: meta must be int32 holding the block count")
    if isinstance(bm, bool) or not isinstance(bm, int) or bm < 1:
        raise ValueError(f"quantize: bm must be a positive int; got {bm!r}")
    spec = quantize_rows_fp8_spec(convention)
    grid = (slots,) if convention == "per_token" else (slots, -(-hidden // FP8_COLUMNS[convention]))
    return runtime.Launch(spec, grid, (a, meta, xq, xscale, hidden, bm))


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
