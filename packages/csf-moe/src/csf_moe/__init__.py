"""csf-moe: fused MoE layers on Hopper with FP4 experts and CSF-compressed scales.

    plan(geometry, max_tokens, ...) -> prepare_weights(plan, ...) -> bind(plan, weights, scratch)
        -> layer.run(hidden_states, topk_ids, topk_weights)

:mod:`csf_moe.expert_parallel` gives one rank of a tensor- or expert-parallel layer its slice and route ids.
Routing helpers compute (topk_weights, topk_ids) as vLLM and SGLang do; :mod:`csf_moe.reference` is
the float32 layer every kernel is tested against.
"""

from .expert_parallel import LocalRoutes, RankShard, RouteBuffers, local_expert_map, shard_weights
from .layer import MoELayer, bind
from .plan import SCALE_SOURCES, BucketPlan, MoEPlan, plan
from .prefetch import ExpansionPrefetcher
from .routing import fused_topk, grouped_topk
from .weights import MoEWeights, prepare_weights

__all__ = [
    "SCALE_SOURCES",
    "BucketPlan",
    "ExpansionPrefetcher",
    "LocalRoutes",
    "MoELayer",
    "MoEPlan",
    "MoEWeights",
    "RankShard",
    "RouteBuffers",
    "bind",
    "fused_topk",
    "grouped_topk",
    "local_expert_map",
    "plan",
    "prepare_weights",
    "shard_weights",
]
