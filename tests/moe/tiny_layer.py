"""A tiny fused MoE layer on the CPU, for tests of launch order, buffers and binding (the GEMMs run on GPUs)."""

from __future__ import annotations

import torch

from csf_codec import scale_format
from csf_kernels.catalog import MoEGeometry
from csf_moe import plan, prepare_weights
from csf_moe.layer import MoELayer
from csf_moe.synthetic import synthetic_layer


def tiny_layer(
    fmt: str, source: str, *, shape: dict | None = None, max_tokens: int = 16, seed: int = 3, **plan_kwargs
) -> tuple[MoEGeometry, MoELayer]:
    """A tiny layer (``shape``: other experts, hidden, intermediate, top_k) on the CPU."""
    dims = dict(experts=8, hidden=320, intermediate=192, top_k=3) | (shape or {})
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format(fmt), **dims)
    p = plan(geo, max_tokens, scale_source=source, **plan_kwargs)
    data = synthetic_layer(geo, seed=seed, device="cpu")
    # MoELayer directly: CPU tensors need not be 256-byte aligned, as bind() requires of device scratch
    layer = MoELayer(plan=p, weights=prepare_weights(p, **data.weight_kwargs()),
                     scratch=torch.empty(p.scratch_bytes, dtype=torch.uint8))  # fmt: skip
    return geo, layer
