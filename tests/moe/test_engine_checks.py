"""The engine's host API refuses what its programs cannot serve, with errors that say what is wrong (CPU)."""

from __future__ import annotations

import re

import pytest
import torch

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.engine import combine_launch, dense_fp4_gemm_launch, gather_tokens_launch, grouped_fp4_gemm_launch
from csf_kernels.moe.engine_panels import fc1_engine_rows, panel_scales_to_plane
from csf_kernels.moe.engine_specs import (
    ENGINE_IO,
    ENGINE_PROBE_TILE_N,
    ENGINE_PROBES,
    ENGINE_SCHEDULES,
    ENGINE_TILE_N,
    engine_gemm_spec,
    engine_geometry_specs,
    engine_occupancies,
    engine_occupancy,
    engine_probe_specs,
    engine_ragged,
    engine_schedule,
    engine_serves,
    engine_specs,
    engine_tile_n,
)
from csf_moe.engine_layer import EngineMoE, call_buffers, call_tile_n, engine_weights, fc1_rows_for
from csf_moe.reference import QuantizedExperts

E, R, K, NX = 2, 128, 128, 64


def _operands(rows=R, k=K, out_cols=R, per_step=2):
    w = torch.zeros(E, k // 64, rows // 64, 256, dtype=torch.uint64)
    s = torch.zeros(E, k // 64, per_step * rows, dtype=torch.uint8)
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


def test_an_nvfp4_call_passes_its_scale_words_and_global_scales():
    w, s, x, out, be, meta = _operands(per_step=4)
    g = torch.ones(E, dtype=torch.float32)
    launch = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=32, fmt="nvfp4", global_scale=g)
    assert launch.spec == engine_gemm_spec(32, fmt="nvfp4") and launch.spec.fact["FMT"] == "nvfp4"
    words = launch.args[1]
    assert words.dtype == torch.uint32 and tuple(words.shape) == (E, K // 64, R)  # one word of 4 E4M3 bytes a row
    assert words.data_ptr() == s.data_ptr() and launch.args[5] is g
    mx = grouped_fp4_gemm_launch(*_operands(), tile_n=32)
    assert mx.spec.fact["FMT"] == "mxfp4" and mx.args[1].dtype == torch.uint8 and mx.args[5].dtype == torch.float32


@pytest.mark.parametrize(
    "per_step, fmt, g, error",
    [
        (4, "nvfp4", None, "nvfp4 weights take a global scale"),
        (2, "mxfp4", torch.ones(E), "mxfp4 weights take no global scale"),
        (2, "nvfp4", torch.ones(E), "nvfp4 scale panel"),  # MXFP4's two bytes a row a step
        (4, "nvfp4", torch.ones(E + 1), "global_scale must be float32"),
        (4, "nvfp4", torch.ones(E, dtype=torch.float64), "global_scale must be float32"),
        (4, "fp8", None, "scales; got 'fp8'"),
    ],
)
def test_bad_format_calls_are_refused(per_step, fmt, g, error):
    with pytest.raises(ValueError, match=error):
        grouped_fp4_gemm_launch(*_operands(per_step=per_step), tile_n=16, fmt=fmt, global_scale=g)


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


def test_dense_and_combine_checks():
    w, s, x, out, _, _ = _operands()
    assert dense_fp4_gemm_launch(w[0], s[0], x, out, tile_n=128).spec.fact["TN"] == 128
    ids = torch.zeros(4, 2, dtype=torch.int32)
    y = torch.zeros(8, K, dtype=torch.bfloat16)
    out4 = torch.zeros(4, K, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        combine_launch(y, None, ids, torch.zeros(4, 2, dtype=torch.bfloat16), out4, num_experts=E)
    with pytest.raises(ValueError, match="8 routes' rows"):  # y in block order (slots), not one row a route
        combine_launch(x, None, ids, torch.zeros(4, 2), out4, num_experts=E)
    assert combine_launch(y, None, ids, torch.zeros(4, 2), out4, num_experts=E).args[0] is y
    # W4A8: y in block order, read through each route's slot
    inverse = torch.zeros(8, dtype=torch.int32)
    by_slot = combine_launch(x, None, ids, torch.zeros(4, 2), out4, num_experts=E, inverse=inverse)
    assert by_slot.spec.fact["INV"] == 1 and by_slot.args[:2] == (x, inverse)
    assert combine_launch(y, None, ids, torch.zeros(4, 2), out4, num_experts=E).spec.fact["INV"] == 0
    with pytest.raises(ValueError, match="inverse must be int32"):
        combine_launch(x, None, ids, torch.zeros(4, 2), out4, num_experts=E, inverse=inverse[:7])


def test_routed_calls_pass_their_slots_top_k_and_pdl():
    w, s, x, out, be, meta = _operands()
    tokens, top_k = 16, 4
    ids = torch.zeros(NX, dtype=torch.int32)  # NX slots
    fc1 = grouped_fp4_gemm_launch(w, s, x[:tokens], out, be, meta, tile_n=16, io="gather", sorted_ids=ids,
                                  top_k=top_k)  # fmt: skip
    # (..., sorted_ids, ctas, top_k, pairs, split_steps, pdl): a live route id is below tokens x top_k; one split:
    # all of K's steps
    assert fc1.spec == engine_gemm_spec(16, io="gather") and fc1.args[8] is ids
    assert fc1.args[11:] == (top_k, tokens * top_k, x.shape[1] // 64, 1)  # after the wide-block flags, CTA count
    y = torch.zeros(tokens * top_k + 3, R, dtype=torch.bfloat16)  # pairs rows: any count
    fc2 = grouped_fp4_gemm_launch(w, s, x, y, be, meta, tile_n=16, io="scatter", sorted_ids=ids)
    assert fc2.spec.fact["IO"] == "scatter" and fc2.args[3] is y and fc2.args[-3] == y.shape[0]
    runtime.set_pdl(False)
    try:
        assert grouped_fp4_gemm_launch(*_operands(), tile_n=16).args[-1] == 0
    finally:
        runtime.set_pdl(True)
    dense = grouped_fp4_gemm_launch(*_operands(), tile_n=16)
    # sorted_ids unread (block_expert stands in), pairs 0: every block whole
    assert dense.args[-1] == 1 and dense.args[8] is dense.args[6] and dense.args[-3] == 0
    with_ids = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, sorted_ids=ids, pairs=40)
    assert with_ids.args[8] is ids and with_ids.args[-3] == 40 and with_ids.spec.fact["IO"] == "dense"
    with pytest.raises(TypeError, match="sorted_ids"):
        grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, sorted_ids=ids[:8], pairs=40)
    with pytest.raises(ValueError, match="pairs"):
        grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, sorted_ids=ids)


def test_ragged_blocks_default_where_built():
    """128- and 256-route blocks run ragged by default at level 1 (half blocks; the fact RAG), level 2 (quarter
    blocks too, not yet run on a GPU) or whole on request; smaller ones are whole."""
    assert [engine_ragged(t) for t in ENGINE_TILE_N] == [0, 0, 0, 1, 1]
    assert engine_ragged(256, False) == 0 and engine_ragged(64, True) == 0 and engine_ragged(128, True) == 1
    assert engine_gemm_spec(128).fact["RAG"] == 1 and "RAG" not in engine_gemm_spec(128, ragged=False).fact
    assert engine_gemm_spec(256, ragged=2).fact["RAG"] == 2
    with pytest.raises(ValueError, match="ragged"):
        engine_gemm_spec(64, ragged=True)
    with pytest.raises(ValueError, match="ragged"):
        engine_gemm_spec(256, ragged=3)
    w, s, x, out, be, meta = _operands()
    assert grouped_fp4_gemm_launch(w, s, x, out, be[:1], meta, tile_n=128).spec.fact["RAG"] == 1
    assert grouped_fp4_gemm_launch(w, s, x, out, be[:1], meta, tile_n=128, ragged=2).spec.fact["RAG"] == 2
    assert "RAG" not in grouped_fp4_gemm_launch(w, s, x, out, be[:1], meta, tile_n=128, ragged=False).spec.fact
    assert "RAG" not in grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, ragged=True).spec.fact


