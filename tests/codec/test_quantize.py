"""FP4 element/scale encodings and the reference MXFP4 / NVFP4 quantizers (fp4.py, quantize.py)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from csf_codec.fp4 import (
    E2M1_VALUES,
    e2m1_to_float,
    e4m3_bytes_to_float,
    e8m0_to_float,
    float_to_e2m1,
    float_to_e4m3_bytes,
    pack_fp4,
    unpack_fp4,
)
from csf_codec.quantize import (
    dequantize_mxfp4,
    dequantize_nvfp4,
    nvfp4_global_scale,
    quantize_mxfp4,
    quantize_nvfp4,
)

NAN = float("nan")
INF = float("inf")


def _weights(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Gaussian weights whose rows span ~16 binades, so scales cover a wide range."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.exp2(torch.randn((*shape[:-1], 1), generator=g) * 4)
    return (torch.randn(shape, generator=g) * rows).to(dtype)


def _half_spacing(a: torch.Tensor) -> torch.Tensor:
    """Largest rounding error of E2M1 at magnitude a (in units of the block scale); beyond 6 it saturates."""
    return torch.where(a <= 2, 0.25, torch.where(a <= 4, 0.5, torch.where(a <= 6, 1.0, a - 6)))


# --- fp4.py -----------------------------------------------------------------------------------------------------


def test_e2m1_table() -> None:
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert E2M1_VALUES.tolist() == mags + [-m for m in mags]
    assert torch.signbit(E2M1_VALUES[8])  # code 8 is -0.0


def test_pack_order_low_nibble_first() -> None:
    codes = torch.tensor([[1, 2, 3, 4, 0xF, 0]], dtype=torch.uint8)
    assert pack_fp4(codes).tolist() == [[0x21, 0x43, 0x0F]]
    assert torch.equal(unpack_fp4(pack_fp4(codes)), codes)
    every_byte = torch.arange(256, dtype=torch.uint8).view(2, 128)
    assert torch.equal(pack_fp4(unpack_fp4(every_byte)), every_byte)
    assert unpack_fp4(every_byte).shape == (2, 256)


def test_pack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="odd"):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(TypeError):
        pack_fp4(torch.zeros(4, dtype=torch.int32))


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (0.0, 0),
        (-0.0, 8),
        (0.25, 0),  # tie 0 | 0.5 -> even code 0
        (0.2500001, 1),
        (0.75, 2),  # tie 0.5 | 1.0 -> code 2
        (1.25, 2),  # tie 1.0 | 1.5 -> code 2
        (1.75, 4),  # tie 1.5 | 2.0 -> code 4
        (2.5, 4),  # tie 2 | 3 -> code 4
        (3.5, 6),  # tie 3 | 4 -> code 6
        (5.0, 6),  # tie 4 | 6 -> code 6
        (5.0001, 7),
        (7.0, 7),
        (1e30, 7),
        (INF, 7),
        (-INF, 15),
        (-2.9, 13),
        (-1e-9, 8),  # negative that rounds to zero keeps its sign, as torchao
        (NAN, 0),
    ],
)
def test_float_to_e2m1_known_values(value: float, code: int) -> None:
    assert float_to_e2m1(torch.tensor([value])).item() == code


def test_e2m1_grid_is_fixed_point() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(float_to_e2m1(e2m1_to_float(codes)), codes)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=1, max_size=64))
def test_float_to_e2m1_is_nearest_even(values: list[float]) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    mags = E2M1_VALUES[:8]
    dist = (x.abs().unsqueeze(1) - mags).abs()
    best = dist.min(dim=1, keepdim=True).values
    # among the nearest magnitudes, the even code wins (ties are exactly two adjacent codes)
    candidates = (dist == best) & (torch.arange(8) % 2 == 0)
    expected = torch.where(candidates.any(dim=1), candidates.int().argmax(dim=1), dist.argmin(dim=1))
    expected = expected.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)
    assert torch.equal(float_to_e2m1(x), expected)


def test_e8m0_to_float() -> None:
    got = e8m0_to_float(torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8))
    assert got[:6].tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    assert math.isnan(got[6])
    every = torch.arange(256, dtype=torch.uint8)
    ref = every.view(torch.float8_e8m0fnu).to(torch.float32)  # torch's own E8M0 decode agrees on all bytes
    assert torch.allclose(e8m0_to_float(every), ref, rtol=0, atol=0, equal_nan=True)


def test_e4m3_bytes() -> None:
    every = torch.arange(256, dtype=torch.uint8)
    finite = (every & 0x7F) != 0x7F
    values = e4m3_bytes_to_float(every)
    assert torch.isnan(values[~finite]).all()
    assert torch.equal(float_to_e4m3_bytes(values[finite]), every[finite])
    assert values[0x38] == 1.0 and values[0x7E] == 448.0 and values[0x08] == 2.0**-6 and values[0x01] == 2.0**-9
    x = torch.tensor([17.0, 19.0, 1000.0, -1000.0, INF, NAN, 1e-6])
    # 17 and 19 are ties (spacing 2 in [16, 32)): even mantissa wins, 16 (0x58) and 20 (0x5A)
    assert float_to_e4m3_bytes(x).tolist() == [0x58, 0x5A, 0x7E, 0xFE, 0x7E, 0x7F, 0x00]


# --- MXFP4 ------------------------------------------------------------------------------------------------------


def test_mxfp4_known_block() -> None:
    w = torch.zeros(1, 64)
    w[0, :4] = torch.tensor([3.0, -1.7, 0.3, 0.1])  # amax 3 -> floor(log2 3) = 1 -> X = -1, byte 126
    w[0, 32:36] = torch.tensor([4.0, 5.0, 0.25, -0.75])  # amax 4 -> X = 0, byte 127; 5 is a tie -> 4
    q = quantize_mxfp4(w)
    assert q.scales.tolist() == [[126, 127]]
    # w / 0.5 = 6.0, -3.4, 0.6, 0.2 -> codes 7, 13 (-3), 1, 0 ; block 2: 4 -> 6, 5 -> 6, 0.25 -> 0, -0.75 -> 10 (-1)
    assert q.values[0, :2].tolist() == [7 | 13 << 4, 1 | 0 << 4]
    assert q.values[0, 16:18].tolist() == [6 | 6 << 4, 0 | 10 << 4]
    assert q.values[0, 2:16].eq(0).all() and q.values[0, 18:].eq(0).all()
    deq = dequantize_mxfp4(q.values, q.scales)
    assert deq[0, :4].tolist() == [3.0, -1.5, 0.25, 0.0]
    assert deq[0, 32:36].tolist() == [4.0, 4.0, 0.0, -1.0]


@pytest.mark.parametrize(
    ("amax", "byte"),
    [(4.0, 127), (8.0, 128), (7.99, 127), (1.0, 125), (6.0, 127), (2.0**-124, 1), (2.0**-125, 0), (1e-42, 0),
     (2.0**127 * 1.5, 252)],
)  # fmt: skip
def test_mxfp4_shared_exponent(amax: float, byte: int) -> None:
    w = torch.zeros(1, 32)
    w[0, 5] = amax
    assert quantize_mxfp4(w).scales.item() == byte


def test_mxfp4_saturates_and_clamps_exactly() -> None:
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 7.99, -7.5  # X = 0: both beyond 6 -> saturate
    assert unpack_fp4(quantize_mxfp4(w).values)[0, :2].tolist() == [7, 15]
    # X clamped at -127: elements divide by 2**-127 exactly (OCP), so 2**-125 -> 4.0 (code 6);
    # torchao divides by 2**-126 here and would give 2.0.
    w = torch.zeros(1, 32)
    w[0, 0] = 2.0**-125
    q = quantize_mxfp4(w)
    assert q.scales.item() == 0 and unpack_fp4(q.values)[0, 0].item() == 6
    assert dequantize_mxfp4(q.values, q.scales)[0, 0].item() == 2.0**-125


def test_mxfp4_zero_nan_inf_blocks() -> None:
    w = torch.randn(2, 128)
    w[0, :32] = 0.0
    w[0, 40] = NAN
    w[1, 70] = -INF
    q = quantize_mxfp4(w)
    assert q.scales[0, 0] == 0 and q.values[0, :16].eq(0).all()  # all-zero block: byte 0, codes 0
    assert q.scales[0, 1] == 0xFF and q.values[0, 16:32].eq(0).all()  # NaN block: 0xFF, codes 0
    assert q.scales[1, 2] == 253  # Inf: exponent field 255 -> X = 126
    assert unpack_fp4(q.values)[1, 70].item() == 15  # -Inf saturates to -6
    deq = dequantize_mxfp4(q.values, q.scales)
    assert deq[0, :32].eq(0).all()
    assert torch.isnan(deq[0, 32:64]).all() and not torch.isnan(deq[0, 64:]).any()
    assert not torch.isnan(deq[1]).any()


@pytest.mark.parametrize("k", [16, 48, 100])
def test_mxfp4_k_must_be_multiple_of_32(k: int) -> None:
    with pytest.raises(ValueError, match=r"mxfp4.*multiple of the block size 32"):
        quantize_mxfp4(torch.randn(4, k))


def test_dequantize_checks_shapes() -> None:
    with pytest.raises(ValueError, match="need scales"):
        dequantize_mxfp4(torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.uint8))
    with pytest.raises(TypeError):
        dequantize_mxfp4(torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="need scales"):
        dequantize_nvfp4(torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8), 1.0)


@pytest.mark.parametrize("shape", [(64, 256), (3, 40, 128), (2, 2, 8, 64)])
def test_mxfp4_roundtrip_error_and_requantization(shape: tuple[int, ...]) -> None:
    w = _weights(shape, seed=len(shape))
    q = quantize_mxfp4(w)
    assert q.values.shape == (*shape[:-1], shape[-1] // 2) and q.values.dtype == torch.uint8
    assert q.scales.shape == (*shape[:-1], shape[-1] // 32) and q.scales.dtype == torch.uint8
    deq = dequantize_mxfp4(q.values, q.scales)
    assert deq.dtype == torch.float32 and deq.shape == w.shape
    scale = e8m0_to_float(q.scales).repeat_interleave(32, dim=-1)
    assert ((deq - w).abs() <= _half_spacing(w.abs() / scale) * scale).all()
    again = quantize_mxfp4(deq)  # dequantized values are exactly representable: same bytes
    assert torch.equal(again.values, q.values) and torch.equal(again.scales, q.scales)


def test_mxfp4_chunking_and_dtype_do_not_change_bytes() -> None:
    w = _weights((4, 30, 96), seed=7, dtype=torch.bfloat16)
    ref = quantize_mxfp4(w.float())
    for chunk_rows in (1, 7, 1000, None):
        q = quantize_mxfp4(w, chunk_rows=chunk_rows)
        assert torch.equal(q.values, ref.values) and torch.equal(q.scales, ref.scales)
        deq = dequantize_mxfp4(q.values, q.scales, chunk_rows=chunk_rows)
        assert torch.equal(deq, dequantize_mxfp4(ref.values, ref.scales))
    strided = w.float().transpose(0, 1).contiguous().transpose(0, 1)  # same values, non-contiguous
    q = quantize_mxfp4(strided, chunk_rows=5)
    assert torch.equal(q.values, ref.values) and torch.equal(q.scales, ref.scales)


# --- NVFP4 ------------------------------------------------------------------------------------------------------


def test_nvfp4_known_blocks() -> None:
    w = torch.zeros(1, 32)
    w[0, :3] = torch.tensor([6.0, 3.0, -1.0])
    w[0, 16:19] = torch.tensor([1.2, 0.5, -0.3])
    q = quantize_nvfp4(w, global_scale=0.5)
    # block 0: 6 / 6 / 0.5 = 2.0 -> E4M3 0x40; elements w / (2 * 0.5) = 6, 3, -1 -> codes 7, 5, 10
    # block 1: 1.2 / 6 / 0.5 = 0.4 -> E4M3 0.40625 (13/32) = 0x2D; w * 2 / 0.40625: 5.9 -> 6, 2.46 -> 2, -1.48 -> -1.5
    assert q.scales.tolist() == [[0x40, 0x2D]]
    assert unpack_fp4(q.values)[0, :3].tolist() == [7, 5, 10]
    assert unpack_fp4(q.values)[0, 16:19].tolist() == [7, 4, 11]
    assert q.global_scale.dtype == torch.float32 and q.global_scale.dim() == 0 and q.global_scale.item() == 0.5
    deq = dequantize_nvfp4(q.values, q.scales, q.global_scale)
    assert deq[0, :3].tolist() == [6.0, 3.0, -1.0]
    assert deq[0, 16:19].tolist() == [6 * 0.40625 * 0.5, 2 * 0.40625 * 0.5, -1.5 * 0.40625 * 0.5]


def test_nvfp4_default_global_scale_uses_full_e4m3_range() -> None:
    w = torch.randn(8, 64)
    w[3, 17] = -2688.0  # amax 2688 -> global scale 1.0, and that block's scale is 448 (0x7E)
    q = quantize_nvfp4(w)
    assert q.global_scale.item() == 1.0
    assert q.scales[3, 1].item() == 0x7E
    assert unpack_fp4(q.values)[3, 17].item() == 15  # -6
    assert nvfp4_global_scale(w).item() == 1.0


def test_nvfp4_zero_nan_tiny_blocks_and_global() -> None:
    w = torch.randn(2, 64)
    w[0, :16] = 0.0
    w[0, 20] = NAN
    w[1, 48:64] = 1e-6  # far below the global: block scale clamps to 2**-6
    w[1, 0] = INF
    q = quantize_nvfp4(w)
    finite = w[torch.isfinite(w)]
    assert q.global_scale.item() == (finite.abs().max() / 2688.0).item()  # NaN / Inf ignored
    assert q.scales[0, 0] == 0x08 and q.values[0, :8].eq(0).all()  # zero block: torchao's 2**-6 floor
    assert q.scales[0, 1] == 0x7F and q.values[0, 8:16].eq(0).all()  # NaN block
    assert q.scales[1, 3] == 0x08
    assert q.scales[1, 0] == 0x7E and unpack_fp4(q.values)[1, 0].item() == 7  # Inf saturates
    deq = dequantize_nvfp4(q.values, q.scales, q.global_scale)
    assert deq[0, :16].eq(0).all() and torch.isnan(deq[0, 16:32]).all() and not torch.isnan(deq[0, 32:]).any()
    zeros = quantize_nvfp4(torch.zeros(3, 32))
    assert zeros.global_scale.item() == 1.0 and zeros.scales.eq(0x08).all() and zeros.values.eq(0).all()


@pytest.mark.parametrize("bad", [0.0, -1.0, NAN, INF])
def test_nvfp4_rejects_bad_global_scale(bad: float) -> None:
    with pytest.raises(ValueError, match="global_scale"):
        quantize_nvfp4(torch.randn(2, 16), global_scale=bad)


@pytest.mark.parametrize("k", [8, 24, 40])
def test_nvfp4_k_must_be_multiple_of_16(k: int) -> None:
    with pytest.raises(ValueError, match=r"nvfp4.*multiple of the block size 16"):
        quantize_nvfp4(torch.randn(4, k))


@pytest.mark.parametrize("shape", [(64, 256), (3, 40, 128), (2, 2, 8, 64)])
def test_nvfp4_roundtrip_error_and_requantization(shape: tuple[int, ...]) -> None:
    w = _weights(shape, seed=10 + len(shape)) / 64  # rows span many binades; some blocks hit the 2**-6 floor
    q = quantize_nvfp4(w)
    assert q.values.shape == (*shape[:-1], shape[-1] // 2)
    assert q.scales.shape == (*shape[:-1], shape[-1] // 16) and q.scales.dtype == torch.uint8
    deq = dequantize_nvfp4(q.values, q.scales, q.global_scale)
    scale = (e4m3_bytes_to_float(q.scales) * q.global_scale).repeat_interleave(16, dim=-1)
    bound = _half_spacing(w.abs() / scale) * scale
    assert ((deq - w).abs() <= bound + 1e-6 * w.abs()).all()  # slack: float32 error of the bound itself
    again = quantize_nvfp4(deq, global_scale=q.global_scale)
    assert torch.equal(again.values, q.values) and torch.equal(again.scales, q.scales)
    recomputed = quantize_nvfp4(deq)  # the global scale re-derived from the dequantized amax agrees too
    assert torch.equal(recomputed.scales, q.scales) and torch.equal(recomputed.values, q.values)


def test_nvfp4_chunking_and_dtype_do_not_change_bytes() -> None:
    w = _weights((4, 30, 96), seed=8, dtype=torch.bfloat16)
    ref = quantize_nvfp4(w.float())
    for chunk_rows in (1, 7, None):
        q = quantize_nvfp4(w, chunk_rows=chunk_rows)
        assert torch.equal(q.values, ref.values) and torch.equal(q.scales, ref.scales)
        assert torch.equal(q.global_scale, ref.global_scale)
        deq = dequantize_nvfp4(q.values, q.scales, q.global_scale, chunk_rows=chunk_rows)
        assert torch.equal(deq, dequantize_nvfp4(ref.values, ref.scales, ref.global_scale))


# --- torchao agreement ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torchao_mx():
    pytest.importorskip("torchao")
    return pytest.importorskip("torchao.prototype.mx_formats")


def _torchao_inputs(seed: int) -> list[torch.Tensor]:
    w3 = _weights((3, 48, 256), seed=seed)
    ties = E2M1_VALUES[torch.randint(16, (2, 64, 128), generator=torch.Generator().manual_seed(seed))]
    ties = ties + torch.tensor([0.25, 0.5, 1.0])[torch.randint(3, ties.shape)] * torch.sign(ties)  # midpoints
    ties[..., ::32] = 6.0  # pin each MX block's amax so the midpoints stay midpoints after scaling
    return [w3, w3.to(torch.bfloat16), _weights((96, 512), seed=seed + 1), ties * 2.0**-3]


def test_torchao_e2m1_rounding_and_packing_agree(torchao_mx) -> None:
    from torchao.prototype.mx_formats.kernels import f32_to_f4_unpacked, pack_uint4, unpack_uint4

    x = torch.cat([_weights((4096,), seed=1) / 1000, (torch.arange(-800, 800) / 100.0), torch.tensor([INF, -INF])])
    assert torch.equal(float_to_e2m1(x), f32_to_f4_unpacked(x.float()))
    codes = torch.randint(16, (64, 32), dtype=torch.uint8)
    assert torch.equal(pack_fp4(codes), pack_uint4(codes))
    assert torch.equal(unpack_fp4(pack_fp4(codes)), unpack_uint4(pack_uint4(codes)))


@pytest.mark.parametrize("seed", [0, 1])
def test_torchao_mxfp4_floor_bytes_equal(torchao_mx, seed: int) -> None:
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

    for w in _torchao_inputs(seed):
        w = w.clone()
        w.view(-1)[:32] = 0.0  # an all-zero block
        w.view(-1)[100] = NAN  # a NaN block
        scale, data = to_mx(w.contiguous(), torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
        q = quantize_mxfp4(w)
        assert torch.equal(q.scales, scale.view(torch.uint8))
        finite = q.scales.repeat_interleave(16, dim=-1) != 0xFF  # torchao's NaN-block element codes are arbitrary
        assert torch.equal(q.values[finite], data.view(torch.uint8)[finite])
        ref = to_dtype(data, scale, torch.float4_e2m1fn_x2, 32, torch.float32)
        assert torch.allclose(dequantize_mxfp4(q.values, q.scales), ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_torchao_nvfp4_bytes_and_global_scale_equal(torchao_mx, seed: int) -> None:
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, nvfp4_quantize, per_tensor_amax_to_scale

    for w in _torchao_inputs(seed):
        w = w.clone()
        w.view(-1)[:16] = 0.0  # an all-zero block: torchao clamps its scale to 2**-6 (0x08)
        q = quantize_nvfp4(w)
        g = per_tensor_amax_to_scale(w.abs().amax())
        assert torch.equal(q.global_scale, g)  # same convention: a multiplier, amax / (6 * 448)
        scales, data = nvfp4_quantize(w.contiguous(), 16, g)
        assert torch.equal(q.scales, scales.view(torch.uint8).view(q.scales.shape))
        assert torch.equal(q.values, data.view(torch.uint8))
        t = NVFP4Tensor.to_nvfp4(w.contiguous(), per_tensor_scale=g)
        assert torch.equal(t.qdata.view(torch.uint8), q.values)
        assert torch.equal(t.scale.view(torch.uint8).view(q.scales.shape), q.scales)
        assert torch.equal(dequantize_nvfp4(q.values, q.scales, q.global_scale), t.dequantize(torch.float32))
        # a caller-chosen global scale is applied the same way
        q2 = quantize_nvfp4(w, global_scale=g * 3)
        scales2, data2 = nvfp4_quantize(w.contiguous(), 16, g * 3)
        assert torch.equal(q2.scales, scales2.view(torch.uint8).view(q2.scales.shape))
        assert torch.equal(q2.values, data2.view(torch.uint8))


def test_torchao_nan_block_scales_agree(torchao_mx) -> None:
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

    w = torch.randn(4, 64)
    w[1, 5] = NAN
    g = quantize_nvfp4(w).global_scale
    scales, _ = nvfp4_quantize(w, 16, g)
    assert torch.equal(quantize_nvfp4(w).scales, scales.view(torch.uint8).view(4, 4))
