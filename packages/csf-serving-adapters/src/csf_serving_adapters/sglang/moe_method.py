"""``CsfMoEMethod``: SGLang's FusedMoE experts served by csf-moe with inline CSF scales (or on the
engine's GEMMs: ``CSF_MOE_ENGINE``, ``CSF_MOE_W4A8``, :mod:`csf_serving_adapters.gemm_choice`).

Loading is SGLang's own: the parameters have the names, shapes and ``quant_method`` attributes of SGLang's MXFP4
(``"group"`` scales) and ModelOpt NVFP4 (``"tensor"`` global scales) MoE methods, so ``FusedMoE.weight_loader``
TP-slices checkpoint tensors (native, or decoded from ``X.csf`` by :mod:`.weight_iterators`) as it does for them.
After loading, the layer is planned, its scales re-encoded as inline CSF records on the GPU, bound to a shared
scratch buffer, and the native scale planes are released (:mod:`csf_serving_adapters.moe_core`). ``apply`` runs
the bound csf-moe layer on SGLang's standard top-k output (no MoeRunner).

Under expert parallelism (``--ep-size``) SGLang creates the rank's local experts, its loader keeps only theirs,
and its standard dispatcher hands ``apply`` local route ids (-1 for other ranks' experts, which csf-moe skips);
the ranks' outputs are all-reduced as for SGLang's own FP4 methods.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase
from sglang.srt.utils import set_weight_attrs

from csf_codec import scale_format
from csf_moe.reference import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT

from ..moe_core import BOUND_ATTR, SCRATCH, CsfMoECore, param_names
from .gpt_oss import patch_gpt_oss_loading

__all__ = ["BOUND_ATTR", "SCRATCH", "CsfMoEMethod"]

DEFAULT_MAX_TOKENS = 16384  # SGLang's default max_prefill_tokens, when no server args are published

# SGLang activation -> csf-moe activation (gate/up rows as FusedMoE.weight_loader writes them: [gate; up])
_ACTIVATIONS = {"silu": "silu"}


def _activation(cfg) -> tuple[str, str]:
    """(csf-moe activation, W13 row layout) for SGLang's MoE runner config. gpt-oss states its clamped SwiGLU by
    ``gemm1_alpha`` / ``gemm1_clamp_limit`` and loads its checkpoint's interleaved gate/up rows as they are."""
    alpha, limit = getattr(cfg, "gemm1_alpha", None), getattr(cfg, "gemm1_clamp_limit", None)
    if alpha is not None or limit is not None:
        if (alpha, limit) != (SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT) or not cfg.is_gated:
            raise NotImplementedError(
                f"csf: clamped SwiGLU with alpha {alpha} and limit {limit} (csf-moe has gpt-oss's: alpha "
                f"{SWIGLU_OAI_ALPHA}, limit {SWIGLU_OAI_LIMIT})"
            )
        return "swiglu_oai", "interleaved"
    if cfg.activation not in _ACTIVATIONS or not cfg.is_gated:
        raise NotImplementedError(
            f"csf: MoE activation {cfg.activation!r} (gated={cfg.is_gated}); supported: {sorted(_ACTIVATIONS)} and "
            "gpt-oss's clamped SwiGLU"
        )
    return _ACTIVATIONS[cfg.activation], "gate_up"


def _whole_tensor_loading(engine_loader):
    """SGLang's loader, plus the whole-tensor loads of gpt-oss's MXFP4 path (``GptOssForCausalLM`` passes every
    expert's rank slice at once, ``shard_id`` and ``expert_id`` None), which SGLang's own loader takes only for a
    config named "mxfp4"."""

    def weight_loader(param, loaded_weight, weight_name, shard_id, expert_id, *args, **kwargs):
        if shard_id is None and expert_id is None:
            if tuple(loaded_weight.shape) != tuple(param.shape):
                raise ValueError(f"csf: {weight_name}: this rank's slice has shape {tuple(loaded_weight.shape)}, the "
                                 f"parameter {tuple(param.shape)} (the per-rank intermediate size must split evenly "
                                 "into 32-wide blocks)")  # fmt: skip
            param.data.copy_(loaded_weight)
            return
        return engine_loader(param, loaded_weight, weight_name, shard_id, expert_id, *args, **kwargs)

    weight_loader.engine_loader = engine_loader
    return weight_loader


def _server_token_limits() -> tuple[int, tuple[int, ...]]:
    """(tokens one prefill forward may carry, decode CUDA-graph batch sizes) from the published server config."""
    from sglang.srt.runtime_context import get_exec, get_schedule

    try:
        schedule = get_schedule()
        chunk = schedule.chunked_prefill_size
        prefill = chunk if chunk and chunk > 0 else schedule.max_prefill_tokens
    except Exception:  # nothing published (a bare layer in a test): SGLang's default
        prefill = None
    try:
        graph = get_exec().graph.cuda_graph_config
        sizes = graph.decode.bs if graph is not None and graph.decode is not None else None
    except Exception:
        sizes = None
    return int(prefill or DEFAULT_MAX_TOKENS), tuple(sorted({int(t) for t in sizes or () if int(t) > 0}))


