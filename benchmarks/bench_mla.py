"""Sparse MLA decode figures on the H200, from the AOT cache (frozen): JSON with provenance.

    python3 benchmarks/bench_mla.py --out FILE [--reps 30] [--arms csf,flashmla] [--flashmla-staged DIR]

FlashMLA's benchmark configurations (../shared/notes/anchors.md): per batch element a 32768-token FP8
KV cache in 64-token pages, top-k 2048 distinct candidates per query row drawn from its sequence, one or
two query rows per element. Counted as FlashMLA's tests count: FLOPs = 2 * rows * heads * topk * (576 +
512); bytes = unique retrieved records x 656. Median of CUDA-graph replays, L2 flushed before each. Also
per call of a chain: one graph of ``CHAIN_CALLS`` calls back to back, each with candidates of its own drawn
the same way, L2 flushed before each replay, its time divided by the calls: the decode as it runs inside a
model's graph, where the replay's own start is paid once per step, not once per layer.
Each row quotes FlashMLA's figures from the notes (``flashmla_us``, ``time_ratio_vs_flashmla``). The ``flashmla``
arm (``--arms csf,flashmla``: peer_flashmla.py) runs FlashMLA 9241ae3 itself on the same instances, timed the same
way, where it is staged and built (scripts/stage_flashmla.sh, scripts/build_flashmla.sh; its staged folder from
``--flashmla-staged``, default ``.peers/flashmla`` under ``$AB_ROOT`` or this tree); otherwise the arm says why and
is skipped. Correctness: every configuration's output, csf's and FlashMLA's, against the float32 reference on a
subset of rows (the reference is too large for all of them); FlashMLA's time is reported only if its output passes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from peer_flashmla import FlashMLADecode, from_flashmla, import_flashmla, to_flashmla
from peer_flashmla import status as flashmla_status
from provenance import provenance
from timing import capture, chain_times, copy_bandwidth, l2_flush_buffer, replay_times

from csf_attention import MLACaps, bind, plan, sparse_mla_reference, write_kv
from csf_kernels import env, runtime
from csf_kernels.mla.layout import HEAD_DIM, LATENT, PAGE_SIZE, RECORD_BYTES, ROPE, VALUE_DIM

ARMS = ("csf", "flashmla")  # csf always runs: the rows' figures are its, and the peer's are set beside them
DEFAULT_FLASHMLA_STAGED = Path(os.environ.get("AB_ROOT") or Path(__file__).resolve().parents[1]) / ".peers/flashmla"
REL_ERR_BOUND = 1.5e-2  # bf16 outputs against the float32 reference
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


def _check(out, lse, q, kv, indices, lengths, sm_scale, rows) -> dict:
    """Output (and lse, where given) of the first rows against the float32 reference (too large for all rows)."""
    sub = slice(0, min(rows, 4))
    want, want_lse = sparse_mla_reference(q[sub], kv, indices[sub], lengths[sub], sm_scale)
    diff = out[sub].float() - want
    err = float(diff.norm() / want.norm())
    check = {"rel_err_vs_float32_reference": err, "max_abs_err_vs_float32_reference": float(diff.abs().max()),
             "correct": bool(err < REL_ERR_BOUND and torch.isfinite(out[sub]).all())}  # fmt: skip
    if lse is not None:
        check["lse_max_abs_err"] = float((lse[sub] - want_lse).abs().max())
    return check


def flashmla_arm(flash_mla, q, kv, indices, lengths, chain, s_q, sm_scale, reps, flush, copy_gbps) -> dict:
    """FlashMLA on this instance, timed as the csf arm is (graph replays after an L2 flush; per call of a chain),
    its output checked first, eager and replayed: a failed check reports the errors and no time."""
    dec = FlashMLADecode(flash_mla, sm_scale)
    x = to_flashmla(q, kv, indices, lengths, s_q)
    rows = q.shape[0]
    arm = {"heads_run": x.q.shape[2]} | _check(*from_flashmla(*dec.run(x), x.heads), q, kv, indices, lengths,
                                                sm_scale, rows)  # fmt: skip
    if not arm["correct"]:
        return arm | {"median_us": None, "why": "FlashMLA's output failed the check against the reference: no time"}
    held = {}
    graph = capture(lambda: held.update(result=dec.run(x)))
    held["result"][0].fill_(float("nan"))  # the replays must write it: capture ran nothing into it
    times = replay_times(graph, reps, flush)
    replayed = _check(*from_flashmla(*held["result"], x.heads), q, kv, indices, lengths, sm_scale, rows)
    if not replayed["correct"]:
        return arm | {"median_us": None, "why": "FlashMLA's replayed output failed the check: no time",
                      "replayed": replayed}  # fmt: skip
    xs = [to_flashmla(q, kv, idx, lengths, s_q) for idx in chain]
    per_call = chain_times([functools.partial(dec.run, xi) for xi in xs], reps, flush)
    med, chain_med = statistics.median(times), statistics.median(per_call)
    unique = int(torch.unique(indices).numel())
    flops = 2 * rows * x.heads * TOPK * (HEAD_DIM + VALUE_DIM)  # the heads asked for, not the padded ones
    return arm | {
        "samples_s": times, "median_us": med * 1e6, "TFLOPs": flops / med / 1e12,
        "GBps": unique * RECORD_BYTES / med / 1e9, "fraction_of_copy": unique * RECORD_BYTES / med / 1e9 / copy_gbps,
        "chain_samples_s_per_call": per_call, "chain_median_us_per_call": chain_med * 1e6,
    }  # fmt: skip


def bench_config(batch, heads, s_q, flash_us, reps, flush, copy_gbps, flash_mla=None):
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
    check = _check(out, None, q, kv, indices, lengths, sm_scale, rows)
    err = check["rel_err_vs_float32_reference"]
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
        **check,
    }  # fmt: skip
    beside = ""
    if flash_mla is not None:
        arm = row["flashmla"] = flashmla_arm(flash_mla, q, kv, indices, lengths, chain, s_q, sm_scale, reps, flush,
                                             copy_gbps)  # fmt: skip
        if arm["median_us"] is not None:
            row["time_ratio_vs_flashmla_measured"] = row["median_us"] / arm["median_us"]
            row["chain_time_ratio_vs_flashmla_measured"] = chain_med * 1e6 / arm["chain_median_us_per_call"]
            beside = f"; FlashMLA here {arm['median_us']:.1f} us ({row['time_ratio_vs_flashmla_measured']:.2f}x)"
        else:
            beside = f"; {arm['why']} (rel err {arm['rel_err_vs_float32_reference']:.2e})"
    print(f"b={batch} h={heads} s_q={s_q}: {row['median_us']:.1f} us {row['TFLOPs']:.0f} TF "
          f"{row['GBps']:.0f} GB/s ({row['fraction_of_copy']:.2f} of copy) err={err:.2e} flashmla={flash_us}; "
          f"chained {chain_med * 1e6:.1f} us a call ({row['chain_fraction_of_copy']:.2f}){beside}",
          flush=True)  # fmt: skip
    return row


def parse_arms(text: str) -> tuple[str, ...]:
    arms = tuple(a for a in text.split(",") if a)
    unknown = [a for a in arms if a not in ARMS]
    if unknown or "csf" not in arms:
        raise argparse.ArgumentTypeError(f"arms are {', '.join(ARMS)}, csf among them; got {text!r}")
    return arms


def peer_of(arms, staged: Path):
    """(FlashMLA's package or None, the arm's status or None when not asked for): an arm that cannot run is skipped
    with its reason, never given a figure."""
    if "flashmla" not in arms:
        return None, None
    st = flashmla_status(staged)
    if not st["available"]:
        print(f"bench_mla: flashmla arm skipped: {st['why']}", flush=True)
        return None, st
    return import_flashmla(staged / "build"), st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--arms", type=parse_arms, default=("csf",), help="csf[,flashmla]")
    ap.add_argument("--flashmla-staged", type=Path, default=DEFAULT_FLASHMLA_STAGED)
    a = ap.parse_args()
    env.configure_runtime()  # CSF_FROZEN, CSF_AOT_CACHE, CSF_PDL: read here, at the edge
    runtime.freeze()
    flash_mla, peer_status = peer_of(a.arms, a.flashmla_staged)
    flush = l2_flush_buffer()
    copy = copy_bandwidth(a.reps, flush)
    doc = {
        "benchmark": "bench_mla",
        "provenance": provenance(),
        "arms": list(a.arms),
        "flashmla": peer_status,
        "copy_bandwidth": copy,
        "results": [],
    }
    for c in CONFIGS:
        doc["results"].append(bench_config(*c, a.reps, flush, copy["median_GBps"], flash_mla))
        torch.cuda.empty_cache()
    doc["compilations_while_frozen"] = runtime.compilations()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
