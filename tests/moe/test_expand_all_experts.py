"""Calls that expand every expert's scales (from EXPAND_ALL_ROUTES_PER_EXPERT routes per expert): the launches they
fork and how W2's expansion lets FC1 in (CPU: launches are inspected, not run)."""

from __future__ import annotations

import pytest
import torch

from csf_codec import scale_format
from csf_kernels.catalog import MoEGeometry
from csf_moe import plan, prepare_weights
from csf_moe.layer import MoELayer
from csf_moe.synthetic import synthetic_layer, synthetic_routing


@pytest.mark.parametrize("pdl", ["1", "0"])
def test_w2s_expansion_lets_fc1_in_only_as_its_ctas_finish(monkeypatch, pdl):
    """W13's on the side stream from the call's start; W2's on the current stream, FC1 right behind it. As a
    row-block dependent launch W2's waits first and lets FC1 in only as its CTAs finish (pdl 1 +
    LETS_DEPENDENT_IN_LAST): FC1 let in as they start was spread unevenly over the SMs (runs 285-287)."""
    import csf_kernels.expand as expand
    import csf_moe.layer as layer_module

    for module in (expand, layer_module):  # CPU tensors would take Triton's interpreter
        monkeypatch.setattr(module, "expansion_engine", lambda inline, out: "row_block")
    monkeypatch.setenv("CSF_PDL", pdl)
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format("mxfp4"), experts=8, hidden=320, intermediate=192, top_k=3)
    p = plan(geo, 16, scale_source="inline")
    data = synthetic_layer(geo, seed=3, device="cpu")
    layer = MoELayer(plan=p, weights=prepare_weights(p, **data.weight_kwargs()),
                     scratch=torch.empty(p.scratch_bytes, dtype=torch.uint8))  # fmt: skip
    t = 8
    assert p.expands_all_experts(t) and not p.expands_all_experts(5)
    x, ids, w = synthetic_routing(geo, t, torch.Generator().manual_seed(1))
    launches, (start, split, end) = layer._launches(x, ids, w, torch.empty_like(x))
    expansions = [i for i, la in enumerate(launches) if la.spec.kernel == "expand.row_blocks"]
    w2_at, w13_at = expansions
    assert start == 0 and w2_at == split - 1 and (split, end) == (w13_at, w13_at + 1)
    assert launches[w2_at].args[6].data_ptr() == layer.w2_plane.data_ptr()
    assert launches[end].spec.kernel.startswith("moe.gemm")  # FC1 right after the join
    assert (launches[w2_at].args[-1], launches[w13_at].args[-1]) == ((5, 1) if pdl == "1" else (0, 0))
