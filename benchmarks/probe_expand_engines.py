"""How long expanding a few-token call's routed experts takes, per expansion engine (a CUDA graph each).

    python3 benchmarks/probe_expand_engines.py --out engines.json [--tokens 1,2,4]

An inline plan's few-token call expands its routed experts' W13 and W2 scales (side by side, forked) before
FC1, a cost native's calls do not have (``docs/archive/perf-log.md``, "Records decoded into a scratch plane in the
GEMM's prologue"). For the routed experts of T tokens (``T * top_k``
distinct experts, drawn at random), each plane alone and both forked, with every engine the AOT cache holds
a program for ("auto" is what the layer runs); each replay after an L2 flush. Every engine's plane is
compared byte for byte with the codec's decode. Programs from the AOT cache (frozen): an engine whose
program the cache lacks is reported as such, not compiled.
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
from timing import capture, l2_flush_buffer, replay_times, run_all

from csf_codec import decode_inline
from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.expand.launch import ENGINES, inline_expansion_launches
from csf_kernels.expand.layer import ForkJoin, side_stream
from csf_moe import plan, prepare_weights
from csf_moe.synthetic import synthetic_layer

GEOMETRIES = (("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1))


def _bound(inline, out, experts, engine, geometry):
    return [la.bind(geometry) for la in inline_expansion_launches(inline, out, experts=experts, engine=engine)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    runtime.freeze()
    flush = l2_flush_buffer()
    side = side_stream("cuda")
    rows = []
    for model, tp in GEOMETRIES:
        geo = load_catalog().moe_geometry(model, tp, "mxfp4")
        p = plan(geo, 8, scale_source="inline")
        weights = prepare_weights(p, **synthetic_layer(geo, seed=3, device="cuda").weight_kwargs())
        w13, w2 = weights.w13.inline, weights.w2.inline
        want = {"w13": decode_inline(w13), "w2": decode_inline(w2)}
        planes = {"w13": torch.empty_like(want["w13"]), "w2": torch.empty_like(want["w2"])}
        for t in (int(s) for s in a.tokens.split(",")):
            g = torch.Generator().manual_seed(t)
            experts = torch.randperm(geo.experts, generator=g)[: t * geo.top_k].to(torch.int32).cuda()
            for engine in ENGINES:
                row = {"geometry": geo.name, "tokens": t, "experts": int(experts.numel()), "engine": engine}
                try:
                    b13 = _bound(w13, planes["w13"], experts, engine, geo.name)
                    b2 = _bound(w2, planes["w2"], experts, engine, geo.name)
                except (ValueError, runtime.UncachedProgramError) as err:  # not covered, or not in the cache
                    row["error"] = str(err).splitlines()[0]
                    print(f"{geo.name} T={t} {engine}: {row['error']}", flush=True)
                    rows.append(row)
                    continue
                for name in ("w13", "w2"):
                    planes[name].fill_(0xFF)
                run_all(b13 + b2)
                torch.cuda.synchronize()
                ids = experts.long().cpu()
                row["exact"] = all(torch.equal(planes[n][ids], want[n][ids]) for n in ("w13", "w2"))
                forked = ForkJoin(main=tuple(b13), side=tuple(b2), stream=side)
                for part, fn in (
                    ("w13", functools.partial(run_all, b13)),
                    ("w2", functools.partial(run_all, b2)),
                    ("forked", forked),
                ):
                    samples = replay_times(capture(fn), a.reps, flush)
                    row[part] = {"median_s": statistics.median(samples), "samples_s": samples}
                times = "  ".join(f"{k} {row[k]['median_s'] * 1e6:6.1f} us" for k in ("w13", "w2", "forked"))
                print(f"{geo.name} T={t} {engine:9s} exact={row['exact']}  {times}", flush=True)
                rows.append(row)
        del weights, want, planes
        torch.cuda.empty_cache()
    doc = {"benchmark": "probe_expand_engines", "provenance": provenance(), "rows": rows,
           "compilations_while_frozen": runtime.compilations()}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
