"""Packing of w-bit unsigned fields (w in 1, 2, 4), least significant bits first.

Field ``i`` of a packed byte string sits at bit ``i * w``: so a little-endian word read at byte
offset ``2 * w * g`` holds fields ``16 g .. 16 g + 15``, which is what the inline tile records rely on.
"""

from __future__ import annotations

import torch

__all__ = ["WIDTHS", "pack_fields", "packed_nbytes", "unpack_fields"]

WIDTHS = (1, 2, 4)


def _check_width(width: int) -> int:
    if width not in WIDTHS:
        raise ValueError(f"field width must be one of {WIDTHS}, not {width}")
    return 8 // width


def packed_nbytes(count: int, width: int) -> int:
    per_byte = _check_width(width)
    return (count + per_byte - 1) // per_byte


def pack_fields(fields: torch.Tensor, width: int) -> torch.Tensor:
    """Pack the last dimension of ``fields`` (uint8 values < 2**width) into bytes.

    The last dimension is zero-padded to a whole number of bytes.
    """
    per_byte = _check_width(width)
    n = fields.shape[-1]
    pad = (-n) % per_byte
    f = fields.to(torch.uint8)
    if pad:
        f = torch.nn.functional.pad(f, (0, pad))
    f = f.reshape(*f.shape[:-1], f.shape[-1] // per_byte, per_byte).to(torch.int32)  # no -1: empty planes
    shifts = torch.arange(per_byte, device=f.device, dtype=torch.int32) * width
    return (f << shifts).sum(dim=-1).to(torch.uint8)


def unpack_fields(packed: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_fields`: ``count`` fields from the last dimension of ``packed``."""
    per_byte = _check_width(width)
    shifts = torch.arange(per_byte, device=packed.device, dtype=torch.int32) * width
    mask = (1 << width) - 1
    f = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & mask
    return f.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)[..., :count].to(torch.uint8)
