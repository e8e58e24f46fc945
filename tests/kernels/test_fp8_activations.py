"""W4A8's activation references (csf_kernels.moe.fp8_activations) against float64 arithmetic with E4M3 rounding from
the format's definition, and the MXFP8 one against torchao's MX implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from csf_kernels.moe.fp8_activations import (
    PER_TOKEN_MIN_SCALE,
    dequantize_fp8,
    mxfp8_quant,
    per_token_fp8_quant,
    quantize_activations,
)

from .e4m3_model import round_e4m3


def _rows(seed: int, t: int = 24, k: int = 256) -> torch.Tensor:
    """bf16 rows of mixed magnitudes: gaussian, heavy-tailed, tiny, one zero row and one zero 32-block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g)
    x[1] = torch.randn(k, generator=g) ** 3 * 30  # heavy-tailed, from the seeded generator
    x[2] *= 2.0**-20
    x[3] = 0
    x[4, 32:64] = 0
    x[5, 7] = 1e4  # an outlier channel
    x[6] *= 2.0**-125  # MXFP8 blocks at the clamped exponent
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_token_against_float64(seed):
    x = _rows(seed)
    q, s = per_token_fp8_quant(x)
    xd = x.double().numpy()
    amax = np.abs(xd).max(axis=1)
    want_s = np.maximum((amax / 448.0).astype(np.float32), np.float32(PER_TOKEN_MIN_SCALE))  # f32(amax / 448)
    assert np.array_equal(s.numpy(), want_s)
    quotient = (xd / want_s.astype(np.float64)[:, None]).astype(np.float32)  # the IEEE float32 division
    assert np.array_equal(q.numpy(), round_e4m3(quotient.astype(np.float64)))
    assert s[3].item() == np.float32(PER_TOKEN_MIN_SCALE) and not q[3].any()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mxfp8_against_float64(seed):
    x = _rows(seed)
    q, s = mxfp8_quant(x)
    xd = x.double().numpy().reshape(x.shape[0], -1, 32)
    amax = np.abs(xd).max(axis=2)
    x_exp = np.array([[max(-127, math.frexp(a)[1] - 1 - 8) if a else -127 for a in r] for r in amax])
    assert np.array_equal(s.numpy().astype(np.int64), x_exp + 127)
    want = round_e4m3(xd * np.exp2(-x_exp)[..., None]).reshape(x.shape)
    assert np.array_equal(q.numpy(), want)
    assert s[3].eq(0).all() and s[4, 1] == 0 and not q[4, 32:64].any()
    assert (s[6] == 0).any()  # the clamped exponent occurs


def test_mxfp8_saturates_the_top_of_the_binade():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1], x[0, 2] = 480.0, 256.0, -500.0
    q, s = mxfp8_quant(x)
    assert s.tolist() == [[127]]  # floor(log2(500)) - 8 = 0
    assert q[0, :3].tolist() == [0x7E, 0x78, 0xFE]  # 448, 256, -448


def test_mxfp8_matches_torchao_to_mx():
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    x = _rows(5, t=64, k=512)
    x[6] = x[7]  # drop the clamped-exponent row: torchao scales it by 2**-126 on purpose (see below)
    scale, data = mx.to_mx(x.contiguous(), torch.float8_e4m3fn, 32, mx.ScaleCalculationMode.FLOOR)
    q, s = mxfp8_quant(x)
    assert torch.equal(s, scale.view(torch.uint8).view(s.shape))
    assert torch.equal(q, data.view(torch.uint8))


def test_mxfp8_clamped_exponent_scales_exactly_where_torchao_does_not():
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    x = torch.full((1, 32), 3 * 2.0**-126)  # amax < 2**-118: X = -127
    scale, data = mx.to_mx(x, torch.float8_e4m3fn, 32, mx.ScaleCalculationMode.FLOOR)
    q, s = mxfp8_quant(x)
    assert int(s) == 0 and int(scale.view(torch.uint8)) == 0
    assert dequantize_fp8(q, s, "mxfp8")[0, 0].item() == 3 * 2.0**-126  # ours: x * 2**127 = 6, exact
    assert data.float()[0, 0].item() == 3.0  # torchao's: x * 2**126, half the value under byte 0


@pytest.mark.parametrize("convention", ["per_token", "mxfp8"])
def test_dequantized_rows_are_close(convention):
    x = _rows(9).float()
    q, s = quantize_activations(x, convention)
    back = dequantize_fp8(q, s, convention)
    if convention == "per_token":
        unit = s[:, None].expand(x.shape)
    else:
        unit = torch.exp2(s.float() - 127).repeat_interleave(32, dim=1)
    normal = (x.abs() >= 2.0**-6 * unit) & (x.abs() <= 448 * unit)  # elements on E4M3's normal range
    assert int(normal.sum()) > 0.8 * x.numel()
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max().item() <= 2.0**-4 * (1 + 2.0**-20)  # half an E4M3 ulp (3 mantissa bits)
    # MXFP8 only: a block's top binade above 448 saturates; per-token's amax / 448 may round a float32 ulp low
    over = x.abs() > 448 * unit * (1 + (2.0**-22 if convention == "per_token" else 0))
    assert (convention == "mxfp8") == bool(over.any())
    assert torch.equal(back[over].abs(), 448 * unit[over])
    low = x.abs() < 2.0**-6 * unit
    sub = (back - x).abs()[low] / unit[low]
    assert sub.max().item() <= 2.0**-10 * (1 + 2.0**-20)  # half the subnormal step 2**-9, in scale units


def test_bad_input_is_refused():
    with pytest.raises(TypeError):
        per_token_fp8_quant(torch.zeros(4, dtype=torch.float16))
    with pytest.raises(ValueError, match="blocks of 32"):
        mxfp8_quant(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="unknown activation convention"):
        quantize_activations(torch.zeros(2, 32), "per_tensor")
