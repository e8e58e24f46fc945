"""The inline decoder warp's algorithm, lane by lane on the CPU (record_decoder_model: the program's reads and u32
arithmetic with its shared lane formulas), decodes every record as the torch twin does: raw and selector records,
exceptions of every code and escapes, tail tiles, MXFP4 and NVFP4, with stale bytes from earlier records in the
staging slots; and the slot rows the warp fills are the tile layout's."""

from __future__ import annotations

import random

import pytest
import torch

from csf_codec.engine_records import encode_engine_records
from csf_codec.synthetic import EXCEPTION_DENSE, synthetic_scale_plane
from csf_codec.tile_layout import TILE_ROWS, InlineGeometry
from csf_kernels.moe.engine_record_panel import record_tile
from csf_kernels.moe.kernels.engine_record_lanes import slot_row, spread_bits, spread_nibbles, spread_pairs

from .record_decoder_model import RECORD_BYTES, decode_block
from .test_engine_record_panel import CATALOG_PLANES, PLANES, _catalog_plane


def _check(records, blocks) -> None:
    rnd = random.Random(len(blocks))
    staging = [bytearray(rnd.randbytes(RECORD_BYTES)) for _ in range(4)]  # stale bytes
    geo = records.geometry
    taken = 0
    for rb in blocks:
        real = geo.block_rows()[rb] >= 0
        for j, tile in enumerate(decode_block(records, rb, staging, taken)):
            want = record_tile(records, rb, j)
            got = tile[:, : want.shape[1]]
            assert torch.equal(got[real], want[real]), f"row block {rb}, record {j}"
        taken += geo.col_tiles


@pytest.mark.parametrize("name,plane,group", PLANES, ids=[p[0] for p in PLANES])
def test_model_decodes_as_the_twin(name, plane, group):
    """The twin's planes cut to an even column count: the engine's K steps take MXFP4 columns in twos, so its tail
    tile has 2 columns (the program assumes 2 or 4)."""
    plane = plane[..., : plane.shape[-1] // 2 * 2].contiguous()
    records = encode_engine_records(plane, "mxfp4", row_group=group, name=name)
    _check(records, range(records.geometry.row_blocks))


@pytest.mark.parametrize(("fmt", "label", "rows", "cols"), CATALOG_PLANES, ids=[p[1] for p in CATALOG_PLANES])
def test_model_decodes_catalog_planes(fmt, label, rows, cols):
    """The first row block (its first tile raw), the last (a tail when 64 rows) and one between."""
    plane = _catalog_plane(fmt, rows, cols, seed=rows + cols)
    records = encode_engine_records(plane, fmt, row_group=rows, name=label)
    last = records.geometry.row_blocks - 1
    _check(records, sorted({0, last // 2, last}))


def test_model_decodes_exceptions_and_escapes_in_both_formats():
    for fmt, cols in (("mxfp4", 18), ("nvfp4", 36)):
        plane = synthetic_scale_plane((1, 384, cols), fmt, EXCEPTION_DENSE if fmt == "mxfp4" else None, seed=9)
        plane[0, 7, 3] = 0 if fmt == "mxfp4" else 0x7E  # far from any window: an escape
        records = encode_engine_records(plane, fmt, row_group=384)
        assert records.exceptions > 0
        _check(records, range(records.geometry.row_blocks))


def test_slot_rows_are_the_tile_layouts():
    rows = InlineGeometry.for_shape((TILE_ROWS, 4), TILE_ROWS).block_rows()[0]
    assert [slot_row(s // 4, s % 4) for s in range(TILE_ROWS)] == rows.tolist()


@pytest.mark.parametrize("w", [1, 2, 4])
def test_full_tile_spreads_equal_the_field_loop(w):
    # every group of four w-bit fields, with garbage above them (the program shifts whole words down)
    spread = {1: spread_bits, 2: spread_pairs, 4: spread_nibbles}[w]
    for g in range(1 << (4 * w)):
        want = sum(((g >> (c * w)) & ((1 << w) - 1)) << (8 * c) for c in range(4))
        assert spread(g | (0xABCD << (4 * w))) == want, (w, g)
