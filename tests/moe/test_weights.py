"""Weight preparation on the CPU: every input form gives the same storage, bad input a clear error."""

from __future__ import annotations

import pytest
import torch

from csf_codec import decode_inline, encode_compact, scale_format
from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.fp4_words import gemm_words
from csf_kernels.moe.specs import ScaleRead
from csf_moe import plan, prepare_weights
from csf_moe.reference import interleave_gate_up
from csf_moe.synthetic import synthetic_layer

GEO = MoEGeometry(model="tiny", tp=1, fmt=scale_format("mxfp4"), experts=4, hidden=320, intermediate=192, top_k=2)


def test_compact_payloads_and_native_planes_give_the_same_inline_storage():
    data = synthetic_layer(GEO, seed=5)
    p = plan(GEO, 8, scale_source="inline")
    from_planes = prepare_weights(p, **data.weight_kwargs())
    kwargs = data.weight_kwargs()
    kwargs["w13_scale"] = encode_compact(data.w13_scale, GEO.fmt).payload
    kwargs["w2_scale"] = encode_compact(data.w2_scale, GEO.fmt).payload
    from_compact = prepare_weights(p, **kwargs)
    for a, b, plane in (
        (from_planes.w13, from_compact.w13, data.w13_scale),
        (from_planes.w2, from_compact.w2, data.w2_scale),
    ):
        assert all(torch.equal(x, y) for x, y in zip(a.inline.arrays(), b.inline.arrays(), strict=True))
        assert torch.equal(decode_inline(a.inline), plane)
        assert a.scales is None  # the native planes are not kept
    sizes = from_planes.scale_bytes()
    assert sizes["native"] == data.w13_scale.numel() + data.w2_scale.numel()
    assert sizes["stored"] < sizes["native"]


def test_interleaved_gate_up_rows_are_converted():
    geo = MoEGeometry(
        model="tiny-oss", tp=1, fmt=scale_format("mxfp4"), experts=3, hidden=192, intermediate=320, top_k=2,
        activation="swiglu_oai", bias=True,
    )  # fmt: skip
    data = synthetic_layer(geo, seed=6)
    p = plan(geo, 8, scale_source="native")
    kwargs = data.weight_kwargs()
    kwargs.update(
        w13=interleave_gate_up(data.w13),
        w13_scale=interleave_gate_up(data.w13_scale),
        w13_bias=interleave_gate_up(data.w13_bias),
    )
    got = prepare_weights(p, w13_layout="interleaved", **kwargs)
    want = prepare_weights(p, **data.weight_kwargs())
    for name in ("values", "scales", "bias"):
        assert torch.equal(getattr(got.w13, name), getattr(want.w13, name)), name


def test_fp4_words_get_their_bits_permuted_and_the_inputs_stay_untouched():
    data = synthetic_layer(GEO, seed=8)
    p = plan(GEO, 8, scale_source="native")
    kwargs = data.weight_kwargs()
    w13, w2 = kwargs["w13"].clone(), kwargs["w2"].clone()
    # a strided view of W2 (a slice of a wider tensor) is taken as its values
    wide = torch.zeros(*w2.shape[:-1], w2.shape[-1] + 16, dtype=torch.uint8)
    wide[..., : w2.shape[-1]] = w2
    kwargs["w2"] = wide[..., : w2.shape[-1]]
    got = prepare_weights(p, **kwargs)
    block = GEO.fmt.block_size
    assert torch.equal(got.w13.values, gemm_words(w13, block)) and torch.equal(got.w2.values, gemm_words(w2, block))
    assert torch.equal(kwargs["w13"], w13) and torch.equal(kwargs["w2"], w2)  # the caller's tensors unchanged
    assert got.w13.values.data_ptr() != kwargs["w13"].data_ptr()
    # handed over: a refused input leaves them as they were; else they are permuted where they are
    handed = data.weight_kwargs()
    bad = dict(handed, w2_scale=handed["w2_scale"][:, :-1])
    with pytest.raises(ValueError, match="w2_scale"):
        prepare_weights(p, values_in_place=True, **bad)
    assert torch.equal(handed["w13"], w13) and torch.equal(handed["w2"], w2)
    owned = prepare_weights(p, values_in_place=True, **handed)
    assert owned.w13.values.data_ptr() == handed["w13"].data_ptr()
    assert torch.equal(owned.w13.values, gemm_words(w13, block)) and torch.equal(owned.w2.values, gemm_words(w2, block))


