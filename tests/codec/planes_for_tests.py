"""Small scale planes with controlled statistics, drawn fresh from a seed (test helper only)."""

from __future__ import annotations

import struct
import zlib

import torch


def clustered_plane(
    shape: tuple[int, ...],
    *,
    seed: int,
    exception_rate: float = 0.005,
    center: int = 120,
    spread: int = 3,
    upper: float = 0.4,
    window: int = 1,
) -> torch.Tensor:
    """Rows cluster on a base (adjacent rows alike); ``exception_rate`` of scales land elsewhere."""
    g = torch.Generator().manual_seed(seed)
    rows = shape[:-1]
    base = (center + torch.randint(-spread, spread + 1, rows, generator=g)).clamp(0, 255 - window)
    off = torch.randint(0, 1 << window, shape, generator=g) * (torch.rand(shape, generator=g) < upper * 2).long()
    plane = base.unsqueeze(-1) + off
    exc = torch.rand(shape, generator=g) < exception_rate
    jumps = torch.tensor([-1, 2, 2, -1, 3, -5, 9, 200])
    plane[exc] = plane[exc] + jumps[torch.randint(0, len(jumps), (int(exc.sum()),), generator=g)]
    return plane.clamp(0, 255).to(torch.uint8)


def special_rows(plane: torch.Tensor, *, seed: int) -> torch.Tensor:
    """Add all-zero rows, rows clamped at 0 and at 254/255, and NaN (0xFF) scales."""
    g = torch.Generator().manual_seed(seed)
    p = plane.clone()
    flat = p.view(-1, p.shape[-1])
    r = flat.shape[0]
    picks = torch.randperm(r, generator=g)[: max(1, r // 20)]
    for i, row in enumerate(picks.tolist()):
        kind = i % 4
        if kind == 0:
            flat[row] = 0
        elif kind == 1:
            flat[row] = torch.randint(0, 2, (flat.shape[1],), generator=g).to(torch.uint8)
        elif kind == 2:
            flat[row] = torch.randint(254, 256, (flat.shape[1],), generator=g).to(torch.uint8)
        else:
            flat[row, torch.randint(0, flat.shape[1], (2,), generator=g)] = 0xFF
    return p


def reseal(payload: torch.Tensor) -> torch.Tensor:
    """Recompute a payload's two CRCs, as a forger would: only the structural checks and the plane digest
    then stand between a change and the output."""
    from csf_codec.container import HEADER_BYTES

    b = bytearray(payload.numpy().tobytes())
    if len(b) < HEADER_BYTES:
        return payload.clone()
    b[HEADER_BYTES - 8 : HEADER_BYTES - 4] = struct.pack("<I", zlib.crc32(bytes(b[HEADER_BYTES:])) & 0xFFFFFFFF)
    b[HEADER_BYTES - 4 : HEADER_BYTES] = struct.pack("<I", zlib.crc32(bytes(b[: HEADER_BYTES - 4])) & 0xFFFFFFFF)
    return torch.frombuffer(b, dtype=torch.uint8).clone()
