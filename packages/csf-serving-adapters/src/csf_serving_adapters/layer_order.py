"""The model's MoE layers in forward order, and the side-stream expansion prefetcher per device.

Layers are processed after loading in model order, so the order they register in is the order a forward
pass calls them; the prefetcher (csf_moe.prefetch) uses it to expand the next layer's scales early.
"""

from __future__ import annotations

import threading

import torch

from csf_kernels import env

__all__ = ["MOE_ORDER", "PREFETCH_SWITCH", "LayerOrder", "prefetch_enabled", "prefetcher"]

PREFETCH_SWITCH = "CSF_EXPANSION_PREFETCH"
_INDEX_ATTR = "csf_moe_index"


def prefetch_enabled() -> bool:
    """Side-stream expansion of the next layer's scales (``CSF_EXPANSION_PREFETCH``). Off by default: it
    measures no gain (``benchmarks/bench_prefetch.py``; see :mod:`csf_moe.prefetch`: the expansion is a small
    share of a prefill layer and competes with attention for the same SMs), and it holds two full-layer scale
    planes."""
    return env.flag(PREFETCH_SWITCH, default=False)


class LayerOrder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layers: list[torch.nn.Module] = []

    def add(self, layer: torch.nn.Module) -> int:
        """Register ``layer`` (once: a reload keeps its place) and return its index."""
        with self._lock:
            index = getattr(layer, _INDEX_ATTR, None)
            if index is None or index >= len(self._layers) or self._layers[index] is not layer:
                index = len(self._layers)
                self._layers.append(layer)
                setattr(layer, _INDEX_ATTR, index)
            return index

    def index(self, layer: torch.nn.Module) -> int:
        index = getattr(layer, _INDEX_ATTR, None)
        if index is None:
            raise RuntimeError(f"csf: {getattr(layer, 'layer_name', layer)} was not processed after loading")
        return index

    def after(self, index: int) -> torch.nn.Module | None:
        """The layer a forward pass calls after the ``index``-th, if any."""
        return self._layers[index + 1] if index + 1 < len(self._layers) else None

    def clear(self) -> None:
        with self._lock:
            for layer in self._layers:
                if hasattr(layer, _INDEX_ATTR):
                    delattr(layer, _INDEX_ATTR)
            self._layers.clear()


MOE_ORDER = LayerOrder()
_prefetchers: dict[torch.device, object] = {}
_prefetchers_lock = threading.Lock()


def prefetcher(device: torch.device):
    """The device's :class:`csf_moe.ExpansionPrefetcher` (created on first use)."""
    from csf_moe import ExpansionPrefetcher

    device = torch.device(device)
    with _prefetchers_lock:
        p = _prefetchers.get(device)
        if p is None:
            p = _prefetchers[device] = ExpansionPrefetcher(device)
        return p
