"""How fast the MoE GEMMs' weight access pattern can stream from HBM, by storage order (pure reads).

    python3 benchmarks/probe_weight_order.py --out FILE

Each program reads what one decode GEMM program reads (64 rows of one expert, one K step at a time: 64
bytes a row for MXFP4) from gpt-oss-120b-sized experts (128 x 5760 rows x 1440 bytes), with the rows
stored as checkpoints store them (a step is 64 runs of 64 bytes, one per row), as 16-byte panels of the
64-row block (a step is one 4 KB run, each 16-byte column of it 64 rows long: the "panels" arm) or as the
GEMMs store them (csf_kernels.moe.fp4_words: a step is one row-major [64 rows, 64 bytes] tile, so a warp's
8-lane access phase reads 128 contiguous bytes). Arms alternate within each round, beside the device's copy
ceiling. No correctness state: the arms compute nothing but an XOR of what they read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance
from timing import capture, copy_bandwidth, l2_flush_buffer, replay_times


@triton.jit
def _read(w, out, stride_words, row_bytes, R, STEP_WORDS: tl.constexpr, ORDER: tl.constexpr):
    e, n = tl.program_id(0), tl.program_id(1)
    r = n * 64 + tl.arange(0, 64)
    c = tl.arange(0, STEP_WORDS)
    base = w + e.to(tl.int64) * R * stride_words
    acc = tl.zeros([64, STEP_WORDS], tl.int32)
    for t in range(tl.cdiv(row_bytes, STEP_WORDS * 4)):
        k = t * STEP_WORDS + c
        m = (k * 4 < row_bytes)[None, :] & (r < R)[:, None]
        if ORDER == 1:  # 16-byte panels of the 64-row block, rows one after another in each
            off = n.to(tl.int64) * 64 * stride_words + (k // 4 * 256)[None, :] + (tl.arange(0, 64) * 4)[:, None] + k % 4
        elif ORDER == 2:  # row-major tiles of one step (the last one narrower), as csf_kernels.moe.fp4_words
            width = tl.minimum(stride_words - t * STEP_WORDS, STEP_WORDS)
            off = (
                n.to(tl.int64) * 64 * stride_words
                + t * 64 * STEP_WORDS
                + (tl.arange(0, 64) * width)[:, None]
                + c[None, :]
            )
        else:
            off = r.to(tl.int64)[:, None] * stride_words + k[None, :]
        acc ^= tl.load(base + off, mask=m, other=0)
    tl.store(out + ((e * tl.num_programs(1) + n) * 64 + tl.arange(0, 64)[:, None]) * STEP_WORDS + c[None, :], acc)


ARMS = {  # name: (row stride in bytes, bytes a row per step, order: 0 rows, 1 16-byte panels, 2 step tiles)
    "rows": (1440, 64, 0),
    "rows_stride_1472": (1472, 64, 0),  # rows 64-byte aligned
    "rows_stride_1536": (1536, 64, 0),  # rows 512-byte aligned
    "rows_128_bytes_a_step": (1440, 128, 0),
    "panels": (1440, 64, 1),
    "step_tiles": (1440, 64, 2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    experts, rows, row_bytes = 128, 5760, 1440
    flush = l2_flush_buffer()
    graphs = {}
    for name, (stride, step, order) in ARMS.items():
        w = torch.randint(-(2**31), 2**31 - 1, (experts * rows * stride // 4,), dtype=torch.int32, device="cuda")
        out = torch.empty(experts * rows * step // 4, dtype=torch.int32, device="cuda")

        def launch(w=w, out=out, stride=stride, step=step, order=order):
            _read[(experts, rows // 64)](w, out, stride // 4, row_bytes, rows, STEP_WORDS=step // 4, ORDER=order)

        graphs[name] = (capture(launch), w, out)
    samples = {name: [] for name in ARMS}
    for _ in range(3):  # rounds, the arms alternating
        for name, (graph, _, _) in graphs.items():
            samples[name] += replay_times(graph, a.reps, flush)
    copy = copy_bandwidth(a.reps, flush)
    nbytes = experts * rows * row_bytes
    arms = {}
    for name, t in samples.items():
        med = statistics.median(t)
        arms[name] = {"median_us": med * 1e6, "TBps": nbytes / med / 1e12, "samples_s": t}
        arms[name]["fraction_of_copy"] = arms[name]["TBps"] * 1e3 / copy["median_GBps"]
        print(f"{name:24s} {med * 1e6:8.1f} us {arms[name]['TBps']:5.2f} TB/s {arms[name]['fraction_of_copy']:.2f}")
    doc = {"benchmark": "probe_weight_order", "provenance": provenance(), "bytes_read": nbytes,
           "copy_bandwidth": copy, "arms": arms}  # fmt: skip
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
