"""One call of a sparse-MLA decode or a fused MoE layer, for a profiler (ncu) to look at: no timing of its own.

    ncu --clock-control none -k regex:mla_decode -c 1 --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/profile_kernels.py mla --batch 128 --heads 16
    ncu --clock-control none -k regex:moe_gemm -c 2 ... python3 benchmarks/profile_kernels.py moe --tokens 8
    ncu ... -k regex:GroupedFp4Gemm -c 2 ... python3 benchmarks/profile_kernels.py engine --arm engine_inline
    ncu --clock-control none -k regex:matmul_ogs -s 2 -c 2 ... python3 benchmarks/profile_kernels.py peer

Programs come from the AOT cache (frozen), as in serving, or with ``--unfrozen`` (before the subcommand) from
Triton's JIT where the cache lacks them; inputs as in bench_mla.py / bench_moe.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from engine_arms import ENGINE_ARMS

from csf_kernels import runtime


def profile_mla(batch: int, heads: int) -> None:
    from bench_mla import TOPK, _inputs

    from csf_attention import MLACaps, bind, plan
    from csf_kernels.mla.layout import HEAD_DIM

    q, kv, indices, lengths = _inputs(batch, heads, 1, torch.Generator(device="cuda").manual_seed(0))
    p = plan(MLACaps(heads=heads, max_rows=batch, topk=TOPK))
    dec = bind(p, torch.empty(p.scratch.nbytes, dtype=torch.uint8, device="cuda"))
    dec.run_decode(q, kv, indices, lengths, 1.0 / HEAD_DIM**0.5)
    torch.cuda.synchronize()


def profile_moe(tokens: int, source: str, model: str, tp: int, fmt: str) -> None:
    from csf_kernels.catalog import load_catalog
    from csf_moe import bind, plan, prepare_weights
    from csf_moe.synthetic import synthetic_layer, synthetic_routing

    geo = load_catalog().moe_geometry(model, tp, fmt)
    p = plan(geo, max(tokens, 8), scale_source=source)
    weights = prepare_weights(p, **synthetic_layer(geo, seed=1, device="cuda").weight_kwargs())
    layer = bind(p, weights, torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))
    x, ids, w = synthetic_routing(geo, tokens, torch.Generator(device="cuda").manual_seed(0))
    layer.run(x, ids, w)
    torch.cuda.synchronize()


def profile_engine(tokens: int, arm: str, model: str, tp: int, fmt: str) -> None:
    """One call of the engine layer as bench_moe's ``arm`` builds it (``engine_arms``)."""
    from engine_arms import engine_layer

    from csf_kernels.catalog import load_catalog
    from csf_moe.synthetic import synthetic_layer, synthetic_routing

    geo = load_catalog().moe_geometry(model, tp, fmt)
    layer = engine_layer(arm, synthetic_layer(geo, seed=1, device="cuda").reference(), geo)
    x, ids, w = synthetic_routing(geo, tokens, torch.Generator(device="cuda").manual_seed(0))
    layer.call(x, ids, w, torch.empty_like(x))()
    torch.cuda.synchronize()


def profile_peer(tokens: int, model: str, tp: int, peer_path: str | None) -> None:
    """One call of the triton_kernels peer (MXFP4; JIT-compiled by Triton there: profile its second call)."""
    from peer_triton_kernels import TritonKernelsMoE, import_triton_kernels

    from csf_kernels.catalog import load_catalog
    from csf_moe.synthetic import synthetic_layer, synthetic_routing

    import_triton_kernels(peer_path)
    geo = load_catalog().moe_geometry(model, tp, "mxfp4")
    peer = TritonKernelsMoE(synthetic_layer(geo, seed=1, device="cuda"))
    x, ids, w = synthetic_routing(geo, tokens, torch.Generator(device="cuda").manual_seed(0))
    for _ in range(2):
        peer.call(x, ids, w, torch.empty_like(x))()
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="kernel", required=True)
    mla = sub.add_parser("mla")
    mla.add_argument("--batch", type=int, default=128)
    mla.add_argument("--heads", type=int, default=16)
    moe = sub.add_parser("moe")
    moe.add_argument("--tokens", type=int, default=8)
    moe.add_argument("--source", default="native", choices=("native", "inline"))
    moe.add_argument("--model", default="deepseek-v4.1-flash")
    moe.add_argument("--tp", type=int, default=4)
    moe.add_argument("--fmt", default="mxfp4")
    for name in ("engine", "peer"):
        sub_ = sub.add_parser(name)
        sub_.add_argument("--tokens", type=int, default=128)
        sub_.add_argument("--model", default="gpt-oss-120b")
        sub_.add_argument("--tp", type=int, default=1)
        if name == "engine":
            sub_.add_argument("--arm", default="engine", choices=sorted(ENGINE_ARMS))
            sub_.add_argument("--fmt", default="mxfp4")
        else:
            sub_.add_argument("--peer-path", default=None)
    ap.add_argument("--unfrozen", action="store_true", help="JIT-compile what the cache lacks (sweeping kernels)")
    a = ap.parse_args()
    if a.unfrozen:
        runtime.unfreeze()
    else:
        runtime.freeze()
    if a.kernel == "mla":
        profile_mla(a.batch, a.heads)
    elif a.kernel == "engine":
        profile_engine(a.tokens, a.arm, a.model, a.tp, a.fmt)
    elif a.kernel == "peer":
        runtime.unfreeze()  # the peer is Triton's JIT; csf's programs are not part of it
        profile_peer(a.tokens, a.model, a.tp, a.peer_path)
    else:
        profile_moe(a.tokens, a.source, a.model, a.tp, a.fmt)


if __name__ == "__main__":
    main()
