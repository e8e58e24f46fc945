"""Random FP4 expert layers of any geometry, for tests and benchmarks (deterministic from a seed).

Values are uniformly random E2M1 codes; scale planes come from csf_codec.synthetic, whose statistics
follow real checkpoints (rows clustered around a base, rare far values), so the CSF forms compress
and exercise their exception and raw paths as they would on a real model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec.synthetic import PlaneStats, synthetic_fp4_values, synthetic_scale_plane
from csf_kernels.catalog import MoEGeometry

from .reference import QuantizedExperts, interleave_gate_up

__all__ = ["SyntheticLayer", "synthetic_layer", "synthetic_routing"]


@dataclass(frozen=True, kw_only=True)
class SyntheticLayer:
    geometry: MoEGeometry
    w13: torch.Tensor  # uint8 [E, 2N, H/2], rows [gate; up]
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w13_global_scale: torch.Tensor | None
    w2_global_scale: torch.Tensor | None
    w13_bias: torch.Tensor | None
    w2_bias: torch.Tensor | None

    def weight_kwargs(self) -> dict[str, object]:
        """Keyword arguments of :func:`csf_moe.prepare_weights` (layout [gate; up])."""
        return {
            "w13": self.w13,
            "w13_scale": self.w13_scale,
            "w2": self.w2,
            "w2_scale": self.w2_scale,
            "w13_global_scale": self.w13_global_scale,
            "w2_global_scale": self.w2_global_scale,
            "w13_bias": self.w13_bias,
            "w2_bias": self.w2_bias,
        }

    def reference(self) -> QuantizedExperts:
        """The float32 reference's view of the same weights (gpt-oss's activation wants interleaved rows)."""
        w13, s13, b13 = self.w13, self.w13_scale, self.w13_bias
        if self.geometry.activation == "swiglu_oai":
            w13, s13, b13 = interleave_gate_up(w13), interleave_gate_up(s13), interleave_gate_up(b13)
        return QuantizedExperts(
            fmt=self.geometry.fmt.name,
            w13=w13,
            w13_scale=s13,
            w2=self.w2,
            w2_scale=self.w2_scale,
            w13_global_scale=self.w13_global_scale,
            w2_global_scale=self.w2_global_scale,
            b13=b13,
            b2=self.w2_bias,
        )


def synthetic_layer(
    geometry: MoEGeometry, *, seed: int = 0, device: torch.device | str = "cpu", stats: PlaneStats | None = None
) -> SyntheticLayer:
    g = geometry
    e, h, n, fmt = g.experts, g.hidden, g.intermediate, g.fmt
    gen = torch.Generator().manual_seed(seed)
    nv = fmt.name == "nvfp4"

    def on(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    return SyntheticLayer(
        geometry=g,
        w13=on(synthetic_fp4_values((e, 2 * n, h // 2), seed=seed)),
        w13_scale=on(synthetic_scale_plane(g.w13_scale_shape, fmt, stats, seed=seed + 1)),
        w2=on(synthetic_fp4_values((e, h, n // 2), seed=seed + 2)),
        w2_scale=on(synthetic_scale_plane(g.w2_scale_shape, fmt, stats, seed=seed + 3)),
        w13_global_scale=on(torch.rand(e, generator=gen) * 2**-6 + 2**-7) if nv else None,
        w2_global_scale=on(torch.rand(e, generator=gen) * 2**-6 + 2**-7) if nv else None,
        w13_bias=on(torch.randn(e, 2 * n, generator=gen) * 0.1) if g.bias else None,
        w2_bias=on(torch.randn(e, h, generator=gen) * 0.1) if g.bias else None,
    )


def synthetic_routing(
    geo: MoEGeometry, tokens: int, gen: torch.Generator, *, ids_dtype: torch.dtype = torch.int32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden bf16 [T, H], topk_ids [T, k], topk_weights float32 [T, k]) on ``gen``'s device: random
    activations, a random router's top-k (distinct experts per token), softmax weights."""
    dev = gen.device
    x = torch.randn(tokens, geo.hidden, generator=gen, device=dev).to(torch.bfloat16)
    w, ids = torch.topk(torch.rand(tokens, geo.experts, generator=gen, device=dev), geo.top_k, dim=-1)
    return x, ids.to(ids_dtype).contiguous(), torch.softmax(w, dim=-1).contiguous()
