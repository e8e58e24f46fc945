"""What side-stream expansion (csf_moe.prefetch) saves in a forward pass, on the H200: JSON with provenance.

    python3 benchmarks/bench_prefetch.py --out FILE [--layers 4] [--tokens 2048] [--reps 20]

A stack of DS4.1-TP4 MXFP4 MoE layers (inline plans sharing one scratch, as the engines bind them), each
preceded by an "attention" stand-in (a bf16 matmul on the current stream), at a token count whose calls
expand scales. Arms, side by side in one process: each layer expanding its routed experts' scales itself,
and the prefetcher expanding the next layer's on a side stream. Eager passes (the prefetcher steps aside
under graph capture), timed with events around the whole pass, L2 flushed before each; outputs compared bit
for bit between the arms on every pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance
from timing import l2_flush_buffer

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe import ExpansionPrefetcher, bind, plan, prepare_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    runtime.freeze()
    geo = load_catalog().moe_geometry("deepseek-v4.1-flash", 4, "mxfp4")
    p = plan(geo, a.tokens, scale_source="inline")
    scratch = torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda")
    layers = [bind(p, prepare_weights(p, **synthetic_layer(geo, seed=i, device="cuda").weight_kwargs()), scratch)
              for i in range(a.layers)]  # fmt: skip
    if not layers[0].expands(a.tokens):
        raise SystemExit(f"{a.tokens} tokens do not expand scales (inline limit {p.inline_token_limit})")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, _, _ = synthetic_routing(geo, a.tokens, gen)
    routes = [synthetic_routing(geo, a.tokens, gen)[1:] for _ in range(a.layers)]
    attn_w = torch.randn(geo.hidden, geo.hidden, device="cuda", generator=gen).to(torch.bfloat16)
    attn_out = torch.empty(a.tokens, geo.hidden, dtype=torch.bfloat16, device="cuda")
    flush = l2_flush_buffer()
    prefetcher = ExpansionPrefetcher("cuda")

    def attention(h):
        torch.matmul(h, attn_w, out=attn_out)  # stands in for the layer's attention (result unused)

    def forward(pf):
        h, outs = x, []
        for i, layer in enumerate(layers):
            attention(h)
            ids, w = routes[i]
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            y = layer.run(h, ids, w) if pf is None else pf.run(i, layer, h, ids, w, next_layer=nxt)
            outs.append(y)
            h = torch.nn.functional.rms_norm(y, (geo.hidden,))  # as between a model's layers: no blow-up
        return outs

    def timed(fn) -> tuple[float, object]:
        flush.add_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, result

    arms = {"self_expanding": lambda: forward(None), "prefetched": lambda: forward(prefetcher),
            "self_expanding_again": lambda: forward(None),  # control: is a pass repeatable bit for bit?
            "attention_only": lambda: [attention(x) for _ in layers]}  # fmt: skip
    for fn in arms.values():  # warm: bindings and the prefetcher's slots
        fn()
    samples = {name: [] for name in arms}
    mismatches = []  # (rep, layer, max |difference|) where the arms differ
    for rep in range(a.reps):
        got = {}
        for name, fn in arms.items():
            t, got[name] = timed(fn)
            samples[name].append(t)
        for other in ("prefetched", "self_expanding_again"):
            for i, (u, v) in enumerate(zip(got["self_expanding"], got[other], strict=True)):
                if not torch.equal(u, v):
                    mismatches.append((other, rep, i, float((u.float() - v.float()).abs().max())))
    exact = not mismatches
    if mismatches:
        print(f"arms differ at (arm, rep, layer, max |diff|): {mismatches[:12]}", flush=True)
    med = {name: statistics.median(s) for name, s in samples.items()}
    for name, m in med.items():
        print(f"{name:15s} {m * 1e6:9.1f} us per pass of {a.layers} layers", flush=True)
    print(f"prefetched / self-expanding: {med['prefetched'] / med['self_expanding']:.3f}; bit-identical: {exact}")
    doc = {
        "benchmark": "bench_prefetch",
        "provenance": provenance(),
        "geometry": geo.name,
        "layers": a.layers,
        "tokens": a.tokens,
        "prefetched_calls": prefetcher.prefetched_calls,
        "bit_identical": exact,
        "mismatches": mismatches,
        "arms": {name: {"samples_s": samples[name], "median_us": med[name] * 1e6} for name in arms},
        "ratio_prefetched_over_self_expanding": med["prefetched"] / med["self_expanding"],
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
