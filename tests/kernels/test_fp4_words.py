"""The permuted FP4 word layout the MoE GEMMs read (csf_kernels.moe.fp4_words)."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.moe.fp4_words import (
    BIT_POSITIONS,
    PAIR3_MASKS,
    PAIR3_SHIFTS,
    PAIR_ROTATIONS,
    PANEL_ROWS,
    PLACED,
    checkpoint_words,
    gemm_words,
    panel_bytes,
    panel_offset,
)

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MASK = 0x81C081C0  # the bf16 pair bits of sign, exponent low bits and mantissa top bit


def _seeded() -> torch.Generator:
    return torch.Generator().manual_seed(torch.seed() % (1 << 31))


def test_the_layout_is_a_bijection_that_round_trips():
    assert sorted(b for bits in BIT_POSITIONS for b in bits) == list(range(32))
    values = torch.randint(0, 256, (3, 5, 64), generator=_seeded(), dtype=torch.uint8)
    for block in (32, 16):
        words = gemm_words(values, block)
        assert words.shape == values.shape and words.dtype == torch.uint8
        assert torch.equal(checkpoint_words(words, block), values)
    # rows of one panel: the panel order is the row order, so word i of the input is word i of the output
    values = values.view(-1, panel_bytes(32))
    words = gemm_words(values, 32)
    src, dst = values.view(torch.int32).to(torch.int64), words.view(torch.int32).to(torch.int64)
    for i, bits in enumerate(BIT_POSITIONS):
        for j, placed in enumerate(bits):
            assert torch.equal((dst >> placed) & 1, (src >> (4 * i + j)) & 1), f"weight {i} bit {j}"


def _placement(word: int) -> list[int]:
    """What the GEMMs' conversion (moe_gemm._PLACE) computes from one word: four bf16 pairs, as ints."""
    w = word & 0xFFFFFFFF
    pairs = [((w << r) | (w >> (32 - r))) & MASK for r in PAIR_ROTATIONS]
    return [*pairs, ((w << PAIR3_SHIFTS[0]) & PAIR3_MASKS[0]) | ((w >> PAIR3_SHIFTS[1]) & PAIR3_MASKS[1])]


def test_the_placement_gives_each_weight_times_2_pow_minus_126():
    # every byte value in every nibble position: 256 words of four equal bytes, and random words
    values = torch.arange(256, dtype=torch.uint8).repeat_interleave(4).view(256, 4)
    values = torch.cat([values, torch.randint(0, 256, (512, 4), generator=_seeded(), dtype=torch.uint8)])
    # one panel a row (the order of the words unchanged)
    words = gemm_words(values.view(-1, 16), 16).view(torch.int32).flatten().tolist()
    codes = values.view(torch.int32).flatten().tolist()
    for word, code_word in zip(words, codes, strict=True):
        halves = []
        for pair in _placement(word):
            halves += [pair & 0xFFFF, pair >> 16]
        got = torch.tensor(halves, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).double() * 2.0**126
        want = []
        for i in range(8):
            code = (code_word >> (4 * i)) & 0xF
            want.append(-E2M1[code & 7] if code & 8 else E2M1[code & 7])
        assert got.tolist() == want, f"word {code_word & 0xFFFFFFFF:#010x}"


def test_the_placed_bits_are_a_bf16_pair_s_sign_exponent_and_mantissa_top():
    assert PLACED == (6, 7, 8, 15)
    assert sum(1 << b for b in PLACED) | sum(1 << (b + 16) for b in PLACED) == MASK


