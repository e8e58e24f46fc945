"""Per-plane figures: both forms' ratios, exceptions, raw tiles, and the entropy bound they approach.

The bound is H(delta | row base): the empirical conditional entropy, in bits per scale over the whole
plane, of each scale's offset ``delta = scale - b`` from its row's base ``b`` (csf_codec.rowbase, at the
format's base width), given ``b``. With ``n(b, delta)`` the number of scales of the plane with that base
and offset, ``n(b)`` those with that base and N all scales::

    H = -sum over (b, delta) of n(b, delta) / N * log2(n(b, delta) / n(b))

No coder that sees each scale's row base for free and codes the scales as independent symbols does
better; ``entropy_bound_ratio = 8 / H`` is the compression ratio at the bound, and a form's efficiency is
``H * N / (8 * payload bytes)`` = its ratio / the bound ratio (1.0 = at the bound). The bound leaves out
the cost of the row bases themselves and of structure beyond single scales (rows with more exceptions
than others), which a coder may exploit to pass it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .compact import encode_compact
from .formats import ScaleFormat, scale_format
from .inline import encode_inline
from .planes import as_rows
from .rowbase import row_bases

__all__ = ["PlaneReport", "conditional_offset_entropy", "offset_entropy", "plane_report"]


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
    entropy_bits_per_scale: float  # H(delta | row base), the bound (module docstring)
    entropy_bound_ratio: float | None  # 8 / H: the ratio at the bound (None: zero entropy)
    offset_entropy_bits_per_scale: float  # H(delta), order 0: the bound without conditioning on the base

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


def conditional_offset_entropy(rows: torch.Tensor, bases: torch.Tensor) -> float:
    """H(delta | row base) in bits per scale (module docstring), from joint counts of (base, delta)."""
    if rows.numel() == 0:
        return 0.0
    x = rows.numpy() if rows.device.type == "cpu" else rows.cpu().numpy()
    b = (bases.cpu() if bases.device.type != "cpu" else bases).numpy().astype(np.int64)
    joint = np.zeros(256 * 512, dtype=np.int64)
    step = max(1, (1 << 22) // max(x.shape[1], 1))
    for a in range(0, x.shape[0], step):  # key = base * 512 + (delta + 255)
        keys = (b[a : a + step, None] * 512 + 255 - b[a : a + step, None]) + x[a : a + step]
        joint += np.bincount(keys.reshape(-1), minlength=joint.size)
    n_b = joint.reshape(256, 512).sum(axis=1)
    total = float(x.size)
    nz = joint > 0
    base_of = np.repeat(np.arange(256), 512)[nz]
    p = joint[nz]
    return float(-(p * np.log2(p / n_b[base_of])).sum() / total)


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
            offset_entropy_bits_per_scale=0.0,
            entropy_bound_ratio=None,
        )
    compact = encode_compact(plane, fmt, name=name)
    inline = encode_inline(plane, fmt, name=name, row_group=row_group)
    bases = row_bases(rows, fmt.row_base_width)
    d = rows.to(torch.int16) - bases.to(torch.int16)[:, None]
    exceptions = int(((d < 0) | (d >= (1 << fmt.row_base_width))).sum())
    native = rows.numel()
    h = conditional_offset_entropy(rows, bases)
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
        offset_entropy_bits_per_scale=offset_entropy(rows, bases),
    )
