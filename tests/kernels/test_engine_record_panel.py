"""The torch twin of the engine's inline scale decoder fills, step by step, exactly the scale panel of the plane
the records encode (engine_scale_panel), for every K step and row block, MXFP4 and NVFP4, on every catalog plane
shape."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4
from csf_codec.engine_records import decode_engine_records, encode_engine_records
from csf_codec.synthetic import DOWN_PROJ_DENSE, EXCEPTION_DENSE, SEED_REGIME, SPECIAL_CONTENT, synthetic_scale_plane
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.engine_panels import engine_scale_panel, panel_scales
from csf_kernels.moe.engine_record_panel import decode_record_step, empty_scale_panel
from csf_kernels.moe.engine_specs import engine_serves
from tests.codec.planes_for_tests import clustered_plane, special_rows

PLANES = [
    ("seed-w13", synthetic_scale_plane((2, 1152, 20), MXFP4, SEED_REGIME, seed=1), 576),
    ("down-proj-w2", synthetic_scale_plane((1, 640, 18), MXFP4, DOWN_PROJ_DENSE, seed=2), None),
    ("dense", synthetic_scale_plane((1, 256, 16), MXFP4, EXCEPTION_DENSE, seed=3), None),
    ("special", synthetic_scale_plane((2, 300, 13), MXFP4, SPECIAL_CONTENT, seed=4), 150),
    ("far-and-raw", special_rows(clustered_plane((1, 200, 11), seed=5, exception_rate=0.4, spread=30), seed=6), None),
    ("random", torch.randint(0, 256, (1, 130, 7), generator=torch.Generator().manual_seed(7)).to(torch.uint8), None),
]


@pytest.mark.parametrize("name,plane,group", PLANES, ids=[p[0] for p in PLANES])
def test_twin_fills_the_scale_panel(name, plane, group):
    rec = encode_engine_records(plane, MXFP4, row_group=group, name=name)
    want = engine_scale_panel(plane.reshape(-1, plane.shape[-1]))
    panel = empty_scale_panel(rec)
    assert panel.shape == want.shape
    for step in range(panel.shape[0]):
        for block in range(rec.geometry.row_blocks):
            decode_record_step(rec, block, step, panel)
        assert torch.equal(panel[step], want[step]), f"step {step}"


def test_the_planes_hold_raw_and_selector_records():
    modes = {"sel1": 0, "sel2": 0, "sel4": 0, "raw": 0}
    for name, plane, group in PLANES:
        for k, v in encode_engine_records(plane, MXFP4, row_group=group, name=name).mode_counts().items():
            modes[k] += v
    assert modes["raw"] and modes["sel1"], modes


def _catalog_planes() -> list[tuple[str, str, int, int]]:
    """(fmt, id, rows, scale columns) of every scale plane the engine serves in the catalog: W13 (2N rows, H K) and
    W2 (H rows, N K), once per distinct shape."""
    seen = {}
    for geo in load_catalog().moe:
        if not engine_serves(geo):
            continue
        block = panel_scales(geo.fmt.name).block
        for name, rows, k in (("w13", 2 * geo.intermediate, geo.hidden), ("w2", geo.hidden, geo.intermediate)):
            seen.setdefault((geo.fmt.name, rows, k // block), f"{geo.name}/{name}")
    return [(fmt, label, rows, cols) for (fmt, rows, cols), label in sorted(seen.items())]


CATALOG_PLANES = _catalog_planes()


def _catalog_plane(fmt: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    """One expert's plane with zero rows, clamped rows and NaN scales (MXFP4) or NVFP4's typical spread, its first
    tile (128 rows x 4 columns) random bytes: a raw record."""
    stats = SPECIAL_CONTENT if fmt == "mxfp4" else None
    plane = synthetic_scale_plane((1, rows, cols), fmt, stats, seed=seed)
    g = torch.Generator().manual_seed(seed)
    plane[0, :128, :4] = torch.randint(0, 256, (128, 4), generator=g).to(torch.uint8)
    return plane


@pytest.mark.parametrize(("fmt", "label", "rows", "cols"), CATALOG_PLANES, ids=[p[1] for p in CATALOG_PLANES])
def test_twin_fills_every_catalog_planes_panel(fmt, label, rows, cols):
    """The twin, step by step, writes the codec's decode of the records into the panel: the native panel, for
    each catalog plane shape (grouped by expert, as the engine encodes them), raw and tail tiles included."""
    plane = _catalog_plane(fmt, rows, cols, seed=rows + cols)
    rec = encode_engine_records(plane, fmt, row_group=rows, name=label)
    decoded = decode_engine_records(rec, name=label)
    assert rec.raw_tiles >= 1
    want = engine_scale_panel(decoded.reshape(-1, cols), fmt)
    panel = empty_scale_panel(rec)
    for step in range(panel.shape[0]):
        for block in range(rec.geometry.row_blocks):
            decode_record_step(rec, block, step, panel)
    assert torch.equal(panel, want)


def test_catalog_planes_hold_tail_tiles_in_both_formats():
    assert {fmt for fmt, *_ in CATALOG_PLANES} == {"mxfp4", "nvfp4"}
    assert any(cols % 4 for fmt, _, _, cols in CATALOG_PLANES if fmt == "mxfp4")  # gpt-oss's K = 2880: 90 columns


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_nvfp4_and_mxfp4_twins_on_small_planes(fmt):
    plane = synthetic_scale_plane((2, 192, 8 if fmt == "mxfp4" else 16), fmt, seed=8)
    rec = encode_engine_records(plane, fmt, row_group=192)
    want = engine_scale_panel(plane.reshape(-1, plane.shape[-1]), fmt)
    panel = empty_scale_panel(rec)
    for step in range(panel.shape[0]):
        for block in range(rec.geometry.row_blocks):
            decode_record_step(rec, block, step, panel)
    assert torch.equal(panel, want)
