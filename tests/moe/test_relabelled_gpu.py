"""The catalog's wgmma blocks (16, 32 and 64 routes) reading relabelled activations (``GemmConfig.relabelled``)
against the same programs relabelling in registers (a sweep variant, not in the AOT cache): the same
bits, on geometries with whole and partial K steps (gpt-oss: 2880 = 22.5 steps of 128), every scale source
the GEMM reads. JIT in a subprocess (the frozen tests' zero-compilation check in this process stays whole)."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.interpreted import run_script

pytestmark = pytest.mark.gpu
SEED = int.from_bytes(os.urandom(3), "little")

SCRIPT = textwrap.dedent(
    """
    import dataclasses, sys
    import torch
    from csf_kernels import runtime
    from csf_kernels.catalog import load_catalog
    from csf_kernels.moe.specs import DECODE, DECODE_WIDE, DECODE_WIDEST
    from csf_moe import bind, plan, prepare_weights
    from csf_moe.synthetic import synthetic_layer, synthetic_routing

    seed = int(sys.argv[1])
    runtime.unfreeze()
    for model, tp, fmt in (("qwen3-30b-a3b", 1, "mxfp4"), ("qwen3-30b-a3b", 1, "nvfp4"), ("gpt-oss-120b", 1, "mxfp4")):
        geo = load_catalog().moe_geometry(model, tp, fmt)
        data = synthetic_layer(geo, seed=seed, device="cuda")
        arms = (("native", 0, DECODE), ("native", 0, DECODE_WIDEST), ("inline", 1024, DECODE_WIDE))
        for source, limit, catalog in arms:
            layers = []
            for relabelled in (False, True):
                config = dataclasses.replace(catalog, relabelled=relabelled)
                p = plan(geo, 1024, scale_source=source, inline_token_limit=limit, decode_config=config,
                         decode_routes_per_expert=1 << 30)
                layers.append(bind(p, prepare_weights(p, **data.weight_kwargs()),
                                   torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda")))
            gen = torch.Generator(device="cuda").manual_seed(seed)
            for t in (1, 37, 300, 1000):
                x, ids, w = synthetic_routing(geo, t, gen)
                outs = []
                for lay in layers:
                    lay.scratch.fill_(0xFF)
                    outs.append(lay.run(x, ids, w, out=torch.full_like(x, float("nan"))))
                assert torch.equal(outs[0], outs[1]), f"seed {seed} {geo.name} {source} {catalog.bm} T={t}: differs"
                assert not outs[1].isnan().any()
    print("ok")
    """
)


def test_relabelled_activations_give_the_same_bits():
    run_script(SCRIPT, SEED)
