"""The FP4 weight words the MoE GEMMs read: packed E2M1 with each word's 32 bits permuted for conversion.

A 32-bit word holds eight E2M1 weights, weight ``i`` in nibble ``i`` (bits ``4i .. 4i + 3``: mantissa,
two exponent bits, sign), as stored by MXFP4 / NVFP4 checkpoints. The GEMMs turn a word into four bf16
pairs (weights 2k, 2k + 1 in the low and high halves) by placing each weight's four bits where a bf16
keeps them: sign at bit 15, exponent bits at 8..7, mantissa at bit 6 (+16 for the high half). That bf16
is the weight times 2**-126 exactly (E2M1's zero exponent lands on bf16's subnormals, which keep the
0.5), so one multiply by the block scale times 2**126 gives the scaled weight, rounded once as before.

Weight preparation permutes each word's bits (a bijection: :func:`checkpoint_words` restores the bytes)
so that the placement is cheap: pair 0's bits are already in place (one AND), pairs 1 and 2 are one
shift or rotation away (two instructions each), pair 3 needs two shifts (four). ``BIT_POSITIONS[i]``
are the word bits of weight ``i``'s (mantissa, exponent low, exponent high, sign). The conversion's PTX
(``kernels/moe_gemm.py``) spells these shifts and masks literally; tests/kernels/test_fp4_words.py holds
it to the constants here.
"""

from __future__ import annotations

import torch

__all__ = [
    "BIT_POSITIONS",
    "PAIR3_MASKS",
    "PAIR3_SHIFTS",
    "PAIR_ROTATIONS",
    "PLACED",
    "PLACED_MASK",
    "checkpoint_words",
    "gemm_words",
]

PLACED = (6, 7, 8, 15)  # where a bf16 (low half) keeps E2M1's mantissa, exponent low / high bit, sign
PLACED_MASK = sum(1 << b for b in PLACED) * 0x10001  # both halves of a bf16 pair: 0x81C081C0


def _moved(dest: tuple[int, ...], left: int) -> tuple[int, ...]:
    """The word bits that a rotation left by ``left`` brings to ``dest``."""
    return tuple((d - left) % 32 for d in dest)


def _pair(left: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return _moved(PLACED, left), _moved(tuple(d + 16 for d in PLACED), left)


# pairs 0-2: the word rotated left by these bits, then masked with PLACED_MASK
PAIR_ROTATIONS = (0, 4, 10)
# pair 3: mantissa, exponent low and sign from the word shifted left by 6, exponent high from the word
# shifted right by 2; the masks of what each shift contributes
PAIR3_SHIFTS = (6, 2)
_LEFT_SHIFTED = (True, True, False, True)  # which of (mantissa, exponent low, exponent high, sign)
PAIR3_MASKS = tuple(
    sum(1 << b for b, by_left in zip(PLACED, _LEFT_SHIFTED, strict=True) if by_left == left) * 0x10001
    for left in (True, False)
)  # (0x80C080C0, 0x01000100)
_PAIR3_LO = tuple(
    d - PAIR3_SHIFTS[0] if left else d + PAIR3_SHIFTS[1] for d, left in zip(PLACED, _LEFT_SHIFTED, strict=True)
)
BIT_POSITIONS = (*(b for r in PAIR_ROTATIONS for b in _pair(r)), _PAIR3_LO, tuple(b + 16 for b in _PAIR3_LO))
assert sorted(b for w in BIT_POSITIONS for b in w) == list(range(32)), "the layout must be a bijection"
_CHUNK_WORDS = 1 << 24  # words per pass (64 MiB): bounds the temporaries on large expert stacks


def _moves(to_gemm: bool) -> dict[int, int]:
    """{left shift: mask of destination bits} taking checkpoint words to GEMM words (or back)."""
    moves: dict[int, int] = {}
    for i, bits in enumerate(BIT_POSITIONS):
        for j, placed in enumerate(bits):
            src, dst = (4 * i + j, placed) if to_gemm else (placed, 4 * i + j)
            moves[dst - src] = moves.get(dst - src, 0) | (1 << dst)
    return moves


def _permute(words: torch.Tensor, moves: dict[int, int]) -> torch.Tensor:
    w = words.to(torch.int64) & 0xFFFFFFFF  # as unsigned 32-bit values: no sign fill, no overflow
    out = torch.zeros_like(w)
    for left, mask in moves.items():
        out |= (w << left if left >= 0 else w >> -left) & mask
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


def _apply(values: torch.Tensor, moves: dict[int, int], out: torch.Tensor | None) -> torch.Tensor:
    if values.dtype != torch.uint8 or values.shape[-1] % 4 or not values.is_contiguous():
        raise ValueError(
            f"packed FP4 values must be contiguous uint8 [..., 4n], got {values.dtype} {tuple(values.shape)}"
        )
    if out is None:
        out = torch.empty_like(values)
    elif (out.dtype, out.shape, out.device) != (torch.uint8, values.shape, values.device) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous uint8 {tuple(values.shape)} tensor on {values.device}")
    words, out_words = values.view(torch.int32).reshape(-1), out.view(torch.int32).reshape(-1)
    for start in range(0, words.numel(), _CHUNK_WORDS):
        out_words[start : start + _CHUNK_WORDS] = _permute(words[start : start + _CHUNK_WORDS], moves)
    return out


def gemm_words(values: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Checkpoint FP4 bytes [..., 4n] -> the GEMMs' word layout, into ``out`` (default: a new tensor; may be
    ``values`` itself). The temporaries are allocated while this runs, so a caller may run it inside a
    private memory pool with ``out`` allocated outside."""
    return _apply(values, _moves(True), out)


def checkpoint_words(values: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of :func:`gemm_words`."""
    return _apply(values, _moves(False), out)
