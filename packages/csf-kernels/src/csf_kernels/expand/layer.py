"""A layer's scale planes (W13 and W2) expanded concurrently, on two streams that fork and join.

Each plane's expansion is one grid whose last CTAs leave SMs idle while they finish. Launched side by side, the second
plane's CTAs take the SMs the first plane's tail leaves, so the layer costs about what its work does and measures
faster than the planes in sequence (``docs/perf-notes.md``, "A layer's two planes expand on two streams"). The largest
plane goes to the caller's current stream, the others to a side stream that first waits for everything queued on the
current stream and is joined back before the call returns, so the caller sees one stream's ordering; under CUDA-graph
capture the fork and the join become the graph's edges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from csf_codec import InlineScales
from csf_kernels.expand.launch import bind_expand_inline

__all__ = ["BoundLayerExpansion", "ForkJoin", "bind_expand_inline_layer", "expand_inline_layer", "side_stream"]

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
class ForkJoin:
    """Launches run concurrently: ``main`` on the current stream, ``side`` on ``stream``, which first waits for
    everything queued on the current stream so far; the current stream then waits for ``side``, so work queued
    after the call starts after both (under CUDA-graph capture: the fork and the join are the graph's edges).
    The device's side stream is shared by every fork on it: forks from several streams at once are ordered
    through it (correct, but they wait on each other)."""

    main: tuple[Callable[[], object], ...]
    side: tuple[Callable[[], object], ...]
    stream: torch.cuda.Stream

    def __call__(self) -> None:
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        for launch in self.main:
            launch()
        with torch.cuda.stream(self.stream):
            for launch in self.side:
                launch()
        current.wait_stream(self.stream)


@dataclass(frozen=True, eq=False)
class BoundLayerExpansion:
    """Plane expansions bound to run concurrently; call it to launch. ``run``: the largest plane's expansion
    on the current stream, the others' on the side stream (a :class:`ForkJoin`; one plane: just its
    expansion); ``outs``: the planes in the caller's order."""

    run: Callable[[], object]
    outs: tuple[torch.Tensor, ...]

    def __call__(self) -> tuple[torch.Tensor, ...]:
        self.run()
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
    :func:`~csf_kernels.expand.launch.bind_expand_inline`; ``experts`` routes them all). ``stream``: the side stream
    (default: :func:`side_stream` of the planes' device)."""
    if not planes:
        raise ValueError("expand_inline_layer: no planes given")
    bound = [bind_expand_inline(i, o, experts=experts, geometry=geometry, engine=engine) for i, o in planes]
    devices = {b.out.device for b in bound}
    if len(devices) != 1:
        raise ValueError(f"expand_inline_layer: the planes are on several devices: {sorted(map(str, devices))}")
    (dev,) = devices
    outs = tuple(b.out for b in bound)
    if len(bound) == 1:
        return BoundLayerExpansion(bound[0], outs)
    first, *rest = sorted(bound, key=lambda b: -b.out.numel())
    side = stream if stream is not None else side_stream(dev)  # created at bind, not under a capture
    return BoundLayerExpansion(ForkJoin((first,), tuple(rest), side), outs)


def expand_inline_layer(
    planes: Sequence[tuple[InlineScales, torch.Tensor | None]], **kwargs
) -> tuple[torch.Tensor, ...]:
    """Expand one layer's planes concurrently now (see :func:`bind_expand_inline_layer`); returns the planes."""
    return bind_expand_inline_layer(planes, **kwargs)()
