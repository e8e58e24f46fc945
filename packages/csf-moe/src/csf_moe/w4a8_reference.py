"""The float32 reference of a W4A8 MoE layer (issue 47): the layer computed from exactly the operands the FP8 engine
multiplies, so that its kernel can be held to float32 accumulation rounding and its accuracy trade measured.

Per GEMM (FC1 on the tokens' rows, FC2 on each route's activated row):

* activations quantized to E4M3 by a convention of :mod:`csf_kernels.moe.fp8_activations`: ``per_token`` (one
  float32 scale a row, applied in the epilogue) or ``mxfp8`` (an E8M0 exponent per 32 along K, applied to each k32
  partial: exact powers of two, folded into the operand here);
* MXFP4 weights as :mod:`csf_kernels.moe.w4a8_operands` gives them against per-row bases: E4M3 bytes, folded blocks
  carrying their offset, promoted blocks scaled by ``2**(s - b)``; the row's ``2**(b - 127)`` in the epilogue;
* ``acc = A @ W.T`` in float32, then ``acc * 2**(b - 127) * token scale`` and the bias, as the epilogue.

FC2's input is the activation of FC1's output rounded as the layer stores it (``intermediate``: bf16, after FC1's
bf16 output with ``fused_activation=False``, the activation pass; ``None``: float32), quantized per route row
(per-token: the route's amax over all N outputs; MXFP8: per 32 outputs). E4M3 amplifies a rounding difference
before it: an amax one bf16 step apart moves a row's whole grid, which at one token is percents of the output.
Everything else follows :func:`csf_moe.reference.moe_reference`: routes
outside [0, E) contribute nothing, the top-k weighted sum is float32. Every power-of-two factor is exact, so this
equals the W4A16 layer evaluated on the FP8-rounded activations, up to float32 rounding: the weights lose nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec.rowbase import row_bases
from csf_kernels.moe.fp8_activations import dequantize_fp8, quantize_activations
from csf_kernels.moe.w4a8_operands import row_factor, w4a8_weights

from .reference import QuantizedExperts, activation

__all__ = ["W4A8Expert", "W4A8Experts", "w4a8_moe_reference"]


@dataclass(frozen=True, kw_only=True)
class W4A8Expert:
    """One expert's FP8-engine operands: ``w13`` [2N, H] and ``w2`` [H, N] float32 (E4M3 values, promoted blocks
    times their factor), the epilogue's row factors ``f13`` [2N] and ``f2`` [H], float32 biases."""

    w13: torch.Tensor
    f13: torch.Tensor
    w2: torch.Tensor
    f2: torch.Tensor
    b13: torch.Tensor | None
    b2: torch.Tensor | None


@dataclass(frozen=True, kw_only=True)
class W4A8Experts:
    """MXFP4 experts with their row bases (uint8 [E, 2N] and [E, H]; by default the codec's, ``csf_codec.rowbase``),
    turned into FP8-engine operands one expert at a time."""

    quantized: QuantizedExperts
    w13_bases: torch.Tensor
    w2_bases: torch.Tensor

    @classmethod
    def of(cls, quantized: QuantizedExperts) -> W4A8Experts:
        if quantized.fmt != "mxfp4":
            raise NotImplementedError(f"W4A8 folds MXFP4 weights exactly; {quantized.fmt} does not fold (see the docs)")

        def bases(scales: torch.Tensor) -> torch.Tensor:
            return row_bases(scales.reshape(-1, scales.shape[-1]), 1).view(scales.shape[:-1])

        return cls(quantized=quantized, w13_bases=bases(quantized.w13_scale), w2_bases=bases(quantized.w2_scale))

    @property
    def experts(self) -> int:
        return self.quantized.experts

    @property
    def hidden(self) -> int:
        return self.quantized.w2.shape[1]

    def expert(self, e: int) -> W4A8Expert:
        q = self.quantized
        w13 = w4a8_weights(q.w13[e], q.w13_scale[e], self.w13_bases[e])
        w2 = w4a8_weights(q.w2[e], q.w2_scale[e], self.w2_bases[e])
        return W4A8Expert(
            w13=w13.operand(),
            f13=row_factor(self.w13_bases[e]),
            w2=w2.operand(),
            f2=row_factor(self.w2_bases[e]),
            b13=None if q.b13 is None else q.b13[e].float(),
            b2=None if q.b2 is None else q.b2[e].float(),
        )


def _fp8_gemm(a: torch.Tensor, w: torch.Tensor, f: torch.Tensor, convention: str) -> torch.Tensor:
    """float32 ``a @ W.T`` as the FP8 engine computes it: ``a`` quantized, the accumulator scaled in the epilogue."""
    q, scale = quantize_activations(a, convention)
    if convention == "per_token":
        return (dequantize_fp8(q, torch.ones_like(scale), convention) @ w.T) * f * scale[:, None]
    return (dequantize_fp8(q, scale, convention) @ w.T) * f  # MXFP8's exponents: exact, per k32 partial


def w4a8_moe_reference(
    hidden: torch.Tensor,
    weights: W4A8Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    kind: str = "silu",
    convention: str = "per_token",
    intermediate: torch.dtype | None = torch.bfloat16,
    fused_activation: bool = True,
) -> torch.Tensor:
    """float32 [T, H] output of the W4A8 layer (see the module docstring). ``weights`` may be any object with
    ``experts``, ``hidden`` and ``expert(e) -> W4A8Expert`` (a caller may keep expert operands it reuses)."""
    if hidden.dim() != 2 or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)}, topk_ids {tuple(topk_ids.shape)} and topk_weights "
            f"{tuple(topk_weights.shape)} do not describe the same tokens"
        )
    x = hidden.float()
    out = torch.zeros(x.shape[0], weights.hidden, dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    live = (ids >= 0) & (ids < weights.experts)
    for e in torch.unique(ids[live]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w = weights.expert(e)
        h = _fp8_gemm(x[tok], w.w13, w.f13, convention)
        if w.b13 is not None:
            h = h + w.b13
        y = _fp8_gemm(_stored(h, kind, intermediate, fused_activation), w.w2, w.f2, convention)
        if w.b2 is not None:
            y = y + w.b2
        out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
    return out


def _stored(h: torch.Tensor, kind: str, dtype: torch.dtype | None, fused: bool) -> torch.Tensor:
    """FC1's activated output as the layer stores it for FC2's quantization (float32 values)."""
    if dtype is None:
        return activation(h, kind)
    if not fused:  # the GEMM stores h, the activation pass reads it
        h = h.to(dtype).float()
    return activation(h, kind).to(dtype).float()
