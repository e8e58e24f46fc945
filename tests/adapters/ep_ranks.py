"""Expert-parallel ranks of the adapter tests' MoE layer in each engine, and a rank's forward on the CPU.

Each case is the engine's serve options for two EP ranks, as ``make_experts`` keywords per rank with the rank's
:class:`csf_moe.RankShard`: "without_tp" (vLLM ``--data-parallel-size 2 --enable-expert-parallel``, SGLang
``--tp-size 2 --ep-size 2``: MoE TP 1) and "with_tp" (vLLM ``--tensor-parallel-size 2 --enable-expert-parallel``,
whose experts then run at MoE TP 1 too; SGLang ``--tp-size 4 --ep-size 2``: MoE TP 2).
"""

from __future__ import annotations

import torch

from csf_moe import RankShard, shard_weights
from csf_moe.reference import QuantizedExperts, moe_reference
from csf_serving_adapters.moe_core import BOUND_ATTR

__all__ = ["CASES", "expected_rank_params", "rank_forward", "reference_bound_layer", "sglang_dispatch"]

EP = 2
CASES = {
    "vllm": {
        "without_tp": [(dict(dp=2, dp_rank=r, ep=True), RankShard(ep=EP, ep_rank=r)) for r in range(EP)],
        "with_tp": [(dict(tp=2, rank=r, ep=True), RankShard(ep=EP, ep_rank=r)) for r in range(EP)],
    },
    "sglang": {
        "without_tp": [(dict(ep=EP, ep_rank=r), RankShard(ep=EP, ep_rank=r)) for r in range(EP)],
        "with_tp": [
            (dict(ep=EP, ep_rank=e, tp=2, rank=t), RankShard(tp=2, tp_rank=t, ep=EP, ep_rank=e))
            for e in range(EP)
            for t in range(2)
        ],
    },
}
# the engines' parameter names of the tensors csf_moe.shard_weights slices by width
_WIDE = {"w13_weight": "w13", "w13_weight_scale": "w13_scale", "w2_weight": "w2", "w2_weight_scale": "w2_scale"}


def expected_rank_params(whole: dict[str, torch.Tensor], shard: RankShard) -> dict[str, torch.Tensor]:
    """The single-rank layer's parameters as ``shard``'s rank should hold them (its experts, its width)."""
    named = {_WIDE.get(n, n): t for n, t in whole.items()}
    sliced = shard_weights(named, shard)
    back = {v: k for k, v in _WIDE.items()}
    return {back.get(n, n): t for n, t in sliced.items()}


class _ReferenceLayer:
    """Stands in for the bound csf-moe layer on the CPU: the float32 reference over the rank's loaded experts."""

    def __init__(self, method, layer, max_tokens: int) -> None:
        sdt = torch.uint8
        g13, g2 = method._global_scales(layer) if method.fmt.name == "nvfp4" else (None, None)
        self.experts = QuantizedExperts(
            fmt=method.fmt.name,
            w13=method.values(layer, "w13"),
            w13_scale=layer.w13_weight_scale.data.view(sdt),
            w2=method.values(layer, "w2"),
            w2_scale=layer.w2_weight_scale.data.view(sdt),
            w13_global_scale=g13,
            w2_global_scale=g2,
        )
        self.plan = type("Plan", (), {"max_tokens": max_tokens})()

    def run(self, x, topk_ids, topk_weights, out=None):
        y = moe_reference(x, self.experts, topk_weights, topk_ids)
        return y if out is None else out.copy_(y)


def reference_bound_layer(layer, max_tokens: int = 64) -> None:
    """What process_weights_after_loading leaves on a layer, with the reference in place of the GPU layer."""
    method = layer.quant_method
    setattr(layer, BOUND_ATTR, _ReferenceLayer(method, layer, max_tokens))
    method.map_routes(layer, max_tokens * method.top_k(), torch.device("cpu"))


def rank_forward(engine_name: str, layer, x, topk_weights, topk_ids) -> torch.Tensor:
    """The rank's routed-experts output as the engine computes it before summing the ranks: vLLM hands ``apply``
    the model's route ids; SGLang's standard dispatcher maps them to the rank's first."""
    if engine_name == "vllm":
        return layer.quant_method.apply(layer, x, topk_weights, topk_ids, None, None)
    return layer.quant_method.apply(layer, sglang_dispatch(layer, x, topk_weights, topk_ids)).hidden_states


def sglang_dispatch(layer, x, topk_weights, topk_ids):
    """SGLang's standard dispatch of the top-k on the CPU (its id map is built on ``get_device()``, which finds no
    accelerator here)."""
    from unittest import mock

    from sglang.srt.layers.moe.topk import StandardTopKOutput

    logits = torch.zeros(x.shape[0], layer.num_experts)
    with mock.patch("sglang.srt.layers.moe.token_dispatcher.standard.get_device", return_value="cpu"):
        return layer.dispatcher.dispatch(x, StandardTopKOutput(topk_weights, topk_ids, logits))
