"""Where a sparse-MLA decode call's time goes: what it costs besides its chunks, by batch and split count.

    python3 benchmarks/probe_mla_costs.py --out FILE [--reps 30] [--replays 20] [--only 16:32,32:128]

For 16 and 32 heads (the catalog's programs from the AOT cache, frozen) at batches 1, 8, 32 and 128, top-k 2048
(bench_mla's candidates), each call twice: every candidate live, and one live chunk per row (lengths 64). Each is
timed as bench_mla times it (one call per graph replay after an L2 flush; per call of an 8-call chain), and its
kernels' spans are read in one replay under torch's profiler (start and end relative to the first kernel; a
dependent launch's span starts when it is let in). At batch 32 also the split counts that plans for other SM
counts give. The one-chunk calls bound what a call costs besides its chunks: the replay's start, the program's
prologue (lengths, candidate ids, query), its first gather, the partials and the merge.
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
from bench_mla import CHAIN_CALLS, TOPK, _candidates, _inputs
from provenance import provenance
from timing import capture, chain_times, kernel_timeline, l2_flush_buffer, replay_times

from csf_attention import MLACaps, bind, plan
from csf_kernels import runtime
from csf_kernels.mla.layout import CHUNK, HEAD_DIM, VALUE_DIM

# (heads, batch, SM counts to plan for: the first is the H200's, the rest give other split counts)
CONFIGS = [
    (16, 1, (132,)),
    (16, 8, (132,)),
    (16, 32, (132, 66, 264)),
    (16, 128, (132,)),
    (32, 1, (132,)),
    (32, 8, (132,)),
    (32, 32, (132, 66, 264)),
    (32, 128, (132,)),
]


def probe(heads: int, batch: int, sm_counts, reps: int, replays: int, flush) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000 + heads)
    q, kv, indices, full = _inputs(batch, heads, 1, gen)
    rows = q.shape[0]
    chain = [_candidates(rows, 1, gen) for _ in range(CHAIN_CALLS)]
    sm_scale = 1.0 / HEAD_DIM**0.5
    out = torch.empty(rows, heads, VALUE_DIM, dtype=torch.bfloat16, device="cuda")
    results = []
    for sms in sm_counts:
        p = plan(MLACaps(heads=heads, max_rows=rows, topk=TOPK, sm_count=sms))
        dec = bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device="cuda"))
        for live, lengths in (("all", full), ("one_chunk", torch.full_like(full, CHUNK))):
            call = functools.partial(dec.run_decode, q, kv, indices, lengths, sm_scale, out=out)
            graph = capture(call)
            single = replay_times(graph, reps, flush)
            outs = [torch.empty_like(out) for _ in chain]
            calls = [
                functools.partial(dec.run_decode, q, kv, idx, lengths, sm_scale, out=o)
                for idx, o in zip(chain, outs, strict=True)
            ]
            per_call = chain_times(calls, reps, flush)
            kernels = kernel_timeline(graph, flush, replays)
            row = {
                "heads": heads, "batch": batch, "sm_count": sms, "splits": p.splits_for(rows), "live": live,
                "single_samples_s": single, "single_median_us": statistics.median(single) * 1e6,
                "chain_samples_s_per_call": per_call, "chain_median_us_per_call": statistics.median(per_call) * 1e6,
                "kernels": kernels,
            }  # fmt: skip
            results.append(row)
            spans = "  ".join(f"{k['kernel'][:16]} {k.get('start_us', 0):.1f}-{k.get('end_us', 0):.1f}"
                              for k in kernels)  # fmt: skip
            print(f"h{heads} b{batch} splits {row['splits']} {live}: single {row['single_median_us']:.1f} us, chained "
                  f"{row['chain_median_us_per_call']:.1f}; {spans}", flush=True)  # fmt: skip
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--only", default="", help="heads:batch pairs to probe (default: every configuration)")
    a = ap.parse_args()
    only = {tuple(int(x) for x in pair.split(":")) for pair in a.only.split(",") if pair}
    runtime.freeze()
    flush = l2_flush_buffer()
    doc = {"benchmark": "probe_mla_costs", "provenance": provenance(), "results": []}
    for heads, batch, sms in CONFIGS:
        if only and (heads, batch) not in only:
            continue
        doc["results"] += probe(heads, batch, sms, a.reps, a.replays, flush)
        torch.cuda.empty_cache()
    doc["compilations_while_frozen"] = runtime.compilations()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