@pytest.mark.parametrize("block", [32, 16], ids=["mxfp4", "nvfp4"])
@pytest.mark.parametrize("rows", [PANEL_ROWS, 3 * PANEL_ROWS, 2 * PANEL_ROWS + 24, 5])
@pytest.mark.parametrize("row_bytes", [64, 80, 144])
def test_words_lie_in_panel_order_within_64_row_blocks(rows, row_bytes, block):
    # each expert's rows x row_bytes: per 64-row block, K steps as row-major [rows, panel] tiles, the last
    # one narrower where a row ends mid-step
    experts = 2
    values = torch.randint(0, 256, (experts, rows, row_bytes), generator=_seeded(), dtype=torch.uint8)
    words = gemm_words(values, block)
    bits_only = gemm_words(values.reshape(-1, 16), 16).view(values.shape)  # the same words in row order
    offsets = set()
    for e in range(experts):
        flat = words[e].flatten()
        for r in range(rows):
            for b in range(0, row_bytes, 4):
                at = panel_offset(r, b, rows, row_bytes, block)
                offsets.add((e, at))
                assert torch.equal(flat[at : at + 4], bits_only[e, r, b : b + 4]), (e, r, b)
    assert len(offsets) == experts * rows * row_bytes // 4  # a bijection
    assert torch.equal(checkpoint_words(words, block), values)


def test_a_k_step_of_a_64_row_program_is_one_contiguous_tile():
    rows, row_bytes = 2 * PANEL_ROWS, 1440  # gpt-oss: 22 whole MXFP4 steps and a half one
    for block in (32, 16):
        width = panel_bytes(block)
        for step in range(-(-row_bytes // width)):
            here = min(width, row_bytes - step * width)
            got = sorted(panel_offset(r, step * width + b, rows, row_bytes, block)
                         for r in range(PANEL_ROWS, 2 * PANEL_ROWS) for b in range(here))  # fmt: skip
            assert got == list(range(got[0], got[0] + PANEL_ROWS * here))
            # two rows of four 16-byte quads (one access phase of a warp) are 128 contiguous bytes
            quads = [panel_offset(PANEL_ROWS + r, step * width + 16 * q, rows, row_bytes, block)
                     for r in range(2) for q in range(4) if 16 * q < here]  # fmt: skip
            assert quads == list(range(quads[0], quads[0] + 16 * len(quads), 16)) or width < 64


@pytest.mark.parametrize(
    "bad",
    [torch.zeros(2, 6, dtype=torch.uint8), torch.zeros(2, 8, dtype=torch.int8), torch.zeros(32, dtype=torch.uint8)],
)
def test_refuses_what_is_not_packed_words(bad):
    with pytest.raises(ValueError, match="packed FP4"):
        gemm_words(bad, 32)


def test_permutes_in_place_and_into_a_given_tensor():
    values = torch.randint(0, 256, (4, 32), generator=_seeded(), dtype=torch.uint8)
    want = gemm_words(values, 32)
    out = torch.empty_like(values)
    assert gemm_words(values, 32, out=out) is out and torch.equal(out, want)
    copy = values.clone()
    assert torch.equal(gemm_words(copy, 32, out=copy), want)
    with pytest.raises(ValueError, match="out must be"):
        gemm_words(values, 32, out=torch.empty(4, 16, dtype=torch.uint8))


def test_the_gemms_conversion_is_written_for_this_layout():
    """The PTX of the conversion (kernels/moe_gemm.py, ``_PLACE``) spells the layout's shifts and masks
    literally; it must be exactly what the layout's constants say."""
    pytest.importorskip("triton")
    from csf_kernels.moe.kernels.gemm import _PLACE

    def hexed(mask: int) -> str:
        return f"0x{mask:08X}"

    want = []
    for k, r in enumerate(PAIR_ROTATIONS):
        if r == 0:
            want.append(f"and.b32 p{k}, $8, {hexed(MASK)};")
            continue
        wraps = any((b - r) < 0 for b in range(32) if MASK >> b & 1)  # a plain shift suffices otherwise
        want.append(f"shf.l.wrap.b32 t, $8, $8, {r};" if wraps else f"shl.b32 t, $8, {r};")
        want.append(f"and.b32 p{k}, t, {hexed(MASK)};")
    want += [
        f"shr.b32 t, $8, {PAIR3_SHIFTS[1]};",
        f"and.b32 t, t, {hexed(PAIR3_MASKS[1])};",
        f"shl.b32 p3, $8, {PAIR3_SHIFTS[0]};",
        f"lop3.b32 p3, p3, t, {hexed(PAIR3_MASKS[0])}, 0xEC;",  # (a & c) | b
    ]
    assert _PLACE.strip().splitlines() == want
