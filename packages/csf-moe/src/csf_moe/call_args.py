"""The checks every MoE layer's ``run`` makes on its arguments before anything launches (the Triton layer,
:class:`csf_moe.MoELayer`, and the engine's, :class:`csf_moe.engine_layer.EngineLayer`): one place, one wording."""

from __future__ import annotations

import torch

__all__ = ["checked_output"]


def checked_output(
    plan, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor | None
) -> torch.Tensor:
    """The call's output, ``out`` or a new tensor like ``hidden_states``, after checking that ``hidden_states`` is
    bf16 ``[T, H]``, ``topk_ids`` and ``topk_weights`` ``[T, top_k]``, ``T`` within the plan's ``max_tokens``, and
    ``out`` (when given) contiguous bf16 ``[T, H]``. Raises ``ValueError`` naming what is wrong."""
    geo = plan.geometry
    if hidden_states.dim() != 2 or hidden_states.shape[1] != geo.hidden or hidden_states.dtype != torch.bfloat16:
        raise ValueError(f"hidden_states must be bf16 [T, {geo.hidden}], got {hidden_states.dtype} "
                         f"{tuple(hidden_states.shape)}")  # fmt: skip
    t = hidden_states.shape[0]
    if tuple(topk_ids.shape) != (t, plan.top_k) or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must be [{t}, {plan.top_k}], got {tuple(topk_ids.shape)} and "
                         f"{tuple(topk_weights.shape)}")  # fmt: skip
    if t > plan.max_tokens:
        plan.bucket_for(t)  # raises, saying so
    if out is None:
        return torch.empty_like(hidden_states)
    if out.shape != hidden_states.shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 {tuple(hidden_states.shape)}")
    return out