def _check_expert_parallel(ep_size: int) -> None:
    """Expert parallelism as SGLang runs it around csf: its standard dispatcher maps the model's route ids to the
    rank's (-1: another rank's expert, skipped by csf-moe) and the ranks' outputs are all-reduced. The all-to-all
    backends hand tokens to their own expert kernels; EPLB and redundant experts move or copy experts at run time."""
    if ep_size <= 1:
        return
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend
    from sglang.srt.runtime_context import get_exec

    moe = get_exec().moe  # the server's MoE options (the flags' a2a backend is derived from them)
    for backend in (get_moe_a2a_backend().value, getattr(moe, "moe_a2a_backend", None) or "none"):
        if backend != "none":
            raise NotImplementedError(
                f"csf: expert parallelism with --moe-a2a-backend {backend} (its dispatch feeds expert kernels csf "
                "does not provide); serve --ep-size with --moe-a2a-backend none"
            )
    for option, value in (("--enable-eplb", getattr(moe, "enable_eplb", False)),
                          ("--ep-num-redundant-experts", getattr(moe, "ep_num_redundant_experts", 0)),
                          ("--elastic-ep-backend", getattr(moe, "elastic_ep_backend", None))):  # fmt: skip
        if value:
            raise NotImplementedError(
                f"csf: {option} places or moves experts at run time; csf's compressed experts stay where they "
                f"were loaded (serve --ep-size without {option})"
            )


class CsfMoEMethod(CsfMoECore, FusedMoEMethodBase):
    engine = "sglang"
    scale_quant_method = "group"
    input_scale_quant_method = None
    bias_name = "weight_bias"  # as SGLang's MXFP4 method and gpt-oss's loader name expert biases
    # csf-moe sums the routed experts with the weights it is given: the top-k applies routed_scaling_factor
    fuse_routed_scaling_factor_in_topk = True

    def __init__(self, quant_config, prefix: str = "") -> None:
        super().__init__()
        if quant_config.scale_format not in ("mxfp4", "nvfp4"):
            raise ValueError(
                f"csf: {quant_config!r} has no FP4 scale format; serve a checkpoint written by `csf compress` "
                "or a native MXFP4 / ModelOpt NVFP4 one"
            )
        self.fmt = scale_format(quant_config.scale_format)
        self.choose_gemm()  # CSF_MOE_ENGINE, CSF_MOE_W4A8: read once, as the layer is created
        self.names = param_names(quant_config.base_quant_method)  # ModelOpt / gpt-oss or compressed-tensors
        self.prefix = prefix
        self.moe_runner_config = None
        self._with_bias = False

    def tp_size(self) -> int:
        return self._tp_size

    def ep_size(self) -> int:
        return self._ep_size

    def top_k(self) -> int:
        return self._top_k

    def has_bias(self) -> bool:
        return self._with_bias

    def max_tokens(self) -> int:
        return max(self.prefill_tokens, *self.capture_sizes, 1)

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        with_bias: bool = False,
        **extra_weight_attrs,
    ) -> None:
        cfg = layer.moe_runner_config
        self.activation, self.w13_layout = _activation(cfg)
        if self.activation == "swiglu_oai":
            patch_gpt_oss_loading()  # gpt-oss's model loads its experts through the "mxfp4" path: let csf in
        self._with_bias = bool(with_bias)
        _check_expert_parallel(layer.moe_ep_size)
        if cfg.apply_router_weight_on_input:
            raise NotImplementedError("csf: apply_router_weight_on_input (router weight on the input) is not supported")
        extra_weight_attrs.pop("moe_intermediate_size", None)
        self._top_k, self._tp_size, self._ep_size = cfg.top_k, layer.moe_tp_size, layer.moe_ep_size
        if "weight_loader" in extra_weight_attrs:
            extra_weight_attrs["weight_loader"] = _whole_tensor_loading(extra_weight_attrs["weight_loader"])
        # read here, while SGLang's server args are current: the largest prefill forward and the decode batch sizes
        # SGLang captures in CUDA graphs (each becomes a planned bucket)
        self.prefill_tokens, self.capture_sizes = _server_token_limits()
        n = intermediate_size_per_partition
        self.register_parameters(layer, num_experts, hidden_size, n, w13_rows=2 * n, attrs=extra_weight_attrs,
                                 set_attrs=set_weight_attrs)  # fmt: skip

    def create_moe_runner(self, layer: torch.nn.Module, moe_runner_config) -> None:
        self.moe_runner_config = moe_runner_config  # no MoeRunner: apply() runs the bound csf-moe layer

    def get_moe_runner_backend(self, layer: torch.nn.Module):
        return None  # a direct kernel consuming SGLang's standard top-k output with local expert ids

    def apply(self, layer: torch.nn.Module, dispatch_output):
        from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput
        from sglang.srt.layers.moe.topk import TopKOutputChecker

        bound = self.bound_layer(layer)
        topk = dispatch_output.topk_output
        if not TopKOutputChecker.format_is_standard(topk):
            raise NotImplementedError(f"csf: top-k output format {topk.format} (only the standard format is served)")
        if dispatch_output.hidden_states_scale is not None:
            raise NotImplementedError("csf: pre-quantized activations (csf takes bf16; W4A8 quantizes its own)")
        x = dispatch_output.hidden_states
        ids, weights = topk.topk_ids, topk.topk_weights.to(torch.float32)
        step = bound.plan.max_tokens
        if x.shape[0] <= step:
            return StandardCombineInput(hidden_states=self.run_experts(layer, x, ids, weights))
        # more tokens than planned (a prefill above the server's limits): run the plan's largest bucket in turn
        out = torch.empty_like(x)
        for s in range(0, x.shape[0], step):
            bound.run(x[s : s + step], ids[s : s + step], weights[s : s + step], out=out[s : s + step])
        return StandardCombineInput(hidden_states=out)
