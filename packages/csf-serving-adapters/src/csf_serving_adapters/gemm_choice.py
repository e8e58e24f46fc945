"""Which GEMM serves a MoE layer, and everything the adapters do differently for it: the one place of the adapters
that knows the engine exists (``docs/moe-engine.md``; issue 47's switch).

Two switches, read once when the serving engine creates the layer (:func:`gemm_choice`, through ``csf_kernels.env``):

* ``CSF_MOE_ENGINE``: the CuTe DSL engine's grouped GEMMs (W4A16, inline engine records its FP4 GEMM decodes) instead
  of csf's Triton layer (inline CSF tile records, expanded or decoded per the Triton plan);
* ``CSF_MOE_W4A8``: W4A8 on the engine (MXFP4 weights, vLLM's dynamic per-token FP8 activations); implies the engine
  (``CSF_MOE_ENGINE`` falsy beside it is an error), refused for NVFP4 (its block factors do not fold into E4M3). The
  W4A8 GEMM has no inline source: its layer keeps scale panels as large as the native planes, plus its row bases and
  fold flags, so a W4A8 layer gives no scale memory back (the ledger's ``engine-w4a8-native`` form says so).

A :class:`GemmChoice` plans the layer (its buckets the catalog's and the engine's CUDA-graph sizes), prepares its
weights from the engine's loaded parameters (in place), binds it to the device's shared scratch (resolving every
program the plan lists: frozen, a missing one is an error naming it) and names the form the ledger records.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_kernels import env
from csf_kernels.catalog import MoEGeometry, load_catalog

__all__ = ["ENGINE", "TRITON", "W4A8", "GemmChoice", "gemm_choice"]


@dataclass(frozen=True)
class GemmChoice:
    gemm: str  # csf_moe.plan's gemm: "triton" or "engine"
    activations: str  # csf_moe.plan's activations: "bf16" or "fp8_per_token"

    @property
    def engine(self) -> bool:
        return self.gemm == "engine"

    @property
    def expands_scales(self) -> bool:
        """Whether the layer's calls may expand scales (the Triton layer's; the side-stream prefetch serves them)."""
        return not self.engine

    def plan(self, geometry: MoEGeometry, max_tokens: int, capture_sizes: tuple[int, ...] = ()):
        """The rank's layer plan: inline scales (W4A8: scale panels), the catalog's token buckets and the engine's
        CUDA-graph sizes up to ``max_tokens``."""
        from csf_moe import plan

        buckets = tuple(sorted({t for t in (*load_catalog().token_buckets, *capture_sizes) if t <= max_tokens}))
        return plan(geometry, max_tokens=max_tokens, gemm=self.gemm, activations=self.activations,
                    scale_source="native" if self.activations != "bf16" else "inline",
                    buckets=buckets or None)  # fmt: skip

    def prepare(self, plan, **tensors):
        """The layer's weights for ``plan`` from the engine's parameters (``csf_moe.prepare_weights`` keywords), the
        packed values handed over and rewritten in place."""
        from csf_moe import prepare_engine_weights, prepare_weights

        prepare = prepare_engine_weights if self.engine else prepare_weights
        return prepare(plan, values_in_place=True, **tensors)

    def bind(self, plan, weights, scratch: torch.Tensor, *, l2_resident_scales: bool = False):
        """The served layer (``run(x, topk_ids, topk_weights, out=None)``, ``plan``, ``expands(tokens)``)."""
        from csf_moe import bind, bind_engine

        if self.engine:
            return bind_engine(plan, weights, scratch)  # its GEMMs expand nothing: no L2 window to keep
        return bind(plan, weights, scratch, l2_resident_scales=l2_resident_scales)

    def values(self, weights) -> tuple[torch.Tensor, torch.Tensor]:
        """(W13, W2) packed weights the layer keeps: the GEMM's words (Triton) or panels (engine), in the storage of
        the engine's own parameters where prepared in place."""
        if self.engine:
            return weights.w13, weights.w2
        return weights.w13.values, weights.w2.values

    def form(self, weights) -> str:
        """What a layer of these weights keeps of its scales (``csf_serving_adapters.accounting.FORMS``)."""
        if not self.engine:
            return "triton-native" if weights.w13.inline is None else "triton-inline"
        return f"engine-{'w4a8-' if weights.w4a8 else ''}{weights.scale_source}"


TRITON = GemmChoice("triton", "bf16")
ENGINE = GemmChoice("engine", "bf16")
W4A8 = GemmChoice("engine", "fp8_per_token")


def gemm_choice(fmt: str) -> GemmChoice:
    """The GEMM a new layer of ``fmt`` weights runs on, from ``CSF_MOE_ENGINE`` and ``CSF_MOE_W4A8`` (read now)."""
    w4a8 = env.flag(env.MOE_W4A8)
    engine = env.flag(env.MOE_ENGINE, default=w4a8)
    if w4a8 and not engine:
        raise ValueError(f"csf: {env.MOE_W4A8} runs W4A8 on the engine's FP8 GEMM; {env.MOE_ENGINE} is set falsy "
                         f"beside it (unset it, or unset {env.MOE_W4A8} to serve W4A16)")  # fmt: skip
    if w4a8 and fmt != "mxfp4":
        raise ValueError(f"csf: {env.MOE_W4A8} serves MXFP4 experts; {fmt}'s block factors do not fold into E4M3 "
                         f"(docs/moe-engine.md §8.1), so it stays W4A16: unset {env.MOE_W4A8} (or serve it on the "
                         f"engine with {env.MOE_ENGINE}=1)")  # fmt: skip
    return W4A8 if w4a8 else ENGINE if engine else TRITON
