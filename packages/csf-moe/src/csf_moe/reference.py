"""The float32 torch reference of a fused MoE layer: what every csf-moe kernel is tested against.

    y[t] = sum_j topk_weights[t, j] * W2[e_j] @ act(W13[e_j] @ x[t] + b13[e_j]) + b2[e_j]

with FP4 expert weights dequantized exactly (csf_codec.quantize), routes whose id lies outside
[0, E) (vLLM's CUDA-graph padding) contributing nothing, and the activations the supported models use:

* ``silu``: W13 rows are [gate; up] (first N rows gate, next N up); act = silu(gate) * up;
* ``swiglu_oai``: gpt-oss's clamped SwiGLU with W13 rows interleaved (gate, up, gate, up, ...):
  gate = min(gate, limit), up = clamp(up, -limit, limit), act = gate * sigmoid(alpha * gate) * (up + 1),
  alpha 1.702, limit 7.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec.quantize import dequantize_mxfp4, dequantize_nvfp4

__all__ = ["ExpertWeights", "QuantizedExperts", "activation", "interleave_gate_up", "moe_reference"]

SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


@dataclass(frozen=True, kw_only=True)
class ExpertWeights:
    """Dequantized (float32) expert weights of one layer: W13 [E, 2N, H], W2 [E, H, N], optional biases."""

    w13: torch.Tensor
    w2: torch.Tensor
    b13: torch.Tensor | None = None  # [E, 2N]
    b2: torch.Tensor | None = None  # [E, H]

    @property
    def experts(self) -> int:
        return self.w13.shape[0]

    def expert(self, e: int) -> tuple[torch.Tensor, ...]:
        b13 = None if self.b13 is None else self.b13[e]
        b2 = None if self.b2 is None else self.b2[e]
        return self.w13[e], self.w2[e], b13, b2


@dataclass(frozen=True, kw_only=True)
class QuantizedExperts:
    """FP4 expert weights dequantized one expert at a time (full layers do not fit in float32).

    ``fmt`` 'mxfp4' or 'nvfp4'; values uint8 [E, R, K/2]; scales uint8 [E, R, K/bs]; NVFP4 global
    scales float32 [E]; W13 rows in the activation's layout (see the module docstring)."""

    fmt: str
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w13_global_scale: torch.Tensor | None = None
    w2_global_scale: torch.Tensor | None = None
    b13: torch.Tensor | None = None
    b2: torch.Tensor | None = None

    @property
    def experts(self) -> int:
        return self.w13.shape[0]

    def _dequant(self, values, scales, g, e):
        if self.fmt == "mxfp4":
            return dequantize_mxfp4(values[e], scales[e])
        return dequantize_nvfp4(values[e], scales[e], g[e])

    def expert(self, e: int) -> tuple[torch.Tensor, ...]:
        b13 = None if self.b13 is None else self.b13[e]
        b2 = None if self.b2 is None else self.b2[e]
        w13 = self._dequant(self.w13, self.w13_scale, self.w13_global_scale, e)
        w2 = self._dequant(self.w2, self.w2_scale, self.w2_global_scale, e)
        return w13, w2, b13, b2


def interleave_gate_up(t: torch.Tensor | None) -> torch.Tensor | None:
    """W13-shaped [E, 2N, ...] rows [gate; up] -> (gate, up, gate, up, ...), the layout ``swiglu_oai`` reads."""
    if t is None:
        return None
    gate, up = t.chunk(2, dim=1)
    return torch.stack((gate, up), dim=2).flatten(1, 2)


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """[.., 2N] -> [.., N] in float32."""
    x = x.float()
    if kind == "silu":
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    if kind == "swiglu_oai":
        gate, up = x[..., ::2], x[..., 1::2]
        gate = gate.clamp(max=SWIGLU_OAI_LIMIT)
        up = up.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
        return gate * torch.sigmoid(SWIGLU_OAI_ALPHA * gate) * (up + 1)
    raise ValueError(f"unknown MoE activation {kind!r}: expected 'silu' or 'swiglu_oai'")


def moe_reference(
    hidden: torch.Tensor,
    weights: ExpertWeights | QuantizedExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    kind: str = "silu",
) -> torch.Tensor:
    """float32 [T, H] output of the layer (see the module docstring)."""
    if hidden.dim() != 2 or topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)}, topk_ids {tuple(topk_ids.shape)} and topk_weights "
            f"{tuple(topk_weights.shape)} do not describe the same tokens"
        )
    x = hidden.float()
    out = torch.zeros(x.shape[0], weights.w2.shape[1], dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    live = (ids >= 0) & (ids < weights.experts)
    for e in torch.unique(ids[live]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w13, w2, b13, b2 = weights.expert(e)
        h = x[tok] @ w13.float().T
        if b13 is not None:
            h = h + b13.float()
        y = activation(h, kind) @ w2.float().T
        if b2 is not None:
            y = y + b2.float()
        out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
    return out
