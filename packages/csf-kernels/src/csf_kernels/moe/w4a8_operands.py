"""W4A8's weight operand (issue 47, ``docs/moe-engine.md`` "W4A8"): FP4 weights as exact E4M3 bytes for FP8 wgmma.

An MXFP4 weight is ``e2m1 * 2**(s - 127)`` with ``s`` its block's E8M0 byte. With a per-row base ``b`` the scale
splits into ``2**(b - 127)``, one power of two per output row that the epilogue applies, and ``2**d``, ``d = s - b``,
per (row, 32-K block). ``e2m1 * 2**d`` is an E4M3 value, for every E2M1 value, iff ``FOLD_MIN <= d <= FOLD_MAX``:
such a block *folds* (its E4M3 bytes carry ``d``). Any other block (``d`` out of range, or a NaN scale) is
*promoted*: its bytes carry the plain E2M1 values (``d = 0``, always exact) and the kernel scales that block's
partial accumulator by ``2**d``. Both forms give the same real products; only float32 summation order differs.

NVFP4 (E4M3 block scales) rarely folds: a block's factor ``f = scale / 2**e`` times 1.5 needs more than E4M3's
four significant bits unless ``f``'s mantissa is 0, 2 or 4 (:func:`nvfp4_block_folds`).

torch only (CPU or GPU): the twins of what weight preparation and the kernel's conversion table compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from csf_codec.fp4 import E2M1_VALUES, E4M3_MAX, E8M0_NAN_BYTE, e4m3_bytes_to_float, unpack_fp4

__all__ = [
    "FOLD_MAX",
    "FOLD_MIN",
    "FoldError",
    "W4A8Weights",
    "e4m3_exact",
    "e4m3_from_e2m1",
    "fold_mask",
    "nvfp4_block_folds",
    "promotion_factor",
    "row_factor",
    "tile_fold",
    "w4a8_weights",
]

# E2M1 magnitudes are k * 2**j with k in {2, 3}: 0.5 = 2 * 2**-2 and 1.5 = 3 * 2**-1 set the low end (E4M3's
# subnormal step 2**-9), 4 = 2 * 2**1 and 6 = 3 * 2**1 the high end (448 = 1.75 * 2**8). tests/kernels/
# test_w4a8_operands.py derives the range from every value instead of trusting these two numbers.
FOLD_MIN = -8
FOLD_MAX = 6
TILE_ROWS = 128  # weight rows of an engine tile (two consumer warpgroups)
TILE_K = 64  # K of an engine stage


class FoldError(ValueError):
    """A block was asked to fold whose offset takes E2M1 values out of E4M3."""


def e4m3_from_e2m1(codes: torch.Tensor, offset: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 bytes, exact) of ``e2m1(code) * 2**offset`` for unpacked codes (uint8 0..15) and integer offsets
    (broadcast). ``exact`` is per element and value-aware (zero is exact at any offset, 0.5 up to offset 9);
    where it is False the byte is 0 and must not be used. Signs are kept (code 8, -0, gives 0x80). Built from
    the bits, as a kernel's table is."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"e4m3_from_e2m1: codes must be uint8, got {codes.dtype}")
    c = codes.to(torch.int32)
    mag = c & 7
    d = torch.as_tensor(offset, dtype=torch.int32, device=codes.device)
    # magnitude = k * 2**j: code 1 is 2 * 2**-2, codes 2..7 are (2 + (code & 1)) * 2**((code >> 1) - 2)
    k = torch.where(mag == 1, 2, 2 + (mag & 1))
    j = torch.where(mag == 1, -2, (mag >> 1) - 2) + d
    # normal E4M3: k * 2**j = (k / 2) * 2**(j + 1), exponent field j + 8 in [1, 15] (mantissa 0 or 4: never NaN)
    field = j + 8
    normal = (field >= 1) & (field <= 15)
    normal_byte = (field.clamp(0, 15) << 3) | torch.where(k == 3, 4, 0)
    # subnormal: k * 2**j = m * 2**-9 with m = k * 2**(j + 9) an integer in 1..7 (below field 1, j + 9 <= 1);
    # twice m, k << (j + 10), is an integer from j = -10 on, and m one where it is even (k = 2)
    twice = j + 10
    m2 = torch.where(twice >= 0, k << twice.clamp(0, 2), 1)
    m = m2 >> 1
    sub = (field < 1) & (m2 & 1 == 0) & (m >= 1) & (m <= 7)
    byte = torch.where(mag == 0, 0, torch.where(normal, normal_byte, torch.where(sub, m, 0)))
    exact = (mag == 0) | normal | sub
    byte = torch.where(exact, byte | ((c & 8) << 4), 0)  # the sign bit, -0 included
    return byte.to(torch.uint8), exact.expand(byte.shape)


def e4m3_exact(values: torch.Tensor) -> torch.Tensor:
    """Whether each float64 value is exactly an E4M3 (float8_e4m3fn) value (NaN: no)."""
    v = values.to(torch.float64)
    fits = v.abs() <= E4M3_MAX
    back = v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float64)
    return fits & (back == v)


def fold_mask(scales: torch.Tensor, bases: torch.Tensor) -> torch.Tensor:
    """bool [..., R, C]: the MXFP4 blocks whose E8M0 byte ``s`` folds against its row base ``b`` ([..., R]):
    ``FOLD_MIN <= s - b <= FOLD_MAX``, NaN scales (0xFF) never. Value-independent: what weight preparation flags."""
    if scales.dtype != torch.uint8 or bases.shape != scales.shape[:-1]:
        raise TypeError(f"fold_mask: uint8 scales [..., R, C] and bases [..., R]; got {scales.dtype} "
                        f"{tuple(scales.shape)} and {tuple(bases.shape)}")  # fmt: skip
    d = scales.to(torch.int16) - bases.to(torch.int16)[..., None]
    return (d >= FOLD_MIN) & (d <= FOLD_MAX) & (scales != E8M0_NAN_BYTE)


def row_factor(bases: torch.Tensor) -> torch.Tensor:
    """float32 ``2**(b - 127)`` per row: the epilogue's weight factor (exact; byte 0 gives the subnormal 2**-127)."""
    b = bases.to(torch.int32)
    if bool(((b < 0) | (b >= E8M0_NAN_BYTE)).any()):
        raise ValueError("row bases must be bytes 0..254 (0xFF is NaN, not a base)")
    return torch.where(b == 0, torch.full_like(b, 1 << 22), b << 23).view(torch.float32)


