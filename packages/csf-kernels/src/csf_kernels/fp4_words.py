"""The FP4 weight words the MoE GEMMs read: packed E2M1 with each word's sign bits paired for conversion.

A 32-bit word holds eight E2M1 weights, weight ``i`` in nibble ``i`` (bits ``4i .. 4i + 3``), as stored
by MXFP4 / NVFP4 checkpoints. The GEMMs convert a word into four bf16 pairs (weights 2k, 2k + 1) with a
byte lookup of the magnitudes (``prmt``) and one shift-and-merge per pair for the signs, which needs the
two signs of pair ``k`` 16 bits apart. So weight preparation moves the sign bits (and only them):
nibble ``j``'s top bit holds the sign of weight ``SIGN_OF_NIBBLE[j]``; magnitudes stay in place. The
pairing is a bijection on bits, so it loses nothing and :func:`unpair_signs` restores the checkpoint bytes.
"""

from __future__ import annotations

import torch

__all__ = ["SIGN_OF_NIBBLE", "pair_signs", "unpair_signs"]

# pair k = (2k, 2k + 1): its signs sit in nibbles k and k + 4, so shifting the word left by 12 - 4k puts
# them at bits 15 and 31 of a bf16 pair
SIGN_OF_NIBBLE = (0, 2, 4, 6, 1, 3, 5, 7)
_NIBBLE_OF_SIGN = tuple(SIGN_OF_NIBBLE.index(i) for i in range(8))  # its inverse
_MAGNITUDES = 0x77777777
_CHUNK_WORDS = 1 << 24  # words per pass (64 MiB): bounds the temporaries on large expert stacks


def _move_signs(words: torch.Tensor, source_of: tuple[int, ...]) -> torch.Tensor:
    """Sign bit of nibble ``j`` taken from nibble ``source_of[j]``'s sign; magnitudes kept."""
    out = words & _MAGNITUDES
    for j, src in enumerate(source_of):
        out |= ((words >> (4 * src + 3)) & 1) << (4 * j + 3)
    return out


def _apply(values: torch.Tensor, source_of: tuple[int, ...], out: torch.Tensor | None) -> torch.Tensor:
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
        out_words[start : start + _CHUNK_WORDS] = _move_signs(words[start : start + _CHUNK_WORDS], source_of)
    return out


def pair_signs(values: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Checkpoint FP4 bytes [..., 4n] -> the GEMMs' word layout, into ``out`` (default: a new tensor). The
    temporaries are allocated while this runs, so a caller may run it inside a private memory pool with
    ``out`` allocated outside."""
    return _apply(values, SIGN_OF_NIBBLE, out)


def unpair_signs(values: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of :func:`pair_signs`."""
    return _apply(values, _NIBBLE_OF_SIGN, out)
