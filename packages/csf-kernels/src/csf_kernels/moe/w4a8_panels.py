"""W4A8's weight operands as the FP8 engine reads them (issue 47, ``docs/moe-engine.md`` §4.7): a weight panel whose
words convert into E4M3 wgmma A registers, and per row and tile what the epilogue and the promotion path need.

**Weight panel** ``uint64 [steps, row blocks, 256]``, the shape (and bytes a stage) of
:func:`csf_kernels.moe.engine_panels.engine_weight_panel`: per 64-K step and 64-row block, thread ``t`` of the
consumer warpgroup (warp ``w = t // 32``, lane ``l``, ``g = l // 4``, ``q = l % 4``) owns four 32-bit words at bytes
``16 t .. 16 t + 15``. Word ``2 j + p`` serves k32 slice ``j`` of the step (one MXFP4 block), A registers ``2 p`` and
``2 p + 1`` of ``wgmma.m64nNk32`` (E4M3): group A is row ``r0 = 16 w + g`` and group B row ``r0 + 8``, both at
``k = 32 j + 16 p + 4 q + i`` for weight ``i`` of the group; bits as :mod:`csf_kernels.moe.kernels.w4a8_convert`
places them.

**Row data**: each row's base (uint8, :func:`csf_codec.rowbase.row_bases`, the reference's); each 128-row tile's
fold flag (uint8 1 where every block of its rows folds against its row's base over all of K,
:func:`csf_kernels.moe.w4a8_operands.fold_mask`; a tile without it takes the promotion path). Scales stay the W4A16
scale panel (:func:`~csf_kernels.moe.engine_panels.engine_scale_panel`): the slots hold E8M0 bytes whatever the
source, and the consumer subtracts the base.
"""

from __future__ import annotations

import torch

from csf_codec.rowbase import row_bases
from csf_kernels.moe.engine_panels import PANEL_STEP_K, fragment_codes, words_to_panel
from csf_kernels.moe.w4a8_operands import TILE_ROWS, fold_mask

__all__ = ["fragment_index", "w4a8_bases", "w4a8_tile_flags", "w4a8_weight_panel", "w4a8_words"]


def fragment_index() -> torch.Tensor:
    """[128 threads, 4 words, 8 weights] -> (row in the block, k in the step) as one flat index ``r * 64 + k``;
    weights 0..3 are group A, 4..7 group B."""
    t = torch.arange(128).view(128, 1, 1)
    word = torch.arange(4).view(1, 4, 1)
    n = torch.arange(8).view(1, 1, 8)
    w, lane = t // 32, t % 32
    g, q = lane // 4, lane % 4
    j, p = word // 2, word % 2
    row = 16 * w + g + 8 * (n // 4)
    k = 32 * j + 16 * p + 4 * q + n % 4
    return row * PANEL_STEP_K + k


def w4a8_words(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes int64 ``[..., 8]`` (group A's four, then group B's) -> the panel word (int64, unsigned 32 bits)."""
    mag, sign = codes & 7, (codes >> 3) & 1
    word = torch.zeros(codes.shape[:-1], dtype=torch.int64, device=codes.device)
    for i in range(4):
        word |= (mag[..., i] << (4 * i)) | (sign[..., i] << (8 * i + 7))
        word |= (mag[..., 4 + i] << (16 + 4 * i)) | (sign[..., 4 + i] << (8 * i + 3))
    return word


def w4a8_weight_panel(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint FP4 bytes ``[rows, K / 2]`` (value ``2i`` in byte ``i``'s low nibble) -> the W4A8 weight panel
    ``uint64 [steps, row blocks, 256]``; rows and K past the end are zeros."""
    return words_to_panel(w4a8_words(fragment_codes(packed, fragment_index())))


def w4a8_bases(scales: torch.Tensor) -> torch.Tensor:
    """uint8 [..., R]: each row's base from its E8M0 bytes [..., R, C] (the codec's row base, width 1)."""
    return row_bases(scales.reshape(-1, scales.shape[-1]), 1).view(scales.shape[:-1])


def w4a8_tile_flags(scales: torch.Tensor, bases: torch.Tensor) -> torch.Tensor:
    """uint8 [..., ceil(R / 128)]: 1 where every block of the tile's rows folds against its row's base."""
    bad = (~fold_mask(scales, bases)).any(dim=-1)
    r = bad.shape[-1]
    bad = torch.nn.functional.pad(bad.to(torch.uint8), (0, -r % TILE_ROWS))
    return (bad.view(*bad.shape[:-1], -1, TILE_ROWS).amax(dim=-1) == 0).to(torch.uint8)
