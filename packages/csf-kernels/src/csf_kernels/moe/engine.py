"""Host API of the MoE engine's programs (``docs/moe-engine.md``): shapes checked, launches built, nothing compiled
while frozen (the programs come from the AOT cache like every other)."""

from __future__ import annotations

import torch

from csf_kernels import runtime
from csf_kernels.moe.engine_panels import PANEL_STEP_K, ROW_BLOCK
from csf_kernels.moe.engine_specs import ENGINE_DENSE_TILE_N, ENGINE_TILE_M, engine_dense_spec
from csf_kernels.runtime.device import num_sms

__all__ = ["dense_fp4_gemm_launch"]


def dense_fp4_gemm_launch(
    w_panel: torch.Tensor, s_panel: torch.Tensor, x: torch.Tensor, out: torch.Tensor, *, tile_n: int = 256
) -> runtime.Launch:
    """``out[n, r] = x[n, :] . bf16(w[r, :] * scale)``: the engine's dense GEMM over panels from
    :mod:`csf_kernels.moe.engine_panels` (``w_panel`` uint64 ``[K / 64, R / 64, 256]``, ``s_panel`` uint8
    ``[K / 64, 2 R]``), ``x`` bf16 ``[N, K]``, ``out`` bf16 ``[N, R]``. ``R`` is a multiple of 64 (a row block);
    a last tile of 64 rows reads zeros past the panels' end and stores nothing there."""
    if tile_n not in ENGINE_DENSE_TILE_N:
        raise ValueError(f"tile_n must be one of {ENGINE_DENSE_TILE_N}; got {tile_n}")
    if x.dtype != torch.bfloat16 or out.dtype != torch.bfloat16 or x.dim() != 2 or out.dim() != 2:
        raise TypeError("x and out must be 2-D bf16 tensors")
    n, k = x.shape
    rows = out.shape[1]
    steps, blocks = w_panel.shape[0], w_panel.shape[1]
    if out.shape[0] != n or k != steps * PANEL_STEP_K or rows != blocks * ROW_BLOCK:
        raise ValueError(
            f"shapes disagree: x {tuple(x.shape)}, out {tuple(out.shape)}, weight panel {tuple(w_panel.shape)} "
            "(K = 64 x steps, R = 64 x row blocks)"
        )
    if tuple(s_panel.shape) != (steps, 2 * rows):
        raise ValueError(f"scale panel {tuple(s_panel.shape)} is not [{steps}, {2 * rows}]")
    tiles = -(-rows // ENGINE_TILE_M) * -(-n // tile_n)
    ctas = max(1, min(num_sms(x.device), tiles))
    return runtime.Launch(engine_dense_spec(tile_n), (1, 1, ctas), (w_panel, s_panel, x, out, ctas))
