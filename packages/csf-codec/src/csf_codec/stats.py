"""Per-plane figures: both forms' ratios, exceptions, raw tiles, and the entropy bound they approach."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .compact import encode_compact
from .formats import ScaleFormat, scale_format
from .inline import encode_inline
from .planes import as_rows
from .rowbase import row_bases

__all__ = ["PlaneReport", "offset_entropy", "plane_report"]


@dataclass(frozen=True, kw_only=True)
class PlaneReport:
    name: str
    format: str
    shape: tuple[int, ...]
    native_bytes: int
    compact_bytes: int
    compact_ratio: float
    compact_width: int
    inline_bytes: int
    inline_ratio: float
    inline_record_bytes: int
    exceptions: int  # scales outside [base, base + 2**w - 1] of their row (w: the format's base width)
    exception_fraction: float
    raw_tiles: int
    tiles: int
    entropy_bits_per_scale: float  # order-0 entropy of (scale - row base)
    entropy_bound_ratio: float | None  # 8 / entropy: no coder of offsets alone beats it (None: zero entropy)

    @property
    def compact_efficiency(self) -> float | None:
        """How close the compact form comes to the entropy bound (1.0 = at the bound)."""
        return None if self.entropy_bound_ratio is None else self.compact_ratio / self.entropy_bound_ratio

    @property
    def inline_efficiency(self) -> float | None:
        return None if self.entropy_bound_ratio is None else self.inline_ratio / self.entropy_bound_ratio

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["compact_efficiency"] = self.compact_efficiency
        d["inline_efficiency"] = self.inline_efficiency
        return d


def offset_entropy(rows: torch.Tensor, bases: torch.Tensor) -> float:
    """Order-0 entropy (bits per scale) of each scale's offset from its row base."""
    if rows.numel() == 0:
        return 0.0
    d = rows.to(torch.int32) - bases.to(torch.int32)[:, None] + 255
    p = torch.bincount(d.reshape(-1), minlength=511).double()
    p = p[p > 0] / rows.numel()
    return float(-(p * p.log2()).sum())


def plane_report(
    plane: torch.Tensor, fmt: ScaleFormat | str, *, name: str = "scales", row_group: int | None = None
) -> PlaneReport:
    """Encode ``plane`` in both forms (each verified) and measure it.

    An empty plane (a zero dimension) is stored as it is: 0 bytes in every form, ratios 1.
    """
    fmt = scale_format(fmt)
    rows, shape = as_rows(plane, name=name)
    if rows.numel() == 0:
        return PlaneReport(
            name=name,
            format=fmt.name,
            shape=shape,
            native_bytes=0,
            compact_bytes=0,
            compact_ratio=1.0,
            compact_width=fmt.row_base_width,
            inline_bytes=0,
            inline_ratio=1.0,
            inline_record_bytes=0,
            exceptions=0,
            exception_fraction=0.0,
            raw_tiles=0,
            tiles=0,
            entropy_bits_per_scale=0.0,
            entropy_bound_ratio=None,
        )
    compact = encode_compact(plane, fmt, name=name)
    inline = encode_inline(plane, fmt, name=name, row_group=row_group)
    bases = row_bases(rows, fmt.row_base_width)
    d = rows.to(torch.int16) - bases.to(torch.int16)[:, None]
    exceptions = int(((d < 0) | (d >= (1 << fmt.row_base_width))).sum())
    native = rows.numel()
    h = offset_entropy(rows, bases)
    return PlaneReport(
        name=name,
        format=fmt.name,
        shape=shape,
        native_bytes=native,
        compact_bytes=compact.nbytes,
        compact_ratio=native / compact.nbytes,
        compact_width=compact.width,
        inline_bytes=inline.nbytes,
        inline_ratio=native / max(inline.nbytes, 1),
        inline_record_bytes=inline.record_bytes,
        exceptions=exceptions,
        exception_fraction=exceptions / max(native, 1),
        raw_tiles=inline.raw_tiles,
        tiles=inline.geometry.tiles,
        entropy_bits_per_scale=h,
        entropy_bound_ratio=None if h <= 0 or math.isclose(h, 0.0) else 8.0 / h,
    )
