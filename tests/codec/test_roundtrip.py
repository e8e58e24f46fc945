"""Both CSF forms round-trip every geometry bit-exactly, tails and odd content included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csf_codec import MXFP4, NVFP4, decode_compact, decode_inline, encode_compact, encode_inline, inline_from_payload
from csf_codec.tile_layout import TILE_ROWS, InlineGeometry, row_to_slot, slot_to_row

from .planes_for_tests import clustered_plane, special_rows


def _roundtrip(plane: torch.Tensor, fmt, row_group=None) -> None:
    compact = encode_compact(plane, fmt)
    assert torch.equal(decode_compact(compact.payload), plane)
    inline = encode_inline(plane, fmt, row_group=row_group)
    assert torch.equal(decode_inline(inline), plane)
    assert torch.equal(decode_inline(inline_from_payload(inline.to_payload())), plane)


@pytest.mark.parametrize(
    ("shape", "row_group"),
    [
        ((2, 1152, 160), 576),  # DS4.1 W13 per rank: two 576-row groups, each with a 64-row tail
        ((2, 1152, 160), None),
        ((2, 5120, 18), None),  # DS4.1 W2: K = 576 gives 18 scale columns, a 2-column tail tile
        ((576, 18), None),  # dense 2-D weight
        ((3, 64, 3), None),
        ((1, 1, 1), None),
        ((4, 130, 5), 65),
    ],
)
@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
def test_tails_and_groups(shape, row_group, fmt):
    window = fmt.row_base_width
    plane = special_rows(clustered_plane(shape, seed=hash(shape) % 1000, window=window), seed=1)
    _roundtrip(plane, fmt, row_group)


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("kind", ["zeros", "nan", "clamped_low", "clamped_high", "random", "dense_exceptions"])
def test_extreme_content(fmt, kind):
    g = torch.Generator().manual_seed(7)
    shape = (3, 200, 22)
    plane = {
        "zeros": lambda: torch.zeros(shape, dtype=torch.uint8),
        "nan": lambda: torch.full(shape, 0xFF, dtype=torch.uint8),
        "clamped_low": lambda: torch.randint(0, 2, shape, generator=g).to(torch.uint8),
        "clamped_high": lambda: torch.randint(254, 256, shape, generator=g).to(torch.uint8),
        "random": lambda: torch.randint(0, 256, shape, generator=g).to(torch.uint8),
        "dense_exceptions": lambda: clustered_plane(shape, seed=3, exception_rate=0.3),
    }[kind]()
    _roundtrip(plane, fmt)


def test_random_planes_go_raw_and_stay_exact():
    plane = torch.randint(0, 256, (2, 256, 16), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    inline = encode_inline(plane, MXFP4)
    assert inline.raw_tiles == inline.geometry.tiles
    assert torch.equal(decode_inline(inline), plane)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    experts=st.integers(1, 3),
    rows=st.integers(1, 300),
    cols=st.integers(1, 40),
    groups=st.sampled_from([1, 2, 3]),
    rate=st.sampled_from([0.0, 0.003, 0.02, 0.1, 0.5]),
    spread=st.integers(0, 20),
    fmt=st.sampled_from([MXFP4, NVFP4]),
    two_d=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_randomized_geometries(experts, rows, cols, groups, rate, spread, fmt, two_d, seed):
    rows = rows * groups
    shape = (rows, cols) if two_d else (experts, rows, cols)
    plane = clustered_plane(shape, seed=seed, exception_rate=rate, spread=spread, window=fmt.row_base_width)
    if seed % 3 == 0:
        plane = special_rows(plane, seed=seed)
    _roundtrip(plane, fmt, row_group=rows // groups)


def test_slot_order_is_the_wgmma_fragment_order():
    # lane l of warp w holds rows 16 w + l // 4 and + 8 of each m64 half: four consecutive slots per quad
    for warp in range(4):
        for lane in range(32):
            slots = [32 * warp + 4 * (lane // 4) + k for k in range(4)]
            rows = [slot_to_row(s) for s in slots]
            q = lane // 4
            assert rows == [16 * warp + q, 16 * warp + q + 8, 64 + 16 * warp + q, 64 + 16 * warp + q + 8]
    assert sorted(row_to_slot(r) for r in range(TILE_ROWS)) == list(range(TILE_ROWS))


def test_geometry_counts_tails():
    geo = InlineGeometry.for_shape((384, 1152, 18), 576)
    assert (geo.groups, geo.blocks_per_group, geo.row_blocks) == (768, 5, 3840)
    assert (geo.full_col_tiles, geo.tail_cols, geo.col_tiles) == (4, 2, 5)
    rows = geo.block_rows()
    assert int((rows[4] >= 0).sum()) == 64  # the 64-row group tail
    assert int((rows >= 0).sum()) == 384 * 1152


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_clamped_row_bases_are_the_stored_bases(fmt):
    """A zero row among normal rows gets its block's clamped base; every row's base is base_ref + delta."""
    from csf_codec import inline as inline_mod
    from csf_codec.inline import clamped_row_bases
    from csf_codec.rowbase import row_bases
    from csf_codec.synthetic import SPECIAL_CONTENT, synthetic_scale_plane

    plane = synthetic_scale_plane((3, 320, 12), fmt, SPECIAL_CONTENT, seed=5)
    inline = encode_inline(plane, fmt, row_group=160)
    delta = inline_mod._unpack_deltas(inline.base_delta, inline.fmt).to(torch.int16)
    slot_base = inline.base_ref[:, None].to(torch.int16) + delta
    br = inline.geometry.block_rows()
    want = torch.zeros(plane.shape[0] * plane.shape[1], dtype=torch.int16)
    want[br[br >= 0]] = slot_base[br >= 0]
    got = clamped_row_bases(plane, fmt, row_group=160)
    assert torch.equal(got.to(torch.int16), want)
    natural = row_bases(plane.reshape(-1, 12), 1 if fmt == "mxfp4" else 4)
    clamped = got != natural
    if fmt == "mxfp4":  # zero and clamped rows leave their block's window (seeded: rows 7 and 501 among them)
        assert bool(clamped[7]) and bool(clamped[501])
    else:
        assert not clamped.any()  # NVFP4 stores every row's base outright
