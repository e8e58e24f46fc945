"""Kernel timelines of few-token inline calls with their routed experts' expansions chained or forked.

    python3 benchmarks/probe_expansion_chain.py --out timeline.json [--tokens 1,2]

For each peer geometry and token count, one call per CUDA graph, replayed after an L2 flush under torch's
profiler (CUPTI): each kernel's start and end relative to the call's first kernel, median over the replays, for
the layer's expansions chained as dependent launches as bound by default (W2's letting FC1 in as its CTAs finish,
FC1 copying its first weights early; ``csf_moe.layer``), chained with FC1 let in as W2's CTAs start, chained with
FC1 waiting first, and forked and joined. A span of a dependent launch starts when it is let in, so it includes its
wait for the kernel before it. Programs from the AOT cache (frozen).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance
from timing import capture, kernel_timeline, l2_flush_buffer

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe import bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

GEOMETRIES = (("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1))
MODES = {
    "chained": {},
    "chained_fc1_at_start": dict(fc1_let_in="start"),
    "chained_waits_first": dict(early_fc1=False),
    "forked": dict(chain_expansions=False),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,2")
    ap.add_argument("--replays", type=int, default=20)
    a = ap.parse_args()
    runtime.freeze()
    flush = l2_flush_buffer()
    rows = []
    for model, tp in GEOMETRIES:
        geo = load_catalog().moe_geometry(model, tp, "mxfp4")
        p = plan(geo, 8, scale_source="inline")
        weights = prepare_weights(p, **synthetic_layer(geo, seed=3, device="cuda").weight_kwargs())
        gen = torch.Generator(device="cuda").manual_seed(5)
        for t in (int(s) for s in a.tokens.split(",")):
            x, ids, w = synthetic_routing(geo, t, gen)
            for mode, kwargs in MODES.items():
                layer = bind(p, weights, torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"), **kwargs)
                out = torch.empty_like(x)
                graph = capture(functools.partial(layer.run, x, ids, w, out=out))
                kernels = kernel_timeline(graph, flush, a.replays)
                rows.append({"geometry": geo.name, "tokens": t, "mode": mode, "kernels": kernels})
                print(f"{geo.name} T={t} {mode}: " + "  ".join(
                    f"{k['kernel'][:22]} {k.get('start_us', 0):.1f}-{k.get('end_us', 0):.1f}" for k in kernels),
                    flush=True)  # fmt: skip
    doc = {"benchmark": "probe_expansion_chain", "provenance": provenance(), "rows": rows,
           "compilations_while_frozen": runtime.compilations()}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
