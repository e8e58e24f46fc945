"""Synthetic scale planes hit their target statistics, deterministically (synthetic.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from csf_codec.formats import MXFP4, NVFP4
from csf_codec.quantize import quantize_nvfp4
from csf_codec.synthetic import (
    EXCEPTION_DENSE,
    NVFP4_TYPICAL,
    SEED_REGIME,
    SPECIAL_CONTENT,
    PlaneStats,
    best_row_bases,
    measure_window_fraction,
    synthetic_fp4_values,
    synthetic_scale_plane,
)

# DS4.1-TP4 expert planes, scaled down along E so the statistics tests stay fast.
W13_SMALL = (16, 1152, 160)
W2_SMALL = (16, 5120, 18)


def _exceptions(plane: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(offset from the row's base, mask of scales outside [base, base+1])."""
    offset = plane.to(torch.int16) - best_row_bases(plane, 1).unsqueeze(-1)
    return offset, (offset < 0) | (offset > 1)


def _tile_fraction_with_exceptions(plane: torch.Tensor) -> float:
    """Share of full 128x4 tiles (within each expert's [N, KB]) that hold at least one exception."""
    _, exc = _exceptions(plane)
    e, n, kb = exc.shape
    tiles = exc[:, : n // 128 * 128, : kb // 4 * 4].reshape(e, n // 128, 128, kb // 4, 4)
    return float(tiles.any(dim=4).any(dim=2).float().mean())


def _central_code_range(plane: torch.Tensor) -> torch.Tensor:
    """Per row, codes spanned by the central ~98% of the row's scales."""
    rows = plane.reshape(-1, plane.shape[-1]).to(torch.int16).sort(dim=1).values
    k = rows.shape[1]
    lo, hi = rows[:, int(0.01 * k)], rows[:, max(int(0.99 * k) - 1, 0) if k >= 100 else k - 1]
    return (hi - lo + 1).float()


# --- measurement ------------------------------------------------------------------------------------------------


def test_measure_window_fraction_by_hand() -> None:
    plane = torch.tensor([[5, 5, 6, 9], [0, 255, 255, 1], [7, 7, 7, 7]], dtype=torch.uint8)
    assert best_row_bases(plane).tolist() == [5, 0, 6]  # lowest base among equal counts
    assert measure_window_fraction(plane) == pytest.approx((3 + 2 + 4) / 12)
    assert measure_window_fraction(plane, width=2) == pytest.approx((3 + 2 + 4) / 12)  # [3..6] holds 5, 5, 6
    assert measure_window_fraction(plane, width=4) == pytest.approx((4 + 2 + 4) / 12)  # [0..15] holds all of row 0
    assert measure_window_fraction(plane, width=8) == 1.0
    assert best_row_bases(plane, width=0).tolist() == [5, 255, 7]
    assert best_row_bases(plane.view(3, 1, 4)).shape == (3, 1)


# --- MXFP4 presets ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [W13_SMALL, W2_SMALL])
@pytest.mark.parametrize(("stats", "target"), [(SEED_REGIME, 0.995), (EXCEPTION_DENSE, 0.98)])
def test_mxfp4_presets_hit_window_fraction(shape: tuple[int, ...], stats: PlaneStats, target: float) -> None:
    plane = synthetic_scale_plane(shape, MXFP4, stats, seed=3)
    assert plane.shape == shape and plane.dtype == torch.uint8 and plane.device.type == "cpu"
    assert abs(measure_window_fraction(plane) - target) <= 0.002
    assert not plane.eq(0xFF).any()  # no NaN unless asked for


def test_exception_dense_spreads_over_tiles() -> None:
    assert _tile_fraction_with_exceptions(synthetic_scale_plane(W13_SMALL, "mxfp4", EXCEPTION_DENSE)) >= 0.9
    assert _tile_fraction_with_exceptions(synthetic_scale_plane(W13_SMALL, "mxfp4", SEED_REGIME)) >= 0.7


def test_mxfp4_exception_and_base_statistics() -> None:
    stats = EXCEPTION_DENSE
    plane = synthetic_scale_plane(W13_SMALL, "mxfp4", stats, seed=5)
    offset, exc = _exceptions(plane)
    near = ((offset == -1) | (offset == 2)) & exc
    assert float(near.sum()) / float(exc.sum()) >= 0.85  # mostly base-1 / base+2
    assert (exc & ~near).any() and offset.min() <= -4  # a few far values
    in_window = ~exc
    upper = float((offset == 1).sum()) / float(in_window.sum())
    assert abs(upper - stats.upper_fraction) <= 0.03

    bases = best_row_bases(plane).float()  # [E, N]
    assert 117 <= float(bases.median()) <= 123
    central = bases.flatten().quantile(torch.tensor([0.05, 0.95]))
    assert central[0] >= 114 and central[1] <= 126
    adjacent = torch.corrcoef(torch.stack([bases[:, :-1].flatten(), bases[:, 1:].flatten()]))[0, 1]
    assert adjacent >= 0.6  # bases of adjacent rows are correlated
    high = float((bases >= bases.median() + 5).float().mean())
    assert 0.0005 <= high <= 0.02  # outlier rows exist but are rare


def test_planes_are_deterministic_from_seed() -> None:
    for fmt in (MXFP4, NVFP4):
        a = synthetic_scale_plane((4, 256, 40), fmt, SPECIAL_CONTENT, seed=11)
        b = synthetic_scale_plane((4, 256, 40), fmt, SPECIAL_CONTENT, seed=11)
        c = synthetic_scale_plane((4, 256, 40), fmt, SPECIAL_CONTENT, seed=12)
        assert torch.equal(a, b) and not torch.equal(a, c)
    two_d = synthetic_scale_plane((300, 20), "mxfp4", seed=1)
    assert two_d.shape == (300, 20) and torch.equal(two_d, synthetic_scale_plane((300, 20), "mxfp4", seed=1))


# --- special content --------------------------------------------------------------------------------------------


def test_mxfp4_special_rows() -> None:
    stats = replace(SEED_REGIME, zero_rows=5, clamped_rows=4, nan_scales=7)
    rows = synthetic_scale_plane((8, 512, 36), "mxfp4", stats, seed=2).view(-1, 36)
    assert int(rows.eq(0).all(dim=1).sum()) == 5
    bases = best_row_bases(rows)
    low = (bases == 0) & ~rows.eq(0).all(dim=1)
    high = rows.eq(254).any(dim=1) & rows.eq(255).any(dim=1)
    assert int(low.sum()) == 2 and int(high.sum()) == 2
    assert rows[low].max() <= 5 and rows[high].min() >= 248
    outside = rows[~high]
    assert int(outside.eq(0xFF).sum()) == 7 and int(outside.eq(0xFF).any(dim=1).sum()) == 7


def test_nvfp4_special_rows() -> None:
    stats = replace(NVFP4_TYPICAL, zero_rows=3, clamped_rows=2, nan_scales=6)
    rows = synthetic_scale_plane((4, 512, 36), "nvfp4", stats, seed=2).view(-1, 36)
    assert int(rows.eq(0).all(dim=1).sum()) == 3
    high = rows.eq(0x7E).any(dim=1) & rows.eq(0x7F).any(dim=1)
    assert int(high.sum()) == 1
    low = rows.to(torch.int16).median(dim=1).values <= 2
    assert int((low & ~rows.eq(0).all(dim=1)).sum()) == 1
    assert int(rows[~high].eq(0x7F).sum()) == 6
    assert rows.max() <= 0x7F  # scales are positive: no sign bit


def test_too_many_special_rows_is_an_error() -> None:
    with pytest.raises(ValueError, match="special rows"):
        synthetic_scale_plane((10, 8), "mxfp4", replace(SEED_REGIME, zero_rows=11))


@pytest.mark.parametrize(
    "bad",
    [{"in_window_fraction": 1.5}, {"upper_fraction": -0.1}, {"row_correlation_rows": 0},
     {"outlier_row_shift": (4, 2)}, {"zero_rows": -1}, {"nvfp4_amax_ratio": 0.0}],
)  # fmt: skip
def test_plane_stats_validation(bad: dict) -> None:
    with pytest.raises(ValueError):
        PlaneStats(**bad)


# --- NVFP4 ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [5120, 576])
def test_nvfp4_typical_matches_quantized_gaussian_weights(k: int) -> None:
    plane = synthetic_scale_plane((4, 512, k // 16), "nvfp4", seed=4)
    assert plane.max() <= 0x7E and not plane.eq(0x7F).any()
    spread = _central_code_range(plane)
    assert 10 <= float(spread.median()) <= 14  # each row spans ~10-14 consecutive codes

    # Reference: real Gaussian weights, rows with the same log-normal spread, through quantize_nvfp4.
    g = torch.Generator().manual_seed(k)
    sigma = torch.exp2(torch.randn((512, 1), generator=g) * NVFP4_TYPICAL.row_base_spread)
    real = quantize_nvfp4(torch.randn((512, k), generator=g) * sigma).scales
    assert abs(float(spread.median()) - float(_central_code_range(real).median())) <= 2
    assert abs(measure_window_fraction(plane, 4) - measure_window_fraction(real, 4)) <= 0.01
    assert measure_window_fraction(plane, NVFP4.row_base_width) >= 0.99


# --- FP4 values and speed ---------------------------------------------------------------------------------------


def test_synthetic_fp4_values() -> None:
    v = synthetic_fp4_values((3, 100, 2561), seed=9)
    assert v.shape == (3, 100, 2561) and v.dtype == torch.uint8
    assert torch.equal(v, synthetic_fp4_values((3, 100, 2561), seed=9))
    assert not torch.equal(v, synthetic_fp4_values((3, 100, 2561), seed=10))
    nibbles = torch.cat([(v & 0x0F).flatten(), (v >> 4).flatten()])
    freq = torch.bincount(nibbles.long(), minlength=16).float() / nibbles.numel()
    assert (freq - 1 / 16).abs().max() < 0.002


@pytest.mark.slow
def test_ds41_tp4_planes_generate_quickly() -> None:
    start = time.perf_counter()
    w13 = synthetic_scale_plane((384, 1152, 160), "mxfp4", seed=0)
    w2 = synthetic_scale_plane((384, 5120, 18), "mxfp4", seed=1)
    elapsed = time.perf_counter() - start
    assert w13.numel() + w2.numel() == 106_168_320
    assert elapsed < 20.0, f"{elapsed:.1f}s"  # ~3-4 s on 2 cores; generous for loaded CI machines
