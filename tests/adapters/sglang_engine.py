"""SGLang for the adapter tests (import only after importorskip("sglang")): real FusedMoE layers on the CPU and
the SGLang facts the engine-parametrised tests read (:data:`ENGINE`).

SGLang layers read their configuration from a published ServerArgs and the parallel context: a dummy ServerArgs
is published (``override_server_args``, SGLang's own test hook) and a tensor-parallel rank is stated with
``get_parallel().override`` instead of starting process groups.
"""

from __future__ import annotations

from types import SimpleNamespace

import sglang.srt.model_loader.loader as loader
import sglang.srt.model_loader.weight_utils as weight_utils
import torch
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.moe.token_dispatcher import StandardDispatchOutput
from sglang.srt.layers.moe.topk import StandardTopKOutput
from sglang.srt.layers.quantization import QUANTIZATION_METHODS
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.runtime_context import get_context, get_parallel

import csf_serving_adapters.sglang as adapter
from csf_serving_adapters.sglang import weight_iterators
from csf_serving_adapters.sglang.config import CsfConfig
from csf_serving_adapters.sglang.moe_method import BOUND_ATTR, CsfMoEMethod

from .checkpoints import PREFIX
from .engines import Engine

__all__ = ["ENGINE", "load_expert_tensors", "make_experts", "resolve"]


def make_experts(
    quant_config: CsfConfig | None,
    *,
    experts: int = 4,
    hidden: int = 256,
    inter: int = 128,
    top_k: int = 2,
    tp: int = 1,
    rank: int = 0,
    ep: int = 1,
    ep_rank: int = 0,
    activation: str = "silu",
    with_bias: bool = False,
    gemm1_alpha: float | None = None,
    gemm1_clamp_limit: float | None = None,
    device: str = "cpu",
    **server_args,
) -> FusedMoE:
    """One FusedMoE layer as MoE TP rank ``rank`` of ``tp`` and EP rank ``ep_rank`` of ``ep`` builds it (``inter`` is
    the unsharded size; ``--tp-size tp * ep --ep-size ep``)."""
    world, me = tp * ep, ep_rank * tp + rank
    ranks = dict(tp_size=world, tp_rank=me, attn_tp_size=world, attn_tp_rank=me)
    ranks |= dict(moe_tp_size=tp, moe_tp_rank=rank, moe_ep_size=ep, moe_ep_rank=ep_rank)
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


def resolve(quant_cfg, user_quant=None):
    """SGLang's own checkpoint-method resolution (ModelConfig._verify_quantization) on just what it reads."""
    cfg = SimpleNamespace(quantization=user_quant, is_draft_model=False, hf_config=SimpleNamespace())
    cfg.hf_config.quantization_config = dict(quant_cfg)
    cfg._parse_modelopt_quant_config = lambda d: ModelConfig._parse_modelopt_quant_config(cfg, d)
    cfg._parse_quant_hf_config = lambda: ModelConfig._parse_quant_hf_config(cfg)
    cfg._find_quant_modelslim_config = lambda: None
    ModelConfig._verify_quantization(cfg)
    return cfg.quantization


def _apply(layer: FusedMoE, x, topk_weights, topk_ids) -> torch.Tensor:
    """SGLang's standard dispatch of the top-k (router logits unused by csf)."""
    logits = torch.zeros(x.shape[0], layer.num_experts, device=x.device)
    dispatch = StandardDispatchOutput(x, None, StandardTopKOutput(topk_weights, topk_ids, logits))
    return layer.quant_method.apply(layer, dispatch).hidden_states


ENGINE = Engine(
    name="sglang",
    adapter=adapter,
    config=CsfConfig,
    moe_method=CsfMoEMethod,
    bound_attr=BOUND_ATTR,
    weight_iterators=weight_iterators,
    loader=loader,
    weight_utils=weight_utils,
    iterator_args=(),
    quantization_methods=QUANTIZATION_METHODS,
    registered_config=lambda: QUANTIZATION_METHODS["csf"],
    resolve=resolve,
    make_experts=make_experts,
    load_expert_tensors=load_expert_tensors,
    make_linear=lambda: LinearBase(1, 1),
    unquantized_linear=UnquantizedLinearMethod,
    scale_quant_method="group",
    weight_prefix="experts",
    apply=_apply,
    entry_point_group="sglang.srt.plugins",
)
