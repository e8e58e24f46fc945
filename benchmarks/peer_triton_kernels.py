"""OpenAI's triton_kernels MoE as a bench_moe arm, where ``triton_kernels`` is importable (never vendored here).

The peer is the layer as vLLM 0.33's MXFP4 ``TRITON`` backend prepares and runs it on Hopper
(``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` and ``triton_kernel_fused_experts`` there):

- W13 rows interleaved (gate, up, ...), FP4 values and E8M0 scales transposed so K is the quantized axis and
  swizzled into the Hopper value and scale layouts (``make_default_matmul_mxfp4_w_layout(mx_axis=1)``, the scale
  layout for 8 warps), the scale planes' K padded to a multiple of 4 first, and ``split_k`` held at 1;
- FC1 with its routes gathered and gpt-oss's clamped SwiGLU fused (alpha 1.702, limit 7.0), FC2 with the routes
  scattered and weighted by their gates: two ``matmul_ogs`` calls.

Only the API generation that vLLM calls "3.5.1" is driven (``matmul_ogs`` with ``routing.RoutingData``: vLLM 0.33's
own copy, ``vllm/third_party/triton_kernels``, which it uses unless another is installed). ``scripts/
stage_triton_kernels.sh`` puts that copy, or a triton checkout's, under ``.peers/`` (git-ignored) for the device.

As ``../shared/notes/anchors.md`` measured it, the timed call is the experts only: the routing data (experts
sorted, gather and scatter indices, per-block maps) is built from the call's top-k ids before capture, so the
peer's figure leaves out the work csf's call does to align its routes. The peer always computes gpt-oss's
activation; on the SiLU geometries (DeepSeek, Qwen) its output is checked against the float32 reference with that
activation over the same FP4 weights, which is how anchors.md timed them too.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from csf_moe.reference import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, QuantizedExperts, interleave_gate_up
from csf_moe.synthetic import SyntheticLayer

SUPPORTED_API = "3.5.1"
# vLLM's patch for its Hopper path (#47303): the scale planes' K (groups of 32) padded to a multiple of 4
SCALE_K_MULTIPLE = 4
SCALE_LAYOUT_WARPS = 8


def api_generation(tk) -> str:
    """The MoE API generation of an imported ``triton_kernels``, as vLLM names them (it exposes no version)."""
    try:
        importlib.import_module(f"{tk.__name__}.matmul_ogs")
    except ImportError:
        return "3.8"
    return "3.6" if hasattr(importlib.import_module(f"{tk.__name__}.tensor"), "SparseMatrix") else "3.5.1"


def tree_sha256(package_dir: Path) -> str:
    """sha256 over the package's Python sources (relative path and bytes, in path order): which copy ran."""
    h = hashlib.sha256()
    for f in sorted(package_dir.rglob("*.py")):
        h.update(str(f.relative_to(package_dir)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def import_triton_kernels(extra_path: str | None = None):
    """``triton_kernels``: from ``extra_path`` (a staged copy's parent), an installed one, or vLLM's own copy, which
    vLLM then uses too (registered under the plain name, as vLLM does)."""
    if extra_path:
        sys.path.insert(0, str(Path(extra_path).resolve()))
    try:
        return importlib.import_module("triton_kernels")
    except ImportError:
        try:
            tk = importlib.import_module("vllm.third_party.triton_kernels")
        except ImportError:
            raise ImportError("no triton_kernels: neither installed, staged (.peers/), nor vLLM's copy") from None
        sys.modules["triton_kernels"] = tk
        return tk


def _source(tk, package: Path) -> str:
    """Where the copy came from: a staged copy's SOURCE line, or the vLLM it ships with."""
    if tk.__name__.startswith("vllm."):
        import vllm

        return f"vllm {vllm.__version__}: its own copy ({tk.__name__})"
    source = package.parent / "SOURCE"
    return source.read_text().strip() if source.exists() else "unrecorded"


def status(extra_path: str | None = None) -> dict:
    """Whether the arm can run here: where ``triton_kernels`` comes from, its API generation and tree hash."""
    try:
        tk = import_triton_kernels(extra_path)
    except ImportError as exc:
        return {"importable": False, "why": f"not importable here ({exc}); figures of anchors.md used instead"}
    package = Path(tk.__file__).parent
    out = {
        "importable": True,
        "path": str(package),
        "api": api_generation(tk),
        "tree_sha256": tree_sha256(package),
        "source": _source(tk, package),
    }
    if out["api"] != SUPPORTED_API:
        out |= {"importable": False, "why": f"API generation {out['api']} (the arm drives {SUPPORTED_API} only)"}
    return out


@dataclass(frozen=True)
class PeerRouting:
    """A call's routing in triton_kernels' form, built before the call (not timed)."""

    data: object  # triton_kernels.routing.RoutingData
    gather: object  # GatherIndx
    scatter: object  # ScatterIndx
    tokens: int


class TritonKernelsMoE:
    """The peer's layer over the same FP4 weights as a csf arm (MXFP4 only)."""

    def __init__(self, layer: SyntheticLayer):
        from triton_kernels.matmul_ogs import FlexCtx, FnSpecs, FusedActivation, PrecisionConfig
        from triton_kernels.matmul_ogs_details import opt_flags
        from triton_kernels.numerics import InFlexData
        from triton_kernels.swiglu import swiglu_fn

        geo = layer.geometry
        if geo.fmt.name != "mxfp4":
            raise ValueError(f"triton_kernels' Hopper MoE takes MXFP4 weights, not {geo.fmt.name}")
        self.geometry = geo
        self.device = layer.w2.device
        self.reference = self._reference(layer)
        if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
            opt_flags.update_opt_flags_constraints({"split_k": 1})  # as vLLM sets it on Hopper
        ref = self.reference
        self.w13, s13 = self._swizzled(ref.w13, ref.w13_scale)
        self.w2, s2 = self._swizzled(ref.w2, ref.w2_scale)
        self.b13 = None if ref.b13 is None else ref.b13.float().contiguous()
        self.b2 = None if ref.b2 is None else ref.b2.float().contiguous()
        self.fc1_precision = PrecisionConfig(weight_scale=s13, flex_ctx=FlexCtx(rhs_data=InFlexData()))
        self.fc2_precision = PrecisionConfig(weight_scale=s2, flex_ctx=FlexCtx(rhs_data=InFlexData()))
        swiglu = FnSpecs("swiglu", swiglu_fn, ("alpha", "limit"))
        self.act = FusedActivation(swiglu, (SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT), 2)  # 2N columns reduce to N

    @staticmethod
    def _reference(layer: SyntheticLayer) -> QuantizedExperts:
        """The same FP4 weights with W13's rows interleaved, as the peer reads them (and the reference with it)."""
        return QuantizedExperts(
            fmt="mxfp4",
            w13=interleave_gate_up(layer.w13),
            w13_scale=interleave_gate_up(layer.w13_scale),
            w2=layer.w2,
            w2_scale=layer.w2_scale,
            b13=interleave_gate_up(layer.w13_bias),
            b2=layer.w2_bias,
        )

    @staticmethod
    def _swizzled(values: torch.Tensor, scales: torch.Tensor):
        """uint8 values [E, R, K/2] and scales [E, R, K/32] -> the peer's tensors, K on the quantized axis."""
        from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
        from triton_kernels.tensor_details import layout

        scales = torch.nn.functional.pad(scales, (0, -scales.shape[-1] % SCALE_K_MULTIPLE))
        value_layout, value_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
        scale_layout, scale_opts = layout.make_default_matmul_mxfp4_w_scale_layout(
            mx_axis=1, num_warps=SCALE_LAYOUT_WARPS
        )
        w = convert_layout(wrap_torch_tensor(values.transpose(-2, -1), dtype=FP4), value_layout, **value_opts)
        s = convert_layout(wrap_torch_tensor(scales.transpose(-2, -1)), scale_layout, **scale_opts)
        return w, s

    def routing(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> PeerRouting:
        """triton_kernels' routing data for these top-k ids (distinct experts per token; no padding ids), built with
        torch from the ids as triton_kernels' own reference builds it (``routing.routing_torch``), gates in bf16 as
        vLLM passes them."""
        from triton_kernels.routing import GatherIndx, RoutingData, ScatterIndx, compute_expt_data_torch

        tokens, k = topk_ids.shape
        experts = self.geometry.experts
        if int(topk_ids.min()) < 0 or int(topk_ids.max()) >= experts:
            raise ValueError(f"the peer's arm takes live route ids only, in [0, {experts})")
        flat = topk_ids.reshape(-1).to(torch.int32)
        to_sorted = torch.argsort(flat, stable=True)  # sorted slot -> route
        to_route = torch.argsort(to_sorted, stable=True)  # route -> sorted slot
        gates = topk_weights.to(torch.bfloat16).reshape(-1)[to_sorted]
        hist = torch.bincount(flat.long(), minlength=experts).to(torch.int32)
        data = RoutingData(gates, hist, experts, k, compute_expt_data_torch(hist, experts, tokens * k))
        gather = GatherIndx(src_indx=to_sorted.to(torch.int32), dst_indx=to_route.to(torch.int32))
        scatter = ScatterIndx(src_indx=to_route.to(torch.int32), dst_indx=to_sorted.to(torch.int32))
        return PeerRouting(data, gather, scatter, tokens)

    def intermediate(self, routing: PeerRouting) -> torch.Tensor:
        """FC1's output buffer of a call (allocated outside the timed graph)."""
        routes = routing.tokens * self.geometry.top_k
        return torch.empty(1, routes, self.geometry.intermediate, dtype=torch.bfloat16, device=self.device)

    def call(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor):
        """A zero-argument function that runs the layer on this input into ``out``: its routing data and FC1's
        buffer made now, so that the function is what a CUDA graph captures (the experts only)."""
        routing = self.routing(topk_ids, topk_weights)
        inter = self.intermediate(routing)
        return functools.partial(self.run, x, routing, inter, out)

    def run(self, x: torch.Tensor, routing: PeerRouting, inter: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [T, H] bf16 = the layer's output (the two matmul_ogs calls vLLM makes)."""
        from triton_kernels.matmul_ogs import matmul_ogs

        t, h = x.shape
        matmul_ogs(
            x,
            self.w13,
            self.b13,
            routing.data,
            gather_indx=routing.gather,
            precision_config=self.fc1_precision,
            fused_activation=self.act,
            y=inter,
        )
        matmul_ogs(
            inter.view(inter.shape[1], inter.shape[2]),
            self.w2,
            self.b2,
            routing.data,
            scatter_indx=routing.scatter,
            precision_config=self.fc2_precision,
            gammas=routing.data.gate_scal,
            y=out.view(1, t, h),
        )
        return out