@pytest.mark.parametrize(
    "io, change, error",
    [
        ("sideways", {}, "io must be one of"),
        ("gather", dict(ids=None), "sorted_ids must be an int32 vector"),
        ("gather", dict(ids=torch.zeros(NX, dtype=torch.int64)), "sorted_ids must be an int32 vector"),
        ("gather", dict(top_k=0), "top_k must be a positive int"),
        ("gather", dict(ids=torch.zeros(NX + 16, dtype=torch.int32)), "shapes disagree"),  # out holds the slots
        ("scatter", dict(ids=torch.zeros(NX - 16, dtype=torch.int32)), "x must hold the 48 slots"),
        ("scatter", dict(activation="silu"), "no activation"),
    ],
)
def test_bad_routed_calls_are_refused(io, change, error):
    w, s, x, out, be, meta = _operands()
    args = dict(ids=torch.zeros(NX, dtype=torch.int32), top_k=2) | change
    act = {"activation": args["activation"]} if "activation" in args else {}
    if act:
        out = out[:, : R // 2]
    with pytest.raises((ValueError, TypeError), match=error):
        grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, io=io, sorted_ids=args["ids"], top_k=args["top_k"],
                                **act)  # fmt: skip


def test_specs_and_block_choice():
    with pytest.raises(ValueError, match="routes a block"):
        engine_gemm_spec(48)
    with pytest.raises(ValueError, match="serves"):
        engine_gemm_spec(16, fmt="fp8")
    with pytest.raises(ValueError, match="only with a fused activation"):
        engine_gemm_spec(16, None, bias=True)
    with pytest.raises(ValueError, match="scatter without activation"):
        engine_gemm_spec(16, "silu", io="scatter")
    assert [engine_tile_n(r) for r in (0.1, 16, 17, 200, 5000)] == [16, 16, 32, 256, max(ENGINE_TILE_N)]


