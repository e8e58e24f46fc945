"""Timing shared by the GPU benchmarks: CUDA-graph replays after an L2 flush, and the copy ceiling."""

from __future__ import annotations

import collections
import json
import statistics
import tempfile
from pathlib import Path

import torch

__all__ = [
    "L2_FLUSH_BYTES",
    "capture",
    "chain_times",
    "copy_bandwidth",
    "kernel_timeline",
    "l2_flush_buffer",
    "replay_times",
    "run_all",
]

L2_FLUSH_BYTES = 256 << 20


def l2_flush_buffer() -> torch.Tensor:
    """The buffer every timed replay rewrites first (``flush.add_(1)``), so that it starts with a cold L2."""
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")


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


def kernel_timeline(graph, flush, replays: int) -> list[dict]:
    """Median (start, end) in us of each kernel of one replay of ``graph``, relative to its first kernel, with its
    grid (which tells launches of one program apart: FC1 from FC2, W13's expansion from W2's)."""
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            flush.add_(1)
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return timeline_of_trace(json.loads(trace.read_text()), replays)


def timeline_of_trace(trace: dict, replays: int) -> list[dict]:
    """:func:`kernel_timeline` from a profiler's chrome trace of ``replays`` replays (the flushes left out)."""
    events = sorted(
        (e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "elementwise" not in e["name"]),
        key=lambda e: e["ts"],
    )
    per_replay = len(events) // replays
    if not events or len(events) % replays:
        return [{"kernel": f"unusable trace: {len(events)} kernel events for {replays} replays"}]
    spans = collections.defaultdict(list)
    for i in range(replays):
        chunk = events[i * per_replay : (i + 1) * per_replay]
        t0 = chunk[0]["ts"]
        for k, e in enumerate(chunk):
            grid = tuple(e.get("args", {}).get("grid", ()))
            spans[(k, e["name"], grid)].append((e["ts"] - t0, e["ts"] + e["dur"] - t0))
    timeline = []
    for (_, name, grid), v in sorted(spans.items()):
        start, end = (statistics.median(x) for x in zip(*v, strict=True))
        timeline.append({"kernel": name[:60], "grid": list(grid), "start_us": start, "end_us": end})
    return timeline
