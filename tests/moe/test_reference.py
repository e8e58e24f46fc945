"""The float32 MoE reference: FP4 weights dequantized exactly, padding routes inert, both activations."""

from __future__ import annotations

import pytest
import torch

from csf_codec.quantize import dequantize_mxfp4, quantize_mxfp4
from csf_moe.reference import ExpertWeights, activation, moe_reference


def _layer(e=6, h=64, n=32, bias=False, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    w13 = torch.randn(e, 2 * n, h, generator=g) * 0.1
    w2 = torch.randn(e, h, n, generator=g) * 0.1
    q13, q2 = quantize_mxfp4(w13), quantize_mxfp4(w2)
    b13 = torch.randn(e, 2 * n, generator=g) if bias else None
    b2 = torch.randn(e, h, generator=g) if bias else None
    deq = ExpertWeights(
        w13=dequantize_mxfp4(q13.values, q13.scales), w2=dequantize_mxfp4(q2.values, q2.scales), b13=b13, b2=b2
    )
    return deq, g


@pytest.mark.parametrize(("kind", "bias"), [("silu", False), ("swiglu_oai", True)])
def test_reference_equals_a_per_token_loop(kind, bias):
    w, g = _layer(bias=bias)
    x = torch.randn(9, 64, generator=g)
    ids = torch.randint(0, 6, (9, 3), generator=g, dtype=torch.int32)
    tw = torch.rand(9, 3, generator=g)
    got = moe_reference(x, w, tw, ids, kind=kind)
    for t in range(9):
        want = torch.zeros(64)
        for j in range(3):
            e = int(ids[t, j])
            h = w.w13[e] @ x[t] + (w.b13[e] if bias else 0)
            want += tw[t, j] * (w.w2[e] @ activation(h, kind) + (w.b2[e] if bias else 0))
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_padding_routes_contribute_nothing(dtype):
    w, g = _layer()
    x = torch.randn(5, 64, generator=g)
    ids = torch.tensor([[0, -1], [6, 2], [-1, 7], [1, 1], [100, 3]], dtype=dtype)
    tw = torch.rand(5, 2, generator=g)
    masked = torch.where((ids >= 0) & (ids < 6), tw, torch.zeros_like(tw))
    safe = ids.clamp(0, 5)
    torch.testing.assert_close(moe_reference(x, w, tw, ids), moe_reference(x, w, masked, safe))
    assert torch.equal(moe_reference(x, w, tw, ids)[2], torch.zeros(64))


def test_swiglu_oai_clamps_as_gpt_oss_defines():
    x = torch.tensor([[10.0, -9.0, -1.0, 2.0]])  # (gate, up) pairs: (10, -9), (-1, 2)
    got = activation(x, "swiglu_oai")
    g0, u0 = 7.0, -7.0
    g1, u1 = -1.0, 2.0
    want = torch.tensor(
        [
            [
                g0 * torch.sigmoid(torch.tensor(1.702 * g0)) * (u0 + 1),
                g1 * torch.sigmoid(torch.tensor(1.702 * g1)) * (u1 + 1),
            ]
        ]
    )
    torch.testing.assert_close(got, want)


def test_bad_shapes_and_kinds_are_refused():
    w, _ = _layer()
    with pytest.raises(ValueError, match="same tokens"):
        moe_reference(torch.randn(3, 64), w, torch.rand(2, 2), torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="activation"):
        activation(torch.randn(2, 4), "gelu")
