"""Synthetic FP4 scale planes with realistic statistics, for tests, the demo and the benchmark.

A plane is uint8 [E, N, KB] (or [N, KB]); a row is the KB scales of one output channel. Both formats share one
row model: each row has a log2 magnitude (binades) = expert offset + smooth per-row noise (adjacent rows
correlated) + an occasional outlier shift.

- MXFP4 (E8M0 bytes): the row's base byte is round(row_base_center + magnitude). Each scale is base or base+1
  with probability ``in_window_fraction`` (base+1 with a per-row share around ``upper_fraction``); the rest are
  exceptions drawn independently per scale, so they spread over the 128x4 tiles instead of clumping: mostly
  base-1 / base+2, a few far (base-6..base-2, base+3..base+4). With ``exception_row_sigma`` > 0 the exception
  rate is per row instead: the plane's rate times a log-normal factor of mean 1 (log-std sigma, capped at
  half the row), so exceptions cluster in some rows, as in real down projections.
- NVFP4 (E4M3 bytes): simulated, not knob-fitted. Each block amax is row sigma * (max of 16 |N(0,1)|, sampled by
  inverse CDF) with a heavy-tail boost on a few blocks; it goes through exactly the cast quantize_nvfp4 uses,
  amax / 6 / global -> clamp [2**-6, 448] -> E4M3, with the global scale set so that tensor amax / median row
  sigma = ``nvfp4_amax_ratio``. That lands each row on ~10-14 consecutive codes around its own centre.

Generation is vectorised over chunks of rows and deterministic from the seed (one CPU torch.Generator).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from .formats import MXFP4, NVFP4, ScaleFormat, scale_format
from .fp4 import E4M3_MAX, E4M3_NAN_BYTE, E8M0_NAN_BYTE, float_to_e4m3_bytes
from .rowbase import row_bases

__all__ = [
    "DOWN_PROJ_DENSE",
    "EXCEPTION_DENSE",
    "NVFP4_TYPICAL",
    "SEED_REGIME",
    "SPECIAL_CONTENT",
    "PlaneStats",
    "best_row_bases",
    "measure_window_fraction",
    "synthetic_fp4_values",
    "synthetic_scale_plane",
]


@dataclass(frozen=True, kw_only=True)
class PlaneStats:
    """Knobs of a synthetic scale plane. Magnitudes are in binades (powers of two), which is one E8M0 step
    and eight E4M3 codes."""

    # Row model, both formats.
    row_base_spread: float = 1.2  # std of a row's log2 magnitude around its expert's centre
    expert_base_spread: float = 0.6  # std of each expert's centre
    row_correlation_rows: int = 16  # row noise is a moving average over this many rows: adjacent corr 1 - 1/L
    outlier_row_fraction: float = 0.002  # rows sitting several binades higher
    outlier_row_shift: tuple[int, int] = (3, 6)  # binades, inclusive range

    # MXFP4 (E8M0) scale bytes.
    in_window_fraction: float = 0.995  # scales equal to their row's base or base+1
    upper_fraction: float = 0.45  # mean share of in-window scales at base+1
    upper_fraction_spread: float = 0.25  # per-row share drawn uniformly in upper_fraction +- this
    row_base_center: float = 120.0  # E8M0 byte of a typical row base (2**-7)
    near_exception_share: float = 0.9  # exceptions at base-1 or base+2; the rest are far
    low_exception_share: float = 0.6  # of the near exceptions, the share at base-1
    exception_row_sigma: float = 0.0  # log-std of a row's exception rate around the plane's (0: one rate)

    # NVFP4 (E4M3) scale bytes.
    nvfp4_amax_ratio: float = 24.0  # tensor amax / median row sigma; sets the global scale
    nvfp4_tail_fraction: float = 0.02  # blocks whose amax comes from a heavy-tailed outlier weight
    nvfp4_tail_binades: float = 0.6  # mean log2 boost of such a block (exponentially distributed)

    # Special content (counts over the whole plane; rows and positions drawn from the seed, all distinct).
    # All-zero weight rows: every scale byte 0x00 (E8M0 2**-127, what OCP/torchao give a zero block; E4M3 +0,
    # what a plain cast of a zero scale gives; quantize_nvfp4 follows torchao's 2**-6 floor and writes 0x08).
    zero_rows: int = 0
    clamped_rows: int = 0  # rows pinned at the code range's ends; half low (base 0 / 0x00), half high (see below)
    nan_scales: int = 0  # single NaN scale bytes (E8M0 0xFF / E4M3 0x7F), one per chosen row

    # High clamped rows: MXFP4 base 254, so base+1 is the 0xFF NaN code; NVFP4 centred on 0x7E with 0x7F NaN
    # neighbours above it. They are codec stress rows, not something a quantizer produces in bulk.

    def __post_init__(self) -> None:
        for name in ("in_window_fraction", "upper_fraction", "near_exception_share", "low_exception_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PlaneStats.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.outlier_row_fraction <= 1.0 or not 0.0 <= self.nvfp4_tail_fraction <= 1.0:
            raise ValueError("PlaneStats: outlier_row_fraction and nvfp4_tail_fraction must be in [0, 1]")
        if self.row_correlation_rows < 1:
            raise ValueError(f"PlaneStats.row_correlation_rows must be >= 1, got {self.row_correlation_rows}")
        lo, hi = self.outlier_row_shift
        if not 0 <= lo <= hi:
            raise ValueError(f"PlaneStats.outlier_row_shift must be 0 <= lo <= hi, got {self.outlier_row_shift}")
        if min(self.zero_rows, self.clamped_rows, self.nan_scales) < 0:
            raise ValueError("PlaneStats: special-content counts must be >= 0")
        if self.exception_row_sigma < 0:
            raise ValueError(f"PlaneStats.exception_row_sigma must be >= 0, got {self.exception_row_sigma}")
        if self.nvfp4_amax_ratio <= 0:
            raise ValueError(f"PlaneStats.nvfp4_amax_ratio must be > 0, got {self.nvfp4_amax_ratio}")


# The seed regime: >= 99.5% of MXFP4 scales in [base, base+1].
SEED_REGIME = PlaneStats(in_window_fraction=0.995)
# Harder: 2% exceptions, present in nearly every 128x4 tile.
EXCEPTION_DENSE = PlaneStats(in_window_fraction=0.98)
# Real down projections: 4% of scales outside [base, base + 1], 90% of them at base-1 / base+2, clustered by
# row (a row's rate is log-normal around 4%, log-std 1: the busiest quarter of the rows holds two thirds to
# three quarters of the exceptions).
DOWN_PROJ_DENSE = PlaneStats(in_window_fraction=0.96, exception_row_sigma=1.0)
# NVFP4 with Gaussian-ish weights; outlier rows 1-2 binades up (more would saturate at 448).
NVFP4_TYPICAL = PlaneStats(outlier_row_shift=(1, 2))
# SEED_REGIME plus every kind of special row, for codec edge cases.
SPECIAL_CONTENT = replace(SEED_REGIME, zero_rows=4, clamped_rows=4, nan_scales=8)

_CHUNK_ELEMENTS = 1 << 22
_NVFP4_QUANTILES = 4096  # inverse-CDF table of the max of 16 |N(0,1)|
_FAR_OFFSETS = torch.tensor([-6, -5, -4, -3, -2, 3, 4], dtype=torch.int16)


def synthetic_scale_plane(
    shape: tuple[int, ...] | torch.Size,
    fmt: str | int | ScaleFormat,
    stats: PlaneStats | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """uint8 CPU scale plane of ``shape`` ([E, N, KB] or [N, KB]) for ``fmt``, deterministic from ``seed``.

    ``stats`` defaults to SEED_REGIME for MXFP4 and NVFP4_TYPICAL for NVFP4.
    """
    fmt = scale_format(fmt)
    shape = tuple(int(d) for d in shape)
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise ValueError(f"synthetic_scale_plane: shape must be [E, N, KB] or [N, KB] with sizes >= 1, got {shape}")
    if stats is None:
        stats = NVFP4_TYPICAL if fmt == NVFP4 else SEED_REGIME
    experts, n, kb = (1, *shape) if len(shape) == 2 else shape
    gen = torch.Generator().manual_seed(seed)

    magnitude = _row_magnitudes(experts, n, stats, gen)  # float32 [E*N], binades
    if fmt == MXFP4:
        plane = _mxfp4_rows(magnitude, kb, stats, gen)
    elif fmt == NVFP4:
        plane = _nvfp4_rows(magnitude, kb, stats, gen)
    else:
        raise ValueError(f"synthetic_scale_plane: no generator for format {fmt.name}")
    _add_special_content(plane, fmt, stats, gen)
    return plane.view(shape)


def synthetic_fp4_values(shape_values: tuple[int, ...] | torch.Size, seed: int = 0) -> torch.Tensor:
    """uint8 tensor of ``shape_values`` holding uniformly random packed E2M1 code pairs, deterministic from seed."""
    shape_values = tuple(int(d) for d in shape_values)
    numel = math.prod(shape_values)
    gen = torch.Generator().manual_seed(seed)
    # Full-range int64 draws give 8 random bytes each, ~5x faster than drawing bytes one at a time.
    words = torch.empty((numel + 7) // 8, dtype=torch.int64).random_(-(2**63), None, generator=gen)
    return words.view(torch.uint8)[:numel].view(shape_values)


def best_row_bases(plane: torch.Tensor, width: int = 1) -> torch.Tensor:
    """Per row, the codec's base byte for offset width ``width`` (csf_codec.rowbase), as int16 of plane.shape[:-1]."""
    rows = plane.reshape(-1, plane.shape[-1])
    return row_bases(rows, width).to(torch.int16).view(plane.shape[:-1])


