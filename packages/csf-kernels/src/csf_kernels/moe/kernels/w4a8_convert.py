"""The W4A8 consumers' conversion of FP4 words into E4M3 wgmma A registers (issue 47, ``docs/moe-engine.md`` §4.7), as
PTX for the CuTe kernel and as the same bit operations on torch integers for the CPU tests. No cutlass import.

A W4A8 panel word (:mod:`csf_kernels.moe.w4a8_panels`) holds eight E2M1 weights, two groups of four: group A (one
A register: one row, four consecutive K) and group B (the register of the row 8 below). Its bits::

    group A weight i: magnitude code at bits 4i .. 4i + 2,        sign at bit 8i + 7
    group B weight i: magnitude code at bits 16 + 4i .. 16 + 4i + 2, sign at bit 8i + 3

so that a group's four magnitude codes are the four selector nibbles of one ``prmt`` over its row's 8-byte table
(byte ``m``: the E4M3 byte of E2M1 magnitude ``m`` times ``2**d``), and its signs land on the E4M3 sign bits (bit 7
of each byte) with one mask (group A) or one shift and mask (group B): 3 and 5 instructions a register.

The table of offset ``d`` (``FOLD_MIN <= d <= FOLD_MAX``: every magnitude times ``2**d`` is an E4M3 value,
subnormals included) is entry ``d + LUT_BIAS`` of :data:`E4M3_LUT`, built here from float arithmetic (torch's
float8_e4m3fn rounding of exact values), independently of :mod:`csf_kernels.moe.w4a8_operands`' bit construction
that the tests hold it to. The kernel keeps the 16 entries in shared memory and indexes them by ``(s + LUT_BIAS -
b) & 15`` from a block's E8M0 byte ``s`` and its row's base ``b``.

Promoted tiles use the ``d = 0`` table and scale each k32 partial by ``2**(s - b)`` (:data:`PROMOTION_FACTOR_PTX`);
the epilogue multiplies row ``r`` by ``2**(b_r - 127)`` (:data:`ROW_FACTOR_PTX`).
"""

from __future__ import annotations

import torch

from csf_kernels.moe.w4a8_operands import FOLD_MAX, FOLD_MIN

__all__ = [
    "E4M3_LUT",
    "GROUP_A_MASKS",
    "GROUP_PTX",
    "LUT_BIAS",
    "PLAIN_TABLE",
    "PROMOTION_FACTOR_PTX",
    "ROW_FACTOR_PTX",
    "convert_group",
    "lut_table",
    "promotion_factor_bits",
    "row_factor_bits",
]

LUT_BIAS = -FOLD_MIN  # table index of offset d: d + LUT_BIAS, in [0, 14] for the folding offsets
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SIGN_BITS = 0x80808080  # bit 7 of each byte: where E4M3 keeps its sign and group A its weights' signs
GROUP_A_MASKS = (0x7777, SIGN_BITS)  # group A: its selector nibbles, its sign bits


def _table(d: int) -> tuple[int, int]:
    """(lo, hi) words: byte m of the 8 is the E4M3 byte of E2M1 magnitude m times 2**d (exact for the folding d)."""
    v = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float64) * 2.0**d
    e4 = v.to(torch.float8_e4m3fn)
    if not torch.equal(e4.to(torch.float64), v):
        raise ValueError(f"offset {d}: some E2M1 magnitude times 2**{d} is not an E4M3 value")
    b = e4.view(torch.uint8).to(torch.int64).tolist()
    return sum(x << (8 * i) for i, x in enumerate(b[:4])), sum(x << (8 * i) for i, x in enumerate(b[4:]))


# 16 (lo, hi) tables by index d + LUT_BIAS; index 15 (d = 7) never folds and holds zeros
E4M3_LUT = tuple(_table(d) for d in range(FOLD_MIN, FOLD_MAX + 1)) + ((0, 0),) * (16 - (FOLD_MAX - FOLD_MIN + 1))
PLAIN_TABLE = E4M3_LUT[LUT_BIAS]  # d = 0: the E2M1 values themselves (promoted tiles)

