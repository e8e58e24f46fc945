"""The engine consumers' conversion of placed FP4 words, as PTX (for the CuTe kernels) and as the same arithmetic on
torch integers (for the CPU tests that hold the PTX to the dequantized weights). No cutlass or triton import.

A placed word (:mod:`csf_kernels.moe.fp4_words`) gives its four bf16 pairs by a mask after a shift or rotation
(``PAIR_STEPS``); each pair is then multiplied by 2**126 (placement leaves the weight times 2**-126) and by its
row's scale, a bf16 ``2**(s - 127)`` built from the E8M0 byte (``FACTOR_PTX``): each product rounds once, as the
multiply of the exact bf16 weight by its scale rounds it.
"""

from __future__ import annotations

from csf_kernels.moe.fp4_words import PAIR3_MASKS, PAIR3_SHIFTS, PAIR_ROTATIONS, PLACED_MASK

__all__ = ["FACTOR_BITS", "FACTOR_PTX", "PAIR_OPS", "PAIR_PTX", "TWO_POW_126_X2"]

TWO_POW_126_X2 = 0x7E807E80  # bf16x2 (2**126, 2**126)

_MULS = f"mov.b32 u, {TWO_POW_126_X2:#x};\nmul.rn.bf16x2 t, t, u;\nmul.rn.bf16x2 $0, t, $2;\n}}"


def _rotated_pair(left: int) -> str:
    if left == 0:
        move = "mov.b32 t, $1;\n"
    elif left == PAIR_ROTATIONS[1]:  # pair 1: the shifted-out bits are never placed, a shift does
        move = f"shl.b32 t, $1, {left};\n"
    else:
        move = f"shf.l.wrap.b32 t, $1, $1, {left};\n"
    return "{\n.reg .b32 t, u;\n" + move + f"and.b32 t, t, {PLACED_MASK:#x};\n" + _MULS


# $0 = pair p of placed word $1, times 2**126, times the bf16x2 scale pair $2
PAIR_PTX = (
    *(_rotated_pair(r) for r in PAIR_ROTATIONS),
    "{\n.reg .b32 t, u, v;\n"
    f"shr.b32 v, $1, {PAIR3_SHIFTS[1]};\nand.b32 v, v, {PAIR3_MASKS[1]:#x};\n"
    f"shl.b32 t, $1, {PAIR3_SHIFTS[0]};\nand.b32 t, t, {PAIR3_MASKS[0]:#x};\nor.b32 t, t, v;\n" + _MULS,
)

# $0 = bf16x2 (2**($1 - 127), twice) of E8M0 byte $1: s << 7, plus 0x40 for 0 (2**-127, a subnormal) and 255 (NaN)
FACTOR_PTX = (
    "{\n.reg .b32 e, m;\n.reg .pred z;\nshl.b32 e, $1, 7;\nadd.u32 m, $1, 1;\nand.b32 m, m, 255;\n"
    "setp.lt.u32 z, m, 2;\n@z or.b32 e, e, 64;\nprmt.b32 $0, e, e, 0x1010;\n}"
)


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
