"""bench_moe's triton_kernels arm (benchmarks/peer_triton_kernels.py) on the CPU: where triton_kernels comes from,
the weights as the peer reads them, and its routing data, whose meaning (matmul_ogs's: gather rows by
``src_indx // k``, expert blocks by the histogram, gates and scatter by sorted slot) applied to the dequantized
weights must give the float32 reference's output. The matmuls themselves need the H200 (bench_moe records their
error against the reference). Runs where triton_kernels is importable: staged under .peers/
(scripts/stage_triton_kernels.sh) or vLLM's own copy (``nox -s tests_vllm`` runs this file too)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from csf_codec import scale_format
from csf_kernels.catalog import MoEGeometry, load_catalog
from csf_moe.reference import activation, moe_reference
from csf_moe.synthetic import synthetic_layer
from tests.repo_scripts import ROOT, load_script

peer = load_script("benchmarks/peer_triton_kernels.py", "peer_triton_kernels")
STATUS = peer.status(str(ROOT / ".peers") if (ROOT / ".peers" / "triton_kernels").is_dir() else None)
pytestmark = pytest.mark.skipif(not STATUS["importable"], reason=STATUS.get("why", ""))


def _layer(activation_kind: str, bias: bool):
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format("mxfp4"), experts=6, hidden=320, intermediate=192,
                      top_k=3, activation=activation_kind, bias=bias)  # fmt: skip
    return geo, synthetic_layer(geo, seed=5)


def _routed_by_peer_data(ref, x, routing, k) -> torch.Tensor:
    """What matmul_ogs computes from the routing data (its torch reference's semantics), on float32 weights."""
    data, gather, scatter = routing.data, routing.gather, routing.scatter
    offsets = [0, *torch.cumsum(data.expt_hist, 0).tolist()]
    out = torch.zeros(x.shape[0], ref.w2.shape[1], dtype=torch.float32)
    for e, (lo, hi) in enumerate(itertools.pairwise(offsets)):
        if lo == hi:
            continue
        w13, w2, b13, b2 = ref.expert(e)
        h = x[gather.src_indx[lo:hi].long() // k].float() @ w13.T
        h = h + (0 if b13 is None else b13.float())
        y = activation(h, "swiglu_oai") @ w2.T + (0 if b2 is None else b2.float())
        out.index_add_(0, scatter.dst_indx[lo:hi].long() // k, y * data.gate_scal[lo:hi, None].float())
    return out


def test_status_names_the_copy_and_its_api():
    assert STATUS["api"] == peer.SUPPORTED_API
    assert len(STATUS["tree_sha256"]) == 64
    assert Path(STATUS["path"]).is_dir()
    assert STATUS["source"] != "unrecorded"  # staged copies carry a SOURCE line; vLLM's copy names its vLLM


@pytest.mark.parametrize(("kind", "bias"), [("silu", False), ("swiglu_oai", True)])
def test_routing_data_routes_every_token_to_its_experts(kind, bias):
    geo, layer = _layer(kind, bias)
    moe = peer.TritonKernelsMoE(layer)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(5, geo.hidden, generator=gen).to(torch.bfloat16)
    w, ids = torch.topk(torch.rand(5, geo.experts, generator=gen), geo.top_k, dim=-1)
    weights = torch.softmax(w, dim=-1)
    routing = moe.routing(ids.to(torch.int32), weights)
    assert routing.data.expt_hist.tolist() == torch.bincount(ids.flatten(), minlength=geo.experts).tolist()
    got = _routed_by_peer_data(moe.reference, x, routing, geo.top_k)
    # the peer's gates are bf16, as vLLM passes them; its activation is gpt-oss's on interleaved W13 rows
    want = moe_reference(x, moe.reference, weights.to(torch.bfloat16).float(), ids, kind="swiglu_oai")
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_weights_are_k_major_with_padded_scale_groups():
    geo, layer = _layer("silu", False)
    moe = peer.TritonKernelsMoE(layer)
    n, h = geo.intermediate, geo.hidden
    assert list(moe.w13.shape) == [geo.experts, h, 2 * n]
    assert list(moe.w2.shape) == [geo.experts, n, h]
    # K / 32 scale groups padded to a multiple of 4: 320 / 32 = 10 -> 12 (W13), 192 / 32 = 6 -> 8 (W2)
    assert moe.fc1_precision.weight_scale.shape[-2] == 12
    assert moe.fc2_precision.weight_scale.shape[-2] == 8
    # W13's rows interleaved: the peer's reference row 1 is the layer's first up row
    assert torch.equal(moe.reference.w13[:, 1], layer.w13[:, n])


def test_padding_and_out_of_range_ids_are_refused():
    geo, layer = _layer("silu", False)
    moe = peer.TritonKernelsMoE(layer)
    weights = torch.full((1, geo.top_k), 1 / geo.top_k)
    for bad in (-1, geo.experts):
        ids = torch.tensor([[0, 1, bad]], dtype=torch.int32)
        with pytest.raises(ValueError, match="live route ids"):
            moe.routing(ids, weights)


def test_nvfp4_weights_are_refused():
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format("nvfp4"), experts=4, hidden=256, intermediate=128, top_k=2)
    with pytest.raises(ValueError, match="MXFP4"):
        peer.TritonKernelsMoE(synthetic_layer(geo, seed=1))


@pytest.mark.parametrize("model_tp", [("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1)])
def test_hopper_layouts_take_the_peer_geometries(monkeypatch, model_tp):
    """What the H200 gets (the CPU has no capability to pick them): both planes of each geometry the anchors measured
    swizzle into the Hopper value layout and back to the K-major FP4 bytes, and their scales into the scale layout."""
    from triton_kernels.tensor_details import layout

    value_layout = (layout.HopperMXValueLayout, {"mx_axis": 1})
    scale_layout = (layout.HopperMXScaleLayout, {"mx_axis": 1, "num_warps": peer.SCALE_LAYOUT_WARPS})
    monkeypatch.setattr(layout, "make_default_matmul_mxfp4_w_layout", lambda mx_axis: value_layout)
    monkeypatch.setattr(layout, "make_default_matmul_mxfp4_w_scale_layout", lambda mx_axis, num_warps: scale_layout)
    geo = replace(load_catalog().moe_geometry(*model_tp, "mxfp4"), experts=2)
    moe = peer.TritonKernelsMoE(synthetic_layer(geo, seed=1))
    planes = ((moe.w13, moe.fc1_precision, moe.reference.w13), (moe.w2, moe.fc2_precision, moe.reference.w2))
    for w, precision, values in planes:
        assert type(w.storage.layout).__name__ == "HopperMXValueLayout"
        assert torch.equal(w.storage.layout.unswizzle_data(w.storage.data), values.transpose(-2, -1))
        scales = precision.weight_scale
        assert type(scales.storage.layout).__name__ == "HopperMXScaleLayout"
        assert scales.shape[-2] % peer.SCALE_K_MULTIPLE == 0
