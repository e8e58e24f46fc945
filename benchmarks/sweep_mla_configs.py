"""Decode-config sweep of sparse MLA on the GPU (development: unfrozen, JIT-compiles variants).

    python3 benchmarks/sweep_mla_configs.py --out FILE [--reps 20] [--configs 64/8/1/1/bf16,16/4/1/2 | --catalog]

Times each candidate (heads per program, warps) at FlashMLA's benchmark configurations (CUDA-graph
replays, L2 flushed) and checks each against the float32 reference on a few rows, so the catalog's
config is chosen by measurement. Inputs as in bench_mla.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_mla import TOPK, _inputs
from provenance import provenance
from timing import capture, l2_flush_buffer, replay_times

from csf_attention import MLACaps, bind, plan, sparse_mla_reference
from csf_kernels import runtime
from csf_kernels.mla.heuristics import decode_config
from csf_kernels.mla.layout import HEAD_DIM, VALUE_DIM
from csf_kernels.mla.specs import DecodeConfig

# head block, warps, stages, waves (programs per SM the split policy aims at), operand type; 2 stages,
# 32-candidate steps and a 128-register cap are not candidates: each measures slower (docs/archive/perf-log.md,
# "The wgmma program in two warpgroups"). The Gluon programs (16 and 32 heads) first, then the Triton ones
CANDIDATES = [
    DecodeConfig(16, 4, 1, 2, engine="gluon"),
    DecodeConfig(16, 8, 1, 1, engine="gluon"),
    DecodeConfig(32, 8, 1, 1, engine="gluon"),
    DecodeConfig(32, 4, 1, 1, engine="gluon"),
    DecodeConfig(16, 4, 1, 2),
    DecodeConfig(16, 4, 1, 2, regroup=True),
    DecodeConfig(16, 4, 1, 2, operand="bfloat16"),
    DecodeConfig(16, 8, 1, 1),
    DecodeConfig(32, 8, 1, 1),
    DecodeConfig(32, 8, 1, 1, operand="bfloat16"),
    DecodeConfig(64, 8, 1, 1, operand="bfloat16"),
    DecodeConfig(64, 16, 1, 1, operand="bfloat16"),
]
OPERAND_NAMES = {"f16": "float16", "bf16": "bfloat16"}
ENGINE_TOKENS = {"g": "gluon", "w": "wgmma", "W": "wide"}


def _configs(text: str) -> list[DecodeConfig]:
    """``64/8/1/1/bf16,16/4/1/2/f16/r,32/8/1/1/f16/g``: head block / warps / stages / waves [/ f16 or bf16
    [/ r: regroup, g: the gluon engine, w: the wgmma engine, W: the wide engine]], comma-separated."""
    configs = []
    for item in filter(None, text.split(",")):
        fields = item.split("/")
        extra = {"operand": OPERAND_NAMES[fields[4]]} if len(fields) > 4 else {}
        for token in fields[5:]:
            if token == "r":
                extra["regroup"] = True
            elif token in ENGINE_TOKENS:
                extra["engine"] = ENGINE_TOKENS[token]
            else:
                raise ValueError(f"unknown config token {token!r} in {item!r}")
        configs.append(DecodeConfig(*map(int, fields[:4]), **extra))
    return configs


def _shapes(text: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, item.split("x"))) for item in filter(None, text.split(","))]


SHAPES = [(128, 128, 2), (32, 16, 1), (128, 16, 1), (32, 32, 1), (128, 32, 1), (128, 64, 1)]  # (batch, heads, rows)


def time_config(config: DecodeConfig, heads: int, inputs, want, reps: int, flush, direct: bool = True) -> dict:
    """``direct``: single-split calls finished by the decode program where it can (the plan's default);
    False: every call's splits merged by the merge program."""
    q, kv, indices, lengths = inputs
    rows, sm_scale = q.shape[0], 1.0 / HEAD_DIM**0.5
    p = plan(MLACaps(heads=heads, max_rows=rows, topk=TOPK, direct_single_split=direct), config)
    dec = bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device="cuda"))
    out = torch.empty(rows, heads, VALUE_DIM, dtype=torch.bfloat16, device="cuda")
    times = replay_times(capture(lambda: dec.run_decode(q, kv, indices, lengths, sm_scale, out=out)), reps, flush)
    err = float((out[:4].float() - want).norm() / want.norm())
    return {"samples_s": times, "median_us": statistics.median(times) * 1e6, "rel_err": err, "correct": err < 1.5e-2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--configs", type=_configs, default=CANDIDATES, help="head/warps/stages/waves,...")
    ap.add_argument("--catalog", action="store_true", help="only the catalog's config for each head count")
    ap.add_argument("--label", default="", help="a name for this arm, kept in the JSON")
    ap.add_argument("--shapes", type=_shapes, default=SHAPES, help="batch x heads x rows,... e.g. 32x16x1")
    ap.add_argument("--finish", default="direct", help="direct (single splits finished by the decode where it "
                    "can), merged (always merged), or both: direct,merged")  # fmt: skip
    a = ap.parse_args()
    runtime.unfreeze()
    flush = l2_flush_buffer()
    results = []
    for batch, heads, s_q in a.shapes:
        gen = torch.Generator(device="cuda").manual_seed(batch + heads + s_q)
        inputs = _inputs(batch, heads, s_q, gen)
        q, kv, indices, lengths = inputs
        want, _ = sparse_mla_reference(q[:4], kv, indices[:4], lengths[:4], 1.0 / HEAD_DIM**0.5)
        arms = [(c, f) for c in ([decode_config(heads)] if a.catalog else a.configs) for f in a.finish.split(",")]
        for config, finish in arms:
            if heads % config.head_block:
                continue
            row = {"arm": a.label, "batch": batch, "heads": heads, "query_rows_per_element": s_q, "finish": finish}
            row["config"] = vars(config)
            try:
                row.update(time_config(config, heads, inputs, want, a.reps, flush, direct=finish == "direct"))
            except Exception as exc:  # a config that does not compile or launch is a result too
                row.update(error=f"{type(exc).__name__}: {exc}"[:500])
            print(json.dumps({k: v for k, v in row.items() if k != "samples_s"}), flush=True)
            results.append(row)
        torch.cuda.empty_cache()
    doc = {"benchmark": "sweep_mla_configs", "provenance": provenance(), "results": results}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
