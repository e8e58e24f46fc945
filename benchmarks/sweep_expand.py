"""Tiles- and warps-per-program sweep of the inline expansion on the GPU (development: unfrozen,
JIT-compiles variants).

    python3 benchmarks/sweep_expand.py --out FILE

Times each plane of the DeepSeek-V4.1-Flash TP4 MXFP4 layer with every tiles-per-program choice its
store width allows, at 1, 2, 4 and 8 warps (CUDA-graph replays, L2 flushed), and checks each variant bit
for bit, so the catalog's choices are made by measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_expand import layer_planes
from provenance import provenance
from timing import capture, l2_flush_buffer, replay_times

from csf_kernels import runtime
from csf_kernels.expand.launch import inline_expansion_launches
from csf_kernels.expand.specs import TILES_BY_STORE
from csf_kernels.runtime.programs import ProgramSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    runtime.unfreeze()
    flush = l2_flush_buffer()
    rows = []
    for proj, (plane, inline) in layer_planes()[1].items():
        out = torch.empty_like(plane)
        (launch,) = inline_expansion_launches(inline, out, engine="triton")
        fact = launch.spec.fact
        full = inline.geometry.full_col_tiles
        # narrow planes: one program holds every full tile; vector stores take any multiple of their words
        tiles = (fact["CT"],) if fact["NARROW"] else sorted({*TILES_BY_STORE[fact["STORE"]], 16, 32})
        for ct, warps in itertools.product(tiles, (1, 2, 4, 8)):
            spec = ProgramSpec.of(launch.spec.kernel, launch.spec.version, **{**fact, "CT": ct, "num_warps": warps})
            grid = (-(-full // ct), *launch.grid[1:])
            bound = runtime.program(spec).bind(grid, *launch.args)
            out.fill_(0xAB)
            bound()
            torch.cuda.synchronize()
            exact = torch.equal(out, plane)
            t = replay_times(capture(bound), a.reps, flush)
            med = statistics.median(t)
            rows.append({"plane": proj, "spec": spec.describe(), "grid": list(grid), "bit_exact": exact,
                         "samples_s": t, "median_us": med * 1e6})  # fmt: skip
            print(f"{proj} tiles {ct} warps {warps}: {med * 1e6:7.1f} us exact={exact}  {spec.describe()}", flush=True)
    doc = {"benchmark": "sweep_expand", "provenance": provenance(), "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