def test_block_fill_sizes_blocks_for_a_fraction_of_the_mean_routes():
    # gpt-oss at 8192 tokens: 256 routes an expert on average
    assert call_tile_n(8192 * 4, 128, w4a8=False) == 256
    assert call_tile_n(8192 * 4, 128, w4a8=False, block_fill=0.5) == 128
    assert call_tile_n(8192 * 4, 128, w4a8=False, block_fill=0.25) == 64
    # more, smaller blocks: the buffers are sized for the call's block size
    whole = call_buffers(8192, 4, 128, 2880, 2880, w4a8=False, fc1_rows="pass")
    half = call_buffers(8192, 4, 128, 2880, 2880, w4a8=False, fc1_rows="pass", block_fill=0.5)
    assert half["sorted_ids"][0][0] < whole["sorted_ids"][0][0]
    assert half["sorted_ids"][0][0] % 128 == 0
    with pytest.raises(ValueError, match="block_fill"):
        EngineMoE.__init__(object.__new__(EngineMoE), None, 4, block_fill=0.0)


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


def _experts(fmt, rows, k, **globals_):
    block = 16 if fmt == "nvfp4" else 32
    z = torch.zeros(2, rows, k // 2, dtype=torch.uint8)
    sc = torch.arange(2 * rows * (k // block)).remainder(127).to(torch.uint8).view(2, rows, k // block)
    return QuantizedExperts(fmt=fmt, w13=z, w13_scale=sc, w2=z, w2_scale=sc, **globals_)


def test_engine_weights_refuse_bad_formats_missing_global_scales_and_ragged_shapes():
    with pytest.raises(NotImplementedError, match="serves"):
        engine_weights(_experts("fp8", 128, 128), "silu")
    with pytest.raises(ValueError, match="w13_global_scale"):
        engine_weights(_experts("nvfp4", 128, 128), "silu")
    with pytest.raises(ValueError, match="3 values for 2 experts"):
        engine_weights(_experts("nvfp4", 128, 128, w13_global_scale=torch.ones(3), w2_global_scale=torch.ones(3)),
                       "silu")  # fmt: skip
    with pytest.raises(ValueError, match="multiples of 64"):
        engine_weights(_experts("mxfp4", 96, 128), "silu")


@pytest.mark.parametrize("fused", [True, False])
def test_engine_weights_of_nvfp4_experts(fused):
    g13, g2 = torch.tensor([0.5, 2.0]), torch.tensor([3.0, 0.25])
    ex = _experts("nvfp4", 128, 192, w13_global_scale=g13, w2_global_scale=g2)
    w = engine_weights(ex, "silu", fused=fused)
    assert w.fmt == "nvfp4" and torch.equal(w.g13, g13) and torch.equal(w.g2, g2)
    assert tuple(w.s13.shape) == (2, 3, 4 * 128) and tuple(w.s2.shape) == (2, 3, 4 * 128)
    perm = fc1_engine_rows(64, interleaved=False) if fused else torch.arange(128)
    assert torch.equal(panel_scales_to_plane(w.s13[1], 128, 192, "nvfp4"), ex.w13_scale[1][perm])
    assert torch.equal(panel_scales_to_plane(w.s2[0], 128, 192, "nvfp4"), ex.w2_scale[0])
    mx = engine_weights(_experts("mxfp4", 128, 192), "silu", fused=fused)
    assert mx.fmt == "mxfp4" and mx.g13 is None and mx.g2 is None and tuple(mx.s13.shape) == (2, 3, 2 * 128)


# the schedules the cache holds a block size's programs of, and the ragged levels of each: both cooperative
# schedules at the decode sizes; transform warps beside them at 64, 128 and 256, at one ragged level
_SCHEDULES = {t: ("slice", "stage") + (("transform",) if t == 64 else ()) if t <= 64 else ("slice", "transform")
              for t in ENGINE_TILE_N}  # fmt: skip
_RAGGEDS = {(t, sched): ((1,) if sched == "transform" else (0, 1, 2)) if t >= 128 else (0,)
            for t in ENGINE_TILE_N for sched in _SCHEDULES[t]}  # fmt: skip


def _serves(sched: str, src: str, io: str) -> bool:
    """Transform warps are producer warps: built for rows not gathered only (the gathering warps are busy)."""
    return sched != "transform" or io != "gather"


def test_catalog_nvfp4_geometries_get_engine_programs():
    catalog = load_catalog()
    nv = [g for g in catalog.moe if g.fmt.name == "nvfp4"]
    assert nv and all(engine_serves(g) for g in nv)
    for geo in nv:
        fc1 = [s for s in engine_geometry_specs(geo) if s.kernel == engine_gemm_spec(16).kernel]
        # FC1 at every block size, from scale panels and from inline records, both schedules at the decode sizes,
        # gathering its routes' rows itself or reading them from the gather pass; the stage schedule two CTAs an SM
        got = sorted(
            (
                s.fact["TN"],
                s.fact.get("SRC", "native"),
                s.fact.get("SCHED", "slice"),
                s.fact["IO"],
                s.fact.get("RAG", 0),
                s.fact.get("OCC", 1),
            )
            for s in fc1
        )
        assert got == sorted(
            (t, src, sched, io, rag, occ)
            for t in ENGINE_TILE_N
            for src in ("native", "inline")
            for sched in _SCHEDULES[t]
            for io in ("gather", "dense")
            if _serves(sched, src, io)
            for rag in _RAGGEDS[t, sched]
            for occ in ((2,) if t <= 64 and sched == "stage" else (1,))
        )
        assert all(s.fact["FMT"] == "nvfp4" and s.fact["ACT"] == 1 + (geo.activation == "swiglu_oai") for s in fc1)
        passes = [s for s in engine_geometry_specs(geo) if s.kernel == "moe.engine_gather_tokens"]
        assert len(passes) == 1  # one pass for every block size: it reads the routes' slots, not the blocks
        inverse = [s for s in engine_geometry_specs(geo) if s.kernel.startswith("moe.align") and s.fact.get("INV")]
        assert {s.fact.get("BM") for s in inverse if "BM" in s.fact} == set(ENGINE_TILE_N)
    plain = engine_specs()
    want = {
        (f, t, src, io, sched, rag, occ)
        for f in ("mxfp4", "nvfp4")
        for t in ENGINE_TILE_N
        for src in ("native", "inline")
        for io in ENGINE_IO
        for sched in _SCHEDULES[t]
        if _serves(sched, src, io)
        for rag in _RAGGEDS[t, sched]
        for occ in ((2,) if t <= 64 and sched == "stage" else (1,))
    }
    got = {(s.fact["FMT"], s.fact["TN"], s.fact.get("SRC", "native"), s.fact["IO"], s.fact.get("SCHED", "slice"),
            s.fact.get("RAG", 0), s.fact.get("OCC", 1)) for s in plain}  # fmt: skip
    assert got == want
    assert all(s.fact["ACT"] == 0 for s in plain) and len({s.key for s in plain}) == len(plain)
    # native programs keep the identity they had before the inline source existed, slice ones theirs from before
    # the stage schedule
    assert "SRC" not in engine_gemm_spec(16).fact and engine_gemm_spec(16, scales="inline").fact["SRC"] == "inline"
    assert "SCHED" not in engine_gemm_spec(16, schedule="slice").fact


def test_schedules_default_by_block_size_and_fall_back_where_not_built():
    """``stage`` serves the decode block sizes by default; a wanted schedule the cache lacks for a size falls back
    to the size's default; an unknown one is refused."""
    assert [engine_schedule(t) for t in ENGINE_TILE_N] == ["stage", "stage", "stage", "slice", "slice"]
    assert engine_schedule(16, "slice") == "slice" and engine_schedule(128, "stage") == "slice"
    assert engine_gemm_spec(32).fact["SCHED"] == "stage" and "SCHED" not in engine_gemm_spec(128).fact
    with pytest.raises(ValueError, match="schedules"):
        engine_schedule(16, "deep")
    with pytest.raises(ValueError, match="schedules"):
        engine_gemm_spec(16, schedule="deep")
    w, s, x, out, be, meta = _operands()
    slice_ = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, schedule="slice")
    stage = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16)
    assert slice_.spec == engine_gemm_spec(16, schedule="slice") and stage.spec.fact["SCHED"] == "stage"
    # the same arguments: only the program differs
    same = [(a.data_ptr(), a.shape) if torch.is_tensor(a) else a for a in slice_.args]
    assert same == [(a.data_ptr(), a.shape) if torch.is_tensor(a) else a for a in stage.args]
    assert slice_.grid == stage.grid
    big = grouped_fp4_gemm_launch(w, s, x, out, be[:1], meta, tile_n=128, schedule="stage")
    assert big.spec == engine_gemm_spec(128, schedule="slice")


def test_pingpong_is_refused():
    """The ping-pong consumer schedule is gone (``docs/moe-engine.md`` §4.13): asking for it names the schedules that
    exist, at the specs, the launch and the layer, and the cache holds no ``SCHED=pingpong`` program."""
    assert "pingpong" not in ENGINE_SCHEDULES and {"slice", "stage"} <= set(ENGINE_SCHEDULES)
    named = re.escape(f"{ENGINE_SCHEDULES}; got 'pingpong'")
    with pytest.raises(ValueError, match=named):
        engine_schedule(256, "pingpong")
    with pytest.raises(ValueError, match=named):
        engine_gemm_spec(256, schedule="pingpong")
    w, s, x, out, be, meta = _operands()
    with pytest.raises(ValueError, match=named):
        grouped_fp4_gemm_launch(w, s, x, out, be[:1], meta, tile_n=256, schedule="pingpong")
    layer = engine_weights(_experts("mxfp4", 128, 128), "silu", fused=False)
    with pytest.raises(ValueError, match=re.escape(f"schedule 'pingpong': the FP4 GEMMs' are {ENGINE_SCHEDULES}")):
        EngineMoE(layer, 2, schedule="pingpong")
    assert not [spec for spec in engine_specs() if spec.fact.get("SCHED") == "pingpong"]
    # the 128- and 256-route programs keep the identity they had beside ping-pong
    assert engine_gemm_spec(128) == engine_gemm_spec(128, schedule="slice", ragged=1)
    assert engine_ragged(256, 2) == 2


def test_bound_probes_are_diagnostic_programs_no_plan_serves():
    """The bound probes are MXFP4 native dense GEMMs without an activation, whole blocks, at every block size with its
    default schedule and occupancy, carrying the fact ``PROBE``; anything else is refused, the launch asks for them
    only when told, and no program a layer's plan binds is one."""
    specs = engine_probe_specs()
    built = {(s.fact["PROBE"], s.fact["TN"]) for s in specs}
    assert built == {(p, t) for p in ENGINE_PROBES for t in ENGINE_PROBE_TILE_N}
    assert all("RAG" not in s.fact and s.fact["IO"] == "dense" and s.fact["FMT"] == "mxfp4" for s in specs)
    for bad in (
        {"tile_n": 64, "schedule": "slice"},
        {"tile_n": 256, "fmt": "nvfp4"},
        {"tile_n": 256, "io": "gather"},
        {"tile_n": 256, "activation": "silu"},
        {"tile_n": 256, "scales": "inline"},
        {"tile_n": 256, "ragged": 1},
        {"tile_n": 256, "probe": "fast"},
    ):
        with pytest.raises(ValueError, match="probe"):
            engine_gemm_spec(**{"ragged": 0, "probe": "ss", **bad})
    w, s, x, out, be, meta = _operands()
    probe = grouped_fp4_gemm_launch(w, s, x, out, be[:1], meta, tile_n=256, probe="noconvert")
    assert probe.spec == engine_gemm_spec(256, ragged=0, probe="noconvert")
    plain = dense_fp4_gemm_launch(w[0], s[0], x, out, tile_n=128)
    assert "PROBE" not in plain.spec.fact
    assert dense_fp4_gemm_launch(w[0], s[0], x, out, tile_n=128, probe="ss").spec.fact["PROBE"] == "ss"
    small = dense_fp4_gemm_launch(w[0], s[0], x, out, tile_n=16, probe="ss")
    assert small.spec == engine_gemm_spec(16, probe="ss") and small.spec.fact["OCC"] == 2
    geo = next(g for g in load_catalog().moe if g.fmt.name == "mxfp4")
    layer_specs = engine_geometry_specs(geo) + engine_specs()
    assert not any("PROBE" in spec.fact for spec in layer_specs)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("fused", [True, False])
def test_inline_engine_weights_carry_each_planes_engine_records(fmt, fused):
    """scale_source="inline": the records of the rows the GEMM reads (W13 in engine order where fused), one row group
    an expert, starts as int32 16-byte units; the weight panels are the native source's."""
    from csf_codec.engine_records import encode_engine_records
    from csf_kernels.moe.engine_inline import InlineScales

    g = {"w13_global_scale": torch.ones(2), "w2_global_scale": torch.ones(2)} if fmt == "nvfp4" else {}
    ex = _experts(fmt, 320, 192, **g)
    inline = engine_weights(ex, "silu", fused=fused, scale_source="inline")
    native = engine_weights(ex, "silu", fused=fused)
    assert inline.scale_source == "inline" and native.scale_source == "native"
    assert torch.equal(inline.w13, native.w13) and torch.equal(inline.w2, native.w2)
    perm = fc1_engine_rows(160, interleaved=False) if fused else torch.arange(320)
    for got, plane in ((inline.s13, ex.w13_scale[:, perm]), (inline.s2, ex.w2_scale)):
        assert isinstance(got, InlineScales) and (got.fmt, got.experts, got.rows, got.k) == (fmt, 2, 320, 192)
        want = encode_engine_records(plane.contiguous(), fmt, row_group=320)
        for name in ("base_ref", "base_delta", "record_units", "body"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert got.block_start.dtype == torch.int32 and torch.equal(got.block_start.long(), want.block_start.long())


def test_block_starts_read_as_units_from_bytes_or_units():
    from csf_codec.engine_record_layout import block_start_units

    as_bytes = torch.tensor([0, 48, 1600], dtype=torch.int64)
    assert torch.equal(block_start_units(as_bytes), torch.tensor([0, 3, 100]))
    as_units = torch.tensor([0, 3, 100], dtype=torch.int32)
    assert torch.equal(block_start_units(as_units), as_units)


def test_inline_sources_refuse_what_the_program_cannot_read():
    from csf_kernels.moe.engine_inline import inline_scales

    with pytest.raises(ValueError, match="scale_source"):
        engine_weights(_experts("mxfp4", 128, 128), "silu", scale_source="expanded")
    with pytest.raises(ValueError, match="at most 128"):  # 129 record tiles a row block: past the offset table
        inline_scales(torch.zeros(1, 64, 129 * 4, dtype=torch.uint8), "mxfp4")
    with pytest.raises(ValueError, match="multiples of 64"):
        inline_scales(torch.zeros(1, 96, 4, dtype=torch.uint8), "mxfp4")
    w = engine_weights(_experts("mxfp4", 128, 128), "silu", fused=False, scale_source="inline")
    x = torch.zeros(16, 128, dtype=torch.bfloat16)
    out = torch.zeros(16, 128, dtype=torch.bfloat16)
    i32 = dict(dtype=torch.int32)
    other = inline_scales(torch.full((2, 256, 4), 127, dtype=torch.uint8), "mxfp4")  # 256 rows an expert
    with pytest.raises(ValueError, match="do not fit"):
        grouped_fp4_gemm_launch(w.w13, other, x, out, torch.zeros(1, **i32), torch.ones(1, **i32), tile_n=16)
    launch = grouped_fp4_gemm_launch(w.w13, w.s13, x, out, torch.zeros(1, **i32), torch.ones(1, **i32), tile_n=16)
    assert launch.spec.fact["SRC"] == "inline" and launch.args[1:6] == w.s13.tensors()


def test_the_layer_passes_its_schedule_to_the_fp4_gemms():
    """EngineMoE(schedule=...) picks each FP4 GEMM's program (falling back where the size lacks it) and refuses an
    unknown schedule or one for W4A8 weights (their GEMM has its own)."""
    w = engine_weights(_experts("mxfp4", 128, 128), "silu", fused=False)
    x = torch.zeros(NX, 128, dtype=torch.bfloat16)
    out = torch.zeros(NX, 128, dtype=torch.bfloat16)
    be, meta = torch.zeros(NX // 16, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    for schedule, bm, want in (
        ("slice", 16, "slice"),
        ("stage", 16, "stage"),
        (None, 32, "stage"),
        ("stage", 128, "slice"),
    ):
        launch = EngineMoE(w, 2, schedule=schedule)._gemm("13", {"x": x}, out, be, meta, bm)
        assert launch.spec == engine_gemm_spec(bm, schedule=want), (schedule, bm)
    with pytest.raises(ValueError, match="schedule 'deep'"):
        EngineMoE(w, 2, schedule="deep")


def test_gather_pass_refuses_what_it_cannot_serve():
    x = torch.zeros(5, 128, dtype=torch.bfloat16)
    route_slots = torch.zeros(10, dtype=torch.int32)
    xs = torch.zeros(64, 128, dtype=torch.bfloat16)
    launch = gather_tokens_launch(x, route_slots, xs, top_k=2)
    assert launch.spec.kernel == "moe.engine_gather_tokens" and launch.grid == (1, 1)  # 8 tokens a program
    assert launch.args[3:] == (5, 128, 2, 64)  # tokens, hidden, top_k, and xs's slots: a slot past them is not stored
    with pytest.raises(TypeError, match="bf16"):
        gather_tokens_launch(x.float(), route_slots, xs, top_k=2)
    with pytest.raises(TypeError, match="bf16"):
        gather_tokens_launch(x[:, :64], route_slots, xs, top_k=2)
    with pytest.raises(ValueError, match="route_slots"):
        gather_tokens_launch(x, route_slots[:9], xs, top_k=2)
    with pytest.raises(ValueError, match="route_slots"):
        gather_tokens_launch(x, route_slots.long(), xs, top_k=2)
    with pytest.raises(ValueError, match="top_k"):
        gather_tokens_launch(x, route_slots, xs, top_k=0)


def test_fc1_rows_option_is_checked():
    weights = engine_weights(_experts("mxfp4", 128, 128), "silu")
    with pytest.raises(ValueError, match="fc1_rows"):
        EngineMoE(weights, 2, fc1_rows="tma")
    assert EngineMoE(weights, 2, fc1_rows="pass").fc1_rows == "pass"
    assert [fc1_rows_for(t) for t in ENGINE_TILE_N] == ["producer", "producer", "pass", "pass", "pass"]
    assert [fc1_rows_for(t, "inline") for t in ENGINE_TILE_N] == ["producer", "pass", "pass", "pass", "pass"]


def test_two_ctas_an_sm_where_built():
    """Two CTAs an SM serve 16-64-route blocks (their stage schedule's one-CTA programs are not built); anything else
    runs one CTA an SM, launched on that many SMs' count."""
    assert [engine_occupancy(t, engine_schedule(t)) for t in ENGINE_TILE_N] == [2, 2, 2, 1, 1]
    assert [engine_occupancy(t, engine_schedule(t), 1) for t in ENGINE_TILE_N] == [2, 2, 2, 1, 1]
    assert [engine_occupancy(t, engine_schedule(t), 2) for t in ENGINE_TILE_N] == [2, 2, 2, 1, 1]
    assert engine_occupancy(16, "slice", 2) == 1 and engine_occupancies(64, "stage") == (2,)
    with pytest.raises(ValueError, match="CTAs"):
        engine_occupancy(16, "stage", 3)
    with pytest.raises(ValueError, match="CTAs an SM"):
        engine_gemm_spec(128, ctas_per_sm=2)
    with pytest.raises(ValueError, match="CTAs an SM"):
        engine_gemm_spec(64, ctas_per_sm=1)
    w, s, x, out, be, meta = _operands()
    slice_ = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=64, schedule="slice")
    stage = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=64)
    assert "OCC" not in slice_.spec.fact and stage.spec.fact["OCC"] == 2
    assert slice_.grid[0] == 1 and stage.grid[0] == 1  # one unit here (64 slots, one 64-route block): never more CTAs


