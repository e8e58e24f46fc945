"""The float32 W4A8 layer reference (csf_moe.w4a8_reference): its weights lose nothing against W4A16, it equals the
W4A16 layer on FP8-rounded activations, promoted blocks included, and padding routes stay inert."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from csf_codec.quantize import dequantize_mxfp4
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.fp8_activations import dequantize_fp8, quantize_activations
from csf_moe.reference import activation, moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from csf_moe.w4a8_reference import W4A8Experts, w4a8_moe_reference

MODELS = [("gpt-oss-120b", 1), ("qwen3-30b-a3b", 1)]


def _layer(model: str, tp: int, seed: int = 0):
    geo = load_catalog().moe_geometry(model, tp, "mxfp4")
    geo = replace(geo, experts=10, hidden=256, intermediate=192)
    return geo, synthetic_layer(geo, seed=seed).reference()


def _shifted(w: W4A8Experts, seed: int) -> W4A8Experts:
    """The same experts against bases moved by up to +-9 binades: many blocks no longer fold and are promoted."""
    g = torch.Generator().manual_seed(seed)

    def move(b: torch.Tensor) -> torch.Tensor:
        return (b.to(torch.int32) + torch.randint(-9, 10, b.shape, generator=g)).clamp(1, 254).to(torch.uint8)

    return replace(w, w13_bases=move(w.w13_bases), w2_bases=move(w.w2_bases))


@pytest.mark.parametrize(("model", "tp"), MODELS)
@pytest.mark.parametrize("shift", [False, True], ids=["codec-bases", "promoted-blocks"])
def test_operands_times_row_factors_are_the_w4a16_weights(model, tp, shift):
    _, q = _layer(model, tp)
    w = _shifted(W4A8Experts.of(q), 1) if shift else W4A8Experts.of(q)
    for e in range(q.experts):
        ex = w.expert(e)
        assert torch.equal(ex.w13 * ex.f13[:, None], dequantize_mxfp4(q.w13[e], q.w13_scale[e]))
        assert torch.equal(ex.w2 * ex.f2[:, None], dequantize_mxfp4(q.w2[e], q.w2_scale[e]))


def _fp8_rounded_w4a16(x, q, topk_weights, topk_ids, kind, convention):
    """The W4A16 float32 layer with both GEMMs' inputs replaced by their FP8 values (written out independently)."""

    def rounded(a):
        return dequantize_fp8(*quantize_activations(a, convention), convention)

    out = torch.zeros(x.shape[0], q.w2.shape[1])
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if not 0 <= e < q.experts:
                continue
            w13, w2, b13, b2 = q.expert(e)
            h = rounded(x[t : t + 1].float()) @ w13.T + (0 if b13 is None else b13)
            y = rounded(activation(h, kind)) @ w2.T + (0 if b2 is None else b2)
            out[t] += topk_weights[t, j] * y[0]
    return out


@pytest.mark.parametrize(("model", "tp"), MODELS)
@pytest.mark.parametrize("convention", ["per_token", "mxfp8"])
def test_equals_w4a16_on_fp8_rounded_activations(model, tp, convention):
    geo, q = _layer(model, tp, seed=3)
    gen = torch.Generator().manual_seed(4)
    x, ids, wts = synthetic_routing(geo, 9, gen)
    ids[0, 0], ids[-1, -1] = -1, geo.experts  # graph padding
    want = _fp8_rounded_w4a16(x, q, wts, ids, geo.activation, convention)
    for w in (W4A8Experts.of(q), _shifted(W4A8Experts.of(q), 5)):
        got = w4a8_moe_reference(x, w, wts, ids, kind=geo.activation, convention=convention, intermediate=None)
        assert ((got - want).norm() / want.norm()).item() < 1e-5
    # FP8 activations cost accuracy: measurably, not grossly
    exact = moe_reference(x, q, wts, ids, kind=geo.activation)
    rel = ((got - exact).norm() / exact.norm()).item()
    assert 1e-3 < rel < 0.1, rel


def test_padding_routes_contribute_nothing():
    geo, q = _layer("qwen3-30b-a3b", 1)
    x, ids, wts = synthetic_routing(geo, 3, torch.Generator().manual_seed(0))
    ids[1] = -1
    ids[2, :] = geo.experts
    out = w4a8_moe_reference(x, W4A8Experts.of(q), wts, ids, kind=geo.activation)
    assert out[0].abs().sum() > 0 and not out[1:].any()


def test_nvfp4_is_refused():
    geo = replace(load_catalog().moe_geometry("qwen3-30b-a3b", 1, "nvfp4"), experts=2, hidden=64, intermediate=64)
    with pytest.raises(NotImplementedError, match="nvfp4"):
        W4A8Experts.of(synthetic_layer(geo).reference())
