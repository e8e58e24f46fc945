"""Timing shared by the GPU benchmarks: CUDA-graph replays after an L2 flush, and the copy ceiling."""

from __future__ import annotations

import statistics

import torch

__all__ = ["L2_FLUSH_BYTES", "capture", "chain_times", "copy_bandwidth", "replay_times", "run_all"]

L2_FLUSH_BYTES = 256 << 20


def replay_times(graph: torch.cuda.CUDAGraph, reps: int, flush: torch.Tensor) -> list[float]:
    """Seconds per replay, each after an L2 flush, timed with events around the replay alone."""
    out = []
    for _ in range(reps):
        flush.add_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def capture(fn) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        fn()
    return g


def run_all(launches) -> None:
    """Run bound launches in order (a graph of several programs: ``capture(functools.partial(run_all, ...))``)."""
    for launch in launches:
        launch()


def chain_times(calls, reps: int, flush: torch.Tensor) -> list[float]:
    """Seconds per call of a chain: ``calls`` (zero-argument functions) captured back to back in one graph, each
    replay after an L2 flush, its time divided by the calls (a graph replay's own start paid once)."""

    def chain():
        for call in calls:
            call()

    return [s / len(calls) for s in replay_times(capture(chain), reps, flush)]


def copy_bandwidth(reps: int, flush: torch.Tensor) -> dict:
    """The device copy ceiling, bytes read + written: the faster of the copy engine path (copy_, a
    memcpy node in a graph) and an SM kernel streaming the same bytes (mul by 1)."""
    n = 1 << 30
    src = torch.randint(0, 1 << 30, (n // 8,), dtype=torch.int64, device="cuda")
    dst = torch.empty_like(src)
    arms = {}
    for name, fn in (("memcpy", lambda: dst.copy_(src)), ("sm_kernel", lambda: torch.mul(src, 1, out=dst))):
        t = replay_times(capture(fn), reps, flush)
        arms[name] = {"samples_s": t, "median_GBps": 2 * n / statistics.median(t) / 1e9}
    best = max(a["median_GBps"] for a in arms.values())
    return {"bytes_moved": 2 * n, "arms": arms, "median_GBps": best}
