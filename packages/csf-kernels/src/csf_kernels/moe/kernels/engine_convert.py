"""The engine consumers' conversion of placed FP4 words, as PTX (for the CuTe kernels) and as the same arithmetic on
torch integers (for the CPU tests that hold the PTX to the dequantized weights). No cutlass or triton import.

A placed word (:mod:`csf_kernels.moe.fp4_words`) gives its four bf16 pairs by a mask after a shift or rotation
(``PAIR_STEPS``); each pair is then multiplied by 2**126 (placement leaves the weight times 2**-126) and by its
row's scale, a bf16 ``2**(s - 127)`` built from the E8M0 byte (``FACTOR_PTX``): each product rounds once, as the
multiply of the exact bf16 weight by its scale rounds it.

NVFP4's factor is its E4M3 scale byte's value in bf16 (``E4M3_FACTOR_PTX``: E4M3 -> f16 -> f32 -> bf16, each exact:
4 significant bits, magnitudes 2**-9 .. 448; the NaN bytes 0x7F / 0xFF stay NaN). An E2M1 value (at most 2
significant bits) times it has at most 6, so the product is exact in bf16 and the format's per-tensor global scale
is left to the GEMM's epilogue, one float32 multiply of each output.
"""

from __future__ import annotations

import torch

from csf_kernels.moe.fp4_words import PAIR3_MASKS, PAIR3_SHIFTS, PAIR_ROTATIONS, PLACED_MASK

__all__ = [
    "E4M3_FACTOR_BITS",
    "E4M3_FACTOR_PTX",
    "FACTOR_BITS",
    "FACTOR_PTX",
    "PAIR_ONE_MULTIPLY_PTX",
    "PAIR_OPS",
    "PAIR_PTX",
    "PLACED_FACTOR_BITS",
    "PLACED_FACTOR_PTX",
    "TWO_POW_126_X2",
]

TWO_POW_126_X2 = 0x7E807E80  # bf16x2 (2**126, 2**126)

_MULS = f"mov.b32 u, {TWO_POW_126_X2:#x};\nmul.rn.bf16x2 t, t, u;\nmul.rn.bf16x2 $0, t, $2;\n}}"
_MUL_ONCE = "mul.rn.bf16x2 $0, t, $2;\n}"  # $2 already holds 2**126 times the scale (PLACED_FACTOR_PTX)


def _rotated_pair(left: int, muls: str = _MULS) -> str:
    if left == 0:
        move = "mov.b32 t, $1;\n"
    elif left == PAIR_ROTATIONS[1]:  # pair 1: the shifted-out bits are never placed, a shift does
        move = f"shl.b32 t, $1, {left};\n"
    else:
        move = f"shf.l.wrap.b32 t, $1, $1, {left};\n"
    return "{\n.reg .b32 t, u;\n" + move + f"and.b32 t, t, {PLACED_MASK:#x};\n" + muls


def _pair3(muls: str) -> str:
    return (
        "{\n.reg .b32 t, u, v;\n"
        f"shr.b32 v, $1, {PAIR3_SHIFTS[1]};\nand.b32 v, v, {PAIR3_MASKS[1]:#x};\n"
        f"shl.b32 t, $1, {PAIR3_SHIFTS[0]};\nand.b32 t, t, {PAIR3_MASKS[0]:#x};\nor.b32 t, t, v;\n" + muls
    )


# $0 = pair p of placed word $1, times 2**126, times the bf16x2 scale pair $2
PAIR_PTX = (*(_rotated_pair(r) for r in PAIR_ROTATIONS), _pair3(_MULS))
# $0 = pair p of placed word $1 times the bf16x2 factor pair $2 = 2**126 x scale, one multiply: for rows whose
# E8M0 bytes are all <= 128 or 255 (no 64-row tile flagged by ``csf_kernels.moe.launch.wide_row_tiles``), where the
# factor is a bf16; the product is the same single rounding of the exact weight times its scale
PAIR_ONE_MULTIPLY_PTX = (*(_rotated_pair(r, _MUL_ONCE) for r in PAIR_ROTATIONS), _pair3(_MUL_ONCE))

