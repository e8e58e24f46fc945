"""The W4A8 engine's host API and layer option on the CPU: launches built for well-formed operands, bad ones refused
with what is wrong, W4A8 weights (panels, bases, fold flags) prepared from MXFP4 experts and refused for NVFP4, the
catalog's W4A8 programs, the layer's launches sharing the alignment's route slots, and the FP8 activation programs
built for sm_90a on this machine."""

from __future__ import annotations

import pytest
import torch

from csf_codec import scale_format
from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import MoEGeometry, load_catalog
from csf_kernels.moe.engine_panels import fc1_engine_rows, panel_scales_to_plane
from csf_kernels.moe.engine_specs import engine_combine_spec
from csf_kernels.moe.fp8_activations import ACTIVATION_CONVENTIONS
from csf_kernels.moe.w4a8 import gather_fp8_launch, grouped_w4a8_gemm_launch, quantize_rows_fp8_launch
from csf_kernels.moe.w4a8_panels import w4a8_bases, w4a8_tile_flags, w4a8_weight_panel
from csf_kernels.moe.w4a8_specs import (
    W4A8_GEMM,
    W4A8_TILE_N,
    gather_fp8_spec,
    quantize_rows_fp8_spec,
    w4a8_gemm_spec,
    w4a8_geometry_specs,
    w4a8_tile_n,
)
from csf_moe.engine_layer import EngineMoE, engine_weights
from csf_moe.reference import QuantizedExperts
from csf_moe.synthetic import synthetic_layer

E, R, K, NX = 2, 192, 128, 64


