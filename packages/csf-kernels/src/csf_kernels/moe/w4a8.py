"""Host API of W4A8's programs (issue 47): shapes checked, launches built; the programs come from the AOT cache."""

from __future__ import annotations

import torch

from csf_kernels import runtime
from csf_kernels.moe.fp8_activations import MX_BLOCK
from csf_kernels.moe.w4a8_specs import GATHER_FP8_COLUMNS, gather_fp8_spec

__all__ = ["gather_fp8_launch"]


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
