"""The sign-paired FP4 word layout the MoE GEMMs read (csf_kernels.fp4_words)."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.fp4_words import SIGN_OF_NIBBLE, pair_signs, unpair_signs


def test_pairing_moves_only_sign_bits_and_round_trips():
    gen = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    values = torch.randint(0, 256, (3, 5, 64), generator=gen, dtype=torch.uint8)
    paired = pair_signs(values)
    assert paired.shape == values.shape and paired.dtype == torch.uint8
    assert torch.equal(paired & 0x77, values & 0x77)  # magnitudes in place
    assert torch.equal(unpair_signs(paired), values)
    words, pwords = values.view(torch.int32), paired.view(torch.int32)
    for nibble, weight in enumerate(SIGN_OF_NIBBLE):
        assert torch.equal((pwords >> (4 * nibble + 3)) & 1, (words >> (4 * weight + 3)) & 1)


def test_each_pair_has_its_signs_16_bits_apart():
    # pair k = weights (2k, 2k + 1): signs in nibbles k and k + 4 (bits 4k + 3 and 4k + 19)
    for k in range(4):
        assert (SIGN_OF_NIBBLE[k], SIGN_OF_NIBBLE[k + 4]) == (2 * k, 2 * k + 1)


@pytest.mark.parametrize("bad", [torch.zeros(2, 6, dtype=torch.uint8), torch.zeros(2, 8, dtype=torch.int8)])
def test_refuses_what_is_not_packed_words(bad):
    with pytest.raises(ValueError, match="packed FP4"):
        pair_signs(bad)


def test_pairs_in_place_and_into_a_given_tensor():
    values = torch.randint(0, 256, (4, 32), dtype=torch.uint8)
    want = pair_signs(values)
    out = torch.empty_like(values)
    assert pair_signs(values, out=out) is out and torch.equal(out, want)
    copy = values.clone()
    assert torch.equal(pair_signs(copy, out=copy), want)
    with pytest.raises(ValueError, match="out must be"):
        pair_signs(values, out=torch.empty(4, 16, dtype=torch.uint8))
