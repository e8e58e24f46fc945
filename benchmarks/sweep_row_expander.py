"""Sweep of the CuTe expanders against the Triton expansion, from the AOT cache (frozen).

    python3 benchmarks/sweep_row_expander.py --out FILE

Times each plane of the DeepSeek-V4.1-Flash TP4 MXFP4 layer with every row-image layout the cache has a program
for (8-tile groups, one warp per row block; 32-tile groups, a CTA per block), the row-block expander at several
grid sizes (CTAs per SM) and Triton's tile programs beside them, CUDA-graph replays with L2 flushed, each
variant checked bit for bit, so ``expand.auto_engine`` and ``expand.ROW_BLOCK_CTAS_PER_SM`` choose by
measurement.
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
from timing import capture, l2_flush_buffer, replay_times

from csf_kernels import runtime
from csf_kernels.expand.launch import _row_block_launch, _row_expander_launch, all_experts, inline_expansion_launches
from csf_kernels.expand.specs import ROW_EXPANDER_GROUP_TILES, RowImageLayout, row_image_layout


def _layouts(cols: int, plane_bytes: int) -> list[RowImageLayout]:
    """Every layout of a plane: the chosen one, and for 16-byte multiple columns each group size."""
    chosen = row_image_layout(cols, plane_bytes)
    if chosen is None:
        return []
    if chosen.flat:
        return [chosen]
    full = cols // 4
    return [RowImageLayout(gt, -(-full // gt), flat=False, store=chosen.store) for gt in ROW_EXPANDER_GROUP_TILES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    runtime.freeze()
    flush = l2_flush_buffer()
    rows = []
    for proj, (plane, inline) in layer_planes()[1].items():
        out = torch.empty_like(plane)
        experts = all_experts(inline.geometry.experts, plane.device)
        arms = [("triton", None, inline_expansion_launches(inline, out, engine="triton"))]
        arms += [
            (f"cute-g{lay.group_tiles}", lay, [_row_expander_launch(inline, out, experts, lay)])
            for lay in _layouts(plane.shape[-1], plane.numel())
        ]
        sms = torch.cuda.get_device_properties(plane.device).multi_processor_count
        for per_sm in (4, 8, 16, 64):  # the row-block expander's grid: CTAs per SM (64: a block per warp or CTA)
            arms.append((f"rows-{per_sm}", None, [_row_block_launch(inline, out, experts, ctas=sms * per_sm)]))
        for name, lay, launches in arms:
            bound = [la.bind("deepseek-v4.1-flash") for la in launches]

            def run(bound=bound):
                for b in bound:
                    b()

            out.fill_(0xAB)
            run()
            torch.cuda.synchronize()
            exact = bool(torch.equal(out, plane))
            t = replay_times(capture(run), a.reps, flush)
            med = statistics.median(t)
            rows.append(
                {
                    "plane": proj,
                    "arm": name,
                    "layout": None if lay is None else lay.__dict__,
                    "bit_exact": exact,
                    "median_us": med * 1e6,
                    "samples_s": t,
                }
            )
            print(f"{proj:4s} {name:9s} {med * 1e6:8.1f} us exact={exact}", flush=True)
    doc = {"benchmark": "sweep_row_expander", "provenance": provenance(), "results": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
