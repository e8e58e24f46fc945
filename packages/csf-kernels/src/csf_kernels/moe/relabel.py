"""The decode GEMM's relabelled K order, for activations stored in it (wgmma programs with ``XR``).

The decode GEMM gives each thread of a quad the weights of one contiguous K range per step (see
``kernels/moe_gemm_decode.py``): within a step of ``k_step`` columns (128 MXFP4, 64 NVFP4) the operand's
logical column ``L`` holds the actual column

    a(L) = (k_step / 4) * t + 8 q + 4 i2 + 2 i1 + i0,   L = 16 (2 q + i2) + 8 i1 + 2 t + i0

(``t`` the quad lane, ``q`` the thread's weight word, ``i`` the weight within it). Activations stored in this
order (rows padded with zeros to whole steps) are copied by the wgmma programs straight into their operand.
Nothing here imports triton; the kernels compute the same map (``moe_relabel``, ``moe_fc1_finish``).
"""

from __future__ import annotations

import torch

from csf_codec import ScaleFormat

__all__ = ["k_step", "padded_k", "relabel_reference"]


def k_step(fmt: ScaleFormat) -> int:
    """Columns per decode-GEMM K step: 4 scale blocks (128 MXFP4, 64 NVFP4)."""
    return 4 * fmt.block_size


def padded_k(k: int, fmt: ScaleFormat) -> int:
    """A relabelled row's length: ``k`` rounded up to whole K steps."""
    step = k_step(fmt)
    return -(-k // step) * step


def relabel_reference(x: torch.Tensor, fmt: ScaleFormat) -> torch.Tensor:
    """``x`` [rows, K] in the relabelled order, [rows, padded_k(K)] (the padding zero), by reshapes: the same
    permutation the GEMM's ``_logical_k`` applies to a step's activations in registers."""
    rows, k = x.shape
    step, kp = k_step(fmt), padded_k(k, fmt)
    q = step // 32
    padded = torch.nn.functional.pad(x, (0, kp - k))
    v = padded.view(rows, kp // step, 4, q, 2, 2, 2).permute(0, 1, 3, 4, 5, 2, 6)
    return v.reshape(rows, kp).contiguous()
