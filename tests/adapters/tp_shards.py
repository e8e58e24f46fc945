"""Comparing tensor-parallel shards of a MoE layer's parameters with the single-rank layer (engine-neutral)."""

from __future__ import annotations

import torch

__all__ = ["merge_tp", "params", "same"]


def params(layer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in layer.named_parameters()}


def merge_tp(ranks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The unsharded layout from every rank's shard: W13 halves [gate; up] on dim 1, W2 columns on dim 2."""
    out = {}
    for name in ranks[0]:
        parts = [r[name] for r in ranks]
        if name.startswith("w13_weight") and parts[0].dim() == 3:
            gate = [p.chunk(2, dim=1)[0] for p in parts]
            up = [p.chunk(2, dim=1)[1] for p in parts]
            out[name] = torch.cat(gate + up, dim=1)
        elif name.startswith("w2_weight") and parts[0].dim() == 3:
            out[name] = torch.cat(parts, dim=2)
        else:  # per-expert globals and input scales are replicated
            assert all(torch.equal(p, parts[0]) for p in parts), name
            out[name] = parts[0]
    return out


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bytes, dtype and shape (FP8 and uint8 tensors alike)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
