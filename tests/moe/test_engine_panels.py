"""The engine's operand panels: lossless rearrangements, and a torch model of the consumers' conversion (the PTX of
``moe/kernels/engine_gemm.py`` spelled as integer and bf16 arithmetic) reproduces the dequantized weights bit for bit
at the (row, K) positions PTX's wgmma A fragment layout gives each thread."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels.moe.engine_panels import (
    engine_scale_panel,
    engine_weight_panel,
    panel_scales_to_plane,
    panel_words_to_plane,
)
from csf_kernels.moe.kernels.engine_convert import FACTOR_BITS, PAIR_OPS

SEED = int.from_bytes(os.urandom(3), "little")
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _dequantized(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [rows, K]: each E2M1 value times 2**(s - 127), rounded once (255: NaN)."""
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


def _pair_halves(word: torch.Tensor, p: int, factor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair ``p`` of ``word`` (int64 0..2**32-1) converted: (low, high) bf16 bit patterns."""
    placed = PAIR_OPS[p](word) & 0xFFFFFFFF
    two126 = torch.full_like(word, 0x7E80)
    out = []
    for half in (0, 1):
        v = (placed >> (16 * half)) & 0xFFFF
        out.append(_bf16_mul(_bf16_mul(v, two126), factor))
    return out[0], out[1]


def _factor(s: torch.Tensor) -> torch.Tensor:
    return FACTOR_BITS(s.to(torch.int64)) & 0xFFFF


@pytest.mark.parametrize("rows,k", [(128, 64), (256, 2880), (192, 320)])
def test_panels_round_trip(rows, k):
    g = torch.Generator().manual_seed(SEED)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (rows, k // 32), dtype=torch.uint8, generator=g)
    wp, sp = engine_weight_panel(packed), engine_scale_panel(scales)
    assert wp.dtype == torch.uint64 and tuple(wp.shape) == (-(-k // 64), -(-rows // 64), 256)
    assert tuple(sp.shape) == (-(-k // 64), 2 * 64 * -(-rows // 64))
    assert torch.equal(panel_words_to_plane(wp, rows, k), packed)
    assert torch.equal(panel_scales_to_plane(sp, rows, k), scales)


@pytest.mark.parametrize("seed", [SEED, SEED + 1])
def test_conversion_model_matches_dequantized_weights(seed):
    rows, k = 128, 192
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (rows, k // 32), dtype=torch.uint8, generator=g)
    scales[0, 0], scales[1, 1], scales[2, 2], scales[3, 3] = 0, 255, 254, 128  # the edges of E8M0
    want = _dequantized(packed, scales).view(torch.int16).to(torch.int64) & 0xFFFF
    wp = engine_weight_panel(packed).view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [steps, blocks, 512 words]
    sp = engine_scale_panel(scales).to(torch.int64)  # [steps, 2 rows]
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
                blk = 2 * step + j // 2
                f0 = _factor(sp[step, 2 * r0 + j // 2])
                f1 = _factor(sp[step, 2 * (r0 + 8) + j // 2])
                places = ((r0, kb, f0), (r0 + 8, kb, f1), (r0, kb + 8, f0), (r0 + 8, kb + 8, f1))
                for p, (row, col, f) in enumerate(places):
                    lo, hi = _pair_halves(word, p, f)
                    got[row, col], got[row, col + 1] = lo, hi
                assert blk == (kb // 32).unique().item()
    nan = ((want & 0x7F80) == 0x7F80) & ((want & 0x7F) != 0)  # NaN patterns may differ; infinities may not
    assert (got >= 0).all()
    assert torch.equal(got[~nan], want[~nan])
    assert ((got[nan] & 0x7F80) == 0x7F80).all() and ((got[nan] & 0x7F) != 0).all()  # NaN stays NaN
