"""The GEMM's FP4 byte order: per group of two scale columns, byte j pairs element j with element j + bs."""

from __future__ import annotations

import pytest
import torch

from csf_codec.fp4 import pack_fp4, unpack_fp4
from csf_kernels.moe import kernel_weight_layout


@pytest.mark.parametrize(("k", "bs"), [(128, 32), (576, 32), (96, 32), (64, 16), (80, 16)])
def test_bytes_pair_elements_of_two_scale_columns(k, bs):
    codes = torch.randint(0, 16, (3, 5, k), dtype=torch.uint8)
    got = unpack_fp4(kernel_weight_layout(pack_fp4(codes), bs))  # [.., K]: (lo, hi) nibble per byte
    lo, hi = got[..., 0::2], got[..., 1::2]
    full = k // (2 * bs) * (2 * bs)
    for g in range(full // (2 * bs)):
        cols = codes[..., g * 2 * bs : (g + 1) * 2 * bs]
        assert torch.equal(lo[..., g * bs : (g + 1) * bs], cols[..., :bs])
        assert torch.equal(hi[..., g * bs : (g + 1) * bs], cols[..., bs:])
    if k > full:  # a lone last column pairs j with j + bs / 2
        last = codes[..., full:]
        assert torch.equal(lo[..., full // 2 :], last[..., : bs // 2])
        assert torch.equal(hi[..., full // 2 :], last[..., bs // 2 :])