def promotion_factor(scales: torch.Tensor, bases: torch.Tensor) -> torch.Tensor:
    """float32 [..., R, C] ``2**(s - b)`` per block (NaN for NaN scales): what a promoted block's partial sum is
    multiplied by before it joins the row's accumulator. Offsets below -149 or above 127 leave float32 (0 or inf),
    which no row base from :mod:`csf_codec.rowbase` produces for a finite scale."""
    d = scales.to(torch.float32) - bases.to(torch.float32)[..., None]
    return torch.exp2(d).masked_fill(scales == E8M0_NAN_BYTE, float("nan"))


@dataclass(frozen=True, kw_only=True)
class W4A8Weights:
    """One MXFP4 matrix as W4A8 reads it: ``codes`` uint8 [..., R, K] E4M3 bytes (folded blocks carry their offset,
    promoted blocks the plain E2M1 value), ``fold`` bool [..., R, K/32], ``bases`` uint8 [..., R]."""

    codes: torch.Tensor
    fold: torch.Tensor
    bases: torch.Tensor
    scales: torch.Tensor  # the E8M0 plane, for the promoted blocks' factors

    def operand(self) -> torch.Tensor:
        """float32 [..., R, K]: what each weight contributes to the row's accumulator before the epilogue, the E4M3
        value for folded blocks and ``e4m3 * 2**(s - b)`` (the promoted partial's factor) for the others."""
        w = e4m3_bytes_to_float(self.codes)
        block = w.shape[-1] // self.fold.shape[-1]
        promote = torch.where(self.fold, 1.0, promotion_factor(self.scales, self.bases))
        return w * promote.repeat_interleave(block, dim=-1)

    def dequantize(self) -> torch.Tensor:
        """float32 [..., R, K]: each weight as the kernel's operands give it, :meth:`operand` times the epilogue's
        ``2**(b - 127)``."""
        return self.operand() * row_factor(self.bases)[..., None]


