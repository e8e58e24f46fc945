"""The MoE layer on the engine's grouped GEMMs (``docs/moe-engine.md``), MXFP4 or NVFP4 (per-expert global scales
applied in the GEMMs' epilogues), native scales. Not yet a plan of :mod:`csf_moe.plan` (the adapters serve
:mod:`csf_moe.layer`); ``bench_moe`` times it as the ``engine`` arm (``engine_unfused``: the activation as its own
pass) beside today's layer and the peer.

A call: align the routes into blocks of ``bm`` routes per expert (the alignment programs of today's layer); FC1 as a
grouped GEMM whose producer fetches each slot's token row of ``x`` itself and whose epilogue adds W13's bias and
applies the activation into ``[slots, N]`` (bf16; or, unfused, the GEMM ``[slots, 2N]`` then an activation pass);
FC2 as a grouped GEMM whose epilogue stores each slot's row at its route, ``[pairs, H]``; then the top-k weighted
sum with FC2's bias, reading a token's ``k`` rows in order. Routes of experts outside ``[0, E)`` join no block and
contribute nothing. The GEMMs and the Triton passes launch as programmatic dependent launches where the runtime
allows (each waits for its predecessor before reading). Every buffer is allocated when a token count is bound; a
bound call allocates nothing and follows new routings as device data, so CUDA graphs capture it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_kernels.moe.engine import act_launch, combine_launch, grouped_fp4_gemm_launch
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel, fc1_engine_rows
from csf_kernels.moe.engine_specs import ENGINE_FORMATS, engine_tile_n
from csf_kernels.moe.launch import align_launches, max_blocks_for
from csf_kernels.moe.specs import experts_bins

from .reference import QuantizedExperts

__all__ = ["EngineMoE", "EngineWeights", "engine_weights"]


@dataclass(frozen=True, eq=False)
class EngineWeights:
    """One layer's experts as the engine reads them: weight and scale panels of W13 (rows in the activation's
    layout) and W2, float32 biases, NVFP4's float32 global scales."""

    w13: torch.Tensor  # uint64 [E, H / 64, 2N / 64, 256]
    s13: torch.Tensor  # uint8 [E, H / 64, 2N b]: b scale bytes a row a step (MXFP4 2, NVFP4 4)
    w2: torch.Tensor  # uint64 [E, N / 64, H / 64, 256]
    s2: torch.Tensor  # uint8 [E, N / 64, H b]
    b13: torch.Tensor | None
    b2: torch.Tensor | None
    activation: str
    fused: bool  # W13's rows (and b13) in engine order: FC1's epilogue applies the activation
    fmt: str = "mxfp4"
    g13: torch.Tensor | None = None  # NVFP4: float32 [E]
    g2: torch.Tensor | None = None

    @property
    def experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2.shape[2] * 64

    @property
    def inter(self) -> int:
        return self.w2.shape[1] * 64


