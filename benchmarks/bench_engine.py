"""The MoE engine's dense FP4 x bf16 GEMM (docs/moe-engine.md step 1) beside torch.matmul on the dequantized bf16
weights and triton_kernels' dense MXFP4 matmul_ogs, in one call on one card: the step-1 gate (>= 72% of the
measured bf16 peak at R = N = 8192, K = 2880).

Every arm is a CUDA graph replayed after an L2 flush; each arm's output is checked against the float32 reference
before it is timed (``correct`` in the JSON). Run on the GPU machine with the AOT cache (frozen):

    python3 benchmarks/bench_engine.py --out results.json [--peer-path .peers]
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
from csf_kernels.moe.engine import dense_fp4_gemm_launch
from csf_kernels.moe.engine_panels import engine_scale_panel, engine_weight_panel
from csf_kernels.moe.engine_specs import ENGINE_DENSE_TILE_N

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
    for tile_n in ENGINE_DENSE_TILE_N:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peer-path", default=str(Path(__file__).resolve().parents[1] / ".peers"))
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
    for shape in SHAPES:  # the JSON is rewritten after each shape: a failure later keeps what ran
        results.append(bench_shape(*shape, a.reps, flush, peak["median_TFLOPs"], peer_status["importable"]))
        doc["compilations_while_frozen"] = runtime.compilations()
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
