"""Which expansion program a plane gets, and what its CuTe launch carries (CPU: launches are built, not run)."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4, NVFP4, encode_inline
from csf_codec.synthetic import synthetic_scale_plane
from csf_kernels.expand.heuristics import auto_engine
from csf_kernels.expand.launch import (
    DIVIDEND_LIMIT,
    ENGINES,
    division_magic,
    exception_caps,
    inline_expansion_launches,
)
from csf_kernels.expand.specs import (
    CUTE_ROW_BLOCK_EXPANDER,
    CUTE_ROW_EXPANDER,
    EXPAND_INLINE,
    row_block_covers,
    row_block_expander_spec,
    row_block_group_tiles,
    row_block_groups,
    row_block_warps,
    row_expander_spec,
)
from csf_kernels.runtime import config as runtime_settings
from csf_kernels.runtime.cute_so import TensorRef


def _inline(shape, fmt=MXFP4, group=None):
    return encode_inline(synthetic_scale_plane(shape, fmt, seed=3), fmt, row_group=group)


def test_engines_pick_the_programs_the_measurements_chose():
    assert ENGINES[0] == "auto"
    w2 = _inline((4, 512, 18))
    out = torch.empty(w2.shape, dtype=torch.uint8)
    # CPU tensors run only in Triton's interpreter: "auto" keeps Triton there
    (auto,) = inline_expansion_launches(w2, out)
    assert auto.spec.kernel == EXPAND_INLINE.kernel
    (cute,) = inline_expansion_launches(w2, out, engine="cute")
    assert cute.spec == row_expander_spec(MXFP4, 8, 2)  # narrow, even columns: 16-bit image stores
    assert cute.grid[1:] == (1, 4)  # one column group, four experts
    w13 = _inline((2, 1152, 160), group=576)
    (wide,) = inline_expansion_launches(w13, torch.empty(w13.shape, dtype=torch.uint8), engine="cute")
    assert wide.spec == row_expander_spec(MXFP4, 32, 4) and wide.grid[1] == 2  # 160 columns: two groups
    with pytest.raises(ValueError, match="engine must be one of"):
        inline_expansion_launches(w2, out, engine="fast")


def test_auto_takes_cute_for_narrow_rows_and_rows_triton_stores_in_small_pieces():
    assert auto_engine(18, 384 * 5120 * 18, 0) == "cute"  # DS4.1-TP4 W2: one warp per row block
    assert auto_engine(160, 384 * 1152 * 160, 0) == "triton"  # DS4.1-TP4 W13: 16-byte stores
    assert auto_engine(90, 128 * 5760 * 90, 0) == "cute"  # gpt-oss W13: 2-byte stores
    assert auto_engine(37, 2 * 128 * 37, 0) == "triton"  # odd rows: CuTe does not cover them


def test_cute_refuses_planes_it_does_not_cover():
    odd = _inline((2, 128, 37), NVFP4)
    with pytest.raises(ValueError, match="does not cover"):
        inline_expansion_launches(odd, torch.empty(odd.shape, dtype=torch.uint8), engine="cute")
    (launch,) = inline_expansion_launches(odd, torch.empty(odd.shape, dtype=torch.uint8))
    assert launch.spec.kernel == EXPAND_INLINE.kernel  # odd rows: byte stores, Triton
    w2 = _inline((2, 128, 18))
    with pytest.raises(ValueError, match="does not cover"):  # a store width is a Triton knob
        inline_expansion_launches(w2, torch.empty(w2.shape, dtype=torch.uint8), engine="cute", store=1)


def test_cute_launch_arguments_are_flat_word_views_and_scalars():
    w2 = _inline((4, 512, 18))
    out = torch.empty(w2.shape, dtype=torch.uint8)
    experts = torch.tensor([3, -1, 0], dtype=torch.int32)
    (launch,) = inline_expansion_launches(w2, out, experts=experts, engine="cute")
    tensors = [a for a in launch.args if isinstance(a, torch.Tensor)]
    scalars = [a for a in launch.args if not isinstance(a, torch.Tensor)]
    assert len(tensors) == 8 and len(scalars) == 13 and all(isinstance(s, int) for s in scalars)
    records, out_words = tensors[2], tensors[6]
    assert records.dtype == torch.uint32 and records.dim() == 1 and records.numel() * 4 == w2.records.numel()
    assert out_words.dtype == torch.uint32 and out_words.data_ptr() == out.data_ptr()
    assert tensors[7] is experts
    geo = w2.geometry
    bpe = geo.row_blocks // geo.experts
    assert launch.grid == (-(-bpe // scalars[-2]), 1, 3)  # runs of blocks_per_cta row blocks


def test_with_pointers_drops_views_of_the_callers_buffers_for_cute_launches():
    w2 = _inline((2, 256, 18))
    out = torch.empty(w2.shape, dtype=torch.uint8)
    (launch,) = inline_expansion_launches(w2, out, engine="cute")
    refs = launch.with_pointers((out,))
    assert refs.spec.kernel == CUTE_ROW_EXPANDER
    snap = refs.args[6]
    assert isinstance(snap, TensorRef) and snap.data_ptr() == out.data_ptr() and snap.dtype == torch.uint32
    assert snap.shape == (out.numel() // 4,) and snap.is_contiguous()
    # the CSF arrays are not the caller's per-call buffers: they stay tensors
    assert all(isinstance(a, torch.Tensor) for a in refs.args[:6])


def test_row_block_launch_covers_row_blocks_by_warps_or_by_ctas():
    w13 = _inline((3, 1152, 160), group=576)
    out = torch.empty(w13.shape, dtype=torch.uint8)
    (launch,) = inline_expansion_launches(w13, out, engine="row_block")
    spec = row_block_expander_spec(MXFP4, 160)
    assert launch.spec == spec and spec.kernel == CUTE_ROW_BLOCK_EXPANDER and spec.fact["GT"] == 8
    # 3 experts x 10 row blocks (two row groups of 576 rows), a CTA per block: one warp per 8-tile group
    assert row_block_warps(160) == 5 and launch.grid == (30, 1, 1)
    scalars = [a for a in launch.args if not isinstance(a, torch.Tensor)]
    assert len(scalars) == 13 and scalars[-2] == 30 and scalars[4] == w13.record_bytes // 4  # ctas, then pdl
    assert scalars[6:8] == [division_magic(10), division_magic(5)]  # blocks per expert, per group
    assert scalars[8:10] == [exception_caps(w13.record_bytes, 4), 0]  # capacities per mode; no tail tile
    w2 = _inline((4, 512, 18))
    (launch,) = inline_expansion_launches(w2, torch.empty(w2.shape, dtype=torch.uint8), engine="row_block")
    assert row_block_group_tiles(18) == 4 and row_block_warps(18) == 4 and launch.grid == (4, 1, 1)
    assert launch.args[-3] == 4  # num_experts, then ctas and pdl
    assert launch.args[-5:-3] == (exception_caps(w2.record_bytes, 4), exception_caps(w2.tail_record_bytes, 2))


def test_row_block_launch_waits_first_or_last_as_a_dependent_launch(monkeypatch):
    w2 = _inline((4, 512, 18))

    def pdl(**kwargs) -> int:
        (launch,) = inline_expansion_launches(w2, torch.empty(w2.shape, dtype=torch.uint8), engine="row_block",
                                              **kwargs)  # fmt: skip
        return launch.args[-1]

    monkeypatch.setitem(runtime_settings._settings, "pdl", True)  # the default
    assert pdl() == 1 and pdl(wait="first") == 1 and pdl(wait="last") == 2  # the program's pdl argument
    assert pdl(lets_next_in="end") == 5 and pdl(wait="last", lets_next_in="end") == 6  # + LETS_DEPENDENT_IN_LAST
    monkeypatch.setitem(runtime_settings._settings, "pdl", False)  # dependent launches off: a plain launch either way
    assert pdl(wait="first") == 0 and pdl(wait="last") == 0 and pdl(wait="last", lets_next_in="end") == 0
    with pytest.raises(ValueError, match="wait must be one of"):
        pdl(wait="never")
    with pytest.raises(ValueError, match="lets_next_in must be one of"):
        pdl(lets_next_in="never")
    for kwargs in (dict(wait="last"), dict(lets_next_in="end")):
        with pytest.raises(ValueError, match="only the row-block expander waits last"):
            inline_expansion_launches(w2, torch.empty(w2.shape, dtype=torch.uint8), engine="cute", **kwargs)


def test_exception_caps_pack_each_modes_capacity_as_the_codec_counts_it():
    from csf_codec.inline import exception_capacity, record_bytes_choices

    for cols in (1, 2, 3, 4):
        for s in record_bytes_choices(MXFP4, cols) + record_bytes_choices(NVFP4, cols):
            packed = exception_caps(s, cols)
            for m in range(3):
                assert (packed >> (8 * m)) & 0xFF == max(0, exception_capacity(1 << m, s, cols))
            assert packed >> 24 == 0  # raw tiles (mode 3) have no exceptions
    # DS4.1's 96-byte records of 4 columns: 9 exceptions beside 1-bit selectors; 2- and 4-bit ones do not fit
    assert exception_caps(96, 4) == 9


def test_row_block_group_tiles_split_only_rows_wider_than_eight_tiles():
    assert row_block_group_tiles(160) == 8 and row_block_group_tiles(48) == 4  # 5 and 3 groups
    assert row_block_group_tiles(32) == 8 and row_block_group_tiles(18) == 4  # whole rows (18: tail too)
    assert row_block_group_tiles(90) == 11 and row_block_groups(90) == 2  # 22 tiles: two groups, the tail in one
    assert row_block_group_tiles(36) == 9 and row_block_groups(36) == 1  # 9 tiles: no group size divides them
    assert row_block_group_tiles(154) == 38 and row_block_groups(154) == 1  # 38 = 2 x 19: whole rows
    assert row_block_warps(160) == 5 and row_block_warps(48) == 3 and row_block_warps(90) == 2  # a warp per group
    assert row_block_warps(36) == 2 and row_block_warps(24) == 4  # a warp per row block


def test_row_block_refuses_planes_it_does_not_cover():
    odd = _inline((2, 128, 37), NVFP4)
    with pytest.raises(ValueError, match="row-block expander does not cover"):
        inline_expansion_launches(odd, torch.empty(odd.shape, dtype=torch.uint8), engine="row_block")
    for cols in (456, 166):  # wider than any column-group image; past 160 columns in whole rows (41 tiles)
        wide = _inline((1, 128, cols), NVFP4)
        with pytest.raises(ValueError, match="row-block expander does not cover"):
            inline_expansion_launches(wide, torch.empty(wide.shape, dtype=torch.uint8), engine="row_block")


def test_row_block_covers_wide_planes_in_column_groups():
    """Past 160 columns the row-block expander takes rows that split into column groups (a CTA per block, one
    image of 128 x cols bytes): DS4.1-TP4 NVFP4's W13 (320), Kimi-K2 TP16's and DeepSeek-V3 TP8's (224, 448)."""
    for cols, groups in ((224, 7), (320, 10), (448, 14)):
        assert row_block_covers(cols, 16) and row_block_groups(cols) == groups == row_block_warps(cols)
    assert not row_block_covers(166, 16) and row_block_groups(166) == 1  # 41 tiles: whole rows only up to 160
    assert not row_block_covers(456, 16)


