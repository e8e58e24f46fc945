"""Buckets on wgmma programs that read relabelled activations (``GemmConfig.relabelled``): the layer copies
FC1's input into the relabelled order first, the FC1 finish writes FC2's in it, and the GEMMs read both with
rows of whole K steps. Launch order and shapes only (the GEMM itself runs on GPUs: Gluon)."""

from __future__ import annotations

import pytest
import torch

from csf_codec import scale_format
from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.relabel import padded_k
from csf_kernels.moe.specs import DECODE_WIDE
from csf_moe import plan, prepare_weights
from csf_moe.layer import MoELayer
from csf_moe.synthetic import synthetic_layer, synthetic_routing


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_relabelled_buckets_relabel_both_gemm_inputs(fmt):
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format(fmt), experts=8, hidden=320, intermediate=192, top_k=3)
    assert DECODE_WIDE.relabelled
    p = plan(geo, 64, scale_source="native", decode_config=DECODE_WIDE, decode_routes_per_expert=1 << 30)
    data = synthetic_layer(geo, seed=3, device="cpu")
    # MoELayer directly: CPU tensors need not be 256-byte aligned, as bind() requires of device scratch
    layer = MoELayer(plan=p, weights=prepare_weights(p, **data.weight_kwargs()),
                     scratch=torch.empty(p.scratch_bytes, dtype=torch.uint8))  # fmt: skip
    x, ids, w = synthetic_routing(geo, 40, torch.Generator().manual_seed(3))
    launches = layer.launches(x, ids, w, torch.empty_like(x))
    kernels = [la.spec.kernel for la in launches]
    relabel, fc1, finish, fc2 = (kernels.index(k) for k in ("moe.relabel", "moe.gemm_decode", "moe.fc1_finish",
                                                             "moe.combine"))  # fmt: skip
    assert relabel < fc1 < finish < fc2 and kernels.count("moe.gemm_decode") == 2
    x1 = launches[relabel].args[1]
    assert tuple(x1.shape) == (40, padded_k(geo.hidden, geo.fmt))
    assert launches[fc1].args[0].data_ptr() == x1.data_ptr()
    assert launches[finish].spec.fact["RELABEL"] == 4 * geo.fmt.block_size
    inter = launches[finish].args[4]
    fc2_gemm = [la for la in launches if la.spec.kernel == "moe.gemm_decode"][1]
    assert tuple(fc2_gemm.args[0].shape) == (40 * geo.top_k, padded_k(geo.intermediate, geo.fmt))
    assert fc2_gemm.args[0].data_ptr() == inter.data_ptr()
    assert all(la.spec.fact.get("XR") == 1 for la in launches if la.spec.kernel == "moe.gemm_decode")
    specs = {s.key for s in p.specs()}
    assert all(la.spec.key in specs for la in launches)  # the plan lists (and a catalog would build) them all