# $0 = the four E4M3 bytes of group g of word $1 through the table ($2 lo, $3 hi)
GROUP_PTX = (
    "{\n.reg .b32 s, r;\n"
    f"and.b32 s, $1, {GROUP_A_MASKS[0]:#x};\nprmt.b32 r, $2, $3, s;\n"
    f"and.b32 s, $1, {SIGN_BITS:#x};\nor.b32 $0, r, s;\n}}",
    "{\n.reg .b32 s, r;\n"
    f"shr.b32 s, $1, 16;\nand.b32 s, s, {GROUP_A_MASKS[0]:#x};\nprmt.b32 r, $2, $3, s;\n"
    f"shl.b32 s, $1, 4;\nand.b32 s, s, {SIGN_BITS:#x};\nor.b32 $0, r, s;\n}}",
)

# $0 = float32 bits of 2**($1 - $2) for E8M0 byte $1 and row base $2 (subnormal below 2**-126, 0 below 2**-149,
# inf above 2**127), NaN for byte 255: a promoted k32 partial's factor, as w4a8_operands.promotion_factor
PROMOTION_FACTOR_PTX = (
    "{\n.reg .b32 e, n, m, one;\n.reg .pred p, q;\n"
    "sub.s32 e, $1, $2;\nadd.s32 e, e, 127;\n"
    "min.s32 n, e, 255;\nshl.b32 n, n, 23;\n"
    "neg.s32 m, e;\nmin.s32 m, m, 31;\nmax.s32 m, m, 0;\nmov.b32 one, 0x400000;\nshr.b32 m, one, m;\n"
    "setp.ge.s32 p, e, 1;\nselp.b32 $0, n, m, p;\n"
    "setp.eq.u32 q, $1, 255;\n@q mov.b32 $0, 0x7fc00000;\n}"
)

# $0 = float32 bits of 2**($1 - 127) for a row base byte $1 in 0..254 (byte 0: the subnormal 2**-127)
ROW_FACTOR_PTX = (
    "{\n.reg .b32 n;\n.reg .pred z;\nshl.b32 n, $1, 23;\nsetp.eq.u32 z, $1, 0;\nselp.b32 $0, 0x400000, n, z;\n}"
)


def lut_table(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) int64 tables of table indices (int64 tensor, the kernel's ``(s + LUT_BIAS - b) & 15``)."""
    lo = torch.tensor([t[0] for t in E4M3_LUT], dtype=torch.int64, device=index.device)
    hi = torch.tensor([t[1] for t in E4M3_LUT], dtype=torch.int64, device=index.device)
    return lo[index & 15], hi[index & 15]


def _prmt(a: torch.Tensor, b: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """PTX ``prmt.b32`` (default mode) on int64 tensors holding unsigned 32-bit values: byte i of the result is
    byte ``sel[4i .. 4i + 2]`` of the 8 bytes {b, a}, replicated sign of it where ``sel`` bit ``4i + 3`` is set."""
    pool = a | (b << 32)
    out = torch.zeros_like(a)
    for i in range(4):
        nib = (sel >> (4 * i)) & 15
        byte = (pool >> (8 * (nib & 7))) & 0xFF
        byte = torch.where(nib >= 8, torch.where(byte >= 0x80, 0xFF, 0), byte)
        out |= byte << (8 * i)
    return out


def convert_group(words: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, group: int) -> torch.Tensor:
    """What :data:`GROUP_PTX` ``[group]`` computes, on int64 tensors holding unsigned 32-bit values."""
    w = words & 0xFFFFFFFF
    if group == 0:
        return _prmt(lo, hi, w & GROUP_A_MASKS[0]) | (w & SIGN_BITS)
    return _prmt(lo, hi, (w >> 16) & GROUP_A_MASKS[0]) | ((w << 4) & SIGN_BITS)


def promotion_factor_bits(s: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """What :data:`PROMOTION_FACTOR_PTX` computes (int64 tensors in, int64 float32 bit patterns out)."""
    e = s - base + 127
    normal = e.clamp(max=255) << 23
    sub = 0x400000 >> (-e).clamp(0, 31)
    return torch.where(s == 255, 0x7FC00000, torch.where(e >= 1, normal, sub))


def row_factor_bits(base: torch.Tensor) -> torch.Tensor:
    """What :data:`ROW_FACTOR_PTX` computes."""
    return torch.where(base == 0, 0x400000, base << 23)