def measure_window_fraction(plane: torch.Tensor, width: int = 1) -> float:
    """Fraction of scales in [base, base + 2**width - 1] of their row, with the codec's row bases."""
    rows = plane.reshape(-1, plane.shape[-1])
    d = rows.to(torch.int16) - row_bases(rows, width).to(torch.int16)[:, None]
    return float(((d >= 0) & (d < (1 << width))).sum()) / max(plane.numel(), 1)


# --- row model ------------------------------------------------------------------------------------------------


def _row_magnitudes(experts: int, n: int, stats: PlaneStats, gen: torch.Generator) -> torch.Tensor:
    length = stats.row_correlation_rows
    white = torch.randn((experts, n + length - 1), generator=gen)
    csum = torch.nn.functional.pad(white.cumsum(dim=1), (1, 0))
    smooth = (csum[:, length:] - csum[:, :-length]) / math.sqrt(length)  # unit variance, corr 1 - 1/L
    expert = torch.randn((experts, 1), generator=gen) * stats.expert_base_spread
    magnitude = (expert + stats.row_base_spread * smooth).reshape(-1)
    outlier = torch.rand(magnitude.shape, generator=gen) < stats.outlier_row_fraction
    lo, hi = stats.outlier_row_shift
    shift = torch.randint(lo, hi + 1, magnitude.shape, generator=gen).to(torch.float32)
    return magnitude + outlier * shift


