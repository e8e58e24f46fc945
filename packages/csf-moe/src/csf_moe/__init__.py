"""csf-moe: fused MoE layers on Hopper with FP4 experts and CSF-compressed scales.

    plan(geometry, max_tokens, ...) -> prepare_weights(plan, ...) -> bind(plan, weights, scratch)
        -> layer.run(hidden_states, topk_ids, topk_weights)

    plan(geometry, max_tokens, gemm="engine", activations="bf16" | "fp8_per_token")  # the CuTe DSL engine
        -> prepare_engine_weights(plan, ...) -> bind_engine(plan, weights, scratch) -> layer.run(...)

:mod:`csf_moe.expert_parallel` gives one rank of a tensor- or expert-parallel layer its slice and route ids.
Routing helpers compute (topk_weights, topk_ids) as vLLM and SGLang do; :mod:`csf_moe.reference` is
the float32 layer every kernel is tested against.
"""

from .engine_layer import EngineLayer, bind_engine
from .engine_plan import EnginePlan
from .engine_prepare import prepare_engine_weights
from .expert_parallel import LocalRoutes, RankShard, RouteBuffers, local_expert_map, shard_weights
from .layer import MoELayer, bind
from .plan import SCALE_SOURCES, BucketPlan, MoEPlan, plan
from .prefetch import ExpansionPrefetcher
from .routing import fused_topk, grouped_topk
from .weights import MoEWeights, prepare_weights

__all__ = [
    "SCALE_SOURCES",
    "BucketPlan",
    "EngineLayer",
    "EnginePlan",
    "ExpansionPrefetcher",
    "LocalRoutes",
    "MoELayer",
    "MoEPlan",
    "MoEWeights",
    "RankShard",
    "RouteBuffers",
    "bind",
    "bind_engine",
    "fused_topk",
    "grouped_topk",
    "local_expert_map",
    "plan",
    "prepare_engine_weights",
    "prepare_weights",
    "shard_weights",
]
