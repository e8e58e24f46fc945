"""Why W2's expansion beside a one-token FC1 on records hides on some geometries and not on gpt-oss (runs 267-268).

    python3 benchmarks/probe_w2_beside_fc1.py --out w2-beside-fc1.json

For each geometry, a one-token inline call in the form of ``plan.FC1_RECORDS_TOKENS`` (forced on where the plan
leaves it off: gpt-oss), with W2's expansion launched after FC1 in three dependent-launch modes (the row-block
expander's ``pdl``): 2, beside FC1, waiting for it only before it exits (the layer's); 1, waiting for FC1 first
(serial); 6, beside FC1 but letting FC2 in only as its CTAs finish their work. Each replayed in CUDA graphs after
an L2 flush: FC1 alone, the expansion alone, FC1 then the expansion, the whole call; and the whole call's kernel
spans from torch's profiler (with dependent launches a span includes a program's wait for its predecessor).
Outputs are the call's on the scratch the layer left behind: only the timing is of interest here.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance
from timing import capture, kernel_timeline, l2_flush_buffer, replay_times, run_all

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe import bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

GEOMETRIES = (("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1))
MODES = {"beside": 2, "serial": 1, "beside_lets_fc2_in_at_end": 6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    runtime.freeze()
    flush = l2_flush_buffer()
    rows = []
    for model, tp in GEOMETRIES:
        geo = load_catalog().moe_geometry(model, tp, "mxfp4")
        p = plan(geo, 8, scale_source="inline", buckets=(1, 8))
        forced = not p.buckets[0].fc1_reads_records
        p = dataclasses.replace(p, buckets=(dataclasses.replace(p.buckets[0], fc1_reads_records=True), *p.buckets[1:]))
        data = synthetic_layer(geo, seed=3, device="cuda")
        layer = bind(p, prepare_weights(p, **data.weight_kwargs()), torch.empty(p.scratch_bytes, dtype=torch.uint8,
                                                                                 device="cuda"))  # fmt: skip
        del data
        x, ids, w = synthetic_routing(geo, 1, torch.Generator(device="cuda").manual_seed(1))
        out = torch.empty_like(x)
        launches = layer.launches(x, ids, w, out)
        kernels = [la.spec.kernel for la in launches]
        assert kernels == ["moe.gemm_decode", "expand.row_blocks", "moe.gemm_decode", "moe.combine"], kernels
        layer.run(x, ids, w, out=out)
        torch.cuda.synchronize()
        row = {"geometry": geo.name, "forced": forced, "w2_expansion_grid": list(launches[1].grid), "modes": {}}

        def timed(parts):
            samples = replay_times(capture(functools.partial(run_all, parts)), a.reps, flush)
            return {"median_s": statistics.median(samples), "samples_s": samples}

        for mode, pdl in MODES.items():
            variant = list(launches)
            variant[1] = dataclasses.replace(launches[1], args=(*launches[1].args[:-1], pdl))
            bound = [la.with_pointers((x, ids, w, out)).bind(geo.name) for la in variant]
            parts = {"fc1": bound[:1], "expansion": bound[1:2], "fc1+expansion": bound[:2], "call": bound}
            res = {name: timed(part) for name, part in parts.items()}
            res["call_spans"] = kernel_timeline(capture(functools.partial(run_all, bound)), flush, 10)
            row["modes"][mode] = res
            times = " ".join(f"{k} {v['median_s'] * 1e6:.1f}" for k, v in res.items() if k != "call_spans")
            spans = [(s["kernel"][:18], round(s.get("start_us", 0), 1), round(s.get("end_us", 0), 1))
                     for s in res["call_spans"]]  # fmt: skip
            print(geo.name, mode, times, "| spans", spans, flush=True)
        rows.append(row)
        del layer
        torch.cuda.empty_cache()
    doc = {"benchmark": "probe_w2_beside_fc1", "provenance": provenance(), "rows": rows,
           "compilations_while_frozen": runtime.compilations()}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
