"""benchmarks/timing.py's kernel timelines, read from a profiler's chrome trace: the L2 flushes left out, each
kernel's median span per replay relative to the replay's first kernel, and its grid (which tells launches of one
program apart: FC1 from FC2)."""

from __future__ import annotations

from tests.repo_scripts import load_script


def _timing():
    return load_script("benchmarks/timing.py", "bench_timing")


def _kernel(name: str, ts: float, dur: float, grid: list[int]) -> dict:
    args = {"grid": grid, "block": [128, 1, 1]}
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": args}


def test_timeline_of_a_trace_has_median_spans_and_grids_per_kernel():
    events = []
    for replay, t0 in enumerate((1000.0, 5000.0)):
        events += [
            _kernel("void at::native::vectorized_elementwise_kernel<4>", t0 - 100, 50, [1024, 1, 1]),  # the flush
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t0 - 5, "dur": 3},
            _kernel("moe_gemm_decode", t0, 10 + replay, [4, 90, 2]),  # FC1
            _kernel("moe_gemm_decode", t0 + 12, 5, [4, 45, 1]),  # FC2
        ]
    timing = _timing()
    timeline = timing.timeline_of_trace({"traceEvents": events}, 2)
    assert [(k["kernel"], k["grid"]) for k in timeline] == [
        ("moe_gemm_decode", [4, 90, 2]),
        ("moe_gemm_decode", [4, 45, 1]),
    ]
    assert (timeline[0]["start_us"], timeline[0]["end_us"]) == (0, 10.5)
    assert (timeline[1]["start_us"], timeline[1]["end_us"]) == (12, 17)
    unusable = timing.timeline_of_trace({"traceEvents": events[:-1]}, 2)  # a kernel event short
    assert len(unusable) == 1 and unusable[0]["kernel"].startswith("unusable trace: 3 kernel events for 2 replays")
