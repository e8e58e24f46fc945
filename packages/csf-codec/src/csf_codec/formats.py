"""The two FP4 block-scale formats csf compresses, as plain facts."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORMATS", "MXFP4", "NVFP4", "ScaleFormat", "scale_format"]


@dataclass(frozen=True, kw_only=True)
class ScaleFormat:
    """One FP4 weight format's scale plane.

    ``row_base_width`` is the offset width (bits) the per-row base byte is chosen for: a row's base
    maximises how many of its scales fall in ``[base, base + 2**width - 1]``.
    """

    name: str
    code: int  # stored in CSF headers
    block_size: int  # weights per scale along K
    scale_dtype: str  # "e8m0" (bias 127, 0xFF = NaN) or "e4m3" (float8_e4m3fn bits)
    row_base_width: int
    has_global_scale: bool

    def scale_columns(self, k: int) -> int:
        if k % self.block_size:
            raise ValueError(f"{self.name}: K={k} is not a multiple of the block size {self.block_size}")
        return k // self.block_size


MXFP4 = ScaleFormat(name="mxfp4", code=1, block_size=32, scale_dtype="e8m0", row_base_width=1, has_global_scale=False)
NVFP4 = ScaleFormat(name="nvfp4", code=2, block_size=16, scale_dtype="e4m3", row_base_width=4, has_global_scale=True)

FORMATS: dict[str, ScaleFormat] = {f.name: f for f in (MXFP4, NVFP4)}
_BY_CODE = {f.code: f for f in FORMATS.values()}


def scale_format(name_or_code: str | int | ScaleFormat) -> ScaleFormat:
    """Look a format up by name ("mxfp4"/"nvfp4"), header code, or pass one through."""
    if isinstance(name_or_code, ScaleFormat):
        return name_or_code
    table = _BY_CODE if isinstance(name_or_code, int) else FORMATS
    key = name_or_code if isinstance(name_or_code, int) else str(name_or_code).lower()
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"unknown FP4 scale format {name_or_code!r}; known: {sorted(FORMATS)}") from None
