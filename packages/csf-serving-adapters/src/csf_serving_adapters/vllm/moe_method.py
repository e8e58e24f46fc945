"""``CsfMoEMethod``: vLLM's routed experts served by csf-moe with inline CSF scales.

Loading is vLLM's own: the parameters have the shapes and ``quant_method`` attributes of vLLM's MXFP4 / ModelOpt
NVFP4 MoE methods, so ``RoutedExperts.weight_loader`` TP-slices checkpoint tensors (native, or decoded from
``X.csf`` by :mod:`.weight_iterators`) exactly as it does for them. After loading, the layer is planned,
its scales re-encoded as inline CSF records on the GPU, bound to a shared scratch buffer, and the native scale
planes are released; :data:`csf_serving_adapters.accounting.LEDGER` records what each layer gave back.
"""

from __future__ import annotations

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import FusedMoEConfig, FusedMoEMethodBase, RoutedExperts
from vllm.model_executor.utils import set_weight_attrs

from csf_codec import scale_format
from csf_kernels import runtime
from csf_kernels.catalog import MoEGeometry, load_catalog

from ..accounting import LEDGER, LayerScaleMemory
from ..scratch import SharedScratch

__all__ = ["BOUND_ATTR", "SCRATCH", "CsfMoEMethod"]

logger = init_logger(__name__)

BOUND_ATTR = "csf_moe_layer"  # the bound csf_moe.MoELayer, kept on the RoutedExperts module
SCRATCH = SharedScratch()

# vLLM activation -> (csf-moe activation, W13 row layout as the engine loads it)
_ACTIVATIONS = {
    "silu": ("silu", "gate_up"),
    "swigluoai": ("swiglu_oai", "interleaved"),  # gpt-oss: fused checkpoint tensors interleave gate and up rows
    "swigluoai_uninterleave": ("swiglu_oai", "gate_up"),
}
# after binding: copied by prepare_weights (biases and global scales as float32), or unused by W4A16 (input scales)
_RELEASED = (
    "w13_weight_scale",
    "w2_weight_scale",
    "w13_weight_scale_2",
    "w2_weight_scale_2",
    "w13_input_scale",
    "w2_input_scale",
    "w13_bias",
    "w2_bias",
)


