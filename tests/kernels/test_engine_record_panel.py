"""The torch twin of the engine's inline scale decoder fills, step by step, exactly the scale panel of the plane
the records encode (engine_scale_panel), for every K step and row block."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4, NVFP4
from csf_codec.engine_records import encode_engine_records
from csf_codec.synthetic import DOWN_PROJ_DENSE, EXCEPTION_DENSE, SEED_REGIME, SPECIAL_CONTENT, synthetic_scale_plane
from csf_kernels.moe.engine_panels import engine_scale_panel
from csf_kernels.moe.engine_record_panel import decode_record_step, empty_scale_panel
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


def test_twin_refuses_nvfp4_until_its_panel_exists():
    rec = encode_engine_records(synthetic_scale_plane((1, 128, 8), NVFP4, seed=8), NVFP4)
    with pytest.raises(NotImplementedError):
        decode_record_step(rec, 0, 0, torch.zeros(4, 256, dtype=torch.uint8))
