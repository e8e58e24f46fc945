"""Routing helpers match a per-token reference written from the models' definitions."""

from __future__ import annotations

import pytest
import torch

from csf_moe.routing import fused_topk, grouped_topk


def _fresh(tokens: int, experts: int) -> torch.Tensor:
    return torch.randn(tokens, experts, generator=torch.Generator().manual_seed(torch.seed() % 2**31)) * 3


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_fused_topk_per_token(scoring, renormalize):
    logits = _fresh(37, 64)
    w, ids = fused_topk(logits, 6, renormalize=renormalize, scoring=scoring)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (37, 6)
    for t in range(37):
        s = logits[t].softmax(-1) if scoring == "softmax" else logits[t].sigmoid()
        order = sorted(range(64), key=lambda e: -float(s[e]))[:6]
        # the top six by score, in order; experts whose float32 scores tie (sigmoid saturates near 1: about one
        # run in a hundred) may come in either order, as from torch.topk
        assert len(set(ids[t].tolist())) == 6 and torch.equal(s[ids[t].long()], s[order]), (ids[t], order)
        want = s[order] / (s[order].sum() if renormalize else 1.0)
        torch.testing.assert_close(w[t], want)


def test_grouped_topk_matches_deepseek_v3_definition():
    tokens, experts, groups, topk_group, k = 29, 256, 8, 4, 8
    logits = _fresh(tokens, experts)
    bias = torch.randn(experts) * 0.5
    w, ids = grouped_topk(
        logits,
        k,
        num_expert_group=groups,
        topk_group=topk_group,
        renormalize=True,
        scoring="sigmoid",
        e_score_correction_bias=bias,
        routed_scaling_factor=2.5,
    )
    per = experts // groups
    for t in range(tokens):
        s = logits[t].sigmoid()
        b = s + bias
        group_score = [sum(sorted(b[g * per : (g + 1) * per].tolist(), reverse=True)[:2]) for g in range(groups)]
        chosen = sorted(range(groups), key=lambda g: -group_score[g])[:topk_group]
        eligible = [e for e in range(experts) if e // per in chosen]
        order = sorted(eligible, key=lambda e: -float(b[e]))[:k]
        assert sorted(ids[t].tolist()) == sorted(order)
        want = s[ids[t].long()] / s[ids[t].long()].sum() * 2.5  # weights: unbiased scores
        torch.testing.assert_close(w[t], want)


def test_grouped_topk_without_bias_ranks_groups_by_their_best_expert():
    logits = _fresh(16, 64)
    w, ids = grouped_topk(logits, 4, num_expert_group=8, topk_group=2, renormalize=False)
    s = logits.softmax(-1)
    for t in range(16):
        best = s[t].view(8, 8).max(-1).values
        chosen = set(best.topk(2).indices.tolist())
        assert {e // 8 for e in ids[t].tolist()} <= chosen
        torch.testing.assert_close(w[t], s[t][ids[t].long()])


def test_bad_routing_arguments_are_refused():
    logits = _fresh(4, 16)
    with pytest.raises(ValueError, match="top_k"):
        fused_topk(logits, 17, renormalize=True)
    with pytest.raises(ValueError, match="scoring"):
        fused_topk(logits, 2, renormalize=True, scoring="relu")
    with pytest.raises(ValueError, match="groups"):
        grouped_topk(logits, 2, num_expert_group=3, topk_group=1, renormalize=True)
    with pytest.raises(ValueError, match="eligible"):
        grouped_topk(logits, 5, num_expert_group=4, topk_group=1, renormalize=True)
