"""W4A8's weight operand (csf_kernels.moe.w4a8_operands) against float64 arithmetic and an E4M3 table decoded from
the format's definition (not from torch's float8 cast)."""

from __future__ import annotations

import pytest
import torch

from csf_codec.fp4 import pack_fp4
from csf_codec.quantize import dequantize_mxfp4
from csf_codec.synthetic import SPECIAL_CONTENT, best_row_bases, synthetic_fp4_values, synthetic_scale_plane
from csf_kernels.moe.w4a8_operands import (
    FOLD_MAX,
    FOLD_MIN,
    FoldError,
    e4m3_exact,
    e4m3_from_e2m1,
    fold_mask,
    nvfp4_block_folds,
    promotion_factor,
    row_factor,
    tile_fold,
    w4a8_weights,
)

from .e4m3_model import VALUES as TABLE
from .e4m3_model import decode as _decode

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
OFFSETS = range(-140, 141)


def test_every_nibble_and_offset_against_float64():
    codes = torch.arange(16, dtype=torch.uint8)[:, None].expand(16, len(OFFSETS))
    offs = torch.tensor(list(OFFSETS), dtype=torch.int32)[None, :]
    got, exact = e4m3_from_e2m1(codes.contiguous(), offs)
    for c in range(16):
        value = (-1 if c & 8 else 1) * E2M1[c & 7]
        for i, d in enumerate(OFFSETS):
            v = value * 2.0**d
            want_exact = v in TABLE
            assert bool(exact[c, i]) == want_exact, (c, d, v)
            if want_exact:
                assert _decode(int(got[c, i])) == v, (c, d, v, int(got[c, i]))
                assert int(got[c, i]) >> 7 == c >> 3, (c, d)  # the sign bit, -0 included


def test_fold_range_is_derived_from_every_value():
    folds = [d for d in OFFSETS if all(s * m * 2.0**d in TABLE for m in E2M1 for s in (1, -1))]
    assert folds == list(range(FOLD_MIN, FOLD_MAX + 1))


def test_e4m3_exact_agrees_with_the_table():
    v = [0.0, 2.0**-9, 3 * 2.0**-10, 448.0, 480.0, 1.0625, 1.125, 17.0, 18.0, float("nan")]
    v = torch.tensor(v, dtype=torch.float64)
    assert e4m3_exact(v).tolist() == [float(x) in TABLE for x in v.tolist()]


def test_fold_mask_boundaries_and_nan():
    bases = torch.tensor([100, 100, 100, 100, 100, 100, 0], dtype=torch.uint8)
    s = torch.tensor([[92], [91], [106], [107], [100], [255], [0]], dtype=torch.uint8)
    assert fold_mask(s, bases)[:, 0].tolist() == [True, False, True, False, True, False, True]


def test_operands_dequantize_to_the_w4a16_weights_bit_for_bit():
    g = torch.Generator().manual_seed(7)
    scales = synthetic_scale_plane((3, 256, 8), "mxfp4", SPECIAL_CONTENT, seed=3)
    values = synthetic_fp4_values((3, 256, 128), seed=4)
    # bases pushed around so that every block kind occurs: in range, below, above, NaN
    bases = (best_row_bases(scales).to(torch.int32) + torch.randint(-9, 9, (3, 256), generator=g)).clamp(1, 254)
    bases = bases.to(torch.uint8)
    w = w4a8_weights(values, scales, bases)
    assert 0 < int(w.fold.sum()) < w.fold.numel()
    want = dequantize_mxfp4(values, scales)
    got = w.dequantize()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num().view(torch.int32), want.nan_to_num().view(torch.int32))


def test_strict_refuses_a_block_that_does_not_fold():
    values = pack_fp4(torch.full((2, 64), 7, dtype=torch.uint8))
    scales = torch.tensor([[120, 126], [120, 127]], dtype=torch.uint8)
    bases = torch.tensor([120, 120], dtype=torch.uint8)
    w4a8_weights(values[:1], scales[:1], bases[:1], strict=True)
    with pytest.raises(FoldError, match="1 blocks do not fold, the first at \\[1, 1\\]"):
        w4a8_weights(values, scales, bases, strict=True)


def test_factors():
    assert row_factor(torch.tensor([0, 127, 254], dtype=torch.uint8)).tolist() == [2.0**-127, 1.0, 2.0**127]
    with pytest.raises(ValueError):
        row_factor(torch.tensor([255], dtype=torch.uint8))
    f = promotion_factor(torch.tensor([[120, 255]], dtype=torch.uint8), torch.tensor([127], dtype=torch.uint8))
    assert f[0, 0].item() == 2.0**-7 and f[0, 1].isnan()


def test_tile_fold_covers_whole_and_partial_tiles():
    fold = torch.ones(200, 5, dtype=torch.bool)  # 2 row tiles (128 + 72), 3 K tiles (2 + 2 + 1 blocks)
    fold[130, 4] = False  # second row tile, last (partial) K tile
    fold[0, 1] = False  # first row tile, first K tile
    assert tile_fold(fold, 32).tolist() == [[False, True, True], [True, True, False]]
    nv = torch.ones(128, 8, dtype=torch.bool)
    nv[5, 4] = False
    assert tile_fold(nv, 16).tolist() == [[True, False]]


def test_nvfp4_block_folds_against_float64():
    codes = torch.arange(256, dtype=torch.uint8)[:, None].expand(256, 8).contiguous()
    eb = torch.arange(-4, 4)[None, :].expand(256, 8)
    got = nvfp4_block_folds(codes.view(256, 8, 1)[..., 0:1].expand(256, 8, 1).reshape(256 * 8, 1),
                            eb.reshape(-1))[:, 0].view(256, 8)  # fmt: skip
    for b in range(256):
        if b & 0x7F == 0x7F:
            assert not got[b].any()
            continue
        scale = _decode(b)
        for i, e in enumerate(range(-4, 4)):
            f = scale * 2.0**-e
            assert bool(got[b, i]) == all(m * f in TABLE for m in E2M1), (b, e)
    # 1.0 and 1.25 fold (1.5 and 1.875 have <= 4 significant bits), 1.125 does not (1.6875 has 5)
    one = torch.tensor([[0x38, 0x3A, 0x39]], dtype=torch.uint8)
    assert nvfp4_block_folds(one, torch.tensor([0])).tolist() == [[True, True, False]]