def test_wide_block_flags_default_to_two_multiplies_and_are_checked():
    """Without flags every 64-row block takes two multiplies a pair (ones); given ones must be uint8 [E, R / 64];
    the engine weights carry the flags of their rows as the panels hold them (MXFP4 only)."""
    w, s, x, out, be, meta = _operands()
    launch = grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16)
    wide = launch.args[9]
    assert wide.dtype == torch.uint8 and tuple(wide.shape) == (E, R // 64) and bool((wide == 1).all())
    flags = torch.zeros(E, R // 64, dtype=torch.uint8)
    assert grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, wide=flags).args[9] is flags
    with pytest.raises(ValueError, match="wide"):
        grouped_fp4_gemm_launch(w, s, x, out, be, meta, tile_n=16, wide=flags[:, :1])
    ex = _experts("mxfp4", 128, 128)
    ex.w2_scale[1, 70, 0] = 200  # a byte 129..254: its 64-row block converts with two multiplies
    weights = engine_weights(ex, "silu", fused=False)
    assert weights.wide2.tolist() == [[0, 0], [0, 1]] and weights.wide13.tolist() == [[0, 0], [0, 1]]
    assert engine_weights(_experts("nvfp4", 128, 128, w13_global_scale=torch.ones(2), w2_global_scale=torch.ones(2)),
                          "silu").wide13 is None  # fmt: skip
