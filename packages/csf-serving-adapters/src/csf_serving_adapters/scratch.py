"""One scratch buffer, and one set of route-map buffers, per device for every bound MoE layer: layers run one after
another, so they can share them (``csf_moe.bind`` and ``csf_moe.RouteBuffers`` say so) instead of each holding
``plan.scratch_bytes`` and its own route maps' working memory."""

from __future__ import annotations

import threading

import torch

__all__ = ["SharedRouteBuffers", "SharedScratch"]


class SharedScratch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device | str, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes`` on ``device``. A larger request allocates a new buffer; layers
        bound to the old one keep it alive (plans of one model normally agree, so this rarely happens)."""
        device = torch.device(device)
        with self._lock:
            buf = self._buffers.get(device)
            if buf is None or buf.numel() < nbytes:
                buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
                self._buffers[device] = buf
            return buf

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()


class SharedRouteBuffers:
    """The ``csf_moe.RouteBuffers`` of each device, shared by every layer's ``csf_moe.LocalRoutes``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[torch.device, object] = {}

    def get(self, device: torch.device | str, max_pairs: int):
        """The device's set, grown to ``max_pairs`` routes if it is smaller (maps made earlier use the grown set
        from their next call). Call it while layers are bound, before CUDA graphs are captured."""
        from csf_moe import RouteBuffers

        with self._lock:
            buf = self._buffers.get(torch.device(device))
            if buf is None:
                buf = RouteBuffers(device, max_pairs)
                self._buffers[torch.device(device)] = buf
            buf.reserve(max_pairs)
            return buf

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()
