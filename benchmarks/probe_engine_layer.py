"""Run the engine layer's launches one at a time, synchronising after each, and name the first that fails: for
faults that surface asynchronously in a whole-layer benchmark.

    CUDA_LAUNCH_BLOCKING=1 python3 benchmarks/probe_engine_layer.py --tokens 8192
"""

from __future__ import annotations

import argparse

import torch

from csf_kernels import env, runtime
from csf_kernels.catalog import load_catalog
from csf_moe.engine_layer import EngineMoE, engine_weights
from csf_moe.reference import moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing

GEOMETRIES = [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "mxfp4"), ("qwen3-30b-a3b", 1, "mxfp4")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8192")
    a = ap.parse_args()
    env.configure_runtime()
    runtime.freeze()
    for model, tp, fmt in GEOMETRIES:
        geo = load_catalog().moe_geometry(model, tp, fmt)
        data = synthetic_layer(geo, seed=1234, device="cuda")
        layer = EngineMoE(engine_weights(data.reference(), geo.activation), geo.top_k)
        gen = torch.Generator(device="cuda").manual_seed(99)
        for t in (int(x) for x in a.tokens.split(",")):
            x, ids, w = synthetic_routing(geo, t, gen)
            out = torch.full_like(x, float("nan"))
            run = layer.call(x, ids, w, out)
            meta = run.buffers[3]
            for name, launch in run.launches:
                launch()
                torch.cuda.synchronize()
                print(f"{geo.name} T={t}: {name} ok (meta {meta[:2].tolist()})", flush=True)
            want = moe_reference(x, data.reference(), w, ids, kind=geo.activation)
            err = float((out.float() - want).norm() / want.norm())
            print(f"{geo.name} T={t}: rel error {err:.3e}", flush=True)
        del layer, data
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
