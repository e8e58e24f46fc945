"""``CsfMoEMethod``: vLLM's routed experts served by csf-moe with inline CSF scales (or on the
engine's GEMMs: ``CSF_MOE_ENGINE``, ``CSF_MOE_W4A8``, :mod:`csf_serving_adapters.gemm_choice`).

Loading is vLLM's own: the parameters have the shapes and ``quant_method`` attributes of vLLM's MXFP4 / ModelOpt
NVFP4 MoE methods, so ``RoutedExperts.weight_loader`` TP-slices checkpoint tensors (native, or decoded from
``X.csf`` by :mod:`.weight_iterators`) exactly as it does for them. After loading, the layer is planned,
its scales re-encoded as inline CSF records on the GPU, bound to a shared scratch buffer, and the native scale
planes are released (:mod:`csf_serving_adapters.moe_core`; the ledger records what each layer gave back).

Under expert parallelism (``--enable-expert-parallel``) vLLM creates the rank's local experts and its loader keeps
only theirs; ``apply`` gets the model's route ids, mapped through ``layer.expert_map`` (other ranks' experts
become ids the layer skips), and vLLM sums the ranks' outputs as it does its own FP4 methods' (all-reduce, or the
allgather_reducescatter backend's reduce-scatter under data parallelism).
"""

from __future__ import annotations

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.model_executor.layers.fused_moe import FusedMoEConfig, FusedMoEMethodBase, RoutedExperts
from vllm.model_executor.utils import set_weight_attrs

from csf_codec import scale_format

from ..moe_core import BOUND_ATTR, SCRATCH, CsfMoECore, param_names

__all__ = ["BOUND_ATTR", "SCRATCH", "CsfMoEMethod"]

# vLLM activation -> (csf-moe activation, W13 row layout as the engine loads it)
_ACTIVATIONS = {
    "silu": ("silu", "gate_up"),
    "swigluoai": ("swiglu_oai", "interleaved"),  # gpt-oss: fused checkpoint tensors interleave gate and up rows
    "swigluoai_uninterleave": ("swiglu_oai", "gate_up"),
}


# all-to-all backends whose dispatch and combine vLLM runs around a method without a modular kernel (csf's): the
# all-gather of the tokens before and the reduce-scatter after, under data or sequence parallelism
_SERVED_ALL2ALL = ("allgather_reducescatter",)


def _check_expert_parallel(par) -> None:
    """Expert parallelism as vLLM runs it around csf: every rank computes its experts' share of the tokens it is
    given, summed by the all-reduce (EP over TP ranks) or the all-gather / reduce-scatter backend (with DP)."""
    if not par.use_ep:
        return
    if par.enable_eplb:
        raise NotImplementedError(
            "csf: --enable-eplb moves experts between ranks at run time; csf's experts stay where they were "
            "loaded (serve with --enable-expert-parallel and without --enable-eplb)"
        )
    if par.use_passthrough_all2all or (par.use_all2all_kernels and par.all2all_backend not in _SERVED_ALL2ALL):
        raise NotImplementedError(
            f"csf: expert parallelism with --all2all-backend {par.all2all_backend} (its kernels dispatch tokens to "
            f"expert kernels csf does not provide); csf serves {', '.join(_SERVED_ALL2ALL)}, or EP over "
            "tensor-parallel ranks without data parallelism"
        )


class CsfMoEMethod(CsfMoECore, FusedMoEMethodBase):
    engine = "vllm"
    scale_quant_method = "block"
    input_scale_quant_method = "tensor"

    def __init__(self, moe: FusedMoEConfig, quant_config) -> None:
        super().__init__(moe)
        if quant_config.scale_format not in ("mxfp4", "nvfp4"):
            raise ValueError(
                f"csf: {quant_config!r} has no FP4 scale format; serve a checkpoint written by `csf compress` "
                "or a native MXFP4 / ModelOpt NVFP4 one"
            )
        self.fmt = scale_format(quant_config.scale_format)
        self.choose_gemm()  # CSF_MOE_ENGINE, CSF_MOE_W4A8: read once, as the layer is created
        self.names = param_names(quant_config.base_quant_method)  # ModelOpt / gpt-oss or compressed-tensors
        # as vLLM's FP4 methods name it; gpt-oss's loader reads it to pick its packed-expert path (unverified here)
        self.weight_dtype = self.fmt.name
        act = moe.activation.value
        if act not in _ACTIVATIONS:
            raise NotImplementedError(f"csf: MoE activation {act!r} (supported: {sorted(_ACTIVATIONS)})")
        self.activation, self.w13_layout = _ACTIVATIONS[act]
        _check_expert_parallel(moe.moe_parallel_config)

    def tp_size(self) -> int:
        return self.moe.tp_size

    def ep_size(self) -> int:
        return self.moe.moe_parallel_config.ep_size

    def global_expert_map(self, layer: RoutedExperts) -> torch.Tensor | None:
        # vLLM routes with the model's expert ids; its own FP4 methods pass this map to their kernels
        return layer.expert_map if self.moe.moe_parallel_config.use_ep else None

    def top_k(self) -> int:
        return self.moe.experts_per_token

    def has_bias(self) -> bool:
        return self.moe.has_bias

    def max_tokens(self) -> int:
        return self.moe.max_num_tokens

    def create_weights(
        self,
        layer: RoutedExperts,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        # the token counts the engine will capture in CUDA graphs: each becomes a planned bucket (read here, while
        # vLLM's config is current; process_weights_after_loading may run outside that context)
        cfg = get_current_vllm_config_or_none()
        sizes = cfg.compilation_config.cudagraph_capture_sizes if cfg is not None else None
        self.capture_sizes = tuple(sorted({int(t) for t in sizes or () if int(t) > 0}))
        n = intermediate_size_per_partition
        self.register_parameters(layer, num_experts, hidden_size, n, w13_rows=self.moe.w13_num_shards * n,
                                 attrs=extra_weight_attrs, set_attrs=set_weight_attrs)  # fmt: skip

    def get_fused_moe_quant_config(self, layer: RoutedExperts):
        return None  # no modular kernel: apply() runs the bound csf-moe layer

    def apply(
        self,
        layer: RoutedExperts,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts,
        shared_experts_input: torch.Tensor | None,
    ) -> torch.Tensor:
        return self.run_experts(layer, x, topk_ids, topk_weights.to(torch.float32))
