"""The engine-neutral half of csf's MoE quantization method: parameters, plan, preparation, binding.

Each engine's ``CsfMoEMethod`` derives from :class:`CsfMoECore` and the engine's ``FusedMoEMethodBase``;
it reads the engine's config (activation, parallelism, token limits, CUDA-graph sizes) and supplies the
hooks below. Everything from the parameter list to the released scale planes happens here, once. Which GEMM a
layer runs on (csf's Triton layer, or the engine's W4A16 or W4A8 GEMMs: ``CSF_MOE_ENGINE``, ``CSF_MOE_W4A8``, read
when the layer is created) is :mod:`.gemm_choice`'s, the only module here that knows the engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from csf_codec import ScaleFormat
from csf_kernels import env, runtime
from csf_kernels.catalog import MoEGeometry

from .accounting import LEDGER, LayerScaleMemory
from .checkpoint_config import COMPRESSED_TENSORS
from .gemm_choice import TRITON, GemmChoice, gemm_choice
from .layer_order import MOE_ORDER, prefetch_enabled, prefetcher
from .scratch import SharedRouteBuffers, SharedScratch

__all__ = ["BOUND_ATTR", "COMPRESSED_TENSORS_NAMES", "LOCAL_ROUTES_ATTR", "MODELOPT_NAMES", "ROUTE_BUFFERS", "SCRATCH",
           "CsfMoECore", "ParamNames", "param_names", "plan_rank_layer"]  # fmt: skip

logger = logging.getLogger(__name__)

BOUND_ATTR = "csf_moe_layer"  # the bound csf_moe.MoELayer (or EngineLayer), kept on the engine's MoE module
LOCAL_ROUTES_ATTR = "csf_local_routes"  # its csf_moe.LocalRoutes where the engine hands it the model's route ids
SCRATCH = SharedScratch()
ROUTE_BUFFERS = SharedRouteBuffers()  # the working memory of every layer's LocalRoutes, per device


def plan_rank_layer(
    geometry: MoEGeometry, max_tokens: int, capture_sizes: tuple[int, ...] = (), choice: GemmChoice = TRITON
):
    """The plan a served rank's layer runs on ``choice``'s GEMM (csf's Triton layer by default): inline scales (W4A8:
    scale panels), the catalog's token buckets and the engine's CUDA-graph sizes up to ``max_tokens``. With
    :func:`csf_moe.prepare_weights` (or, on the engine, :func:`csf_moe.prepare_engine_weights`) on the rank's tensors
    (as :func:`csf_moe.shard_weights` slices them, or the engine's loader wrote them) it builds the layer an adapter
    serves."""
    return choice.plan(geometry, max_tokens, capture_sizes)


@dataclass(frozen=True)
class ParamNames:
    """How the engine's own FP4 MoE method of a checkpoint's convention names its parameters (``w13_`` /
    ``w2_`` + these), so its weight loader routes checkpoint tensors into them."""

    values: str  # packed E2M1 bytes
    global_scale: str  # NVFP4's per-expert second-level scale
    input_scale: str  # activation scales (loaded, unused by W4A16)
    inverted_global: bool  # the checkpoint stores 1 / scale (compressed-tensors)
    input_scale_method: str | None  # the loader's slicing attribute for input scales, None: the engine's default
    w13_input_per_shard: bool  # w13's input scale has one value per gate/up shard: [E, 2]


MODELOPT_NAMES = ParamNames(  # ModelOpt NVFP4, and gpt-oss's MXFP4
    values="weight",
    global_scale="weight_scale_2",
    input_scale="input_scale",
    inverted_global=False,
    input_scale_method=None,
    w13_input_per_shard=False,
)
COMPRESSED_TENSORS_NAMES = ParamNames(
    values="weight_packed",
    global_scale="weight_global_scale",
    input_scale="input_global_scale",
    inverted_global=True,
    input_scale_method="tensor",
    w13_input_per_shard=True,
)


def param_names(base_quant_method: str | None) -> ParamNames:
    return COMPRESSED_TENSORS_NAMES if base_quant_method == COMPRESSED_TENSORS else MODELOPT_NAMES


class CsfMoECore:
    # set by the engine's method
    fmt: ScaleFormat
    engine: str  # the model name of geometries of unnamed layers
    scale_quant_method: str  # the engine loader's name for block-scale slicing ("block", "group")
    input_scale_quant_method: str | None  # ... and for per-expert scalars ("tensor"), if it wants one
    activation: str  # csf-moe's name
    names: ParamNames = MODELOPT_NAMES
    w13_layout: str = "gate_up"
    bias_name: str = "bias"  # expert biases as the engine's loader names them: w13_<bias_name>, w2_<bias_name>
    capture_sizes: tuple[int, ...] = ()
    prefetch: bool = False  # side-stream expansion (CSF_EXPANSION_PREFETCH), read once the layer is bound
    gemm: GemmChoice = TRITON  # the layer's GEMM (CSF_MOE_ENGINE, CSF_MOE_W4A8), read once: choose_gemm

    def choose_gemm(self) -> None:
        """Read the GEMM switches for this layer (the engine's method calls it as it creates the layer, once its
        scale format is known): csf's Triton layer, the engine's W4A16 GEMMs or its W4A8 GEMM (gemm_choice)."""
        self.gemm = gemm_choice(self.fmt.name)

    # hooks: the engine's view of the layer
    def tp_size(self) -> int:
        raise NotImplementedError

    def ep_size(self) -> int:
        raise NotImplementedError

    def global_expert_map(self, layer) -> torch.Tensor | None:
        """int32 [model's experts] -> local id or -1, where the engine hands ``apply`` the model's route ids (None:
        it hands the rank's own)."""
        return None

    def top_k(self) -> int:
        raise NotImplementedError

    def has_bias(self) -> bool:
        raise NotImplementedError

    def max_tokens(self) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ weights
    def register_parameters(self, layer, e: int, h: int, n: int, *, w13_rows: int, attrs: dict, set_attrs) -> None:
        """The parameters of the engine's own FP4 MoE methods (names, shapes, dtypes, slicing attributes),
        so its weight loader TP-slices checkpoint tensors into them as it does for those methods."""
        bs = self.fmt.block_size
        if h % bs or n % bs:
            raise ValueError(f"csf: hidden {h} and per-rank intermediate {n} must be multiples of the block {bs}")
        self.num_experts, self.hidden_size, self.intermediate_size = e, h, n
        scale_dtype = torch.float8_e4m3fn if self.fmt.name == "nvfp4" else torch.uint8

        def add(name: str, shape: tuple[int, ...], dtype: torch.dtype, quant_method: str | None = None) -> None:
            p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, p)
            set_attrs(p, attrs)
            if quant_method is not None:
                p.quant_method = quant_method  # read by the engine's weight_loader to TP-slice scales

        v, g, i = self.names.values, self.names.global_scale, self.names.input_scale
        add(f"w13_{v}", (e, w13_rows, h // 2), torch.uint8)
        add("w13_weight_scale", (e, w13_rows, h // bs), scale_dtype, self.scale_quant_method)
        add(f"w2_{v}", (e, h, n // 2), torch.uint8)
        add("w2_weight_scale", (e, h, n // bs), scale_dtype, self.scale_quant_method)
        if self.fmt.name == "nvfp4":
            # per-expert global scales: one per gate/up shard while loading, as the engines write them
            add(f"w13_{g}", (e, 2), torch.float32, "tensor")
            add(f"w2_{g}", (e,), torch.float32, "tensor")
            # NVFP4 checkpoints carry activation scales too; a W4A16 layer loads and drops them
            method = self.names.input_scale_method or self.input_scale_quant_method
            add(f"w13_{i}", (e, 2) if self.names.w13_input_per_shard else (e,), torch.float32, method)
            add(f"w2_{i}", (e,), torch.float32, method)
        if self.has_bias():
            add(f"w13_{self.bias_name}", (e, w13_rows), torch.bfloat16)
            add(f"w2_{self.bias_name}", (e, h), torch.bfloat16)

    def geometry(self, layer) -> MoEGeometry:
        """The layer as this rank holds it (a catalog entry or not)."""
        return MoEGeometry(
            model=getattr(layer, "layer_name", None) or self.engine,
            tp=self.tp_size(),
            ep=self.ep_size(),
            fmt=self.fmt,
            experts=self.num_experts,
            hidden=self.hidden_size,
            intermediate=self.intermediate_size,
            top_k=self.top_k(),
            activation=self.activation,
            bias=self.has_bias(),
        )

    def _global_scales(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        """(W13, W2) per-expert global scales as multipliers (one per expert: gate and up must agree)."""
        g13, g2 = (getattr(layer, f"{stem}_{self.names.global_scale}").data for stem in ("w13", "w2"))
        if not torch.equal(g13[:, 0], g13[:, 1]):
            raise ValueError(f"csf: {layer.layer_name}: gate and up global scales differ; one per expert is supported")
        g13 = g13[:, 0]
        return (1.0 / g13, 1.0 / g2) if self.names.inverted_global else (g13, g2)

    def values(self, layer, stem: str) -> torch.Tensor:
        return getattr(layer, f"{stem}_{self.names.values}").data

    def prepare(self, layer):
        """Plan the layer on its GEMM and build its weights (inline scales; W4A8: scale panels) on the weights'
        device; no binding."""
        p = plan_rank_layer(self.geometry(layer), self.max_tokens(), self.capture_sizes, self.gemm)
        g13, g2 = self._global_scales(layer) if self.fmt.name == "nvfp4" else (None, None)
        w = self.gemm.prepare(
            p,
            w13=self.values(layer, "w13"),
            w13_scale=layer.w13_weight_scale.data,
            w2=self.values(layer, "w2"),
            w2_scale=layer.w2_weight_scale.data,
            w13_global_scale=g13,
            w2_global_scale=g2,
            w13_bias=getattr(layer, f"w13_{self.bias_name}", None),
            w2_bias=getattr(layer, f"w2_{self.bias_name}", None),
            w13_layout=self.w13_layout,
        )  # the layer's FP4 parameters handed over: replaced by the results (release_native)
        return p, w

    def release_native(self, layer, weights) -> LayerScaleMemory:
        """Drop what ``weights`` now holds in another form, and record the scale memory returned."""
        # after binding: copied by the preparation (biases and global scales as float32), or unused (input scales:
        # W4A16 multiplies bf16 activations, W4A8 quantizes its own per token)
        n = self.names
        released = ["weight_scale", n.global_scale, n.input_scale, self.bias_name]
        for name in (f"{stem}_{r}" for stem in ("w13", "w2") for r in released):
            old = getattr(layer, name, None)
            if isinstance(old, torch.Tensor):
                setattr(layer, name, torch.nn.Parameter(old.new_empty(0), requires_grad=False))
        # what the GEMM reads (an interleaved W13 the Triton layer reordered into a new tensor): keep only that
        w13, w2 = self.gemm.values(weights)
        setattr(layer, f"w13_{n.values}", torch.nn.Parameter(w13, requires_grad=False))
        setattr(layer, f"w2_{n.values}", torch.nn.Parameter(w2, requires_grad=False))
        sizes = weights.scale_bytes()
        entry = LayerScaleMemory(layer=layer.layer_name, native_bytes=sizes["native"], stored_bytes=sizes["stored"],
                                 form=self.gemm.form(weights))  # fmt: skip
        LEDGER.record(entry)
        return entry

    def process_weights_after_loading(self, layer) -> None:
        device = self.values(layer, "w13").device
        if device.type != "cuda":
            raise RuntimeError(
                f"csf: {layer.layer_name}: the CSF fused MoE runs on a CUDA GPU (Hopper, sm_90a); "
                f"its weights are on {device}"
            )
        p, w = self.prepare(layer)
        scratch = SCRATCH.get(device, p.scratch_bytes)
        bound = self.gemm.bind(p, w, scratch, l2_resident_scales=env.flag(env.L2_SCALES))  # resolves every program
        setattr(layer, BOUND_ATTR, bound)
        self.map_routes(layer, p.max_pairs, device)
        MOE_ORDER.add(layer)  # the model's MoE layers in forward order (they are processed in that order)
        # read here, not on every forward call; only the Triton layer expands scales a side stream could prefetch
        self.prefetch = self.gemm.expands_scales and prefetch_enabled()
        # serving from here on: a program missing from the AOT cache is an error naming it, never a compilation
        runtime.freeze()
        entry = self.release_native(layer, w)
        logger.debug("csf: %s keeps %d of %d scale bytes", entry.layer, entry.stored_bytes, entry.native_bytes)

    def map_routes(self, layer, max_pairs: int, device: torch.device) -> None:
        """Where the engine routes with the model's expert ids: the layer's LocalRoutes, writing the device's shared
        route buffers (grown now, while layers are processed after loading and before the engine captures CUDA
        graphs, so that the mapping in ``apply`` is captured allocating nothing)."""
        from csf_moe import LocalRoutes

        expert_map = self.global_expert_map(layer)
        if expert_map is not None:
            buffers = ROUTE_BUFFERS.get(device, max_pairs)
            setattr(layer, LOCAL_ROUTES_ATTR, LocalRoutes(expert_map.to(device), max_pairs, buffers))

    def bound_layer(self, layer):
        bound = getattr(layer, BOUND_ATTR, None)
        if bound is None:
            raise RuntimeError(f"csf: {layer.layer_name} was not processed after loading")
        return bound

    def run_experts(self, layer, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The layer's MoE output for the engine's routing (this rank's experts' share of it under expert
        parallelism: the model's route ids go through the layer's LocalRoutes, other ranks' experts are skipped).
        Calls that expand scales (above the inline token limit) read an expansion made on a side stream while the
        engine ran attention, and start the next layer's when ``CSF_EXPANSION_PREFETCH`` is set (see
        csf_moe.prefetch and layer_order)."""
        bound = self.bound_layer(layer)
        local_routes = getattr(layer, LOCAL_ROUTES_ATTR, None)
        if local_routes is not None:
            topk_ids = local_routes(topk_ids)
        if not self.prefetch:
            return bound.run(x, topk_ids, topk_weights)
        index = MOE_ORDER.index(layer)
        nxt = MOE_ORDER.after(index)
        return prefetcher(x.device).run(index, bound, x, topk_ids, topk_weights,
                                        next_layer=None if nxt is None else getattr(nxt, BOUND_ATTR, None))  # fmt: skip
