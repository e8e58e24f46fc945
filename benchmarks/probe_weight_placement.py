"""Whether where a layer's weights land changes a large call's time (bench_moe, gpt-oss at 8192 tokens).

    python3 benchmarks/probe_weight_placement.py --out placement.json [--model gpt-oss-120b --tp 1 --copies 6]

bench_moe prepares a copy of the weights per arm, and at gpt-oss's 8192 tokens one copy can time slower than the
others with the same launches. This probe separates where a copy lies from when it is timed: the slowdown follows the
time (a slow episode of the device), not the placement, hence bench_moe's interleaved arms (``docs/perf-notes.md``,
"Benchmarks interleave their arms and compare trees in one call"). Here: ``--copies`` layers of one inline plan,
each with its own prepared weights, the same inputs, timed in turn (CUDA-graph replays after an L2 flush), each
copy's tensors' addresses reported (offsets within 2 MiB pages and 1 GiB), and every copy's output compared with the
first's.
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
from provenance import provenance
from timing import capture, l2_flush_buffer, replay_times

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe import bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing


def _addresses(weights) -> dict:
    out = {}
    for name in ("w13", "w2"):
        op = getattr(weights, name)
        inline = op.inline.records if op.inline is not None else None
        for field, t in (("values", op.values), ("scales", op.scales), ("records", inline)):
            if isinstance(t, torch.Tensor):
                p = t.data_ptr()
                out[f"{name}.{field}"] = {"ptr": p, "mod_2MiB": p % (2 << 20), "mod_1GiB": p % (1 << 30),
                                          "bytes": t.numel() * t.element_size()}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--copies", type=int, default=6)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    runtime.freeze()
    flush = l2_flush_buffer()
    geo = load_catalog().moe_geometry(a.model, a.tp, "mxfp4")
    p = plan(geo, a.tokens, scale_source="inline")
    data = synthetic_layer(geo, seed=1234, device="cuda")
    x, ids, w = synthetic_routing(geo, a.tokens, torch.Generator(device="cuda").manual_seed(99))
    copies = []
    for _ in range(a.copies):
        weights = prepare_weights(p, **data.weight_kwargs())
        layer = bind(p, weights, torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))
        out = torch.empty_like(x)
        graph = capture(functools.partial(layer.run, x, ids, w, out=out))
        copies.append((weights, out, graph, layer))  # the layer holds the scratch its graph writes: kept alive
    rows = []
    for rnd in range(2):  # two rounds, so a copy's figure is not its turn's
        for i, (weights, out, graph, _) in enumerate(copies):
            samples = replay_times(graph, a.reps, flush)
            median, placed = statistics.median(samples), _addresses(weights)
            exact = bool(torch.equal(out, copies[0][1]))
            rows.append({"copy": i, "round": rnd, "median_s": median, "samples_s": samples, "exact": exact,
                         "addresses": placed})  # fmt: skip
            where = "  ".join(f"{k} +{v['mod_2MiB'] >> 10}K/{v['mod_1GiB'] >> 20}M" for k, v in placed.items())
            print(f"round {rnd} copy {i}: {median * 1e6:8.1f} us exact={exact} {where}", flush=True)
    doc = {"benchmark": "probe_weight_placement", "provenance": provenance(), "geometry": geo.name,
           "tokens": a.tokens, "rows": rows, "compilations_while_frozen": runtime.compilations()}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
