"""Sparse MLA decode figures on the H200, from the AOT cache (frozen): JSON with provenance.

    python3 benchmarks/bench_mla.py --out FILE [--reps 30]

FlashMLA's benchmark configurations (../shared/notes/anchors.md): per batch element a 32768-token FP8
KV cache in 64-token pages, top-k 2048 distinct candidates per query row drawn from its sequence, one or
two query rows per element. Counted as FlashMLA's tests count: FLOPs = 2 * rows * heads * topk * (576 +
512); bytes = unique retrieved records x 656. Median of CUDA-graph replays, L2 flushed before each. Also
per call of a chain: one graph of ``CHAIN_CALLS`` calls back to back, each with candidates of its own drawn
the same way, L2 flushed before each replay, its time divided by the calls: the decode as it runs inside a
model's graph, where the replay's own start is paid once per step, not once per layer.
FlashMLA is not installed on the device machine: its figures are quoted from the notes, and each row
gives the time ratio csf / FlashMLA. Correctness: every configuration's output against the float32
reference on a subset of rows (the reference is too large for all of them).
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
from timing import capture, chain_times, copy_bandwidth, l2_flush_buffer, replay_times

from csf_attention import MLACaps, bind, plan, sparse_mla_reference, write_kv
from csf_kernels import env, runtime
from csf_kernels.mla.layout import HEAD_DIM, LATENT, PAGE_SIZE, RECORD_BYTES, ROPE, VALUE_DIM

SEQ = 32768
CHAIN_CALLS = 8
TOPK = 2048
# (batch, heads, query rows per element, FlashMLA us measured on this H200 or None). FlashMLA runs 64 or
# 128 heads only: 16 heads are its padded-to-64 times, and so are 32 heads (its 64-head times).
CONFIGS = [
    (128, 128, 2, 365),
    (32, 16, 1, 51),
    (128, 16, 1, 120),
    (32, 32, 1, 52),
    (128, 32, 1, 121),
    (32, 64, 1, 52),
    (128, 64, 1, 121),
]


def _candidates(rows: int, s_q: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, TOPK] int32 record ids: TOPK distinct candidates per row from its batch element's sequence."""
    base = (torch.arange(rows, device="cuda") // s_q * SEQ)[:, None]
    cand = torch.rand(rows, SEQ, device="cuda", generator=gen).argsort(dim=1)[:, :TOPK]
    return (base + cand).to(torch.int32).contiguous()


def _inputs(batch: int, heads: int, s_q: int, gen: torch.Generator):
    pages_per_seq = SEQ // PAGE_SIZE
    kv = torch.empty(batch * pages_per_seq, PAGE_SIZE, RECORD_BYTES, dtype=torch.uint8, device="cuda")
    for b in range(batch):  # fill in slices: the float temporaries of a whole cache would not fit
        slots = torch.arange(b * SEQ, (b + 1) * SEQ, device="cuda")
        write_kv(kv, slots, torch.randn(SEQ, LATENT, device="cuda", generator=gen),
                 torch.randn(SEQ, ROPE, device="cuda", generator=gen))  # fmt: skip
    rows = batch * s_q
    indices = _candidates(rows, s_q, gen)
    q = (torch.randn(rows, heads, HEAD_DIM, device="cuda", generator=gen) / HEAD_DIM**0.5).to(torch.bfloat16)
    lengths = torch.full((rows,), TOPK, dtype=torch.int32, device="cuda")
    return q, kv, indices, lengths


def bench_config(batch, heads, s_q, flash_us, reps, flush, copy_gbps):
    gen = torch.Generator(device="cuda").manual_seed(batch * 1000 + heads * 10 + s_q)
    q, kv, indices, lengths = _inputs(batch, heads, s_q, gen)
    rows = q.shape[0]
    sm_scale = 1.0 / HEAD_DIM**0.5
    p = plan(MLACaps(heads=heads, max_rows=rows, topk=TOPK))
    dec = bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device="cuda"))
    out = torch.empty(rows, heads, VALUE_DIM, dtype=torch.bfloat16, device="cuda")
    times = replay_times(capture(lambda: dec.run_decode(q, kv, indices, lengths, sm_scale, out=out)), reps, flush)
    chain = [_candidates(rows, s_q, gen) for _ in range(CHAIN_CALLS)]
    outs = [torch.empty_like(out) for _ in chain]
    calls = [
        functools.partial(dec.run_decode, q, kv, idx, lengths, sm_scale, out=o)
        for idx, o in zip(chain, outs, strict=True)
    ]
    per_call = chain_times(calls, reps, flush)
    chain_unique = statistics.mean(int(torch.unique(idx).numel()) for idx in chain)
    chain_med = statistics.median(per_call)
    last = torch.empty_like(out)
    dec.run_decode(q, kv, chain[-1], lengths, sm_scale, out=last)
    chain_exact = bool(torch.equal(last, outs[-1]))
    sub = slice(0, min(rows, 4))
    want, _ = sparse_mla_reference(q[sub], kv, indices[sub], lengths[sub], sm_scale)
    err = float((out[sub].float() - want).norm() / want.norm())
    med = statistics.median(times)
    unique = int(torch.unique(indices).numel())
    flops = 2 * rows * heads * TOPK * (HEAD_DIM + VALUE_DIM)
    row = {
        "batch": batch, "heads": heads, "query_rows_per_element": s_q, "rows": rows, "topk": TOPK,
        "splits": p.splits_for(rows), "head_block": p.head_block,
        "samples_s": times, "median_us": med * 1e6,
        "TFLOPs": flops / med / 1e12, "GBps": unique * RECORD_BYTES / med / 1e9,
        "fraction_of_copy": unique * RECORD_BYTES / med / 1e9 / copy_gbps,
        "flashmla_us": flash_us, "time_ratio_vs_flashmla": (med * 1e6 / flash_us) if flash_us else None,
        "chain_calls": CHAIN_CALLS, "chain_samples_s_per_call": per_call,
        "chain_median_us_per_call": chain_med * 1e6, "chain_output_equals_eager": chain_exact,
        "chain_fraction_of_copy": chain_unique * RECORD_BYTES / chain_med / 1e9 / copy_gbps,
        "chain_TFLOPs": flops / chain_med / 1e12,
        "rel_err_vs_float32_reference": err, "correct": err < 1.5e-2,
    }  # fmt: skip
    print(f"b={batch} h={heads} s_q={s_q}: {row['median_us']:.1f} us {row['TFLOPs']:.0f} TF "
          f"{row['GBps']:.0f} GB/s ({row['fraction_of_copy']:.2f} of copy) err={err:.2e} flashmla={flash_us}; "
          f"chained {chain_med * 1e6:.1f} us a call ({row['chain_fraction_of_copy']:.2f})", flush=True)  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    env.configure_runtime()  # CSF_FROZEN, CSF_AOT_CACHE, CSF_PDL: read here, at the edge
    runtime.freeze()
    flush = l2_flush_buffer()
    copy = copy_bandwidth(a.reps, flush)
    doc = {
        "benchmark": "bench_mla",
        "provenance": provenance(),
        "copy_bandwidth": copy,
        "results": [],
    }
    for c in CONFIGS:
        doc["results"].append(bench_config(*c, a.reps, flush, copy["median_GBps"]))
        torch.cuda.empty_cache()
    doc["compilations_while_frozen"] = runtime.compilations()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
