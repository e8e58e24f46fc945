"""CUDA-graph helpers for the GPU tests."""

from __future__ import annotations

import torch


def replay_allocating_nothing(graph: torch.cuda.CUDAGraph) -> None:
    """Replay ``graph`` to completion and assert the replay allocated no device memory."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "replay allocated"


def captured(fn) -> torch.cuda.CUDAGraph:
    """``fn`` (no arguments) run once on a side stream, then captured there into a graph (not replayed)."""
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    return graph
