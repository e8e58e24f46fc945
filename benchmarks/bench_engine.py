"""The MoE engine's dense FP4 x bf16 GEMM (docs/moe-engine.md step 1) beside torch.matmul on the dequantized bf16
weights and triton_kernels' dense MXFP4 matmul_ogs, in one call on one card: the step-1 gate (>= 72% of the
measured bf16 peak at R = N = 8192, K = 2880).

Every arm is a CUDA graph replayed after an L2 flush; each arm's output is checked against the float32 reference
before it is timed (``correct`` in the JSON). Run on the GPU machine with the AOT cache (frozen):

    python3 benchmarks/bench_engine.py --out results.json [--peer-path .peers] [--probes]

``--probes`` also times the grouped GEMMs' bound probes (``ENGINE_PROBES``, docs/moe-engine.md §7) beside the same
GEMMs run whole-block (``whole``, the probes' baseline, checked): ``noconvert`` (the loop without the conversion) and
``ss`` (A from shared memory, a transform warpgroup's consumers). Their outputs are wrong by design: ``correct`` is
null and ``probe`` true for them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import bf16_peak
from peer_triton_kernels import TritonKernelsMoE
from peer_triton_kernels import status as triton_kernels_status
from provenance import provenance
from timing import capture, copy_bandwidth, l2_flush_buffer, replay_times

from csf_codec.quantize import dequantize_mxfp4
from csf_kernels import env, runtime
from csf_kernels.moe.engine import dense_fp4_gemm_launch, grouped_fp4_gemm_launch
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel
from csf_kernels.moe.engine_specs import ENGINE_PROBE_TILE_N, ENGINE_PROBES, ENGINE_TILE_N
from csf_kernels.moe.launch import WIDE_TILE_ROWS, wide_row_tiles

# (weight rows R, tokens N, K): the gate's square problem, then gpt-oss's FC1 (2N rows) and FC2 per expert at the
# routes an expert sees at 8192 tokens (256) and at 512 (16)
SHAPES = (
    (8192, 8192, 2880),
    (5760, 256, 2880),
    (2880, 256, 2880),
    (5760, 16, 2880),
    (5760, 8192, 2880),
    (2880, 8192, 2880),
    (4096, 4096, 4096),
)


def _within(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> float:
    """Worst error as a multiple of the tolerance (bf16 output rounding plus fp32 accumulation order)."""
    tol = ref.abs() * 2.0**-8 + bound * 2.0**-16 + 1e-30
    err = (out.float() - ref).abs() / tol
    return float("inf") if not torch.isfinite(out.float()).all() else err.max().item()


def _peer_dense(packed: torch.Tensor, scales: torch.Tensor):
    """triton_kernels' dense MXFP4 x bf16 matmul over the same weights (its Hopper layouts, as vLLM prepares them)."""
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig, matmul_ogs
    from triton_kernels.numerics import InFlexData

    w, s = TritonKernelsMoE._swizzled(packed[None], scales[None])
    precision = PrecisionConfig(weight_scale=s, flex_ctx=FlexCtx(rhs_data=InFlexData()))

    def run(x: torch.Tensor, out: torch.Tensor) -> None:
        matmul_ogs(x, w, None, None, precision_config=precision, y=out.view(1, *out.shape))

    return run