class CsfMoEMethod(FusedMoEMethodBase):
    def __init__(self, moe: FusedMoEConfig, quant_config) -> None:
        super().__init__(moe)
        if quant_config.scale_format not in ("mxfp4", "nvfp4"):
            raise ValueError(
                f"csf: {quant_config!r} has no FP4 scale format; serve a checkpoint written by `csf compress` "
                "or a native MXFP4 / ModelOpt NVFP4 one"
            )
        self.fmt = scale_format(quant_config.scale_format)
        # as vLLM's FP4 methods name it; gpt-oss's loader reads it to pick its packed-expert path (unverified here)
        self.weight_dtype = self.fmt.name
        act = moe.activation.value
        if act not in _ACTIVATIONS:
            raise NotImplementedError(f"csf: MoE activation {act!r} (supported: {sorted(_ACTIVATIONS)})")
        self.activation, self.w13_layout = _ACTIVATIONS[act]
        if moe.moe_parallel_config.use_ep:
            raise NotImplementedError("csf: expert parallelism is not supported yet (tensor parallel only)")

    # ------------------------------------------------------------------------------------------ weights
    def create_weights(
        self,
        layer: RoutedExperts,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        bs = self.fmt.block_size
        e, h, n = num_experts, hidden_size, intermediate_size_per_partition
        if h % bs or n % bs:
            raise ValueError(f"csf: hidden {h} and per-rank intermediate {n} must be multiples of the block {bs}")
        self.num_experts, self.hidden_size, self.intermediate_size = e, h, n
        # the token counts the engine will capture in CUDA graphs: each becomes a planned bucket (read here, while
        # vLLM's config is current; process_weights_after_loading may run outside that context)
        cfg = get_current_vllm_config_or_none()
        sizes = cfg.compilation_config.cudagraph_capture_sizes if cfg is not None else None
        self.capture_sizes = tuple(sorted({int(t) for t in sizes or () if int(t) > 0}))
        rows = self.moe.w13_num_shards * n
        scale_dtype = torch.float8_e4m3fn if self.fmt.name == "nvfp4" else torch.uint8

        def add(name: str, shape: tuple[int, ...], dtype: torch.dtype, quant_method: str | None = None) -> None:
            p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, extra_weight_attrs)
            if quant_method is not None:
                p.quant_method = quant_method  # read by RoutedExperts.weight_loader to TP-slice scales

        add("w13_weight", (e, rows, h // 2), torch.uint8)
        add("w13_weight_scale", (e, rows, h // bs), scale_dtype, "block")
        add("w2_weight", (e, h, n // 2), torch.uint8)
        add("w2_weight_scale", (e, h, n // bs), scale_dtype, "block")
        if self.fmt.name == "nvfp4":
            # ModelOpt's per-expert global scales: one per gate/up shard while loading, as vLLM's loader writes them
            add("w13_weight_scale_2", (e, 2), torch.float32, "tensor")
            add("w2_weight_scale_2", (e,), torch.float32, "tensor")
            # ModelOpt checkpoints carry activation scales too; a W4A16 layer loads and drops them
            add("w13_input_scale", (e,), torch.float32, "tensor")
            add("w2_input_scale", (e,), torch.float32, "tensor")
        if self.moe.has_bias:
            add("w13_bias", (e, rows), torch.bfloat16)
            add("w2_bias", (e, h), torch.bfloat16)

    def geometry(self, layer: RoutedExperts) -> MoEGeometry:
        """The layer as this rank holds it (a catalog entry or not)."""
        return MoEGeometry(
            model=layer.layer_name or "vllm",
            tp=self.moe.tp_size,
            fmt=self.fmt,
            experts=self.num_experts,
            hidden=self.hidden_size,
            intermediate=self.intermediate_size,
            top_k=self.moe.experts_per_token,
            activation=self.activation,
            bias=self.moe.has_bias,
        )

    def _w13_global_scale(self, layer: RoutedExperts) -> torch.Tensor:
        g = layer.w13_weight_scale_2.data
        if not torch.equal(g[:, 0], g[:, 1]):
            raise ValueError(f"csf: {layer.layer_name}: gate and up weight_scale_2 differ; one per expert is supported")
        return g[:, 0]

    def prepare(self, layer: RoutedExperts):
        """Plan the layer and build its weights (inline CSF scales) on the weights' device; no binding."""
        from csf_moe import plan, prepare_weights

        max_tokens = self.moe.max_num_tokens
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
            w13_bias=getattr(layer, "w13_bias", None),
            w2_bias=getattr(layer, "w2_bias", None),
            w13_layout=self.w13_layout,
        )
        return p, w

    def release_native(self, layer: RoutedExperts, weights) -> LayerScaleMemory:
        """Drop what ``weights`` now holds in another form, and record the scale memory returned."""
        for name in _RELEASED:
            old = getattr(layer, name, None)
            if isinstance(old, torch.Tensor):
                setattr(layer, name, torch.nn.Parameter(old.new_empty(0), requires_grad=False))
        # an interleaved W13 was reordered into a new tensor: keep only that one
        layer.w13_weight = torch.nn.Parameter(weights.w13.values, requires_grad=False)
        layer.w2_weight = torch.nn.Parameter(weights.w2.values, requires_grad=False)
        sizes = weights.scale_bytes()
        entry = LayerScaleMemory(layer=layer.layer_name, native_bytes=sizes["native"], stored_bytes=sizes["stored"])
        LEDGER.record(entry)
        return entry

    def process_weights_after_loading(self, layer: RoutedExperts) -> None:
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
        bound = getattr(layer, BOUND_ATTR, None)
        if bound is None:
            raise RuntimeError(f"csf: {layer.layer_name} was not processed after loading")
        return bound.run(x, topk_ids, topk_weights.to(torch.float32))