def test_auto_takes_the_row_block_expander_for_every_cached_shape(monkeypatch):
    from csf_kernels import runtime

    cached = {row_block_expander_spec(MXFP4, 18).key, row_block_expander_spec(MXFP4, 160).key,
              row_block_expander_spec(NVFP4, 320).key}  # fmt: skip
    monkeypatch.setattr(runtime, "is_cached", lambda spec: spec.key in cached)
    assert auto_engine(18, 384 * 5120 * 18, 0, MXFP4) == "row_block"  # DS4.1-TP4 W2
    assert auto_engine(160, 384 * 1152 * 160, 0, MXFP4) == "row_block"  # DS4.1-TP4 W13
    assert auto_engine(320, 384 * 1152 * 320, 0, NVFP4) == "row_block"  # DS4.1-TP4 NVFP4 W13 (column groups)
    assert auto_engine(18, 384 * 5120 * 18, 0, NVFP4) == "cute"  # no program for this shape: as before
    assert auto_engine(160, 384 * 1152 * 160, 0) == "triton"  # no format named: as before
    assert auto_engine(18, 384 * 5120 * 18, 8, MXFP4) == "triton"  # unaligned output: not covered


def test_division_magic_divides_every_dividend_the_row_block_expander_takes():
    for d in (1, 2, 3, 5, 7, 10, 40, 45, 127, 1000, DIVIDEND_LIMIT - 1):
        m = division_magic(d)
        assert 0 <= m < 1 << 31
        for x in (0, 1, d - 1, d, d + 1, 7 * d + 3, DIVIDEND_LIMIT - 1):
            if 0 <= x < DIVIDEND_LIMIT:
                assert (x if m == 0 else (x * m) >> 31) == x // d, (x, d)
    with pytest.raises(ValueError, match="divisor"):
        division_magic(DIVIDEND_LIMIT)


def test_row_block_launch_refuses_more_blocks_than_its_multipliers_divide():
    w2 = _inline((4, 100, 18))  # one row block per expert
    ids = torch.zeros(DIVIDEND_LIMIT, dtype=torch.int32)  # 2**15 routed blocks
    with pytest.raises(ValueError, match="row blocks exceed the row-block expander"):
        inline_expansion_launches(w2, torch.empty(w2.shape, dtype=torch.uint8), experts=ids, engine="row_block")
    (launch,) = inline_expansion_launches(
        w2, torch.empty(w2.shape, dtype=torch.uint8), experts=ids[:-1], engine="row_block"
    )
    assert launch.args[-7:-5] == (0, 0)  # one block per expert and per group: the multiplier of 1
