"""vLLM for the adapter tests (import only after importorskip("vllm")): real RoutedExperts layers on the CPU and
the vLLM facts the engine-parametrised tests read (:data:`ENGINE`).

vLLM infers no device on a machine without a GPU, so the config names the CPU; a tensor-parallel rank other
than 0 is set where vLLM reads it (``get_tensor_model_parallel_rank``) instead of starting a process group.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import torch
import vllm.model_executor.model_loader.default_loader as default_loader
import vllm.model_executor.model_loader.weight_utils as weight_utils
from vllm.config import CompilationConfig, DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
from vllm.config.model import ModelConfig
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory
from vllm.model_executor.layers.linear import ReplicatedLinear, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

import csf_serving_adapters.vllm as adapter
from csf_serving_adapters.vllm import weight_iterators
from csf_serving_adapters.vllm.config import CsfConfig
from csf_serving_adapters.vllm.moe_method import BOUND_ATTR, CsfMoEMethod

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
    has_bias: bool = False,
    activation: str = "silu",
    device: str = "cpu",
    capture_sizes: list[int] | None = None,
    ep: bool = False,
    dp: int = 1,
    dp_rank: int = 0,
    **parallel,
) -> RoutedExperts:
    """One RoutedExperts layer as TP rank ``rank`` of ``tp`` (and DP rank ``dp_rank`` of ``dp``) builds it (``inter``
    is the unsharded size); ``ep``: with ``--enable-expert-parallel`` (EP over all ``tp * dp`` ranks);
    ``parallel``: other ParallelConfig fields (``all2all_backend``, ``enable_eplb``)."""
    compilation = CompilationConfig(cudagraph_capture_sizes=capture_sizes) if capture_sizes else CompilationConfig()
    par = ParallelConfig(tensor_parallel_size=tp, enable_expert_parallel=ep)
    for field, value in parallel.items():  # set unvalidated: ParallelConfig refuses EPLB on a machine without GPUs
        setattr(par, field, value)
    vllm_config = VllmConfig(device_config=DeviceConfig(device=device), compilation_config=compilation)
    vllm_config.parallel_config = par  # set after construction: VllmConfig checks a world size against the host
    rank_of = "vllm.model_executor.layers.fused_moe.config.get_tensor_model_parallel_rank"
    dp_group = "vllm.model_executor.layers.fused_moe.config.get_dp_group"
    with (set_current_vllm_config(vllm_config), mock.patch(rank_of, return_value=rank),
          mock.patch(dp_group, return_value=SimpleNamespace(rank_in_group=dp_rank)), torch.device(device)):  # fmt: skip
        runner = FusedMoEFactory(
            num_experts=experts,
            top_k=top_k,
            hidden_size=hidden,
            intermediate_size=inter,
            params_dtype=torch.bfloat16,
            quant_config=quant_config,
            tp_size=tp,
            dp_size=dp,
            pcp_size=1,
            prefix=PREFIX,
            has_bias=has_bias,
            activation=activation,
        )
    return runner.routed_experts


def load_expert_tensors(layer: RoutedExperts, weights) -> set[str]:
    """Checkpoint (name, tensor) pairs through the layer's own load_weights (the engine's weight_loader)."""
    rel = ((name.removeprefix(PREFIX + "."), t) for name, t in weights if name.startswith(PREFIX + "."))
    return set(layer.load_weights(rel))


def resolve(quant_cfg, user_quant=None, model_type="deepseek_v3"):
    """vLLM's own checkpoint-method resolution (ModelConfig._verify_quantization) on just what it reads."""
    cfg = SimpleNamespace(
        quantization=user_quant,
        model_arch_config=SimpleNamespace(quantization_config=quant_cfg),
        hf_config=SimpleNamespace(model_type=model_type),
        allow_deprecated_quantization=False,
    )
    ModelConfig._verify_quantization(cfg)
    return cfg.quantization


def _apply(layer: RoutedExperts, x, topk_weights, topk_ids) -> torch.Tensor:
    return layer.quant_method.apply(layer, x, topk_weights, topk_ids, None, None)


ENGINE = Engine(
    name="vllm",
    adapter=adapter,
    config=CsfConfig,
    moe_method=CsfMoEMethod,
    bound_attr=BOUND_ATTR,
    weight_iterators=weight_iterators,
    loader=default_loader,
    weight_utils=weight_utils,
    iterator_args=(False,),  # use_tqdm_on_load
    quantization_methods=QUANTIZATION_METHODS,
    registered_config=lambda: get_quantization_config("csf"),
    resolve=resolve,
    make_experts=make_experts,
    load_expert_tensors=lambda layer, weights, experts: load_expert_tensors(layer, weights),
    make_linear=lambda: ReplicatedLinear.__new__(ReplicatedLinear),  # only its type matters (a real one needs TP)
    unquantized_linear=UnquantizedLinearMethod,
    scale_quant_method="block",
    weight_prefix=PREFIX,
    apply=_apply,
    entry_point_group="vllm.general_plugins",
)
