"""One scratch buffer per device for every bound MoE layer: layers run one after another, so they can share
it (``csf_moe.bind`` says so) instead of each holding ``plan.scratch_bytes`` of their own."""

from __future__ import annotations

import threading

import torch

__all__ = ["SharedScratch"]


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