def _panels(values: torch.Tensor, scales: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.stack([engine_weight_panel(values[e]) for e in range(values.shape[0])])
    s = torch.stack([engine_scale_panel(scales[e], fmt) for e in range(scales.shape[0])])
    return w, s


def _global_scale(g: torch.Tensor | None, experts: int, name: str) -> torch.Tensor:
    if g is None:
        raise ValueError(f"NVFP4 experts need {name} (float32 per expert)")
    g = g.to(torch.float32).reshape(-1)
    if g.numel() != experts:
        raise ValueError(f"{name}: {g.numel()} values for {experts} experts")
    return g.contiguous()


def engine_weights(experts: QuantizedExperts, activation: str, *, fused: bool = True) -> EngineWeights:
    """Panels of MXFP4 or NVFP4 experts (on their device; NVFP4's global scales passed through); W13 rows as
    ``activation`` reads them (``csf_moe.reference``), rearranged into engine order where FC1's epilogue applies the
    activation (``fused``)."""
    fmt = experts.fmt
    if fmt not in ENGINE_FORMATS:
        raise NotImplementedError(f"the engine layer serves {ENGINE_FORMATS} weights; got {fmt}")
    for name, t in (("W13", experts.w13), ("W2", experts.w2)):
        if t.shape[1] % 64 or (2 * t.shape[2]) % 64:
            raise ValueError(f"{name} {tuple(t.shape)}: the engine needs rows and K in whole multiples of 64")
    nv = fmt == "nvfp4"
    g13 = _global_scale(experts.w13_global_scale, experts.experts, "w13_global_scale") if nv else None
    g2 = _global_scale(experts.w2_global_scale, experts.experts, "w2_global_scale") if nv else None
    v13, sc13, b13 = experts.w13, experts.w13_scale, experts.b13
    if fused:
        perm = fc1_engine_rows(v13.shape[1] // 2, interleaved=activation == "swiglu_oai").to(v13.device)
        v13, sc13 = v13[:, perm], sc13[:, perm]
        b13 = None if b13 is None else b13[:, perm]
    w13, s13 = _panels(v13, sc13, fmt)
    w2, s2 = _panels(experts.w2, experts.w2_scale, fmt)
    b13 = None if b13 is None else b13.float().contiguous()
    b2 = None if experts.b2 is None else experts.b2.float().contiguous()
    return EngineWeights(w13=w13, s13=s13, w2=w2, s2=s2, b13=b13, b2=b2, activation=activation, fused=fused, fmt=fmt,
                         g13=g13, g2=g2)  # fmt: skip


class EngineMoE:
    """The engine layer of one set of weights; :meth:`call` binds a token count's buffers and launches."""

    def __init__(self, weights: EngineWeights, top_k: int):
        self.weights = weights
        self.top_k = top_k

    def _fc1(self, x, sorted_ids, h, a, block_expert, meta, bm) -> list:
        """FC1 gathering its rows of ``x`` and its activation: one GEMM whose epilogue activates, or the GEMM then
        the activation pass."""
        w = self.weights
        rows = dict(fmt=w.fmt, global_scale=w.g13, io="gather", sorted_ids=sorted_ids, top_k=self.top_k)
        if w.fused:
            return [grouped_fp4_gemm_launch(w.w13, w.s13, x, a, block_expert, meta, tile_n=bm,
                                            activation=w.activation, bias=w.b13, **rows)]  # fmt: skip
        return [
            grouped_fp4_gemm_launch(w.w13, w.s13, x, h, block_expert, meta, tile_n=bm, **rows),
            act_launch(h, block_expert, meta, w.b13, a, num_experts=w.experts, bm=bm, activation=w.activation),
        ]

    def _fc2(self, a, y, sorted_ids, block_expert, meta, bm):
        """FC2 storing each slot's row at its route."""
        w = self.weights
        return grouped_fp4_gemm_launch(w.w2, w.s2, a, y, block_expert, meta, tile_n=bm, fmt=w.fmt, global_scale=w.g2,
                                       io="scatter", sorted_ids=sorted_ids)  # fmt: skip

    def call(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor):
        """A zero-argument function running the layer on ``x`` into ``out`` with these routes (their values may
        change between runs; their shapes may not), its buffers allocated now."""
        w = self.weights
        tokens = x.shape[0]
        pairs = tokens * self.top_k
        experts = w.experts
        bm = engine_tile_n(pairs / experts)
        blocks = max_blocks_for(pairs, experts, bm)
        dev = x.device
        i32 = dict(dtype=torch.int32, device=dev)
        cursor = torch.empty(experts_bins(experts), **i32)
        block_expert = torch.empty(blocks, **i32)
        active = torch.empty(min(pairs, experts), **i32)
        meta = torch.empty(4, **i32)
        sorted_ids = torch.empty(blocks * bm, **i32)
        bf16 = dict(dtype=torch.bfloat16, device=dev)
        h = None if w.fused else torch.empty(blocks * bm, 2 * w.inter, **bf16)
        a = torch.empty(blocks * bm, w.inter, **bf16)
        y = torch.empty(pairs, w.hidden, **bf16)  # FC2's rows at their routes: a token's k rows contiguous
        weights32 = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
        scratch = dict(
            cursor=cursor, block_expert=block_expert, active_experts=active, meta=meta, sorted_ids=sorted_ids
        )
        launches = [
            *align_launches(topk_ids, num_experts=experts, bm=bm, **scratch),
            *self._fc1(x, sorted_ids, h, a, block_expert, meta, bm),
            self._fc2(a, y, sorted_ids, block_expert, meta, bm),
            combine_launch(y, w.b2, topk_ids.view(tokens, self.top_k), weights32, out, num_experts=experts),
        ]
        bound = [launch.bind("engine layer") for launch in launches]
        keep = (cursor, block_expert, active, meta, sorted_ids, h, a, y, weights32)

        def run() -> torch.Tensor:
            if weights32 is not topk_weights:
                weights32.copy_(topk_weights)
            for launch in bound:
                launch()
            return out

        run.buffers = keep  # alive as long as the function
        run.launches = tuple(zip((launch.spec.kernel for launch in launches), bound, strict=True))
        return run
