"""Where a few-token fused-MoE call's time goes, and what its alignment program costs there.

    python3 benchmarks/probe_small_batch.py --out probe.json --tokens 1,2,8 --arms catalog,chunk16:8,chunk16:2

For each geometry and token count: the layer's latency (CUDA-graph replays after an L2 flush, native scales)
with each arm's alignment, the alignment programs alone the same way, and (first arm only) the device time of
each kernel of an eager call (torch's profiler). Arms: ``catalog``; ``chunkN:W``, the plan program built for
route chunks of N on W warps (``moe_specs.ALIGN_CHUNK``, the catalog's 1024 on 8); ``routedN``, calls of up
to N tokens reading their routes as blocks without an alignment (``moe_heuristics.ROUTED_TOKENS``; 0: none);
``stagesN``, the one-token tiles (``moe_specs.DECODE_NARROW``) with N K steps in flight; ``targetN``, split-K
GEMMs aiming at N programs (``moe_heuristics.TARGET_PROGRAMS``); ``+`` joins settings (``stages5+target264``). Every
arm's output must equal the first arm's (asserted). Programs
missing from the AOT cache are compiled on first use (the runtime is left unfrozen).
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
from kernel_times import kernel_times
from provenance import provenance
from timing import capture, l2_flush_buffer, replay_times, run_all

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.moe import heuristics as moe_heuristics
from csf_kernels.moe import specs as moe_specs
from csf_moe import bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing

GEOMETRIES = (("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1))


def _set_arm(name: str, catalog: tuple) -> None:
    """The settings an arm names, as module settings read when a plan makes its specs and a layer its
    launches; "catalog": the catalog's."""
    (moe_specs.ALIGN_CHUNK, moe_specs.MOE_ALIGN_PLAN, moe_heuristics.ROUTED_TOKENS, moe_specs.DECODE_NARROW,
     moe_heuristics.TARGET_PROGRAMS) = catalog  # fmt: skip
    for part in name.split("+"):
        if part.startswith("chunk"):
            chunk, warps = (int(f) for f in part.removeprefix("chunk").split(":"))
            moe_specs.ALIGN_CHUNK = chunk
            moe_specs.MOE_ALIGN_PLAN = dataclasses.replace(catalog[1], num_warps=warps)
        elif part.startswith("routed"):
            moe_heuristics.ROUTED_TOKENS = int(part.removeprefix("routed"))
        elif part.startswith("stages"):
            moe_specs.DECODE_NARROW = dataclasses.replace(catalog[3], word_stages=int(part.removeprefix("stages")))
        elif part.startswith("target"):
            moe_heuristics.TARGET_PROGRAMS = int(part.removeprefix("target"))
        elif part != "catalog":
            raise ValueError(f"unknown arm {part!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,2,8")
    ap.add_argument("--arms", default="catalog,chunk16:8", help="catalog, chunkN:W, routedN, stagesN, targetN "
                    "(joined by +), comma-separated")  # fmt: skip
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    runtime.unfreeze()
    tokens = [int(t) for t in a.tokens.split(",")]
    arms = a.arms.split(",")
    catalog = (moe_specs.ALIGN_CHUNK, moe_specs.MOE_ALIGN_PLAN, moe_heuristics.ROUTED_TOKENS, moe_specs.DECODE_NARROW,
               moe_heuristics.TARGET_PROGRAMS)  # fmt: skip
    flush = l2_flush_buffer()
    rows = []
    for model, tp in GEOMETRIES:
        geo = load_catalog().moe_geometry(model, tp, "mxfp4")
        data = synthetic_layer(geo, seed=3, device="cuda")
        weights = prepare_weights(plan(geo, max(tokens), scale_source="native"), **data.weight_kwargs())
        del data
        for t in tokens:
            x, ids, w = synthetic_routing(geo, t, torch.Generator(device="cuda").manual_seed(t))
            row = {"geometry": geo.name, "tokens": t, "arms": {}}
            first = None
            for name in arms:
                _set_arm(name, catalog)
                p = plan(geo, t, scale_source="native", buckets=(t,))
                layer = bind(p, weights, torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))
                out = torch.empty_like(x)
                layer.run(x, ids, w, out=out)
                torch.cuda.synchronize()
                if first is None:
                    first = out.clone()
                assert torch.equal(out, first), f"{geo.name} T={t} arm {name}: output differs"
                samples = replay_times(capture(functools.partial(layer.run, x, ids, w, out=out)), a.reps, flush)
                align = [la.bind(geo.name) for la in layer.launches(x, ids, w, out)
                         if la.spec.kernel.startswith("moe.align")]  # fmt: skip
                align_samples = replay_times(capture(functools.partial(run_all, align)), a.reps, flush)
                arm = {
                    "layer_median_s": statistics.median(samples),
                    "layer_samples_s": samples,
                    "align_median_s": statistics.median(align_samples),
                    "align_samples_s": align_samples,
                }
                if name == arms[0]:
                    arm["kernel_us"] = kernel_times(layer, x, ids, w, 20)
                row["arms"][name] = arm
                print(f"{geo.name} T={t} arm {name}: layer {arm['layer_median_s'] * 1e6:7.1f} us, align alone "
                      f"{arm['align_median_s'] * 1e6:6.1f} us", flush=True)  # fmt: skip
            rows.append(row)
            _set_arm("catalog", catalog)
    doc = {"benchmark": "probe_small_batch", "provenance": provenance(), "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
