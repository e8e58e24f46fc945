"""``CsfMoEMethod``: SGLang's FusedMoE experts served by csf-moe with inline CSF scales.

Loading is SGLang's own: the parameters have the names, shapes and ``quant_method`` attributes of SGLang's MXFP4
(``"group"`` scales) and ModelOpt NVFP4 (``"tensor"`` global scales) MoE methods, so ``FusedMoE.weight_loader``
TP-slices checkpoint tensors (native, or decoded from ``X.csf`` by :mod:`.weight_iterators`) as it does for them.
After loading, the layer is planned, its scales re-encoded as inline CSF records on the GPU, bound to a shared
scratch buffer, and the native scale planes are released; :data:`csf_serving_adapters.accounting.LEDGER` records
what each layer gave back. ``apply`` runs the bound csf-moe layer on SGLang's standard top-k output (no MoeRunner).
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase
from sglang.srt.utils import set_weight_attrs

from csf_codec import scale_format
from csf_kernels import runtime
from csf_kernels.catalog import MoEGeometry, load_catalog

from ..accounting import LEDGER, LayerScaleMemory
from ..scratch import SharedScratch

__all__ = ["BOUND_ATTR", "SCRATCH", "CsfMoEMethod"]

logger = logging.getLogger(__name__)

BOUND_ATTR = "csf_moe_layer"  # the bound csf_moe.MoELayer, kept on the FusedMoE module
SCRATCH = SharedScratch()
DEFAULT_MAX_TOKENS = 16384  # SGLang's default max_prefill_tokens, when no server args are published

# SGLang activation -> csf-moe activation (gate/up rows as FusedMoE.weight_loader writes them: [gate; up])
_ACTIVATIONS = {"silu": "silu"}
# after binding: copied by prepare_weights (global scales as float32), or unused by W4A16 (input scales)
_RELEASED = (
    "w13_weight_scale",
    "w2_weight_scale",
    "w13_weight_scale_2",
    "w2_weight_scale_2",
    "w13_input_scale",
    "w2_input_scale",
)


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


class CsfMoEMethod(FusedMoEMethodBase):
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
        self.prefix = prefix
        self.moe_runner_config = None

    # ------------------------------------------------------------------------------------------ weights
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
        if cfg.activation not in _ACTIVATIONS or not cfg.is_gated:
            raise NotImplementedError(
                f"csf: MoE activation {cfg.activation!r} (gated={cfg.is_gated}); supported: {sorted(_ACTIVATIONS)} "
                "(gpt-oss's swiglu is not: SGLang loads its experts by the quantization name 'mxfp4')"
            )
        if with_bias:
            raise NotImplementedError("csf: expert biases are not supported in SGLang yet")
        if layer.moe_ep_size > 1:
            raise NotImplementedError("csf: expert parallelism is not supported yet (tensor parallel only)")
        if cfg.apply_router_weight_on_input:
            raise NotImplementedError("csf: apply_router_weight_on_input (router weight on the input) is not supported")
        extra_weight_attrs.pop("moe_intermediate_size", None)
        bs = self.fmt.block_size
        e, h, n = num_experts, hidden_size, intermediate_size_per_partition
        if h % bs or n % bs:
            raise ValueError(f"csf: hidden {h} and per-rank intermediate {n} must be multiples of the block {bs}")
        self.num_experts, self.hidden_size, self.intermediate_size = e, h, n
        self.activation, self.top_k, self.tp_size = _ACTIVATIONS[cfg.activation], cfg.top_k, layer.moe_tp_size
        # read here, while SGLang's server args are current: the largest prefill forward and the decode batch sizes
        # SGLang captures in CUDA graphs (each becomes a planned bucket)
        self.prefill_tokens, self.capture_sizes = _server_token_limits()
        scale_dtype = torch.float8_e4m3fn if self.fmt.name == "nvfp4" else torch.uint8

        def add(name: str, shape: tuple[int, ...], dtype: torch.dtype, quant_method: str | None = None) -> None:
            p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, extra_weight_attrs)
            if quant_method is not None:
                p.quant_method = quant_method  # read by FusedMoE.weight_loader to TP-slice scales

        add("w13_weight", (e, 2 * n, h // 2), torch.uint8)
        add("w13_weight_scale", (e, 2 * n, h // bs), scale_dtype, "group")
        add("w2_weight", (e, h, n // 2), torch.uint8)
        add("w2_weight_scale", (e, h, n // bs), scale_dtype, "group")
        if self.fmt.name == "nvfp4":
            # ModelOpt's per-expert global scales: one per gate/up shard while loading, as SGLang's loader writes them
            add("w13_weight_scale_2", (e, 2), torch.float32, "tensor")
            add("w2_weight_scale_2", (e,), torch.float32, "tensor")
            # ModelOpt checkpoints carry activation scales too; a W4A16 layer loads and drops them
            add("w13_input_scale", (e,), torch.float32)
            add("w2_input_scale", (e,), torch.float32)

    def create_moe_runner(self, layer: torch.nn.Module, moe_runner_config) -> None:
        self.moe_runner_config = moe_runner_config  # no MoeRunner: apply() runs the bound csf-moe layer

    def max_tokens(self) -> int:
        return max(self.prefill_tokens, *self.capture_sizes, 1)

    def geometry(self, layer: torch.nn.Module) -> MoEGeometry:
        """The layer as this rank holds it (a catalog entry or not)."""
        return MoEGeometry(
            model=layer.layer_name or "sglang",
            tp=self.tp_size,
            fmt=self.fmt,
            experts=self.num_experts,
            hidden=self.hidden_size,
            intermediate=self.intermediate_size,
            top_k=self.top_k,
            activation=self.activation,
            bias=False,
        )

    def _w13_global_scale(self, layer: torch.nn.Module) -> torch.Tensor:
        g = layer.w13_weight_scale_2.data
        if not torch.equal(g[:, 0], g[:, 1]):
            raise ValueError(f"csf: {layer.layer_name}: gate and up weight_scale_2 differ; one per expert is supported")
        return g[:, 0]

    def prepare(self, layer: torch.nn.Module):
        """Plan the layer and build its weights (inline CSF scales) on the weights' device; no binding."""
        from csf_moe import plan, prepare_weights

        max_tokens = self.max_tokens()
        buckets = tuple(sorted({t for t in (*load_catalog().token_buckets, *self.capture_sizes) if t <= max_tokens}))
        p = plan(self.geometry(layer), max_tokens=max_tokens, scale_source="inline", buckets=buckets or None)
        nv = self.fmt.name == "nvfp4"
        w = prepare_weights(
            p,
            w13=layer.w13_weight.data,
            w13_scale=layer.w13_weight_scale.data,
            w2=layer.w2_weight.data,
            w2_scale=layer.w2_weight_scale.data,
            w13_global_scale=self._w13_global_scale(layer) if nv else None,
            w2_global_scale=layer.w2_weight_scale_2.data if nv else None,
            w13_layout="gate_up",
        )
        return p, w

    def release_native(self, layer: torch.nn.Module, weights) -> LayerScaleMemory:
        """Drop what ``weights`` now holds in another form, and record the scale memory returned."""
        for name in _RELEASED:
            old = getattr(layer, name, None)
            if isinstance(old, torch.Tensor):
                setattr(layer, name, torch.nn.Parameter(old.new_empty(0), requires_grad=False))
        layer.w13_weight = torch.nn.Parameter(weights.w13.values, requires_grad=False)
        layer.w2_weight = torch.nn.Parameter(weights.w2.values, requires_grad=False)
        sizes = weights.scale_bytes()
        entry = LayerScaleMemory(layer=layer.layer_name, native_bytes=sizes["native"], stored_bytes=sizes["stored"])
        LEDGER.record(entry)
        return entry

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from csf_moe import bind

        device = layer.w13_weight.device
        if device.type != "cuda":
            raise RuntimeError(
                f"csf: {layer.layer_name}: the CSF fused MoE runs on a CUDA GPU (Hopper, sm_90a); "
                f"its weights are on {device}"
            )
        p, w = self.prepare(layer)
        setattr(layer, BOUND_ATTR, bind(p, w, SCRATCH.get(device, p.scratch_bytes)))  # resolves every program
        # serving from here on: a program missing from the AOT cache is an error naming it, never a compilation
        runtime.freeze()
        entry = self.release_native(layer, w)
        logger.debug("csf: %s keeps %d of %d scale bytes", entry.layer, entry.stored_bytes, entry.native_bytes)

    # -------------------------------------------------------------------------------------------- run
    def get_moe_runner_backend(self, layer: torch.nn.Module):
        return None  # a direct kernel consuming SGLang's standard top-k output with local expert ids

    def apply(self, layer: torch.nn.Module, dispatch_output):
        from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput
        from sglang.srt.layers.moe.topk import TopKOutputChecker

        bound = getattr(layer, BOUND_ATTR, None)
        if bound is None:
            raise RuntimeError(f"csf: {layer.layer_name} was not processed after loading")
        topk = dispatch_output.topk_output
        if not TopKOutputChecker.format_is_standard(topk):
            raise NotImplementedError(f"csf: top-k output format {topk.format} (only the standard format is served)")
        if dispatch_output.hidden_states_scale is not None:
            raise NotImplementedError("csf: pre-quantized activations (the experts are W4A16 with bf16 inputs)")
        x = dispatch_output.hidden_states
        ids, weights = topk.topk_ids, topk.topk_weights.to(torch.float32)
        step = bound.plan.max_tokens
        if x.shape[0] <= step:
            return StandardCombineInput(hidden_states=bound.run(x, ids, weights))
        # more tokens than planned (a prefill above the server's limits): run the plan's largest bucket in turn
        out = torch.empty_like(x)
        for s in range(0, x.shape[0], step):
            bound.run(x[s : s + step], ids[s : s + step], weights[s : s + step], out=out[s : s + step])
        return StandardCombineInput(hidden_states=out)
