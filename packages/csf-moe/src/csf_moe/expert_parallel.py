"""Tensor- and expert-parallel ranks of a MoE layer: what one rank holds, and its route ids.

A rank of ``tp`` tensor-parallel and ``ep`` expert-parallel ranks holds ``experts / ep`` experts (a contiguous
run, as vLLM's default "linear" placement and SGLang place them) at ``intermediate / tp`` of their width (the
gate and up halves of W13 and the columns of W2, as both engines' weight loaders slice them).
:func:`shard_weights` takes that slice of a whole layer's tensors, so a rank's layer can be built without an
engine (:func:`csf_moe.plan` -> :func:`csf_moe.prepare_weights` -> :func:`csf_moe.bind`), and
:class:`LocalRoutes` turns the model's route ids into the rank's: another rank's expert becomes -1, an id the
layer's programs skip (computed by nobody, contributing exactly zero), so summing every rank's output (the
engines' all-reduce) gives the whole layer's. The maps of a device's layers share one :class:`RouteBuffers`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from csf_kernels.catalog import MoEGeometry

__all__ = ["LocalRoutes", "RankShard", "RouteBuffers", "local_expert_map", "shard_weights"]


@dataclass(frozen=True, kw_only=True)
class RankShard:
    """One rank's place: tensor-parallel rank ``tp_rank`` of ``tp`` and expert-parallel rank ``ep_rank`` of ``ep``."""

    tp: int = 1
    tp_rank: int = 0
    ep: int = 1
    ep_rank: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.tp_rank < self.tp and 0 <= self.ep_rank < self.ep):
            raise ValueError(f"rank tp {self.tp_rank} of {self.tp}, ep {self.ep_rank} of {self.ep} is no rank")

    def geometry(self, whole: MoEGeometry) -> MoEGeometry:
        """The layer as this rank holds it, from the single-rank geometry ``whole`` (tp 1, ep 1)."""
        if (whole.tp, whole.ep) != (1, 1):
            raise ValueError(f"{whole.name}: give the single-rank geometry, not a rank's")
        if whole.experts % self.ep or whole.intermediate % self.tp:
            raise ValueError(f"{whole.name}: {whole.experts} experts x {whole.intermediate} do not split over "
                             f"ep {self.ep} x tp {self.tp}")  # fmt: skip
        return replace(whole, tp=self.tp, ep=self.ep, experts=whole.experts // self.ep,
                       intermediate=whole.intermediate // self.tp)  # fmt: skip

    def experts(self, global_experts: int) -> range:
        """The model's experts this rank holds, in local order."""
        if global_experts % self.ep:
            raise ValueError(f"{global_experts} experts do not split over ep {self.ep}")
        local = global_experts // self.ep
        return range(self.ep_rank * local, (self.ep_rank + 1) * local)


def local_expert_map(global_experts: int, shard: RankShard, device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 [global_experts]: each expert's local id on ``shard``'s rank, -1 where another rank holds it (the
    layout of vLLM's ``layer.expert_map`` and SGLang's ``local_expert_mapping``)."""
    out = torch.full((global_experts,), -1, dtype=torch.int32)
    held = shard.experts(global_experts)
    out[held.start : held.stop] = torch.arange(len(held), dtype=torch.int32)
    return out.to(device)


def shard_weights(whole: dict[str, torch.Tensor | None], shard: RankShard) -> dict[str, torch.Tensor | None]:
    """A single-rank layer's :func:`csf_moe.prepare_weights` tensors (W13 rows [gate; up]) as ``shard``'s rank
    holds them: its experts, its slice of each of gate and up, its columns of W2 (values and scale planes
    alike: a rank's width splits into whole scale blocks). Global scales are per expert; W2's bias is added once,
    by tensor-parallel rank 0 (the others hold zeros, as gpt-oss's loaders write it), so the ranks' sum has it once."""
    global_experts = whole["w13"].shape[0]
    held = shard.experts(global_experts)
    tp, r = shard.tp, shard.tp_rank

    def cols(t: torch.Tensor) -> torch.Tensor:  # W2 [E, H, C]: the rank's C / tp columns
        if t.shape[-1] % tp:
            raise ValueError(f"W2's {t.shape[-1]} columns do not split over tp {tp}")
        c = t.shape[-1] // tp
        return t[..., r * c : (r + 1) * c]

    def rows(t: torch.Tensor) -> torch.Tensor:  # W13 [E, 2N, ...] rows [gate; up]: the rank's N / tp of each
        gate, up = t.chunk(2, dim=1)
        if gate.shape[1] % tp:
            raise ValueError(f"W13's {gate.shape[1]} rows per half do not split over tp {tp}")
        n = gate.shape[1] // tp
        return torch.cat((gate[:, r * n : (r + 1) * n], up[:, r * n : (r + 1) * n]), dim=1)

    slicers = {"w13": rows, "w13_scale": rows, "w13_bias": rows, "w2": cols, "w2_scale": cols}
    out: dict[str, torch.Tensor | None] = {}
    for name, t in whole.items():
        if t is None:
            out[name] = None
            continue
        mine = slicers.get(name, lambda x: x)(t[held.start : held.stop]).contiguous()
        out[name] = mine.zero_() if name == "w2_bias" and r != 0 else mine
    return out


def _device(d: torch.device | str) -> torch.device:
    """``d`` with its index (``cuda`` is the current CUDA device), so that two names of one device compare equal."""
    d = torch.device(d)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


class RouteBuffers:
    """The working memory of :class:`LocalRoutes` maps on one device: the clamped ids (in int32 and int64, the
    engines' id dtypes) and the local ids, for up to ``max_pairs`` routes (16 bytes a route pair).

    A map's result is read by its layer before the next layer runs (both on the current stream), so one set serves
    every layer's map: give each layer's map the same object. :meth:`reserve` grows it to the largest layer's pairs
    while layers are built, before any CUDA graph is captured; maps read the buffers at each call, so every map
    uses the grown set."""

    def __init__(self, device: torch.device | str, max_pairs: int = 1) -> None:
        self.device = _device(device)
        self._retired: list[tuple[dict[torch.dtype, torch.Tensor], torch.Tensor]] = []
        self._allocate(max(max_pairs, 1))

    def _allocate(self, pairs: int) -> None:
        self.index = {dt: torch.empty(pairs, dtype=dt, device=self.device) for dt in (torch.int32, torch.int64)}
        self.local = torch.empty(pairs, dtype=torch.int32, device=self.device)

    @property
    def max_pairs(self) -> int:
        return self.local.numel()

    def reserve(self, pairs: int) -> None:
        """Room for ``pairs`` routes. Growing is refused while a CUDA graph is being captured (the capture would
        record an allocation)."""
        if pairs <= self.max_pairs:
            return
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"route buffers of {self.max_pairs} pairs cannot grow to {pairs} during CUDA graph "
                               "capture; reserve them before capturing")  # fmt: skip
        # a graph captured before this growth replays on the old buffers' addresses: keep them alive
        self._retired.append((self.index, self.local))
        self._allocate(pairs)


class LocalRoutes:
    """The model's route ids -> one rank's, without allocating: graph-capturable, for every call up to
    ``max_pairs`` routes. Ids outside ``[0, len(expert_map))`` (an engine's padding) stay outside the rank's
    experts: they are clamped to one of two sentinel rows of the table, never read out of bounds.

    The result is a view of ``buffers`` (a set of the map's own where none is given, or one shared by every layer's
    map on the device: see :class:`RouteBuffers`), rewritten by the next call of any map sharing them (the layer
    consumes it first: both run on the current stream)."""

    def __init__(self, expert_map: torch.Tensor, max_pairs: int, buffers: RouteBuffers | None = None) -> None:
        if expert_map.dim() != 1 or expert_map.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"expert_map must be a 1-D integer tensor, got {expert_map.dtype} "
                             f"{tuple(expert_map.shape)}")  # fmt: skip
        n, dev = expert_map.numel(), expert_map.device
        if buffers is None:
            buffers = RouteBuffers(dev, max_pairs)
        elif buffers.device != _device(dev):
            raise ValueError(f"route buffers on {buffers.device}, the expert map on {dev}")
        buffers.reserve(max(max_pairs, 1))  # now, before any capture
        self.buffers = buffers
        self.global_experts = n
        self.max_pairs = max(max_pairs, 1)
        # table[id + 1] for id clamped to [-1, n]: both ends -1 (the layer's own: placements may differ by layer)
        self.table = torch.full((n + 2,), -1, dtype=torch.int32, device=dev)
        self.table[1 : n + 1] = expert_map.to(torch.int32)

    def __call__(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """int32, ``topk_ids``'s shape: each id's local id, -1 for another rank's expert or an invalid id."""
        pairs = topk_ids.numel()
        if pairs > self.max_pairs:
            raise ValueError(f"{pairs} routes exceed the {self.max_pairs} this map was sized for")
        if topk_ids.device != self.table.device:
            raise ValueError(f"route ids on {topk_ids.device}, the expert map on {self.table.device}")
        if topk_ids.dtype not in self.buffers.index:
            raise ValueError(f"route ids must be int32 or int64, got {topk_ids.dtype}")
        index, local = self.buffers.index[topk_ids.dtype][:pairs], self.buffers.local[:pairs]
        torch.clamp(topk_ids.reshape(-1), min=-1, max=self.global_experts, out=index)
        index.add_(1)
        torch.index_select(self.table, 0, index, out=local)
        return local.view(topk_ids.shape)
