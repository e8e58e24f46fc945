"""Why a chain of calls can cost more per call than one call alone (the figure it looks into, from bench_moe's
run 282: DS4.1 NVFP4 inline at 32 tokens, 475 us a call chained against 387 single; native 301 / 301).

    python3 benchmarks/probe_chained_calls.py --out chained.json --models deepseek-v4.1-flash:4:nvfp4 --tokens 8,32

For each geometry, token count and arm (bench_moe's arms), as bench_moe times them: one call per CUDA graph, and
``CHAIN_CALLS`` calls back to back in one graph, each replay after an L2 flush; then each graph's kernel timeline
from torch's profiler (each kernel's start and end relative to the replay's first kernel, median over replays; a
dependent launch's span includes its wait). Programs from the AOT cache (frozen).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_moe import CHAIN_CALLS, bind_arms, draw_routings, without_other_arms_l2_lines
from provenance import provenance
from timing import capture, kernel_timeline, l2_flush_buffer, replay_times, run_all

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe.synthetic import synthetic_layer, synthetic_routing


def _spans(kernels: list[dict]) -> str:
    """Each kernel's name, grid and span (us), in launch order."""
    return "  ".join(
        f"{k['kernel'][:18]}{k.get('grid', '')} {k.get('start_us', 0):.0f}-{k.get('end_us', 0):.0f}" for k in kernels
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="deepseek-v4.1-flash:4:nvfp4", help="model:tp:fmt, comma separated")
    ap.add_argument("--tokens", default="8,32")
    ap.add_argument("--arms", default="native,inline")
    ap.add_argument("--max-tokens", type=int, default=512, help="the plan's (bench_moe plans for its largest count)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--replays", type=int, default=10, help="profiled replays per timeline")
    ap.add_argument("--bench-tokens", default="", help="draw the routings as bench_moe does for these token counts")
    a = ap.parse_args()
    runtime.freeze()
    flush = l2_flush_buffer()
    arms = a.arms.split(",")
    rows = []
    for spec in a.models.split(","):
        model, tp, fmt = spec.split(":")
        geo = load_catalog().moe_geometry(model, int(tp), fmt)
        data = synthetic_layer(geo, seed=1234, device="cuda")
        layers = bind_arms(geo, data, a.max_tokens, arms)
        gen = torch.Generator(device="cuda").manual_seed(99)
        probed = [int(s) for s in a.tokens.split(",")]
        for t in [int(s) for s in a.bench_tokens.split(",")] if a.bench_tokens else probed:
            if a.bench_tokens:  # bench_moe's draws: its single calls' routings, then its chain's
                _, chain = draw_routings(geo, t, gen)
            else:
                chain = [synthetic_routing(geo, t, gen) for _ in range(CHAIN_CALLS)]
            if t not in probed or not chain:
                continue
            experts = [torch.unique(ids, return_counts=True) for _, ids, _ in chain]
            routing = [{"unique_experts": int(u.numel()), "max_routes_per_expert": int(c.max())} for u, c in experts]
            for arm in arms:
                layer = layers[arm]
                outs = [torch.empty_like(x) for x, _, _ in chain]
                calls = [functools.partial(layer.run, x, i, w, out=o) for (x, i, w), o in zip(chain, outs, strict=True)]
                one = capture(calls[0])
                many = capture(functools.partial(run_all, calls))
                without_other_arms_l2_lines(layers, arm)
                single = statistics.median(replay_times(one, a.reps, flush)) * 1e6
                chained = statistics.median(replay_times(many, a.reps, flush)) * 1e6 / CHAIN_CALLS
                row = {"geometry": geo.name, "tokens": t, "arm": arm, "routing": routing, "single_us": single,
                       "chained_us_per_call": chained, "single_kernels": kernel_timeline(one, flush, a.replays),
                       "chain_kernels": kernel_timeline(many, flush, a.replays)}  # fmt: skip
                rows.append(row)
                print(
                    f"{geo.name} T={t} {arm}: single {single:.1f} us, chained {chained:.1f} us a call; routings "
                    + " ".join(f"{r['unique_experts']}/{r['max_routes_per_expert']}" for r in routing),
                    flush=True,
                )
                print("  single: " + _spans(row["single_kernels"]), flush=True)
                print("  chain:  " + _spans(row["chain_kernels"]), flush=True)
    doc = {"benchmark": "probe_chained_calls", "command": " ".join(sys.argv), "provenance": provenance(),
           "rows": rows, "compilations_while_frozen": runtime.compilations()}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
