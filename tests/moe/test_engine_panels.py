"""The engine's operand panels: lossless rearrangements, and a torch model of the consumers' conversion (the PTX of
``moe/kernels/engine_gemm.py`` spelled as integer and bf16 arithmetic) reproduces the dequantized weights bit for bit
at the (row, K) positions PTX's wgmma A fragment layout gives each thread, MXFP4 and NVFP4 (global scale 1: the
epilogue applies it)."""

from __future__ import annotations

import os

import pytest
import torch

from csf_codec.quantize import dequantize_nvfp4
from csf_kernels.moe.engine_panels import (
    engine_scale_panel,
    engine_weight_panel,
    panel_scales,
    panel_scales_to_plane,
    panel_words_to_plane,
)
from csf_kernels.moe.kernels.engine_convert import E4M3_FACTOR_BITS, FACTOR_BITS, PAIR_OPS, PLACED_FACTOR_BITS

SEED = int.from_bytes(os.urandom(3), "little")
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _dequantized(packed: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """bf16 [rows, K]: MXFP4 each E2M1 value times 2**(s - 127), rounded once (255: NaN); NVFP4 the codec's
    dequantization with global scale 1 (exact in bf16)."""
    if fmt == "nvfp4":
        return dequantize_nvfp4(packed, scales, 1.0).to(torch.bfloat16)
    nib = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], -1).to(torch.int64)
    mag = E2M1[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
    s = scales.to(torch.int64).repeat_interleave(32, dim=1)
    val = mag * torch.pow(2.0, (s - 127).to(torch.float64))
    val = torch.where(s == 255, float("nan"), val)
    return val.to(torch.float32).to(torch.bfloat16)


def _bf16_mul(a_bits: torch.Tensor, b_bits: torch.Tensor) -> torch.Tensor:
    """mul.rn.bf16 on 16-bit patterns (int64 holding 0..65535): the fp32 product is exact, one rounding to bf16."""
    a = a_bits.to(torch.int16).view(torch.bfloat16).float()
    b = b_bits.to(torch.int16).view(torch.bfloat16).float()
    return (a * b).to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def _pair_halves(word: torch.Tensor, p: int, factor: torch.Tensor, once: bool = False):
    """Pair ``p`` of ``word`` (int64 0..2**32-1) converted: (low, high) bf16 bit patterns; ``once``: the
    one-multiply form (``factor`` already 2**126 times the scale)."""
    placed = PAIR_OPS[p](word) & 0xFFFFFFFF
    two126 = torch.full_like(word, 0x7E80)
    out = []
    for half in (0, 1):
        v = (placed >> (16 * half)) & 0xFFFF
        out.append(_bf16_mul(v, factor) if once else _bf16_mul(_bf16_mul(v, two126), factor))
    return out[0], out[1]


def _factor(s: torch.Tensor, fmt: str) -> torch.Tensor:
    return (E4M3_FACTOR_BITS if fmt == "nvfp4" else FACTOR_BITS)(s.to(torch.int64)) & 0xFFFF


FORMATS = ("mxfp4", "nvfp4")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,k", [(128, 64), (256, 2880), (192, 320), (64, 96)])
def test_panels_round_trip(rows, k, fmt):
    block = panel_scales(fmt).block
    g = torch.Generator().manual_seed(SEED)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (rows, k // block), dtype=torch.uint8, generator=g)
    wp, sp = engine_weight_panel(packed), engine_scale_panel(scales, fmt)
    per_step = 64 // block
    assert wp.dtype == torch.uint64 and tuple(wp.shape) == (-(-k // 64), -(-rows // 64), 256)
    assert tuple(sp.shape) == (-(-k // 64), per_step * 64 * -(-rows // 64))
    assert torch.equal(panel_words_to_plane(wp, rows, k), packed)
    assert torch.equal(panel_scales_to_plane(sp, rows, k, fmt), scales)
    # a step's bytes of a row are contiguous, block j of the step at byte j
    first = min(per_step, k // block)
    assert torch.equal(sp[0, per_step * 5 : per_step * 5 + first], scales[5, :first])


@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_panel_pads_with_the_byte_of_one(fmt):
    rows, k = 70, 80  # 58 rows and, for NVFP4, 3 blocks (MXFP4: 1.5, rounded up) of padding
    kind = panel_scales(fmt)
    scales = torch.zeros(rows, -(-k // kind.block), dtype=torch.uint8)
    sp = engine_scale_panel(scales, fmt).view(2, 128, kind.per_step)
    assert (sp[:, rows:] == kind.neutral).all()
    assert (sp[1, :rows, scales.shape[1] - kind.per_step :] == kind.neutral).all()
    assert (sp[0, :rows] == 0).all() and (sp[1, :rows, : scales.shape[1] - kind.per_step] == 0).all()
    one = torch.tensor([kind.neutral])
    assert _factor(one, fmt).item() == 0x3F80  # bf16 1.0


def test_engine_scales_refuse_unknown_formats():
    with pytest.raises(ValueError, match="scales"):
        engine_scale_panel(torch.zeros(64, 2, dtype=torch.uint8), "fp8")


def test_e4m3_factor_edges():
    got = _factor(torch.tensor([0x00, 0x01, 0x08, 0x38, 0x7E, 0x80, 0xB8, 0xFE]), "nvfp4")
    assert got.tolist() == [0x0000, 0x3B00, 0x3C80, 0x3F80, 0x43E0, 0x8000, 0xBF80, 0xC3E0]  # 2**-9, 2**-6, 448
    nan = _factor(torch.tensor([0x7F, 0xFF]), "nvfp4")
    assert (((nan & 0x7F80) == 0x7F80) & ((nan & 0x7F) != 0)).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("seed", [SEED, SEED + 1])
def test_conversion_model_matches_dequantized_weights(seed, fmt):
    rows, k = 128, 192
    kind = panel_scales(fmt)
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (rows, k // kind.block), dtype=torch.uint8, generator=g)
    if fmt == "mxfp4":
        scales[0, 0], scales[1, 1], scales[2, 2], scales[3, 3] = 0, 255, 254, 128  # the edges of E8M0
    else:  # zeros, the smallest subnormal, NaN, the largest magnitude, negative scales
        for i, byte in enumerate((0, 1, 0x7F, 0x7E, 0xFF, 0x80)):
            scales[i, i] = byte
    want = _dequantized(packed, scales, fmt).view(torch.int16).to(torch.int64) & 0xFFFF
    wp = engine_weight_panel(packed).view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [steps, blocks, 512 words]
    b = kind.per_step
    sp = engine_scale_panel(scales, fmt).to(torch.int64)  # [steps, b rows]
    got = torch.full((rows, k), -1, dtype=torch.int64)
    t = torch.arange(128)
    warp, lane = t // 32, t % 32
    g4, q = lane // 4, lane % 4
    for step in range(wp.shape[0]):
        for block in range(wp.shape[1]):
            r0 = block * 64 + 16 * warp + g4  # PTX wgmma A fragment: rows r0 and r0 + 8 of the thread
            for j in range(4):
                word = wp[step, block, 4 * t + j]
                kb = step * 64 + 16 * j + 2 * q  # and columns kb, kb + 1, kb + 8, kb + 9
                slot = j * b // 4  # the slice's scale block in the step: MXFP4 j // 2, NVFP4 j
                blk = b * step + slot
                f0 = _factor(sp[step, b * r0 + slot], fmt)
                f1 = _factor(sp[step, b * (r0 + 8) + slot], fmt)
                places = ((r0, kb, f0), (r0 + 8, kb, f1), (r0, kb + 8, f0), (r0 + 8, kb + 8, f1))
                for p, (row, col, f) in enumerate(places):
                    lo, hi = _pair_halves(word, p, f)
                    got[row, col], got[row, col + 1] = lo, hi
                assert blk == (kb // kind.block).unique().item() == ((kb + 9) // kind.block).unique().item()
    nan = ((want & 0x7F80) == 0x7F80) & ((want & 0x7F) != 0)  # NaN patterns may differ; infinities may not
    assert (got >= 0).all()
    assert torch.equal(got[~nan], want[~nan])
    assert ((got[nan] & 0x7F80) == 0x7F80).all() and ((got[nan] & 0x7F) != 0).all()  # NaN stays NaN


@pytest.mark.parametrize("seed", [SEED, SEED + 2])
def test_one_multiply_conversion_equals_two_where_scales_allow(seed):
    """MXFP4 rows whose E8M0 bytes are all <= 128 or 255 (tiles ``wide_row_tiles`` leaves unflagged): each pair
    times the placed factor ``2**(s - 1)`` (PLACED_FACTOR_PTX, one multiply) gives the bits of the pair times
    ``2**126`` then ``2**(s - 127)``, every edge included (0: the subnormal scale, 128, 255: NaN)."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(0, 1 << 32, (4096,), dtype=torch.int64, generator=g)
    s = torch.randint(0, 129, (4096,), dtype=torch.int64, generator=g)
    s[:4] = torch.tensor([0, 1, 128, 255])
    s[4:64] = 255
    for p in range(4):
        two = _pair_halves(words, p, FACTOR_BITS(s) & 0xFFFF)
        one = _pair_halves(words, p, PLACED_FACTOR_BITS(s) & 0xFFFF, once=True)
        for a, b in zip(two, one, strict=True):
            nan = ((a & 0x7F80) == 0x7F80) & ((a & 0x7F) != 0)
            assert torch.equal(a[~nan], b[~nan]), f"seed {seed}: pair {p} differs"
            assert (((b[nan] & 0x7F80) == 0x7F80) & ((b[nan] & 0x7F) != 0)).all()