def test_bad_weights_are_refused_clearly():
    data = synthetic_layer(GEO, seed=7)
    p = plan(GEO, 8, scale_source="inline")
    bad = data.weight_kwargs()
    bad["w2_scale"] = data.w2_scale[:, :-1]
    with pytest.raises(ValueError, match="w2_scale"):
        prepare_weights(p, **bad)
    bad = data.weight_kwargs()
    bad["w13"] = data.w13[:, :, :-1]
    with pytest.raises(ValueError, match="w13"):
        prepare_weights(p, **bad)
    bad = data.weight_kwargs()
    bad["w13_bias"] = torch.zeros(GEO.experts, 2 * GEO.intermediate)
    with pytest.raises(ValueError, match="takes no"):
        prepare_weights(p, **bad)
    corrupt = encode_compact(data.w13_scale, GEO.fmt).payload.clone()
    corrupt[-5] ^= 0xFF
    bad = data.weight_kwargs()
    bad["w13_scale"] = corrupt
    from csf_codec import CSFError

    with pytest.raises(CSFError):
        prepare_weights(p, **bad)


@pytest.mark.parametrize("source", ["native", "inline"])
def test_preparation_marks_the_row_tiles_whose_e8m0_scales_are_wide(source):
    data = synthetic_layer(GEO, seed=9)
    p = plan(GEO, 8, scale_source=source)
    narrow = prepare_weights(p, **data.weight_kwargs())
    # [E, ceil(R / 64)] per operand; the tiny layer's synthetic scales are all below 2**2
    assert narrow.w13.wide_tiles.shape == (4, 6) and narrow.w2.wide_tiles.shape == (4, 5)
    assert not narrow.w13.wide_tiles.any() and not narrow.w2.wide_tiles.any()
    for byte, wide in ((128, 0), (255, 0), (129, 1), (254, 1)):
        kwargs = data.weight_kwargs()
        kwargs["w2_scale"] = data.w2_scale.clone()
        kwargs["w2_scale"][1, 200, 2] = byte  # expert 1, row tile 3
        got = prepare_weights(p, **kwargs)
        want = torch.zeros(4, 5, dtype=torch.uint8)
        want[1, 3] = wide
        assert torch.equal(got.w2.wide_tiles.cpu(), want) and not got.w13.wide_tiles.any(), byte
    nv = MoEGeometry(model="tiny", tp=1, fmt=scale_format("nvfp4"), experts=4, hidden=320, intermediate=192, top_k=2)
    nv_weights = prepare_weights(plan(nv, 8, scale_source=source), **synthetic_layer(nv, seed=9).weight_kwargs())
    assert nv_weights.w13.wide_tiles is None and nv_weights.w2.wide_tiles is None  # E4M3: always two multiplies


def test_an_expert_past_the_gemms_32_bit_word_offsets_is_refused():
    # the GEMMs address an expert's FP4 words (csf_kernels.moe.fp4_words' tiles) with 32-bit offsets: 8 GiB and up
    # is refused before anything is launched (meta tensors: nothing is allocated)
    from csf_codec import MXFP4
    from csf_kernels.moe.launch import GemmOperand, gemm_launch
    from csf_kernels.moe.specs import DECODE_NARROW

    values = torch.empty(1, 1 << 17, 1 << 16, dtype=torch.uint8, device="meta")
    x = torch.empty(1, 1 << 17, dtype=torch.bfloat16, device="meta")
    ids = torch.empty(8, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="32-bit word offsets"):
        gemm_launch(fmt=MXFP4, source=ScaleRead.PLANE, fc1=False, activation="silu", config=DECODE_NARROW, x=x,
                    weights=GemmOperand(values=values), out=x, sorted_ids=ids, block_expert=ids, meta=ids, pairs=1,
                    x_row_div=1)  # fmt: skip