def _random_int16(count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` uniform int16 (4 per int64 draw): 1/65536 resolution is plenty for the probabilities used."""
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(2**63), None, generator=gen)
    return words.view(torch.int16)[:count]


def _threshold(p: torch.Tensor | float) -> torch.Tensor:
    """int16 t such that P(uniform int16 < t) = p (to 1/65536)."""
    t = torch.as_tensor(p, dtype=torch.float64) * 65536.0 - 32768.0
    return t.round().clamp(-32768, 32767).to(torch.int16)


def _row_chunks(rows: int, kb: int, elements: int = _CHUNK_ELEMENTS) -> Iterator[slice]:
    step = max(1, elements // kb)
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def _mxfp4_rows(magnitude: torch.Tensor, kb: int, stats: PlaneStats, gen: torch.Generator) -> torch.Tensor:
    rows = magnitude.numel()
    # Bases stay in [6, 250] so that far exceptions (base-6 .. base+4) never leave [0, 254]; the byte
    # arithmetic below is then plain uint8 with no clamping. Rows at the range ends are special content.
    base = (stats.row_base_center + magnitude).round().clamp(6, 250).to(torch.uint8)
    upper = stats.upper_fraction + stats.upper_fraction_spread * (2 * torch.rand(rows, generator=gen) - 1)
    in_window: torch.Tensor | float = stats.in_window_fraction
    if stats.exception_row_sigma > 0:  # drawn only then: the other presets keep their planes
        sigma = stats.exception_row_sigma
        factor = torch.exp(sigma * torch.randn(rows, generator=gen) - sigma * sigma / 2)
        in_window = 1.0 - ((1.0 - stats.in_window_fraction) * factor).clamp(max=0.5)
    upper_t = _threshold(in_window * upper.clamp(0.0, 1.0)).unsqueeze(1)
    exception_t = _threshold(in_window)
    if exception_t.dim():
        exception_t = exception_t.unsqueeze(1)
    near_low_t = _threshold(stats.near_exception_share * stats.low_exception_share)
    near_t = _threshold(stats.near_exception_share)

    plane = torch.empty((rows, kb), dtype=torch.uint8)
    for sl in _row_chunks(rows, kb):
        draw = _random_int16((sl.stop - sl.start) * kb, gen).view(-1, kb)
        out = plane[sl]
        torch.add(base[sl].unsqueeze(1), draw < upper_t[sl], out=out)  # base, or base+1 below the row's share
        where = (draw >= (exception_t[sl] if exception_t.dim() else exception_t)).view(-1).nonzero().squeeze(1)
        if where.numel():
            kind = _random_int16(where.numel(), gen)
            far = _FAR_OFFSETS[torch.randint(len(_FAR_OFFSETS), (where.numel(),), generator=gen)]
            offset = torch.where(kind < near_low_t, -1, torch.where(kind < near_t, 2, far))
            row_base = base[sl][torch.div(where, kb, rounding_mode="floor")].to(torch.int16)
            out.view(-1)[where] = (row_base + offset).to(torch.uint8)
    return plane


def _max_abs_normal_quantiles(count: int) -> torch.Tensor:
    """Midpoint quantiles of max(|z_1..z_16|), z ~ N(0,1): CDF erf(x/sqrt 2)**16."""
    u = (torch.arange(count, dtype=torch.float64) + 0.5) / count
    return (math.sqrt(2.0) * torch.special.erfinv(u ** (1.0 / NVFP4.block_size))).to(torch.float32)


def _nvfp4_rows(magnitude: torch.Tensor, kb: int, stats: PlaneStats, gen: torch.Generator) -> torch.Tensor:
    rows = magnitude.numel()
    quantiles = _max_abs_normal_quantiles(_NVFP4_QUANTILES)
    # block scale = amax / 6 / global, global = amax_ratio * median sigma / (6 * 448), median sigma = 1.
    row_factor = (E4M3_MAX / stats.nvfp4_amax_ratio * torch.exp2(magnitude)).unsqueeze(1)

    plane = torch.empty((rows, kb), dtype=torch.uint8)
    for sl in _row_chunks(rows, kb):
        draw = _random_int16((sl.stop - sl.start) * kb, gen).view(-1, kb)
        block_scale = torch.take(quantiles, (draw & (_NVFP4_QUANTILES - 1)).long()) * row_factor[sl]
        # Tail blocks: a binomial count at uniform positions (a rare repeat keeps one boost), cheaper than a
        # full-size draw and compare.
        count = int(
            torch.binomial(torch.tensor(float(draw.numel())), torch.tensor(stats.nvfp4_tail_fraction), generator=gen)
        )
        if count:
            tail = torch.randint(draw.numel(), (count,), generator=gen)
            boost = torch.empty(count).exponential_(1.0 / stats.nvfp4_tail_binades, generator=gen)
            block_scale.view(-1)[tail] *= torch.exp2(boost)
        plane[sl] = float_to_e4m3_bytes(block_scale.clamp_(min=2.0**-6))
    return plane


def _add_special_content(plane: torch.Tensor, fmt: ScaleFormat, stats: PlaneStats, gen: torch.Generator) -> None:
    rows, kb = plane.shape
    wanted = stats.zero_rows + stats.clamped_rows + stats.nan_scales
    if wanted == 0:
        return
    if wanted > rows:
        raise ValueError(f"synthetic_scale_plane: {wanted} special rows requested but the plane has {rows} rows")
    picked = torch.randperm(rows, generator=gen)[:wanted]
    zero, clamped, nan = picked.split([stats.zero_rows, stats.clamped_rows, stats.nan_scales])

    plane[zero] = 0
    if clamped.numel():
        codes = plane[clamped].to(torch.int16)
        if fmt == MXFP4:
            centre, high_centre, top = best_row_bases(codes.to(torch.uint8)), 254, E8M0_NAN_BYTE
        else:
            centre, high_centre, top = codes.median(dim=1).values, 0x7E, E4M3_NAN_BYTE
        target = torch.zeros_like(centre)  # the first half (rounded up) stay low, at 0
        target[(clamped.numel() + 1) // 2 :] = high_centre
        codes += (target - centre).unsqueeze(1)
        plane[clamped] = codes.clamp_(0, top).to(torch.uint8)
    if nan.numel():
        cols = torch.randint(kb, (nan.numel(),), generator=gen)
        plane[nan, cols] = E8M0_NAN_BYTE if fmt == MXFP4 else E4M3_NAN_BYTE
