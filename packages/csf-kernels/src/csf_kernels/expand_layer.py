"""A layer's scale planes (W13 and W2) expanded concurrently, on two streams that fork and join.

Each plane's expansion is one grid whose last CTAs leave SMs idle while they finish (ncu, run 136: the SMs of
DS4.1-TP4's W2 expansion were idle 20% of its time, W13's 10%). Launched side by side, the second plane's CTAs
take the SMs the first plane's tail leaves, and the layer costs about what its work does: 37.9 us for
DS4.1-TP4 against 40.8 us with the planes in sequence (run 137). The largest plane goes to the caller's
current stream, the others to a side stream that first waits for everything queued on the current stream
and is joined back before the call returns, so the caller sees one stream's ordering; under CUDA-graph
capture the fork and the join become the graph's edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from csf_codec import InlineScales

from .expand import BoundExpansion, bind_expand_inline

__all__ = ["BoundLayerExpansion", "bind_expand_inline_layer", "expand_inline_layer", "side_stream"]

_SIDE: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device | str | int) -> torch.cuda.Stream:
    """The device's side stream for concurrent plane expansions (created on first use: before a graph
    capture, e.g. by a warm-up call, as the tests do)."""
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"side_stream: {dev} is not a CUDA device")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(index)
    return _SIDE[index]


@dataclass(frozen=True, eq=False)
class BoundLayerExpansion:
    """Plane expansions bound to run concurrently; call it to launch. ``order``: the expansions, largest
    first (the first runs on the current stream); ``outs``: the planes in the caller's order."""

    order: tuple[BoundExpansion, ...]
    outs: tuple[torch.Tensor, ...]
    side: torch.cuda.Stream | None

    def __call__(self) -> tuple[torch.Tensor, ...]:
        first, *rest = self.order
        if not rest or self.side is None:
            for expansion in self.order:
                expansion()
            return self.outs
        current = torch.cuda.current_stream(first.out.device)
        self.side.wait_stream(current)  # the side stream starts after everything queued so far
        first()
        with torch.cuda.stream(self.side):
            for expansion in rest:
                expansion()
        current.wait_stream(self.side)  # and everything queued later starts after both
        return self.outs


def bind_expand_inline_layer(
    planes: Sequence[tuple[InlineScales, torch.Tensor | None]],
    *,
    experts: torch.Tensor | None = None,
    geometry: str | None = None,
    engine: str = "auto",
    stream: torch.cuda.Stream | None = None,
) -> BoundLayerExpansion:
    """Bind the concurrent expansion of one layer's planes, ``(inline, out)`` pairs (each as for
    :func:`~csf_kernels.expand.bind_expand_inline`; ``experts`` routes them all). ``stream``: the side stream
    (default: :func:`side_stream` of the planes' device)."""
    if not planes:
        raise ValueError("expand_inline_layer: no planes given")
    bound = [bind_expand_inline(i, o, experts=experts, geometry=geometry, engine=engine) for i, o in planes]
    devices = {b.out.device for b in bound}
    if len(devices) != 1:
        raise ValueError(f"expand_inline_layer: the planes are on several devices: {sorted(map(str, devices))}")
    (dev,) = devices
    side = None
    if dev.type == "cuda" and len(bound) > 1:
        side = stream if stream is not None else side_stream(dev)
    order = tuple(sorted(bound, key=lambda b: -b.out.numel()))
    return BoundLayerExpansion(order, tuple(b.out for b in bound), side)


def expand_inline_layer(
    planes: Sequence[tuple[InlineScales, torch.Tensor | None]], **kwargs
) -> tuple[torch.Tensor, ...]:
    """Expand one layer's planes concurrently now (see :func:`bind_expand_inline_layer`); returns the planes."""
    return bind_expand_inline_layer(planes, **kwargs)()
