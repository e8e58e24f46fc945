"""Real vLLM RoutedExperts layers on the CPU, for the adapter tests (import only after importorskip("vllm")).

vLLM infers no device on a machine without a GPU, so the config names the CPU; a tensor-parallel rank other
than 0 is set where vLLM reads it (``get_tensor_model_parallel_rank``) instead of starting a process group.
"""

from __future__ import annotations

from unittest import mock

import torch
from vllm.config import CompilationConfig, DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

from csf_serving_adapters.vllm.config import CsfConfig

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
    has_bias: bool = False,
    activation: str = "silu",
    device: str = "cpu",
    capture_sizes: list[int] | None = None,
) -> RoutedExperts:
    """One RoutedExperts layer as TP rank ``rank`` of ``tp`` builds it (``inter`` is the unsharded size)."""
    compilation = CompilationConfig(cudagraph_capture_sizes=capture_sizes) if capture_sizes else CompilationConfig()
    vllm_config = VllmConfig(device_config=DeviceConfig(device=device), compilation_config=compilation)
    rank_of = "vllm.model_executor.layers.fused_moe.config.get_tensor_model_parallel_rank"
    with set_current_vllm_config(vllm_config), mock.patch(rank_of, return_value=rank), torch.device(device):
        runner = FusedMoEFactory(
            num_experts=experts,
            top_k=top_k,
            hidden_size=hidden,
            intermediate_size=inter,
            params_dtype=torch.bfloat16,
            quant_config=quant_config,
            tp_size=tp,
            dp_size=1,
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
