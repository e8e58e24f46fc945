"""Warps-per-program sweep of the inline expansion on the GPU (development: unfrozen, JIT-compiles variants).

    python3 benchmarks/sweep_expand.py --out FILE

Times each plane of the DeepSeek-V4.1-Flash TP4 MXFP4 layer with the catalog's program at 1, 2, 4 and 8
warps (same grid and arguments; CUDA-graph replays, L2 flushed) and checks each variant bit for bit, so
the catalog's warp counts are chosen by measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_expand import layer_planes
from provenance import provenance
from timing import L2_FLUSH_BYTES, capture, replay_times

from csf_kernels import runtime
from csf_kernels.expand import inline_expansion_launches
from csf_kernels.programs import ProgramSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    runtime.unfreeze()
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    rows = []
    for proj, (plane, inline) in layer_planes()[1].items():
        out = torch.empty_like(plane)
        for launch in inline_expansion_launches(inline, out):
            for warps in (1, 2, 4, 8):
                facts = {**launch.spec.fact, "num_warps": warps}
                spec = ProgramSpec.of(launch.spec.kernel, launch.spec.version, **facts)
                bound = runtime.program(spec).bind(launch.grid, *launch.args)
                out.fill_(0xAB)
                bound()
                torch.cuda.synchronize()
                exact = torch.equal(out, plane)
                t = replay_times(capture(bound), a.reps, flush)
                med = statistics.median(t)
                rows.append({"plane": proj, "spec": spec.describe(), "grid": list(launch.grid), "bit_exact": exact,
                             "samples_s": t, "median_us": med * 1e6})  # fmt: skip
                print(f"{proj} warps {warps}: {med * 1e6:7.1f} us exact={exact}  {spec.describe()}", flush=True)
    doc = {"benchmark": "sweep_expand", "provenance": provenance(), "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
