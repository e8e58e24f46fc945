"""Tile-config sweep of the fused MoE GEMM on the GPU (development: unfrozen, JIT-compiles variants).

    python3 benchmarks/sweep_moe_configs.py --out FILE

Times each candidate decode / prefill config on the DeepSeek-V4.1-Flash TP4 MXFP4 layer (native and
inline scales; CUDA-graph replays, L2 flushed), so the catalog's configs are chosen by measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance
from timing import capture, l2_flush_buffer, replay_times

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.moe import heuristics as moe_heuristics
from csf_kernels.moe import specs as moe_specs
from csf_kernels.moe.specs import (
    DECODE,
    DECODE_MMA_SYNC,
    DECODE_NARROW,
    DECODE_TRITON,
    DECODE_WIDE,
    DECODE_WIDEST,
    PREFILL,
    GemmConfig,
)
from csf_moe import bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer

CATALOG_DECODE = (DECODE_NARROW, DECODE, DECODE_WIDE, DECODE_WIDEST)


def _configs(kind: str, catalog_prefill: bool = False):
    if kind == "decode":
        # the catalog's blocks (by routes per expert: csf_kernels.moe.heuristics.decode_config_for), then the two
        # engines of the Triton decode tile side by side (64 x 16 on 4 warps, 1 stage: the fastest Triton tile;
        # docs/archive/perf-log.md, "History"). The Gluon engine's weight prefetch is not swept: it measures
        # slower (docs/archive/perf-log.md, "The Gluon decode GEMM")
        yield from CATALOG_DECODE
        yield DECODE_MMA_SYNC
        yield DECODE_TRITON
    elif catalog_prefill:
        yield PREFILL
    else:
        for bm, bn, warps, pf in ((64, 64, 4, 1), (64, 64, 4, 0), (64, 128, 8, 0), (128, 128, 8, 0)):
            yield GemmConfig(name="prefill", bm=bm, bn=bn, num_warps=warps, num_stages=3, split_k=False, prefetch=pf)


def _decode_variant(text: str) -> tuple[GemmConfig, int]:
    """One ``--decode-variants`` entry, ``[wg|wgr]BM[xROWS]:SPLIT_TARGET[:CAP[:INLINE_CAP]][@STAGES]``: the catalog's
    decode config changed accordingly, and its split-K program target."""
    mma = "wgmma" if text.startswith("wg") else "mma_sync"
    relabelled = text.startswith("wgr")  # activations stored relabelled (csf_kernels.moe.relabel)
    text, _, stages = text.partition("@")
    tile, target, *caps = text.removeprefix("wgr" if relabelled else "wg").split(":")
    bm, _, rows = tile.partition("x")  # e.g. wg32x128:528:96: 128 rows (two warpgroups) per program
    caps = [int(c) for c in caps]
    # 8-route mma.sync blocks: the catalog's one-token tiles (routes read as blocks, FC2 finishing FC1)
    base = DECODE if mma == "wgmma" else DECODE_NARROW if bm == "8" else DECODE_MMA_SYNC
    native_cap = caps[0] if caps else base.max_registers
    inline_cap = caps[1] if len(caps) > 1 else base.inline_max_registers
    config = dataclasses.replace(
        base, bm=int(bm), mma=mma, max_registers=native_cap or None, inline_max_registers=inline_cap or None,
        word_stages=int(stages or base.word_stages), bn=int(rows or 64), num_warps=int(rows or 64) // 16,
        relabelled=relabelled,
    )  # fmt: skip
    return config, int(target)


_PLAN_MODULE = importlib.import_module("csf_moe.plan")  # (csf_moe.plan is the function)
_catalog_split_count = _PLAN_MODULE.split_count


def _split_targets(text: str) -> int | tuple[int, int]:
    fc1, _, fc2 = text.partition("/")
    return (int(fc1), int(fc2)) if fc2 else int(fc1)


def _split_count_for(fc1_target: int, fc2_target: int):
    """A split_count for csf_moe's planner aiming FC1 and FC2 at different program targets (it plans each bucket's FC1
    splits, then its FC2 splits: the calls alternate)."""
    calls = itertools.count()

    def split_count(programs: int, k_steps: int) -> int:
        saved = moe_heuristics.TARGET_PROGRAMS
        moe_heuristics.TARGET_PROGRAMS = fc1_target if next(calls) % 2 == 0 else fc2_target
        try:
            return _catalog_split_count(programs, k_steps)
        finally:
            moe_heuristics.TARGET_PROGRAMS = saved

    return split_count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--fmt", default="mxfp4")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--kinds", default="decode,prefill", help="which tile kinds to sweep")
    ap.add_argument("--split-targets", default="", help="instead of tile configs: the catalog's decode configs (by "
                    "routes per expert) at these split-K program targets (comma-separated; FC1/FC2: two)")  # fmt: skip
    ap.add_argument("--decode-variants", default="", help="instead of tile configs: Gluon decode tiles as "
                    "[wg]BM[xROWS]:SPLIT_TARGET[:REGISTER_CAP[:INLINE_REGISTER_CAP]][@STAGES], comma-separated (e.g. "
                    "8:528,16:1056:64,wg32x128:528:0@1); 'wg': on wgmma ('wgr': activations stored relabelled); "
                    "ROWS: per program (64; wgmma: 128 on 8 "
                    "warps); a cap of 0 leaves ptxas its choice; STAGES: weight words' K steps in flight (1: into "
                    "registers a step ahead on wgmma)")  # fmt: skip
    ap.add_argument("--word-stages", default="", help="instead of tile configs: the catalog's decode tiles (by routes "
                    "per expert) with these STAGES:AHEAD weight pipelines, comma-separated "
                    "(e.g. 1:0,3:1)")  # fmt: skip
    ap.add_argument("--sources", default="native,inline", help="scale sources: native, inline (as planned: "
                    "expanded), inline_records (the GEMM reading tile records at every token count) and "
                    "inline_fc1_records (FC1 on W13's records, W2 expanded beside it, routed counts)")  # fmt: skip
    ap.add_argument("--catalog-prefill", action="store_true", help="prefill: the catalog's tiles only")
    ap.add_argument("--tokens", default="", help="token counts for every kind (default: decode 1-512, prefill 128+)")
    a = ap.parse_args()
    runtime.unfreeze()
    geo = load_catalog().moe_geometry(a.model, a.tp, a.fmt)
    data = synthetic_layer(geo, seed=7, device="cuda")
    flush = l2_flush_buffer()
    gen = torch.Generator(device="cuda")
    rows = []
    target_default = moe_heuristics.TARGET_PROGRAMS
    first = {}  # (kind, tokens) -> the first variant's output: every variant and source must reproduce it
    kinds = a.kinds.split(",")
    for kind, tokens in (("decode", (1, 8, 32, 128, 512)), ("prefill", (128, 512, 2048))):
        if kind not in kinds:
            continue
        tokens = tuple(int(t) for t in a.tokens.split(",") if t) or tokens
        # a target, or FC1's / FC2's ("1056/264")
        targets = [_split_targets(x) for x in a.split_targets.split(",") if x] if kind == "decode" else []
        variants = [(DECODE, t) for t in targets] or [
            (cfg, moe_heuristics.TARGET_PROGRAMS) for cfg in _configs(kind, a.catalog_prefill)
        ]
        if kind == "decode" and a.decode_variants:
            variants = [_decode_variant(v) for v in a.decode_variants.split(",")]
        if kind == "decode" and a.word_stages:
            variants = []
            for v in a.word_stages.split(","):
                stages, ahead = (int(f) for f in v.split(":"))
                variants.append((dataclasses.replace(DECODE, word_stages=stages, ahead=bool(ahead)), target_default))
        for cfg, target in variants:
            _PLAN_MODULE.split_count = _split_count_for(*target) if isinstance(target, tuple) else _catalog_split_count
            moe_heuristics.TARGET_PROGRAMS = (
                target if isinstance(target, int) else target_default
            )  # read by split_count
            # --word-stages: every decode block gets the variant's pipeline, chosen per bucket as planned
            (moe_specs.DECODE_NARROW, moe_specs.DECODE, moe_specs.DECODE_WIDE, moe_specs.DECODE_WIDEST) = (
                (dataclasses.replace(d, word_stages=cfg.word_stages, ahead=cfg.ahead) for d in CATALOG_DECODE)
                if a.word_stages
                else CATALOG_DECODE
            )
            for source in a.sources.split(","):
                catalog_tiles = a.word_stages or targets  # the catalog's tiles by routes per expert, varied so
                kw = {"decode_config": None if catalog_tiles else cfg} if kind == "decode" else {"prefill_config": cfg}
                if source == "inline_records":
                    kw["inline_token_limit"] = max(tokens)
                if source == "inline_fc1_records":
                    kw["fc1_records_tokens"] = max(tokens)
                p = plan(geo, max(tokens), scale_source=source.split("_")[0], buckets=tokens,
                         decode_routes_per_expert=1 << 30 if kind == "decode" else 0, **kw)  # fmt: skip
                layer = bind(p, prepare_weights(p, **data.weight_kwargs()),
                             torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))  # fmt: skip
                for t in tokens:
                    gen.manual_seed(1000 + t)  # the same inputs for every variant, so their outputs must agree
                    x = torch.randn(t, geo.hidden, generator=gen, device="cuda").to(torch.bfloat16)
                    w, ids = torch.topk(torch.rand(t, geo.experts, generator=gen, device="cuda"), geo.top_k)
                    ids, w = ids.to(torch.int32), torch.softmax(w, -1)
                    out = torch.full_like(x, float("nan"))
                    layer.run(x, ids, w, out=out)
                    ref = first.setdefault((kind, t), out.clone())
                    equal = bool(torch.equal(out, ref))
                    # variants on another MMA sum in another order: how far from the first variant's output
                    rel = float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
                    g = capture(lambda layer=layer, x=x, ids=ids, w=w, out=out: layer.run(x, ids, w, out=out))
                    med = statistics.median(replay_times(g, a.reps, flush))
                    rows.append({"kind": kind, "config": cfg.__dict__, "split_target": target, "source": source,
                                 "tokens": t, "median_s": med, "equal_to_first_variant": equal,
                                 "rel_diff_to_first_variant": rel})  # fmt: skip
                    mma = cfg.mma if cfg.engine == "gluon" else ""
                    verdict = "" if equal else f" differs {rel:.1e}"
                    print(f"{kind} {cfg.engine} {mma} bm{cfg.bm} bn{cfg.bn} w{cfg.num_warps} pf{int(cfg.prefetch)} "
                          f"st{cfg.word_stages}a{int(cfg.ahead)} r{cfg.max_registers}/{cfg.inline_max_registers} "
                          f"target{target} {source:14s} T={t:5d} {med * 1e6:9.1f} us{verdict}",
                          flush=True)  # fmt: skip
                del layer
    doc = {"benchmark": "sweep_moe_configs", "provenance": provenance(), "geometry": geo.name, "rows": rows,
           "defaults": {"decode": DECODE.__dict__, "prefill": PREFILL.__dict__}}  # fmt: skip
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
