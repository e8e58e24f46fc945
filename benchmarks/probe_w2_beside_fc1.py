"""Why W2's expansion beside a one-token FC1 on records hides on some geometries and not on gpt-oss.

    python3 benchmarks/probe_w2_beside_fc1.py --out w2-beside-fc1.json

For each geometry, a one-token inline call in the form of ``plan.FC1_RECORDS_TOKENS`` (forced on where the plan
leaves it off: gpt-oss), with W2's expansion launched after FC1 in three dependent-launch modes (the row-block
expander's ``pdl``): 2, beside FC1, waiting for it only before it exits (the layer's); 1, waiting for FC1 first
(serial); 6, beside FC1 but letting FC2 in only as its CTAs finish their work. Each replayed in CUDA graphs after
an L2 flush: FC1 alone, the expansion alone, FC1 then the expansion, the whole call; and the whole call's kernel
spans from torch's profiler (with dependent launches a span includes a program's wait for its predecessor).
Last, FC1's function asked for the largest shared-memory carveout (``beside_fc1_carveout_max``), and native's
call and FC1 alone without and with that preference on its GEMMs; each FC1's grid and the driver's occupancy.
Outputs are the call's on the scratch the layer left behind: only the timing is of interest here. The findings:
``docs/archive/perf-log.md``, "One-token FC1 on W13's records, W2's expansion beside it".
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


def _prefer_shared(bound) -> None:
    """The largest shared-memory carveout for this launch's function (all its launches), as the runtime asks."""
    runtime.driver.driver().prefer_shared(bound.program.function, bound.program.entry)


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
        p = dataclasses.replace(p, buckets=(dataclasses.replace(p.buckets[0], fc1_records_tokens=1), *p.buckets[1:]))
        data = synthetic_layer(geo, seed=3, device="cuda")
        layer = bind(p, prepare_weights(p, **data.weight_kwargs()), torch.empty(p.scratch_bytes, dtype=torch.uint8,
                                                                                 device="cuda"))  # fmt: skip
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

        for mode, pdl in (*MODES.items(), ("beside_fc1_carveout_max", 2)):
            variant = list(launches)
            variant[1] = dataclasses.replace(launches[1], args=(*launches[1].args[:-1], pdl))
            bound = [la.with_pointers((x, ids, w, out)).bind(geo.name) for la in variant]
            if mode.endswith("carveout_max"):  # last: the attribute stays on the function
                _prefer_shared(bound[0])
            parts = {"fc1": bound[:1], "expansion": bound[1:2], "fc1+expansion": bound[:2], "call": bound}
            res = {name: timed(part) for name, part in parts.items()}
            res["call_spans"] = kernel_timeline(capture(functools.partial(run_all, bound)), flush, 10)
            res["fc1_ctas_per_sm"] = bound[0].programs_per_sm()
            res["fc1_grid"] = list(bound[0].grid)
            row["modes"][mode] = res
            times = " ".join(f"{k} {v['median_s'] * 1e6:.1f}" for k, v in res.items() if isinstance(v, dict))
            times += f" fc1 grid {res['fc1_grid']} occupancy {res['fc1_ctas_per_sm']}"
            spans = [(s["kernel"][:18], round(s.get("start_us", 0), 1), round(s.get("end_us", 0), 1))
                     for s in res["call_spans"]]  # fmt: skip
            print(geo.name, mode, times, "| spans", spans, flush=True)
        pn = plan(geo, 8, scale_source="native", buckets=(1, 8))
        native = bind(pn, prepare_weights(pn, **data.weight_kwargs()),
                      torch.empty(pn.scratch_bytes, dtype=torch.uint8, device="cuda"))  # fmt: skip
        native.run(x, ids, w, out=out)
        torch.cuda.synchronize()
        unbound = native.launches(x, ids, w, out)
        bound = [la.with_pointers((x, ids, w, out)).bind(geo.name) for la in unbound]
        for mode in ("native", "native_gemms_carveout_max"):
            if mode.endswith("carveout_max"):
                for b, la in zip(bound, unbound, strict=True):
                    if la.spec.kernel == "moe.gemm_decode":
                        _prefer_shared(b)
            res = {"fc1": timed(bound[:1]), "call": timed(bound)}
            res["fc1_ctas_per_sm"] = bound[0].programs_per_sm()
            res["fc1_grid"] = list(bound[0].grid)
            row["modes"][mode] = res
            print(geo.name, mode, f"fc1 {res['fc1']['median_s'] * 1e6:.1f} call {res['call']['median_s'] * 1e6:.1f}"
                  f" fc1 grid {res['fc1_grid']} occupancy {res['fc1_ctas_per_sm']}", flush=True)  # fmt: skip
        rows.append(row)
        del layer, native, data
        torch.cuda.empty_cache()
    doc = {"benchmark": "probe_w2_beside_fc1", "provenance": provenance(), "rows": rows,
           "compilations_while_frozen": runtime.compilations()}  # fmt: skip
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