def _operands(rows=R, k=K, out_cols=R):
    return dict(
        w_panel=torch.zeros(E, k // 64, rows // 64, 256, dtype=torch.uint64),
        s_panel=torch.zeros(E, k // 64, 2 * rows, dtype=torch.uint8),
        bases=torch.zeros(E, rows, dtype=torch.uint8),
        flags=torch.zeros(E, -(-rows // 128), dtype=torch.uint8),
        xq=torch.zeros(NX, k, dtype=torch.uint8),
        xscale=torch.ones(NX, dtype=torch.float32),
        out=torch.zeros(NX, out_cols, dtype=torch.bfloat16),
        block_expert=torch.zeros(NX // 16, dtype=torch.int32),
        meta=torch.zeros(1, dtype=torch.int32),
    )


def test_a_well_formed_call_makes_a_launch():
    launch = grouped_w4a8_gemm_launch(**_operands(), tile_n=16)
    assert launch.spec == w4a8_gemm_spec(16) and launch.spec.kernel == W4A8_GEMM and launch.grid[0] >= 1
    fused = grouped_w4a8_gemm_launch(**_operands(out_cols=R // 2), tile_n=32, activation="swiglu_oai",
                                     bias=torch.zeros(E, R))  # fmt: skip
    assert fused.spec.fact["ACT"] == 2 and fused.spec.fact["BIAS"] == 1


@pytest.mark.parametrize(
    "change, error",
    [
        (dict(tile_n=256), "tile_n must be one of"),  # two fp32 accumulators do not fit at 256 routes
        (dict(xq=torch.zeros(NX, K, dtype=torch.bfloat16)), "E4M3 bytes"),
        (dict(xq=torch.zeros(NX, 2 * K, dtype=torch.uint8)), "disagree"),
        (dict(bases=torch.zeros(E, R - 64, dtype=torch.uint8)), "bases must be"),
        (dict(flags=torch.zeros(E, 1, dtype=torch.uint8)), "flags must be"),
        (dict(xscale=torch.ones(NX, 2)), "xscale must be"),
        (dict(s_panel=torch.zeros(E, K // 64, 4 * R, dtype=torch.uint8)), "s_panel must be"),
        (dict(out=torch.zeros(NX, R // 2, dtype=torch.bfloat16)), "out"),
        (dict(activation=None, bias=torch.zeros(E, R)), "bias must be"),
    ],
)
def test_bad_calls_are_refused(change, error):
    args = {**_operands(), "tile_n": 16, **change}
    with pytest.raises((TypeError, ValueError), match=error):
        grouped_w4a8_gemm_launch(**args)


def test_block_choice_and_specs():
    assert W4A8_TILE_N == (16, 32, 64, 128)
    assert [w4a8_tile_n(r) for r in (0.1, 16, 17, 128, 500)] == [16, 16, 32, 128, 128]
    with pytest.raises(ValueError, match="bias only with"):
        w4a8_gemm_spec(16, None, True)
    with pytest.raises(ValueError, match="built for"):
        w4a8_gemm_spec(256)


def test_the_gather_by_token_and_the_row_quantizer_make_launches():
    x = torch.zeros(17, 1056, dtype=torch.bfloat16)
    route_slots = torch.zeros(17 * 3, dtype=torch.int32)
    xq = torch.zeros(96, 1056, dtype=torch.uint8)
    per_token, mx = torch.zeros(96), torch.zeros(96, 33, dtype=torch.uint8)
    launch = gather_fp8_launch(x, route_slots, xq, per_token, top_k=3, convention="per_token")
    assert launch.spec == gather_fp8_spec("per_token") and launch.grid == (3,)  # 8 tokens a program, whole rows
    assert launch.args[:4] == (x, route_slots, xq, per_token)
    assert launch.args[4:] == (17, 1056, 3, 96)  # tokens, hidden, top_k, and xq's slots: a slot past them is not stored
    launch = gather_fp8_launch(x, route_slots, xq, mx, top_k=3, convention="mxfp8")
    assert launch.spec == gather_fp8_spec("mxfp8") and launch.grid == (3, 3)  # 512 columns a program
    assert launch.spec.version == 2 and "BM" not in launch.spec.fact  # by token: no block size
    a = torch.zeros(96, 1056, dtype=torch.bfloat16)
    meta = torch.ones(4, dtype=torch.int32)
    launch = quantize_rows_fp8_launch(a, meta, xq, per_token, bm=32, convention="per_token")
    assert launch.spec == quantize_rows_fp8_spec("per_token") and launch.grid == (96,)
    assert launch.args == (a, meta, xq, per_token, 1056, 32)  # the block size at run time: one program for all
    launch = quantize_rows_fp8_launch(a, meta, xq, mx, bm=16, convention="mxfp8")
    assert launch.spec == quantize_rows_fp8_spec("mxfp8") and launch.grid == (96, 3)


@pytest.mark.parametrize(
    "change, error",
    [
        (dict(x=torch.zeros(17, 1056)), "bf16"),
        (dict(x=torch.zeros(17, 1024, dtype=torch.bfloat16)), "bf16"),
        (dict(xq=torch.zeros(96, 1056, dtype=torch.int8)), "uint8"),
        (dict(route_slots=torch.zeros(50, dtype=torch.int32)), "route_slots"),
        (dict(route_slots=torch.zeros(51, dtype=torch.int64)), "route_slots"),
        (dict(top_k=0), "top_k"),
        (dict(xscale=torch.zeros(95)), "scales must be"),
        (dict(convention="mxfp8"), "scales must be"),
        (dict(convention="fp8"), "unknown activation convention"),
    ],
)
def test_the_gather_refuses_what_it_cannot_serve(change, error):
    args = dict(x=torch.zeros(17, 1056, dtype=torch.bfloat16), route_slots=torch.zeros(51, dtype=torch.int32),
                xq=torch.zeros(96, 1056, dtype=torch.uint8), xscale=torch.zeros(96), top_k=3,
                convention="per_token") | change  # fmt: skip
    with pytest.raises((TypeError, ValueError), match=error):
        gather_fp8_launch(**args)


@pytest.mark.parametrize(
    "change, error",
    [
        (dict(a=torch.zeros(96, 1056)), "bf16"),
        (dict(a=torch.zeros(64, 1056, dtype=torch.bfloat16)), "rows"),
        (dict(a=torch.zeros(96, 48, dtype=torch.bfloat16), xq=torch.zeros(96, 48, dtype=torch.uint8)), "multiple"),
        (dict(meta=torch.ones(4, dtype=torch.int64)), "meta"),
        (dict(bm=0), "bm"),
        (dict(xscale=torch.zeros(96, 33, dtype=torch.uint8)), "scales must be"),
    ],
)
def test_the_row_quantizer_refuses_what_it_cannot_serve(change, error):
    args = dict(a=torch.zeros(96, 1056, dtype=torch.bfloat16), meta=torch.ones(4, dtype=torch.int32),
                xq=torch.zeros(96, 1056, dtype=torch.uint8), xscale=torch.zeros(96), bm=16,
                convention="per_token") | change  # fmt: skip
    with pytest.raises((TypeError, ValueError), match=error):
        quantize_rows_fp8_launch(**args)


def test_catalog_builds_w4a8_gemms_for_mxfp4_geometries_only():
    catalog = load_catalog()
    for geo in catalog.moe:
        fc1 = [s for s in w4a8_geometry_specs(geo) if s.kernel == W4A8_GEMM]
        # the W4A8 layer's combine reads FC2's block-order rows through each route's slot
        by_slot = {s.key for s in w4a8_geometry_specs(geo) if s.fact.get("INV") == 1}
        want = {engine_combine_spec(i64, geo.bias, inverse=True).key for i64 in (False, True)}
        assert by_slot == (want if geo.fmt.name == "mxfp4" else set())
        if geo.fmt.name == "mxfp4":
            assert [s.fact["TN"] for s in fc1] == list(W4A8_TILE_N)
            assert all(s.fact["ACT"] == 1 + (geo.activation == "swiglu_oai") for s in fc1)
            assert all(s.fact["BIAS"] == int(geo.bias) for s in fc1)
        else:
            assert fc1 == []
    plain = {s.key for s in (w4a8_gemm_spec(t) for t in W4A8_TILE_N)}
    built = set(catalog_specs(catalog, cute=True))
    assert plain <= built
    # FC1's gather and FC2's row quantizer: one program each per convention, whatever the block size
    fp8 = [f(conv) for f in (gather_fp8_spec, quantize_rows_fp8_spec) for conv in ACTIVATION_CONVENTIONS]
    assert {s.key for s in fp8} <= built
    kernels = {s.kernel for s, _ in catalog_specs(catalog, cute=False).values()}
    assert {k for k in kernels if "fp8" in k and "gemm" not in k} == {s.kernel for s in fp8}


def _experts(fmt: str, rows: int, k: int) -> QuantizedExperts:
    g = torch.Generator().manual_seed(0)
    block = 32 if fmt == "mxfp4" else 16
    v = torch.randint(0, 256, (2, rows, k // 2), dtype=torch.uint8, generator=g)
    sc = torch.randint(118, 122, (2, rows, k // block), dtype=torch.uint8, generator=g)
    sc[1, 3, 0] = 10  # far below its row: that tile promotes
    extra = {"w13_global_scale": torch.ones(2), "w2_global_scale": torch.ones(2)} if fmt == "nvfp4" else {}
    return QuantizedExperts(fmt=fmt, w13=v, w13_scale=sc, w2=v, w2_scale=sc, **extra)


@pytest.mark.parametrize("fused", [True, False])
def test_w4a8_weights_of_mxfp4_experts(fused):
    ex = _experts("mxfp4", 256, 192)
    w = engine_weights(ex, "silu", fused=fused, w4a8=True)
    perm = fc1_engine_rows(128, interleaved=False) if fused else torch.arange(256)
    assert w.w4a8 and w.fmt == "mxfp4"
    assert torch.equal(w.w13[1], w4a8_weight_panel(ex.w13[1][perm]))
    assert torch.equal(panel_scales_to_plane(w.s13[1], 256, 192), ex.w13_scale[1][perm])
    assert torch.equal(w.base13, w4a8_bases(ex.w13_scale[:, perm]))
    assert torch.equal(w.flags2, w4a8_tile_flags(ex.w2_scale, w.base2))
    assert w.flags2.tolist() == [[1, 1], [0, 1]]  # expert 1's first tile holds the far block
    plain = engine_weights(ex, "silu", fused=fused)
    assert not plain.w4a8 and plain.base13 is None and plain.flags13 is None
    assert EngineMoE(w, 4).activations == "per_token"


def test_w4a8_refuses_nvfp4_inline_scales_and_mxfp8_activations():
    with pytest.raises(NotImplementedError, match="stays W4A16"):
        engine_weights(_experts("nvfp4", 128, 128), "silu", w4a8=True)
    with pytest.raises(NotImplementedError, match="scale panels only"):  # the FP8 GEMM has no record decoder
        engine_weights(_experts("mxfp4", 128, 128), "silu", w4a8=True, scale_source="inline")
    w = engine_weights(_experts("mxfp4", 128, 128), "silu", w4a8=True)
    with pytest.raises(NotImplementedError, match="not built"):
        EngineMoE(w, 4, activations="mxfp8")


@pytest.mark.parametrize("fused", [True, False])
def test_the_w4a8_layer_quantizes_at_the_alignments_route_slots(fused):
    """The alignment writes each route's slot; FC1's gather stores there and the combine reads FC2's rows through the
    same buffer; FC2's input is quantized row by row over the blocks in use (no slot map, no buffer of its own)."""
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format("mxfp4"), experts=8, hidden=256, intermediate=128,
                      top_k=2, activation="silu", bias=False)  # fmt: skip
    w = engine_weights(synthetic_layer(geo, seed=3).reference(), "silu", fused=fused, w4a8=True)
    layer = EngineMoE(w, 2)
    for tokens in (1, 40, 700):  # one-token alignment, one chunk, count + plan + scatter
        x = torch.zeros(tokens, 256, dtype=torch.bfloat16)
        ids = torch.zeros(tokens, 2, dtype=torch.int32)
        launches, keep = layer.launches(x, ids, torch.zeros(tokens, 2), torch.empty_like(x))
        kernels = [launch.spec.kernel for launch in launches]
        gather = launches[kernels.index("moe.engine_gather_fp8")]
        route_slots = gather.args[1]
        assert gather.args[0] is x and route_slots.dtype == torch.int32 and route_slots.numel() == tokens * 2
        writer = [launch for launch in launches if launch.spec.kernel.startswith("moe.align")][-1]  # the scattering
        assert writer.spec.fact["INV"] == 1 and any(a is route_slots for a in writer.args), tokens
        combine = launches[kernels.index("moe.engine_combine")]
        assert combine.spec.fact["INV"] == 1 and combine.args[1] is route_slots
        rows = launches[kernels.index("moe.engine_quantize_rows_fp8")]
        assert kernels.index("moe.engine_gather_fp8") < kernels.index("moe.engine_quantize_rows_fp8")
        assert rows.args[4:] == (128, layer.tile_n(tokens))  # FC2's input width (N) and the block size
        assert kernels.count("moe.w4a8_gemm") == 2 and len(kernels) == len(set(kernels)) + 1
        assert any(b is route_slots for b in keep)


def test_the_fp8_activation_programs_build_for_sm_90a():
    """Built here as ``nox -s aot_build`` builds them (no GPU): programmatic dependent launches, each the block its
    warps make."""
    pytest.importorskip("triton")
    from csf_kernels.aot.compile_triton import compile_triton

    for spec in [f(conv) for f in (gather_fp8_spec, quantize_rows_fp8_spec) for conv in ACTIVATION_CONVENTIONS]:
        art = compile_triton(spec)
        assert art.kind == "triton_cubin" and art.data, spec.describe()
        assert art.launch["pdl"] is True and art.launch["block"] == [32 * spec.fact["num_warps"], 1, 1]
        assert art.launch["multiples"]["hidden"] == 32, spec.describe()
