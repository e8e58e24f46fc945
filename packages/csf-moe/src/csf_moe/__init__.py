"""csf-moe: fused MoE layers on Hopper with FP4 experts and CSF-compressed scales.

    plan(geometry, max_tokens, ...) -> prepare_weights(plan, ...) -> bind(plan, weights, scratch)
        -> layer.run(hidden_states, topk_ids, topk_weights)

Routing helpers compute (topk_weights, topk_ids) as vLLM and SGLang do; :mod:`csf_moe.reference` is
the float32 layer every kernel is tested against.
"""

from .layer import MoELayer, bind
from .plan import SCALE_SOURCES, BucketPlan, MoEPlan, plan
from .prefetch import ExpansionPrefetcher
from .routing import fused_topk, grouped_topk
from .weights import MoEWeights, prepare_weights

__all__ = [
    "SCALE_SOURCES",
    "BucketPlan",
    "ExpansionPrefetcher",
    "MoELayer",
    "MoEPlan",
    "MoEWeights",
    "bind",
    "fused_topk",
    "grouped_topk",
    "plan",
    "prepare_weights",
]
