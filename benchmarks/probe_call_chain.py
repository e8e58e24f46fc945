"""What each program and each boundary of a few-token fused-MoE call costs in a CUDA graph.

    python3 benchmarks/probe_call_chain.py --out chain.json --tokens 1,2,4

For each geometry and token count (native scales by default; ``--arm inline_records``: the GEMMs reading the
CSF records; ``--arm inline``: as planned, expanding the routed experts' scales, at one token W2's only, beside
FC1 reading W13's records; ``--arm inline_both_planes``: both planes expanded first; the catalog's plan from the
AOT cache, frozen), the latency of CUDA graphs holding parts of one call's launches, each replay after an L2
flush: the whole call, each program alone, and each prefix and suffix of two or more. Parts run on the scratch a
full call left behind, so their outputs are meaningless but their memory traffic is the call's. What a part adds
to the chain (whole minus the rest) against what it costs alone says how much of it overlaps its neighbours and
what its boundary costs.
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
from bench_moe import ARMS
from provenance import provenance
from timing import capture, l2_flush_buffer, replay_times, run_all

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe import bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

GEOMETRIES = (("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1))
# bench_moe's arms that differ by plan arguments only
PROBED_ARMS = ("native", "inline", "inline_records", "inline_both_planes")


def _parts(n: int) -> list[tuple[int, int]]:
    """Spans [i, j) of n launches: each alone, every prefix and suffix, the whole."""
    spans = {(i, i + 1) for i in range(n)} | {(0, j) for j in range(2, n + 1)} | {(i, n) for i in range(n - 1)}
    return sorted(spans, key=lambda s: (s[1] - s[0], s[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--arm", choices=PROBED_ARMS, default="native")
    a = ap.parse_args()
    runtime.freeze()
    tokens = [int(t) for t in a.tokens.split(",")]
    flush = l2_flush_buffer()
    rows = []
    for model, tp in GEOMETRIES:
        geo = load_catalog().moe_geometry(model, tp, "mxfp4")
        p = plan(geo, max(tokens), buckets=tokens, **ARMS[a.arm])
        data = synthetic_layer(geo, seed=3, device="cuda")
        weights = prepare_weights(p, **data.weight_kwargs())
        del data
        layer = bind(p, weights, torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))
        for t in tokens:
            x, ids, w = synthetic_routing(geo, t, torch.Generator(device="cuda").manual_seed(t))
            out = torch.empty_like(x)
            layer.run(x, ids, w, out=out)
            torch.cuda.synchronize()
            unbound = layer.launches(x, ids, w, out)
            names = [la.spec.kernel for la in unbound]
            bound = [la.with_pointers((x, ids, w, out)).bind(geo.name) for la in unbound]
            row = {"geometry": geo.name, "arm": a.arm, "tokens": t, "kernels": names, "parts": []}
            for i, j in _parts(len(bound)):
                samples = replay_times(capture(functools.partial(run_all, bound[i:j])), a.reps, flush)
                med = statistics.median(samples)
                row["parts"].append({"span": [i, j], "kernels": names[i:j], "median_s": med, "samples_s": samples})
                print(f"{geo.name} {a.arm} T={t} [{i}, {j}) {'+'.join(names[i:j])}: {med * 1e6:7.1f} us", flush=True)
            rows.append(row)
        del layer, weights
        torch.cuda.empty_cache()
    doc = {"benchmark": "probe_call_chain", "provenance": provenance(), "rows": rows,
           "compilations_while_frozen": runtime.compilations()}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
