"""Native scale planes as the codec sees them: raw bytes, [N, KB] or [E, N, KB]."""

from __future__ import annotations

import torch

from .errors import ShapeMismatchError

__all__ = ["MAX_DIM", "as_rows", "as_scale_bytes"]

MAX_DIM = 1 << 31  # a plane's dimensions lie below it: payload headers hold each in 32 bits, decoders refuse more

_BYTE_DTYPES = {torch.uint8, torch.int8, torch.float8_e4m3fn}
if hasattr(torch, "float8_e8m0fnu"):
    _BYTE_DTYPES.add(torch.float8_e8m0fnu)


def as_scale_bytes(plane: torch.Tensor, *, name: str = "scales") -> torch.Tensor:
    """View a one-byte scale tensor (uint8, float8_e4m3fn, float8_e8m0fnu) as uint8, without copying."""
    if plane.dtype not in _BYTE_DTYPES:
        raise ShapeMismatchError(name, f"scale planes are one byte per scale; got dtype {plane.dtype}")
    return plane if plane.dtype == torch.uint8 else plane.view(torch.uint8)


def as_rows(plane: torch.Tensor, *, name: str = "scales") -> tuple[torch.Tensor, tuple[int, ...]]:
    """Return the plane as contiguous uint8 rows [E * N, KB] and its original shape."""
    if plane.dim() not in (2, 3):
        raise ShapeMismatchError(name, f"a scale plane is [N, KB] or [E, N, KB]; got shape {tuple(plane.shape)}")
    shape = tuple(int(d) for d in plane.shape)
    if any(d >= MAX_DIM for d in shape):
        raise ShapeMismatchError(name, f"a scale plane's dimensions lie below 2**31; got shape {shape}")
    data = as_scale_bytes(plane, name=name).contiguous()
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return data.reshape(rows, shape[-1]), shape  # explicit rows: a plane may have a zero dimension
