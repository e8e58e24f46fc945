"""Real SGLang FusedMoE layers on the CPU, for the adapter tests (import only after importorskip("sglang")).

SGLang layers read their configuration from a published ServerArgs and the parallel context: a dummy ServerArgs
is published (``override_server_args``, SGLang's own test hook) and a tensor-parallel rank is stated with
``get_parallel().override`` instead of starting process groups.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.runtime_context import get_context, get_parallel

from csf_serving_adapters.sglang.config import CsfConfig

from .checkpoints import PREFIX

__all__ = ["MX_CONFIG", "NV_CONFIG", "PREFIX", "load_expert_tensors", "make_experts"]

MX_CONFIG = {"quant_method": "mxfp4", "csf": {"format_version": 1, "scale_format": "mxfp4", "tensors": 2}}
NV_CONFIG = {
    "quant_method": "modelopt",
    "quant_algo": "NVFP4",
    "group_size": 16,
    "csf": {"format_version": 1, "scale_format": "nvfp4", "tensors": 6},
}


def make_experts(
    quant_config: CsfConfig | None,
    *,
    experts: int = 4,
    hidden: int = 256,
    inter: int = 128,
    top_k: int = 2,
    tp: int = 1,
    rank: int = 0,
    activation: str = "silu",
    with_bias: bool = False,
    gemm1_alpha: float | None = None,
    gemm1_clamp_limit: float | None = None,
    device: str = "cpu",
    **server_args,
) -> FusedMoE:
    """One FusedMoE layer as TP rank ``rank`` of ``tp`` builds it (``inter`` is the unsharded size)."""
    ranks = dict(tp_size=tp, tp_rank=rank, attn_tp_size=tp, attn_tp_rank=rank)
    ranks |= dict(moe_tp_size=tp, moe_tp_rank=rank, moe_ep_size=1, moe_ep_rank=0)
    with get_context().override_server_args(**server_args), get_parallel().override(**ranks), torch.device(device):
        return FusedMoE(
            num_experts=experts,
            hidden_size=hidden,
            intermediate_size=inter,
            layer_id=0,
            top_k=top_k,
            params_dtype=torch.bfloat16,
            quant_config=quant_config,
            prefix=PREFIX,
            activation=activation,
            with_bias=with_bias,
            gemm1_alpha=gemm1_alpha,
            gemm1_clamp_limit=gemm1_clamp_limit,
        )


def load_expert_tensors(layer: FusedMoE, weights, experts: int) -> set[str]:
    """Checkpoint (name, tensor) pairs through the layer's weight_loader, mapped as SGLang's MoE models map them
    (``FusedMoE.make_expert_params_mapping``); returns the parameter names written."""
    mapping = FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", experts)
    params = dict(layer.named_parameters())
    loaded = set()
    for name, tensor in weights:
        if not name.startswith(PREFIX + "."):
            continue
        full = "experts." + name.removeprefix(PREFIX + ".")  # "experts.3.gate_proj.weight_scale"
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name in full:
                target = full.replace(weight_name, param_name).removeprefix("experts.")  # "w13_weight_scale"
                param = params[target]
                param.weight_loader(param, tensor, full.replace(weight_name, param_name), shard_id, expert_id)
                loaded.add(target)
                break
    return loaded
