"""Routing as vLLM and SGLang compute it, so csf-moe takes the engines' (topk_weights, topk_ids).

* :func:`fused_topk`: softmax (Mixtral, Qwen, gpt-oss) or sigmoid scores, top-k, optional renormalisation;
* :func:`grouped_topk`: DeepSeek-V3-style group-limited routing (experts in ``num_expert_group`` groups,
  only the best ``topk_group`` groups eligible, optional score-correction bias that steers selection but
  not the weights, a routed scaling factor).

Weights come back as float32 and ids as int32, the dtypes the engines hand to their MoE kernels.
"""

from __future__ import annotations

import torch

__all__ = ["fused_topk", "grouped_topk", "scores"]


def scores(router_logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Per-expert scores in float32: ``softmax`` over experts, or an independent ``sigmoid`` per expert."""
    logits = router_logits.float()
    if scoring == "softmax":
        return torch.softmax(logits, dim=-1)
    if scoring == "sigmoid":
        return torch.sigmoid(logits)
    raise ValueError(f"unknown scoring function {scoring!r}: expected 'softmax' or 'sigmoid'")


def _check(router_logits: torch.Tensor, top_k: int) -> None:
    if router_logits.dim() != 2:
        raise ValueError(f"router logits must be [tokens, experts], got {tuple(router_logits.shape)}")
    if not 0 < top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k={top_k} must lie in [1, {router_logits.shape[1]}] (the number of experts)")


def fused_topk(
    router_logits: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token: (weights float32 [T, k], ids int32 [T, k]), best first."""
    _check(router_logits, top_k)
    weights, ids = torch.topk(scores(router_logits, scoring), k=top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def grouped_topk(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    scoring: str = "softmax",
    e_score_correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 group-limited routing: (weights float32 [T, k], ids int32 [T, k]).

    A group's score is its best expert's score, or, with a correction bias, the sum of its two best
    biased scores. Only experts in the ``topk_group`` best groups are eligible; the bias (if any) ranks
    experts but the weights are the unbiased scores.
    """
    _check(router_logits, top_k)
    tokens, experts = router_logits.shape
    if experts % num_expert_group or not 0 < topk_group <= num_expert_group:
        raise ValueError(f"{experts} experts do not split into {num_expert_group} groups, or topk_group={topk_group}")
    per_group = experts // num_expert_group
    if top_k > topk_group * per_group:
        raise ValueError(f"top_k={top_k} exceeds the {topk_group * per_group} experts of the eligible groups")
    original = scores(router_logits, scoring)
    ranked = original if e_score_correction_bias is None else original + e_score_correction_bias.float()[None, :]
    grouped = ranked.view(tokens, num_expert_group, per_group)
    if e_score_correction_bias is None:
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)
    best_groups = torch.topk(group_scores, k=topk_group, dim=-1).indices
    eligible = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    eligible = eligible.unsqueeze(-1).expand(tokens, num_expert_group, per_group).reshape(tokens, experts)
    ids = torch.topk(ranked.masked_fill(~eligible, float("-inf")), k=top_k, dim=-1).indices
    weights = original.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, ids.to(torch.int32)