def bench_shape(rows: int, n: int, k: int, reps: int, flush, peak: float, peer: bool) -> dict:
    g = torch.Generator().manual_seed(rows * 31 + n * 7 + k)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 130, (rows, k // 32), dtype=torch.uint8, generator=g)
    x = (torch.randn(n, k, generator=g)).to(torch.bfloat16).cuda()
    w = dequantize_mxfp4(packed, scales).to(torch.bfloat16).cuda()
    ref = x.float() @ w.float().T
    bound = x.float().abs() @ w.float().abs().T
    flops = 2.0 * rows * n * k
    arms = {}

    def record(name, fn, out):
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        worst = _within(out, ref, bound)
        t = replay_times(capture(fn), reps, flush)
        med = statistics.median(t)
        arms[name] = {
            "samples_s": t,
            "median_us": med * 1e6,
            "TFLOPs": flops / med / 1e12,
            "of_bf16_peak": flops / med / 1e12 / peak,
            "worst_error_over_tolerance": worst,
            "correct": worst <= 1.0,
        }
        print(f"  R={rows} N={n} K={k} {name:12s} {med * 1e6:9.1f} us {flops / med / 1e12:6.0f} TFLOP/s "
              f"err/tol {worst:.2f}", flush=True)  # fmt: skip

    w_panel, s_panel = engine_weight_panel(packed).cuda(), engine_scale_panel(scales).cuda()
    for tile_n in ENGINE_TILE_N:
        out = torch.empty(n, rows, dtype=torch.bfloat16, device="cuda")
        bound_launch = dense_fp4_gemm_launch(w_panel, s_panel, x, out, tile_n=tile_n).bind("bench_engine")
        record(f"engine_n{tile_n}", bound_launch, out)
    out = torch.empty(n, rows, dtype=torch.bfloat16, device="cuda")
    wt = w.T
    record("torch_bf16", lambda: torch.matmul(x, wt, out=out), out)
    if peer:
        out = torch.empty(n, rows, dtype=torch.bfloat16, device="cuda")
        try:
            run = _peer_dense(packed.cuda(), scales.cuda())
            record("triton_kernels", lambda: run(x, out), out)
        except Exception as exc:  # the peer's API is not ours: record why the arm did not run
            arms["triton_kernels"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  triton_kernels arm failed: {exc}", flush=True)
    return {"rows": rows, "tokens": n, "k": k, "flops": flops, "arms": arms}


# the peer geometries' per-rank experts (E, hidden H, intermediate N, top-k), as bench_moe's peers
GROUPED = (("gpt-oss-120b", 128, 2880, 2880, 4), ("DS4.1-TP4", 384, 5120, 576, 6), ("Qwen3-30B-A3B", 128, 2048, 768, 8))


def _random_panels(experts: int, rows: int, k: int, g: torch.Generator):
    """Random MXFP4 experts, their panels (built on the GPU), their 64-row tiles' wide flags and, for checking,
    expert 0 dequantized. E8M0 bytes 118..128, as real weights keep them: no tile is wide, so the GEMMs take the
    one-multiply conversion the served layer takes (``wide_row_tiles``), not the two-multiply one every tile of an
    unflagged launch gets."""
    w_panel = torch.empty(experts, k // 64, rows // 64, 256, dtype=torch.uint64, device="cuda")
    s_panel = torch.empty(experts, k // 64, 2 * rows, dtype=torch.uint8, device="cuda")
    wide = torch.empty(experts, -(-rows // WIDE_TILE_ROWS), dtype=torch.uint8, device="cuda")
    first = None
    for e in range(experts):
        packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device="cuda", generator=g)
        scales = torch.randint(118, 129, (rows, k // 32), dtype=torch.uint8, device="cuda", generator=g)
        w_panel[e] = engine_weight_panel(packed)
        s_panel[e] = engine_scale_panel(scales)
        wide[e] = wide_row_tiles(scales[None])[0]
        if e == 0:
            first = dequantize_mxfp4(packed.cpu(), scales.cpu()).to(torch.bfloat16).cuda()
    return w_panel, s_panel, wide, first


def bench_grouped(name, experts, hidden, inter, top_k, tokens, reps, flush, peak, probes=False) -> dict:
    """FC1 (2N rows over H) and FC2 (H rows over N) of one MoE layer as the engine's grouped GEMMs on a uniform
    top-k routing: routes sorted into blocks of each expert (host-side, not timed), GEMMs alone (no gather,
    activation or combine: what the engine's fused epilogues will add). ``probes``: also each GEMM whole-block and
    as each bound probe, where the block size has them."""
    g = torch.Generator(device="cuda").manual_seed(tokens * 131 + experts)
    w13, s13, wide13, w13_0 = _random_panels(experts, 2 * inter, hidden, g)
    w2, s2, wide2, w2_0 = _random_panels(experts, hidden, inter, g)
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(top_k, dim=1).indices.reshape(-1)
    counts = torch.bincount(ids, minlength=experts).tolist()
    routes_per_expert = tokens * top_k / experts
    tile_n = min(t for t in ENGINE_TILE_N if t >= min(routes_per_expert, max(ENGINE_TILE_N)))
    block_expert = [e for e, c in enumerate(counts) for _ in range(-(-c // tile_n))]
    blocks = len(block_expert)
    be = torch.tensor(block_expert, dtype=torch.int32, device="cuda")
    meta = torch.tensor([blocks], dtype=torch.int32, device="cuda")
    rows_x = blocks * tile_n
    x1 = torch.randn(rows_x, hidden, device="cuda", generator=g).to(torch.bfloat16)
    x2 = torch.randn(rows_x, inter, device="cuda", generator=g).to(torch.bfloat16)
    out1 = torch.empty(rows_x, 2 * inter, dtype=torch.bfloat16, device="cuda")
    out2 = torch.empty(rows_x, hidden, dtype=torch.bfloat16, device="cuda")
    fc1 = grouped_fp4_gemm_launch(w13, s13, x1, out1, be, meta, tile_n=tile_n, wide=wide13).bind(name)
    fc2 = grouped_fp4_gemm_launch(w2, s2, x2, out2, be, meta, tile_n=tile_n, wide=wide2).bind(name)
    fc1()
    fc2()
    torch.cuda.synchronize()
    checks = {}
    b0 = block_expert.index(0)
    for label, x, w, out in (("fc1", x1, w13_0, out1), ("fc2", x2, w2_0, out2)):
        sl = slice(b0 * tile_n, (b0 + 1) * tile_n)
        ref = x[sl].float() @ w.float().T
        checks[label] = _within(out[sl], ref, x[sl].float().abs() @ w.float().abs().T)
    useful = 6.0 * tokens * top_k * hidden * inter
    arms = {}
    for label, fn in (("fc1", fc1), ("fc2", fc2), ("fc1+fc2", lambda: (fc1(), fc2()))):
        t = replay_times(capture(fn), reps, flush)
        arms[label] = {"samples_s": t, "median_us": statistics.median(t) * 1e6}
    if probes and tile_n in ENGINE_PROBE_TILE_N:
        _time_probes(arms, (w13, s13, wide13, x1, out1, w13_0), (w2, s2, wide2, x2, out2, w2_0), be, meta, tile_n, b0,
                     reps, flush)  # fmt: skip
    med = arms["fc1+fc2"]["median_us"] / 1e6
    print(f"  {name} T={tokens} blocks of {tile_n} ({blocks}): fc1 {arms['fc1']['median_us']:.1f} us, "
          f"fc2 {arms['fc2']['median_us']:.1f} us, both {med * 1e6:.1f} us, {useful / med / 1e12:.0f} useful TFLOP/s, "
          f"err/tol {max(checks.values()):.2f}", flush=True)  # fmt: skip
    return {
        "geometry": name,
        "tokens": tokens,
        "tile_n": tile_n,
        "blocks": blocks,
        "useful_flops": useful,
        "useful_TFLOPs": useful / med / 1e12,
        "of_bf16_peak": useful / med / 1e12 / peak,
        "worst_error_over_tolerance": checks,
        "correct": max(checks.values()) <= 1.0,
        "arms": arms,
    }


def _time_probes(arms, fc1, fc2, be, meta, tile_n, b0, reps, flush) -> None:
    """FC1 and FC2 whole-block (``whole_fc1``, checked against expert 0's block) and as each bound probe
    (``<probe>_fc1``: outputs wrong by design, not checked), their replays interleaved rep by rep (a clock's drift
    lands on every arm alike)."""
    graphs = {}
    for variant in ("whole", *ENGINE_PROBES):
        probe = None if variant == "whole" else variant
        for label, (w, s, wide, x, out, w0) in (("fc1", fc1), ("fc2", fc2)):
            fn = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=tile_n, wide=wide, ragged=False, probe=probe)
            fn = fn.bind("bench_engine")
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            sl = slice(b0 * tile_n, (b0 + 1) * tile_n)
            ref = x[sl].float() @ w0.float().T
            worst = None if probe else _within(out[sl], ref, x[sl].float().abs() @ w0.float().abs().T)
            graphs[f"{variant}_{label}"] = capture(fn)
            arms[f"{variant}_{label}"] = {
                "samples_s": [],
                "probe": probe is not None,
                "worst_error_over_tolerance": worst,
                "correct": None if probe else worst <= 1.0,
            }
    for _ in range(reps):
        for name, graph in graphs.items():
            arms[name]["samples_s"] += replay_times(graph, 1, flush)
    for name in graphs:
        arms[name]["median_us"] = statistics.median(arms[name]["samples_s"]) * 1e6
        print(f"    {name}: {arms[name]['median_us']:.1f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peer-path", default=str(Path(__file__).resolve().parents[1] / ".peers"))
    ap.add_argument("--tokens", default="2048,8192", help="token counts of the grouped (MoE layer) GEMMs")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--probes", action="store_true", help="also time the grouped GEMMs' bound probes")
    a = ap.parse_args()
    env.configure_runtime()
    runtime.freeze()
    peer_status = triton_kernels_status(a.peer_path if Path(a.peer_path, "triton_kernels").is_dir() else None)
    flush = l2_flush_buffer()
    copy = copy_bandwidth(a.reps, flush)
    peak = bf16_peak(a.reps, flush)
    print(f"copy {copy['median_GBps']:.0f} GB/s, bf16 peak {peak['median_TFLOPs']:.0f} TFLOP/s", flush=True)
    results = []
    doc = {
        "benchmark": "bench_engine",
        "provenance": provenance(),
        "copy_bandwidth": copy,
        "bf16_peak": peak,
        "triton_kernels": peer_status,
        "results": results,
        "compilations_while_frozen": runtime.compilations(),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    doc["grouped"] = grouped = []
    for shape in () if a.skip_dense else SHAPES:  # the JSON is rewritten after each: a failure keeps what ran
        results.append(bench_shape(*shape, a.reps, flush, peak["median_TFLOPs"], peer_status["importable"]))
        doc["compilations_while_frozen"] = runtime.compilations()
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for geo in GROUPED:
        for tokens in (int(t) for t in a.tokens.split(",")):
            grouped.append(bench_grouped(*geo, tokens, a.reps, flush, peak["median_TFLOPs"], a.probes))
            doc["compilations_while_frozen"] = runtime.compilations()
            Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