def w4a8_weights(
    values: torch.Tensor, scales: torch.Tensor, bases: torch.Tensor, *, strict: bool = False
) -> W4A8Weights:
    """The E4M3 operand of packed MXFP4 ``values`` ([..., R, K/2]) with E8M0 ``scales`` ([..., R, K/32]) against
    per-row ``bases`` ([..., R]). ``strict``: refuse (:class:`FoldError`) if any block would have to be promoted."""
    codes = unpack_fp4(values)
    if codes.shape[-1] != 32 * scales.shape[-1] or codes.shape[:-1] != scales.shape[:-1]:
        raise ValueError(f"values {tuple(values.shape)} and scales {tuple(scales.shape)} are not one MXFP4 matrix")
    fold = fold_mask(scales, bases)
    if strict and not bool(fold.all()):
        bad = (~fold).nonzero()[0].tolist()
        raise FoldError(f"{int((~fold).sum())} blocks do not fold, the first at {bad}: scale byte "
                        f"{int(scales[tuple(bad)])}, row base {int(bases[tuple(bad[:-1])])}")  # fmt: skip
    d = scales.to(torch.int32) - bases.to(torch.int32)[..., None]
    d = torch.where(fold, d, 0).repeat_interleave(32, dim=-1)
    out, exact = e4m3_from_e2m1(codes, d)
    assert bool(exact.all()), "a folding offset gave an inexact E4M3 byte"
    return W4A8Weights(codes=out, fold=fold, bases=bases, scales=scales)


def tile_fold(fold: torch.Tensor, block_k: int) -> torch.Tensor:
    """bool [..., ceil(R / 128), ceil(K / 64)]: engine tiles (128 weight rows x 64 K) all of whose blocks fold, from a
    per-block mask [..., R, C] of ``block_k``-wide blocks; partial tiles at the edges hold what they cover."""
    per = TILE_K // block_k
    r, c = fold.shape[-2:]
    pad_r, pad_c = -r % TILE_ROWS, -c % per
    f = torch.nn.functional.pad((~fold).to(torch.uint8), (0, pad_c, 0, pad_r))
    f = f.view(*fold.shape[:-2], (r + pad_r) // TILE_ROWS, TILE_ROWS, (c + pad_c) // per, per)
    return f.amax(dim=(-3, -1)) == 0


# ----------------------------------------------------------------------------------------------------- NVFP4


def _nvfp4_fold_table() -> torch.Tensor:
    """bool [256 scale codes, 32 base binades + 16]: every E2M1 magnitude times ``e4m3(code) / 2**eb`` is an E4M3
    value, for ``eb`` in [-16, 15]: column ``eb + 16``."""
    f = e4m3_bytes_to_float(torch.arange(256, dtype=torch.uint8)).to(torch.float64)
    eb = torch.arange(-16, 16, dtype=torch.float64)
    factor = f[:, None] * torch.exp2(-eb)[None, :]
    mags = E2M1_VALUES[1:8].to(torch.float64)
    return e4m3_exact(factor[..., None] * mags).all(dim=-1) & torch.isfinite(factor)


_NVFP4_FOLDS: torch.Tensor | None = None


def nvfp4_block_folds(scales: torch.Tensor, base_binade: torch.Tensor) -> torch.Tensor:
    """bool [..., R, C]: NVFP4 blocks (E4M3 scale codes) whose factor ``scale / 2**eb`` times every E2M1 value is
    an E4M3 value, ``eb`` the row's binade ([..., R], int, in [-16, 15]) that the epilogue applies with the global
    scale. Value-independent, as :func:`fold_mask`."""
    global _NVFP4_FOLDS
    if _NVFP4_FOLDS is None:
        _NVFP4_FOLDS = _nvfp4_fold_table()
    table = _NVFP4_FOLDS.to(scales.device)
    eb = base_binade.to(torch.int64)
    if bool(((eb < -16) | (eb > 15)).any()):
        raise ValueError("nvfp4_block_folds: base binades must lie in [-16, 15]")
    col = (eb + 16)[..., None].expand(scales.shape)
    return table[scales.to(torch.int64), col]
