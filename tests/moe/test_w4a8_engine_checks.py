"""The W4A8 engine's host API and layer option on the CPU: launches built for well-formed operands, bad ones refused
with what is wrong, W4A8 weights (panels, bases, fold flags) prepared from MXFP4 experts and refused for NVFP4, and
the catalog's W4A8 programs."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.engine_panels import fc1_engine_rows, panel_scales_to_plane
from csf_kernels.moe.engine_specs import engine_combine_spec
from csf_kernels.moe.w4a8 import grouped_w4a8_gemm_launch
from csf_kernels.moe.w4a8_panels import w4a8_bases, w4a8_tile_flags, w4a8_weight_panel
from csf_kernels.moe.w4a8_specs import W4A8_GEMM, W4A8_TILE_N, w4a8_gemm_spec, w4a8_geometry_specs, w4a8_tile_n
from csf_moe.engine_layer import EngineMoE, engine_weights
from csf_moe.reference import QuantizedExperts

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
    assert plain <= set(catalog_specs(catalog, cute=True))


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
