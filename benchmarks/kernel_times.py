"""Per-kernel device times of one fused-MoE layer call (torch's profiler, CUPTI), after warm-up calls.

    python3 benchmarks/kernel_times.py --model deepseek-v4.1-flash --tp 4 --tokens 1,8,32
    python3 benchmarks/kernel_times.py --model gpt-oss-120b --tp 1 --tokens 128,8192 --arms engine,triton_kernels \
        --peer-path .peers

Arms: the plan's layer with native or inline scales, the engine layer's arms (``engine_arms.py``) and the
triton_kernels peer (MXFP4; staged by scripts/stage_triton_kernels.sh).

Eager launches (no CUDA graph), L2 not flushed: it shows where a call's device time goes between its
launches, not the call's latency (bench_moe.py measures that). Programs from the AOT cache (frozen). The MoE
programs launch as programmatic dependents (``moe_specs.MOE_PDL``): a program's span starts when it is let in
early and so includes its wait for the one before (a one-token combine's span can cover a third of the call);
sum the spans of programs that run one after another with care.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_arms import ENGINE_ARMS, engine_layer
from peer_triton_kernels import TritonKernelsMoE, import_triton_kernels
from provenance import provenance

from csf_kernels import env, runtime
from csf_kernels.catalog import load_catalog
from csf_moe import bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

ARMS = ("native", "inline", *ENGINE_ARMS, "triton_kernels")


def kernel_times(run, calls: int) -> dict[str, float]:
    """Mean device microseconds per call of each kernel over ``calls`` calls of ``run()``: keyed by its launch's
    place in the call and its name (``2:engine_gemm...``) where every call launched the same count, else by name
    (one layer's FC1 and FC2 share a program name)."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    events = sorted(
        (ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda ev: ev.time_range.start,
    )
    per_call = len(events) // calls if events and len(events) % calls == 0 else 0
    times: dict[str, float] = collections.defaultdict(float)
    for i, ev in enumerate(events):
        name = ev.name if len(ev.name) <= 80 else ev.name[:80] + "..."
        times[f"{i % per_call}:{name}" if per_call else name] += ev.device_time / calls
    return dict(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--fmt", default="mxfp4")
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--arms", default="native", help=f"of {', '.join(ARMS)}")
    ap.add_argument("--peer-path", default=None, help="a staged triton_kernels' parent folder")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    arms = a.arms.split(",")
    if unknown := [arm for arm in arms if arm not in ARMS]:
        ap.error(f"unknown arms {unknown}")
    env.configure_runtime()  # CSF_PDL=0: plain launches, so each span is the program alone
    runtime.freeze()
    geo = load_catalog().moe_geometry(a.model, a.tp, a.fmt)
    tokens = [int(t) for t in a.tokens.split(",")]
    data = synthetic_layer(geo, seed=1, device="cuda")
    rows = []
    for arm in arms:
        make_run = _arm(arm, geo, data, tokens, a.peer_path)
        for t in tokens:
            x, ids, w = synthetic_routing(geo, t, torch.Generator(device="cuda").manual_seed(t))
            times = kernel_times(make_run(x, ids, w), a.calls)
            rows.append({"arm": arm, "tokens": t, "kernel_us": times, "total_us": sum(times.values())})
            print(f"{geo.name} {arm} T={t}: {sum(times.values()):.1f} us of kernels in {len(times)} kinds", flush=True)
            for name, us in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"  {us:8.1f}  {name[:90]}", flush=True)
    if a.out:
        doc = {"benchmark": "kernel_times", "provenance": provenance(), "geometry": geo.name, "rows": rows}
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


def _arm(arm: str, geo, data, tokens: list[int], peer_path: str | None):
    """A function of one routing returning a zero-argument call of ``arm``'s layer on it."""
    if arm in ("native", "inline"):
        p = plan(geo, max(tokens), scale_source=arm, buckets=tokens)
        layer = bind(p, prepare_weights(p, **data.weight_kwargs()), torch.empty(p.scratch_bytes, dtype=torch.uint8,
                                                                                device="cuda"))  # fmt: skip
        return lambda x, ids, w: functools.partial(layer.run, x, ids, w)
    if arm == "triton_kernels":
        import_triton_kernels(peer_path)
        peer = TritonKernelsMoE(data)
        return lambda x, ids, w: peer.call(x, ids, w, torch.empty_like(x))
    engine = engine_layer(arm, data.reference(), geo)
    return lambda x, ids, w: engine.call(x, ids, w, torch.empty_like(x))


if __name__ == "__main__":
    main()
