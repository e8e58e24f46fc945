"""The engine layer's K splits (``docs/moe-engine.md`` §4.6): few-token calls whose GEMM units would leave SMs idle
run FC1 and FC2 as split GEMMs storing float32 partials, which the existing finishing kernels reduce in split order.

A split call: align; FC1 gathering its routes' rows of ``x`` into partials ``[s1 * pairs, 2N]`` (W13's engine rows
as ``[gate; up]`` columns); FC1's finish (sum, NVFP4's global scale, bias, the activation) into FC2's input
``[pairs, N]`` at the routes' rows; FC2 gathering those rows (``top_k`` 1: a slot's route is its row) into partials
``[s2 * pairs, H]``; the partial combine (sum, global scale, FC2's bias, the routes' weights). A call splits where
either GEMM's split count (:func:`call_splits`) is above one; the other then runs one split (FC2 must read the finish's
route-order rows, and FC1's partials are what the finish reads). Outputs differ from the unsplit layer's in rounding
only (another summation order, FC1's activation by the finish's exact ``exp``).
"""

from __future__ import annotations

import torch

from csf_kernels.moe.engine_panels import ROW_BLOCK
from csf_kernels.moe.engine_specs import (
    ENGINE_SPLIT_TILE_N,
    engine_occupancy,
    engine_schedule,
    engine_split_steps,
)
from csf_kernels.moe.heuristics import ENGINE_SPLIT_MAX_TOKENS, engine_splits
from csf_kernels.moe.launch import max_blocks_for

__all__ = ["call_splits", "finish_bias", "splits_option"]

_TILE_M = 2 * ROW_BLOCK  # weight rows a GEMM unit


def splits_option(splits) -> tuple[int, int] | None:
    """``EngineMoE(splits=...)`` checked: ``None`` (the heuristic), 1 (never split), a count for both GEMMs, or
    ``(fc1, fc2)`` counts."""
    if splits is None:
        return None
    pair = (splits, splits) if not isinstance(splits, tuple) else splits
    if len(pair) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in pair):
        raise ValueError(f"splits must be None, a positive int or an (fc1, fc2) pair of them; got {splits!r}")
    return pair


def call_splits(
    tokens: int, top_k: int, experts: int, hidden: int, inter: int, fmt: str, tile_n: int, *,
    want: tuple[int, int] | None = None, split_layer: bool = True,
) -> tuple[int, int]:  # fmt: skip
    """FC1's and FC2's K splits for a call of ``tokens`` tokens at ``tile_n`` routes a block: ``(1, 1)`` unsplit.
    ``want`` (:func:`splits_option`) forces the counts (refused where the K steps cannot make them);
    ``split_layer`` False (W4A8, or FC1's activation not fused into engine-order rows) never splits. Otherwise
    calls of at most ``ENGINE_SPLIT_MAX_TOKENS`` tokens take the heuristic
    (:func:`csf_kernels.moe.heuristics.engine_splits`) on the call's units (route blocks as the
    alignment may use them x 128-row tiles) at the split programs' CTAs an SM, at the block sizes split programs are
    built for."""
    if not split_layer or tile_n not in ENGINE_SPLIT_TILE_N or want == (1, 1):
        return 1, 1
    k1, k2 = hidden // 64, inter // 64
    if want is not None:
        engine_split_steps(k1, want[0], fmt), engine_split_steps(k2, want[1], fmt)  # refuses what cannot be made
        return want
    if tokens > ENGINE_SPLIT_MAX_TOKENS:
        return 1, 1
    occ = engine_occupancy(tile_n, engine_schedule(tile_n))
    blocks = max_blocks_for(tokens * top_k, experts, tile_n)
    fc1 = engine_splits(blocks * -(-2 * inter // _TILE_M), k1, fmt, occ)
    fc2 = engine_splits(blocks * -(-hidden // _TILE_M), k2, fmt, occ)
    return fc1, fc2


def finish_bias(b13: torch.Tensor) -> torch.Tensor:
    """W13's bias in engine row order (``engine_panels.fc1_engine_rows``: 16-row slabs of 8 gate rows, then their up
    rows) as the finish reads it: ``[gate; up]`` columns, gate ``n`` at ``n``, up ``n`` at ``N + n``."""
    rows = b13.shape[1]
    j = torch.arange(rows, device=b13.device)
    n = (j // 16) * 8 + j % 8
    col = torch.where(j % 16 < 8, n, rows // 2 + n)
    out = torch.empty_like(b13)
    out[:, col] = b13
    return out.contiguous()
