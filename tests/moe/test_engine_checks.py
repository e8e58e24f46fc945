"""The engine's host API refuses what its programs cannot serve, with errors that say what is wrong (CPU)."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.moe.engine import combine_launch, dense_fp4_gemm_launch, gather_launch, grouped_fp4_gemm_launch
from csf_kernels.moe.engine_panels import fc1_engine_rows
from csf_kernels.moe.engine_specs import ENGINE_TILE_N, engine_gemm_spec, engine_tile_n
from csf_moe.engine_layer import engine_weights
from csf_moe.reference import QuantizedExperts

E, R, K, NX = 2, 128, 128, 64


def _operands(rows=R, k=K, out_cols=R):
    w = torch.zeros(E, k // 64, rows // 64, 256, dtype=torch.uint64)
    s = torch.zeros(E, k // 64, 2 * rows, dtype=torch.uint8)
    x = torch.zeros(NX, k, dtype=torch.bfloat16)
    out = torch.zeros(NX, out_cols, dtype=torch.bfloat16)
    be = torch.zeros(NX // 16, dtype=torch.int32)
    meta = torch.zeros(1, dtype=torch.int32)
    return w, s, x, out, be, meta


def test_a_well_formed_call_makes_a_launch():
    launch = grouped_fp4_gemm_launch(*_operands(), tile_n=16)
    assert launch.spec == engine_gemm_spec(16) and launch.grid[0] >= 1
    fused = grouped_fp4_gemm_launch(*_operands(out_cols=R // 2), tile_n=16, activation="silu")
    assert fused.spec.fact["ACT"] == 1


@pytest.mark.parametrize(
    "change, error",
    [
        (dict(tile_n=24), "tile_n must be one of"),
        (dict(x=torch.zeros(NX, K + 64, dtype=torch.bfloat16)), "shapes disagree"),
        (dict(out=torch.zeros(NX, R - 64, dtype=torch.bfloat16)), "shapes disagree"),
        (dict(s=torch.zeros(E, K // 64, R, dtype=torch.uint8)), "scale panel"),
        (dict(bias=torch.zeros(E, R)), "bias must be float32"),  # a bias without an activation
        (dict(activation="silu"), "shapes disagree"),  # a fused activation halves out's columns
        (dict(be=torch.zeros(4, dtype=torch.int64)), "int32 vectors"),
    ],
)
def test_bad_grouped_calls_are_refused(change, error):
    w, s, x, out, be, meta = _operands()
    args = dict(w=w, s=s, x=x, out=out, be=be, meta=meta, tile_n=16) | change
    extra = {k: args.pop(k) for k in ("activation", "bias") if k in args}
    with pytest.raises((ValueError, TypeError), match=error):
        grouped_fp4_gemm_launch(args["w"], args["s"], args["x"], args["out"], args["be"], args["meta"],
                                tile_n=args["tile_n"], **extra)  # fmt: skip


def test_dense_and_glue_checks():
    w, s, x, out, _, _ = _operands()
    assert dense_fp4_gemm_launch(w[0], s[0], x, out, tile_n=128).spec.fact["TN"] == 128
    sorted_ids = torch.zeros(NX, dtype=torch.int32)
    meta = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="gather"):
        gather_launch(x, sorted_ids, meta, x, torch.zeros(7, dtype=torch.int32), top_k=2, bm=16)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="float32"):
        combine_launch(x, torch.zeros(8, dtype=torch.int32), None, ids, torch.zeros(4, 2, dtype=torch.bfloat16),
                       torch.zeros(4, K, dtype=torch.bfloat16), num_experts=E)  # fmt: skip


def test_specs_and_block_choice():
    with pytest.raises(ValueError, match="routes a block"):
        engine_gemm_spec(48)
    with pytest.raises(ValueError, match="only with a fused activation"):
        engine_gemm_spec(16, None, bias=True)
    assert [engine_tile_n(r) for r in (0.1, 16, 17, 200, 5000)] == [16, 16, 32, 256, max(ENGINE_TILE_N)]


def test_fc1_engine_rows_is_a_permutation_pairing_gate_and_up():
    for interleaved in (False, True):
        perm = fc1_engine_rows(32, interleaved)
        assert sorted(perm.tolist()) == list(range(64))
        slab = perm.view(-1, 16)
        gate, up = slab[:, :8], slab[:, 8:]
        if interleaved:
            assert torch.equal(up, gate + 1) and bool((gate % 2 == 0).all())
        else:
            assert torch.equal(up, gate + 32) and bool((gate < 32).all())
    with pytest.raises(ValueError, match="multiple of 8"):
        fc1_engine_rows(12, False)


def test_engine_weights_refuse_nvfp4_and_ragged_shapes():
    def experts(fmt, rows, k):
        z = torch.zeros(1, rows, k // 2, dtype=torch.uint8)
        return QuantizedExperts(fmt=fmt, w13=z, w13_scale=torch.zeros(1, rows, k // 32, dtype=torch.uint8), w2=z,
                                w2_scale=torch.zeros(1, rows, k // 32, dtype=torch.uint8))  # fmt: skip

    with pytest.raises(NotImplementedError, match="MXFP4"):
        engine_weights(experts("nvfp4", 128, 128), "silu")
    with pytest.raises(ValueError, match="multiples of 64"):
        engine_weights(experts("mxfp4", 96, 128), "silu")
