"""The decode GEMM's operand pipelines change where operands wait, never the bits: the catalog's staged
programs (three K steps through shared memory) against each step's operands loaded straight into
registers (``word_stages=1``, the unstaged form; mma.sync blocks only: the wgmma blocks' relabelled
activations arrive staged) and a two-stage pipeline without the scales ahead.

The variants are not in the AOT cache, so they compile (Triton's JIT) in a subprocess: the frozen tests'
zero-compilation check in this process stays whole."""

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
    from csf_kernels.moe import specs as moe_specs
    from csf_kernels.catalog import load_catalog
    from csf_moe import bind, plan, prepare_weights
    from csf_moe.synthetic import synthetic_layer, synthetic_routing

    seed = int(sys.argv[1])
    runtime.unfreeze()
    catalog = (moe_specs.DECODE, moe_specs.DECODE_NARROW)  # 9-16 and 1-8 routes per expert
    cases = [
        (("deepseek-v4.1-flash", 4, "mxfp4"), ((1, False), (2, False))),
        (("qwen3-30b-a3b", 1, "nvfp4"), ((1, False),)),
    ]
    for (model, tp, fmt), variants in cases:
        geo = load_catalog().moe_geometry(model, tp, fmt)
        data = synthetic_layer(geo, seed=seed, device="cuda")
        for source, limit in (("native", 1), ("inline", 512)):  # inline up to 512 tokens: records read in the GEMM
            def layer(stages_ahead):
                configs = catalog if stages_ahead is None else tuple(
                    c if c.relabelled and stages_ahead[0] < 2
                    else dataclasses.replace(c, word_stages=stages_ahead[0], ahead=stages_ahead[1]) for c in catalog)
                moe_specs.DECODE, moe_specs.DECODE_NARROW = configs  # read by decode_config_for when planning
                # every bucket on the decode tiles: 8-route blocks up to 8 routes per expert, 16 above
                p = plan(geo, 300, scale_source=source, inline_token_limit=limit, decode_routes_per_expert=1 << 30)
                return bind(p, prepare_weights(p, **data.weight_kwargs()),
                            torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))
            layers = {v: layer(v) for v in (None, *variants)}
            gen = torch.Generator(device="cuda").manual_seed(seed)
            for t in (1, 8, 64, 300):
                x, ids, w = synthetic_routing(geo, t, gen)
                outs = {}
                for v, lay in layers.items():
                    lay.scratch.fill_(0xFF)
                    outs[v] = lay.run(x, ids, w, out=torch.full_like(x, float("nan")))
                for v in variants:
                    assert torch.equal(outs[v], outs[None]), f"seed {seed} {geo.name} {source} T={t}: {v} != catalog"
                assert not outs[None].isnan().any()
    print("ok")
    """
)


def test_register_and_staged_operands_give_the_same_bits():
    run_script(SCRIPT, SEED)
