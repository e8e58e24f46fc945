"""Expanding the next MoE layer's scales on a side stream while the current layer's attention runs.

A call whose bucket expands CSF scales (above the inline token limit) spends a full-layer expansion
before its GEMMs. :class:`ExpansionPrefetcher` moves that work off the critical path: when layer ``i``
of a forward pass has run, it launches layer ``i + 1``'s expansion on its own stream, into one of two
plane slots it owns, so that the expansion overlaps whatever the engine runs between the two MoE calls
(attention, norms). Layer ``i + 1``'s call then waits for that expansion only, and reads the slot.

Ordering, with slot ``s = (i + 1) % 2``:
- before expanding, the side stream waits for everything queued on the current stream so far, which
  includes the last call that read ``s`` (layer ``i - 1``): a slot is never overwritten while it is read,
  and memory the caching allocator hands out is never written early. The layers' shared scratch is
  never touched by the side stream (the slots are the prefetcher's own memory);
- nothing carries across forward passes: a call whose layer index does not follow the previous one
  starts a new pass, and an expansion is consumed only by the layer and token count it was made for
  (otherwise the call expands for itself, as without the prefetcher);
- under CUDA-graph capture the prefetcher steps aside entirely: the call runs as it would without it.

It measures no gain over a self-expanding pass (``benchmarks/bench_prefetch.py``; the figures are in
``validation/log.md``): the expansion is a small share of a prefill layer and, being instruction-bound,
competes with the attention for the same SMs. The engines leave it off unless ``CSF_EXPANSION_PREFETCH`` is
set.

Memory: two full-layer plane pairs (W13 + W2 native scales of the layer shape in use). Host cost: the
expansion programs are bound once per (layer, slot), not per call (``runtime.BindingCache``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_kernels import runtime

from .layer import MoELayer

__all__ = ["ExpansionPrefetcher"]

_SLOTS = 2


@dataclass
class _Pending:
    index: int  # the layer the expansion is for
    tokens: int
    slot: int
    ready: torch.cuda.Event


class ExpansionPrefetcher:
    """One per device; every MoE layer of a model calls :meth:`run` in forward order."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self._slots: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * _SLOTS
        self._bound = runtime.BindingCache(capacity=4 * 256)  # expansions per (layer, slot planes)
        self._pending: _Pending | None = None
        self._last_index: int | None = None
        self.prefetched_calls = 0  # calls that read a prefetched expansion (for tests and logs)

    def _planes(self, slot: int, layer: MoELayer) -> tuple[torch.Tensor, torch.Tensor]:
        geo = layer.plan.geometry
        shapes = (tuple(geo.w13_scale_shape), tuple(geo.w2_scale_shape))
        planes = self._slots[slot]
        if planes is None or (tuple(planes[0].shape), tuple(planes[1].shape)) != shapes:
            planes = tuple(torch.empty(s, dtype=torch.uint8, device=self.device) for s in shapes)
            self._slots[slot] = planes
        return planes

    def _expansion(self, slot: int, layer: MoELayer) -> tuple:
        planes = self._planes(slot, layer)

        def bind():  # the planes as raw addresses (part of the key): a binding never keeps old planes alive
            launches = layer.expansion_launches(*planes)
            return tuple(la.with_pointers(planes).bind(layer.plan.geometry.name) for la in launches)

        return self._bound.get((id(layer), *(p.data_ptr() for p in planes)), bind)

    def run(
        self,
        index: int,
        layer: MoELayer,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        next_layer: MoELayer | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``layer.run(...)`` for the model's ``index``-th MoE layer, reading a prefetched expansion when
        there is one for it, then prefetching ``next_layer``'s (the ``index + 1``-th) when it will expand."""
        t = hidden_states.shape[0]
        if torch.cuda.is_current_stream_capturing():
            self._pending, self._last_index = None, None
            return layer.run(hidden_states, topk_ids, topk_weights, out=out)
        if self._last_index is None or index != self._last_index + 1:
            self._pending = None  # a new forward pass: nothing prefetched carries over
        self._last_index = index
        pending, self._pending = self._pending, None
        current = torch.cuda.current_stream(self.device)
        if pending is not None and pending.index == index and pending.tokens == t and layer.expands(t):
            current.wait_event(pending.ready)
            result = layer.run(hidden_states, topk_ids, topk_weights, out=out, scale_planes=self._slots[pending.slot])
            self.prefetched_calls += 1
        else:
            result = layer.run(hidden_states, topk_ids, topk_weights, out=out)
        if t and next_layer is not None and next_layer.expands(t):
            self._prefetch(index + 1, next_layer, t)
        return result

    def _prefetch(self, index: int, layer: MoELayer, tokens: int) -> None:
        slot = index % _SLOTS
        launches = self._expansion(slot, layer)  # (allocated, if new, in the current stream's order)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # incl. the slot's last reader
        with torch.cuda.stream(self.stream):
            for launch in launches:
                launch()
            ready = torch.cuda.Event()
            ready.record(self.stream)
        self._pending = _Pending(index=index, tokens=tokens, slot=slot, ready=ready)