# $0 = bf16x2 (2**($1 - 127), twice) of E8M0 byte $1: s << 7, plus 0x40 for 0 (2**-127, a subnormal) and 255 (NaN)
FACTOR_PTX = (
    "{\n.reg .b32 e, m;\n.reg .pred z;\nshl.b32 e, $1, 7;\nadd.u32 m, $1, 1;\nand.b32 m, m, 255;\n"
    "setp.lt.u32 z, m, 2;\n@z or.b32 e, e, 64;\nprmt.b32 $0, e, e, 0x1010;\n}"
)


# $0 = bf16x2 (2**($1 - 1), twice) of E8M0 byte $1 <= 128: 2**126 times its scale; 255 stays NaN (bytes 129..254
# overflow: their tiles take FACTOR_PTX and two multiplies)
PLACED_FACTOR_PTX = (
    "{\n.reg .b32 e;\n.reg .pred z;\nadd.u32 e, $1, 126;\nshl.b32 e, e, 7;\nsetp.eq.u32 z, $1, 255;\n"
    "@z mov.b32 e, 0x7FC0;\nprmt.b32 $0, e, e, 0x1010;\n}"
)


def _e4m3_factor(j: int) -> str:
    """$0 = bf16x2 (twice) of E4M3 byte ``j`` of word $1 (an NVFP4 row's four scale bytes of a step)."""
    half, part = ("lo", "hi")[j // 2], ("a", "b")[j % 2]
    return (
        "{\n.reg .b16 lo, hi, a, b;\n.reg .b32 h;\n.reg .f32 f;\nmov.b32 {lo, hi}, $1;\n"
        f"cvt.rn.f16x2.e4m3x2 h, {half};\nmov.b32 {{a, b}}, h;\ncvt.f32.f16 f, {part};\n"
        "cvt.rn.bf16x2.f32 $0, f, f;\n}"
    )


# E4M3_FACTOR_PTX[j]: the factor of slice j (NVFP4 block j of the step) from a row's 32-bit scale word
E4M3_FACTOR_PTX = tuple(_e4m3_factor(j) for j in range(4))


def _rotl(w, left: int):
    return ((w << left) | (w >> (32 - left))) & 0xFFFFFFFF if left else w


def _pair_op(p: int):
    if p < 3:
        left = PAIR_ROTATIONS[p]
        return lambda w: _rotl(w, left) & PLACED_MASK
    return lambda w: ((w << PAIR3_SHIFTS[0]) & PAIR3_MASKS[0]) | ((w >> PAIR3_SHIFTS[1]) & PAIR3_MASKS[1])


# the placement of pair p on unsigned 32-bit values held in int64 tensors (what PAIR_PTX computes before multiplying)
PAIR_OPS = tuple(_pair_op(p) for p in range(4))


def FACTOR_BITS(s):
    """E8M0 bytes (int64 tensor) -> the bf16 bit pattern FACTOR_PTX puts in each half."""
    special = ((s + 1) & 255) < 2
    return (s << 7) | (special.to(s.dtype) << 6)


def PLACED_FACTOR_BITS(s):
    """E8M0 bytes (int64 tensor, each <= 128 or 255) -> the bf16 bit pattern PLACED_FACTOR_PTX puts in each half."""
    return torch.where(s == 255, 0x7FC0, (s + 126) << 7)


def E4M3_FACTOR_BITS(s):
    """E4M3 bytes (int64 tensor) -> the bf16 bit pattern E4M3_FACTOR_PTX puts in each half: the byte's value
    (``(-1)**sign * 2**(e - 7) * (1 + m / 8)``, subnormal ``2**-6 * m / 8`` where ``e = 0``), NaN for 0x7F / 0xFF."""
    sign = torch.where((s >> 7) & 1 == 1, -1.0, 1.0).to(torch.float64)
    e, m = (s >> 3) & 15, (s & 7).to(torch.float64)
    mag = torch.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * torch.pow(2.0, (e - 7).to(torch.float64)))
    val = torch.where((s & 0x7F) == 0x7F, float("nan"), sign * mag)
    return val.to(torch.float32).to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
