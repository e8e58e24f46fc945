"""The fused MoE layer on the GPU, from the AOT cache (frozen): every catalog geometry of the issue,
three scale sources bit-identical, the float32 reference, padding routes, CUDA graphs, memory."""

from __future__ import annotations

import dataclasses
import gc
import os

import pytest
import torch

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe import bind, plan, prepare_weights
from csf_moe.reference import moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from tests.cuda_graphs import replay_allocating_nothing
from tests.moe.padding_routes import with_padding_routes

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")  # fresh data every run; in every failure message
GEOMETRIES = [
    ("deepseek-v4.1-flash", 4, "mxfp4"),
    ("deepseek-v4.1-flash", 4, "nvfp4"),
    ("gpt-oss-120b", 1, "mxfp4"),
    ("qwen3-30b-a3b", 1, "mxfp4"),
    ("qwen3-30b-a3b", 1, "nvfp4"),
    ("qwen3-next-80b-a3b", 1, "mxfp4"),
    ("qwen3-next-80b-a3b", 1, "nvfp4"),
    ("kimi-k2", 16, "mxfp4"),
    ("kimi-k2", 16, "nvfp4"),
]
MAX_TOKENS = 2048
# above its inline limit an inline plan expands its routed experts' scales (the default limit is 0 tokens:
# always; "inline_records" reads the records in the GEMM up to 512). The buckets (powers of two) of these
# token counts run every decode block: 8-route mma.sync blocks (up to 4 routes per expert), 16-, 32- and
# 64-route wgmma blocks reading relabelled activations (16: DS4.1 at 300, records included; 32: most
# geometries at 300-1500; 64: Qwen3-30B at 1500). The prefill tiles (above 1024 routes per expert):
# test_prefill_tiles_are_bit_identical_and_match_the_reference.
TOKENS = (1, 3, 7, 64, 300, 700, 1500)  # 1 and 3: the native and records arms read routes as blocks
ARMS = {
    "native": dict(scale_source="native"),
    "expanded": dict(scale_source="expanded"),
    "inline": dict(scale_source="inline"),
    "inline_records": dict(scale_source="inline", inline_token_limit=512),
}
# relative Frobenius error against float32: the intermediate and the output each round to bf16 once
REL_TOL = 2e-2


def _geometry(model, tp, fmt):
    return load_catalog().moe_geometry(model, tp, fmt)


def _layers(geo, data, arms=ARMS, **common):
    layers = {}
    for arm, kwargs in arms.items():
        p = plan(geo, MAX_TOKENS, **kwargs, **common)
        weights = prepare_weights(p, **data.weight_kwargs())
        layers[arm] = bind(p, weights, torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))
    return layers


def _poisoned_run(layer, x, ids, w):
    layer.scratch.fill_(0xFF)
    out = torch.full_like(x, float("nan"))
    return layer.run(x, ids, w, out=out)


def _check_arms(geo, data, layers, tokens):
    """At each token count: every arm's output bit-identical to native's, and native's close to float32."""
    ref = data.reference()
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for t in tokens:
        x, ids, w = synthetic_routing(geo, t, gen)
        outs = {s: _poisoned_run(layer, x, ids, w) for s, layer in layers.items()}
        for s in layers:
            assert torch.equal(outs[s], outs["native"]), f"seed {SEED} {geo.name} T={t}: {s} != native"
        want = moe_reference(x, ref, w, ids, kind=geo.activation)
        err = float((outs["native"].float() - want).norm() / want.norm())
        assert err < REL_TOL, f"seed {SEED} {geo.name} T={t}: relative error {err:.3e}"


@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES, ids=[f"{m}-tp{t}-{f}" for m, t, f in GEOMETRIES])
def test_sources_are_bit_identical_and_match_the_reference(model, tp, fmt):
    geo = _geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    _check_arms(geo, data, _layers(geo, data), TOKENS)


@pytest.mark.parametrize(
    ("model", "tp", "fmt"),
    [("qwen3-30b-a3b", 1, "nvfp4"), ("gpt-oss-120b", 1, "mxfp4")],
    ids=["qwen3-nvfp4", "gpt-oss"],
)
def test_prefill_tiles_are_bit_identical_and_match_the_reference(model, tp, fmt):
    """Plans run the prefill tiles only above 1024 routes per expert: here at every bucket (decode tiles off)."""
    geo = _geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    arms = {arm: ARMS[arm] for arm in ("native", "expanded", "inline")}
    layers = _layers(geo, data, arms, decode_routes_per_expert=0)
    assert all(not b.config.split_k for lay in layers.values() for b in lay.plan.buckets)
    _check_arms(geo, data, layers, (7, 300))


def _stressed_plane(plane, fmt, gen):
    """``plane`` with its 128 x 4 tiles rewritten at random into what the decode GEMM's step-ahead path does not
    take: MXFP4 tiles spread over four codes (2-bit selectors), tiles spread over 32 codes (raw), and tiles with
    12-40 exceptions (past the four loaded a step ahead). No NaN codes: outputs stay comparable bit for bit."""
    e, rows, cols = plane.shape
    out = plane.view(torch.uint8).clone()
    tiles = out[:, : rows // 128 * 128, : cols // 4 * 4].view(e, rows // 128, 128, cols // 4, 4)
    kind = torch.randint(0, 20, (e, rows // 128, 1, cols // 4, 1), generator=gen, device=plane.device)
    noise = torch.randint(0, 256, tiles.shape, generator=gen, device=plane.device, dtype=torch.int32)
    t32 = tiles.to(torch.int32)
    top = 254 if fmt == "mxfp4" else 0x7E  # the largest code below NaN
    spread = (t32 + noise % 3).clamp(max=top) if fmt == "mxfp4" else t32  # NVFP4 encodes 4-bit windows anyway
    dense = torch.where(noise < 16, (t32 + 6).clamp(max=top), t32)  # ~32 exceptions
    wide = (t32 + noise % 32 - 16).clamp(0, top)
    t32 = torch.where(kind < 6, spread, torch.where(kind == 6, wide, torch.where(kind < 10, dense, t32)))
    tiles.copy_(t32.to(torch.uint8))
    return out.view(plane.dtype)


@pytest.mark.parametrize(("model", "tp", "fmt"), [("gpt-oss-120b", 1, "mxfp4"), ("qwen3-30b-a3b", 1, "nvfp4")])
def test_records_of_every_kind_decode_bit_identically(model, tp, fmt):
    """The decode GEMM takes a full tile in the format's usual selector mode from loads made a step ahead and
    everything else (the tail tile, raw tiles, other modes, exceptions past the fourth) in its own step: planes
    holding all of those give native's bits in every arm."""
    geo = _geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    data = dataclasses.replace(
        data, w13_scale=_stressed_plane(data.w13_scale, fmt, gen), w2_scale=_stressed_plane(data.w2_scale, fmt, gen)
    )
    layers = _layers(geo, data, {arm: ARMS[arm] for arm in ("native", "inline", "inline_records")})
    for op in (layers["inline_records"].weights.w13, layers["inline_records"].weights.w2):
        modes, headers = op.inline.mode_counts(), op.inline.headers()
        assert modes["raw"] > 0 and (fmt == "nvfp4" or modes["sel2"] > 0), f"seed {SEED}: {modes}"
        assert int(((headers >> 2) & 63)[(headers & 3) != 3].max()) > 4, f"seed {SEED}: no long exception list"
    assert layers["inline_records"].weights.w13.inline.tail_record_bytes or fmt == "nvfp4"  # gpt-oss: K tails
    _check_arms(geo, data, layers, (1, 3, 7, 64))


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_padding_routes_contribute_exactly_nothing(ids_dtype):
    geo = _geometry("qwen3-30b-a3b", 1, "mxfp4")
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    layer = _layers(geo, data)["inline_records"]
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for t in (1, 3, 5, 600):  # routes read as blocks (1, 3: no alignment); records read in the GEMM; expanded
        x, ids, w = synthetic_routing(geo, t, gen, ids_dtype=ids_dtype)
        invalid = (-1, geo.experts, torch.iinfo(ids_dtype).max, torch.iinfo(ids_dtype).min)
        # 15% of the routes (each invalid id once 4 are drawn); t <= 3: a token without a live slot (one token: the
        # whole call) gets zero rows
        padded = with_padding_routes(ids, geo.experts, invalid=invalid, fraction=0.15, gen=gen, empty_token=t <= 3)
        live = (padded >= 0) & (padded < geo.experts)
        got = _poisoned_run(layer, x, padded, w)
        # the same routes with padding replaced by a real expert at weight exactly zero
        masked = torch.where(live, padded, torch.zeros_like(padded))
        want = _poisoned_run(layer, x, masked, torch.where(live, w, torch.zeros_like(w)))
        assert torch.equal(got, want), f"seed {SEED} T={t} {ids_dtype}"
        assert not got[~live.any(-1)].any(), f"seed {SEED} T={t} {ids_dtype}: a token without live slots"


@pytest.mark.parametrize(("model", "tp", "fmt"), [("deepseek-v4.1-flash", 4, "mxfp4"), ("kimi-k2", 16, "nvfp4")])
def test_cuda_graph_replay_is_exact_and_allocation_free(model, tp, fmt):
    geo = _geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    layer = _layers(geo, data)["inline_records"]
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    # routes read as blocks without an alignment (1, 3); a bucket reading records in the GEMM; an expanding one
    for t in (1, 3, 8, 700):
        x, ids, w = synthetic_routing(geo, t, gen)
        out = torch.empty_like(x)
        layer.run(x, ids, w, out=out)  # bind outside capture (eager warm-up, as engines do)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer.run(x, ids, w, out=out)
        for _ in range(3):
            nx, nids, nw = synthetic_routing(geo, t, gen)
            x.copy_(nx), ids.copy_(nids), w.copy_(nw)
            eager = _poisoned_run(layer, x, ids, w).clone()
            layer.scratch.fill_(0xFF)
            out.fill_(float("nan"))
            replay_allocating_nothing(graph)
            assert torch.equal(out, eager), f"seed {SEED} {geo.name} T={t}: replay != eager"


@pytest.mark.parametrize(
    ("model", "tp", "fmt"),
    [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "nvfp4"), ("qwen3-30b-a3b", 1, "mxfp4")],
)
def test_one_token_fc1_on_records_is_bit_identical_eager_and_in_graphs(model, tp, fmt):
    """An inline plan's one-token calls (and Qwen3-30B MXFP4's two-token calls, whose FC1 programs run few K steps)
    run FC1 on W13's records while W2's expansion runs beside it (a dependent launch that waits for FC1 only
    before it exits) and FC2 reads the expanded plane; with
    ``fc1_records_tokens=0`` both planes are expanded first. Native's bits at 1-4 tokens, eager with poisoned
    scratch and in CUDA-graph replays with new routes (the W2 plane rewritten beside FC1 in each)."""
    geo = _geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    arms = {"native": ARMS["native"], "inline": ARMS["inline"],
            "both_planes": dict(scale_source="inline", fc1_records_tokens=0)}  # fmt: skip
    layers = _layers(geo, data, arms)
    assert layers["inline"].plan.bucket_for(1).fc1_reads_records
    x, ids, w = synthetic_routing(geo, 1, torch.Generator(device="cuda").manual_seed(SEED))
    fc1 = layers["inline"].launches(x, ids, w, torch.empty_like(x))[0]
    assert fc1.prefer_shared and fc1.spec.fact["SRC"] == 1  # the records programs' carveout
    fc1.bind(geo.name)
    drv = runtime.driver.driver()
    attr = drv.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    function = drv.cu.CUfunction(runtime.program(fc1.spec, geometry=geo.name).function)
    assert drv.check(drv.cu.cuFuncGetAttribute(attr, function), "carveout") == 100
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for t in (1, 2, 3, 4):
        x, ids, w = synthetic_routing(geo, t, gen)
        kernels = [la.spec.kernel for la in layers["inline"].launches(x, ids, w, torch.empty_like(x))]
        records = t <= layers["inline"].plan.bucket_for(t).fc1_records_tokens  # (Qwen3-30B MXFP4: 1-2 tokens)
        assert (kernels[:2] == ["moe.gemm_decode", "expand.row_blocks"]) == records, f"{geo.name} T={t}: {kernels}"
        graphs = {}
        for arm in ("inline", "both_planes"):
            out = torch.empty_like(x)
            layers[arm].run(x, ids, w, out=out)  # bind outside capture
            torch.cuda.synchronize()
            graphs[arm] = (torch.cuda.CUDAGraph(), out)
            with torch.cuda.graph(graphs[arm][0]):
                layers[arm].run(x, ids, w, out=out)
        for _ in range(3):
            want = _poisoned_run(layers["native"], x, ids, w).clone()
            for arm, (graph, out) in graphs.items():
                assert torch.equal(_poisoned_run(layers[arm], x, ids, w), want), f"seed {SEED} {geo.name} T={t} {arm}"
                layers[arm].scratch.fill_(0xFF)
                out.fill_(float("nan"))
                replay_allocating_nothing(graph)
                assert torch.equal(out, want), f"seed {SEED} {geo.name} T={t} {arm}: replay != native"
            nx, nids, nw = synthetic_routing(geo, t, gen)
            x.copy_(nx), ids.copy_(nids), w.copy_(nw)


def test_weight_preparation_leaves_no_reserved_memory():
    geo = _geometry("deepseek-v4.1-flash", 4, "mxfp4")
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    p = plan(geo, 64, scale_source="inline")
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    weights = prepare_weights(p, **data.weight_kwargs())
    torch.cuda.synchronize()
    after = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    # what preparation adds to the reserved-but-unused memory (earlier tests leave their own fragments)
    grown = after - before
    assert grown < 4 << 20, f"preparation left {grown / 2**20:.1f} MiB reserved but unused ({after / 2**20:.1f} total)"
    stored, native = weights.scale_bytes()["stored"], weights.scale_bytes()["native"]
    assert stored < native / 3, f"inline scales {stored} B vs native {native} B"


def test_frozen_plan_and_bind_fail_clearly_for_an_unplanned_token_count():
    geo = _geometry("qwen3-30b-a3b", 1, "nvfp4")
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    p = plan(geo, 16, scale_source="inline")
    layer = bind(p, prepare_weights(p, **data.weight_kwargs()), torch.empty(p.scratch_bytes, dtype=torch.uint8,
                                                                            device="cuda"))  # fmt: skip
    x, ids, w = synthetic_routing(geo, 17, torch.Generator(device="cuda").manual_seed(SEED))
    with pytest.raises(ValueError, match="exceed the plan's max_tokens"):
        layer.run(x, ids, w)


def test_misaligned_and_strided_inputs_give_the_aligned_result():
    """The programs are compiled for 16-byte aligned operands: views that are not get aligned copies
    (and a misaligned ``out`` a temporary), never a misaddressed load."""
    geo = _geometry("qwen3-30b-a3b", 1, "mxfp4")
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    layer = _layers(geo, data)["inline_records"]
    x, ids, w = synthetic_routing(geo, 9, torch.Generator(device="cuda").manual_seed(SEED))
    want = _poisoned_run(layer, x, ids, w).clone()
    # the same values at addresses 2, 4 and 8 bytes past a 16-byte boundary, and a strided top-k
    x_off = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view_as(x).copy_(x)
    ids_off = torch.empty(ids.numel() + 1, dtype=ids.dtype, device="cuda")[1:].view_as(ids).copy_(ids)
    w_wide = torch.empty(w.shape[0], 2 * w.shape[1], dtype=w.dtype, device="cuda")
    w_wide[:, ::2] = w
    out_off = torch.empty(x.numel() + 4, dtype=x.dtype, device="cuda")[4:].view_as(x)
    assert x_off.data_ptr() % 16 and ids_off.data_ptr() % 16 and out_off.data_ptr() % 16
    got = layer.run(x_off, ids_off, w_wide[:, ::2], out=out_off)
    assert got.data_ptr() == out_off.data_ptr() and torch.equal(got, want), f"seed {SEED}"


def _widened(data, gen):
    """The layer with about a tenth of the E8M0 scale bytes of every third 64-row tile raised by 12 (bytes up
    to 254, scales of 4 and more): those tiles need the two-multiply conversion, the others do not."""

    def widen(plane):
        plane = plane.clone()
        rows = torch.arange(plane.shape[1], device=plane.device).view(1, -1, 1)
        pick = (torch.rand(plane.shape, generator=gen, device=plane.device) < 0.1) & (plane < 243)
        plane[pick & (rows // 64 % 3 == 0)] += 12
        assert bool(((plane > 128) & (plane < 255)).any())
        return plane

    return dataclasses.replace(data, w13_scale=widen(data.w13_scale), w2_scale=widen(data.w2_scale))


def test_wide_e8m0_scales_take_two_multiplies_and_stay_exact():
    geo = _geometry("qwen3-30b-a3b", 1, "mxfp4")
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    data = synthetic_layer(geo, seed=SEED, device="cuda")
    wide = _widened(data, gen)
    layers, wide_layers = _layers(geo, data), _layers(geo, wide)
    for arm in ARMS:
        for op in (wide_layers[arm].weights.w13, wide_layers[arm].weights.w2):
            assert op.wide_tiles.any() and not op.wide_tiles.all(), arm  # both conversions in one launch
    # every row tile through two multiplies: the same bits as one multiply where that suffices
    forced = {}
    for arm, layer in layers.items():
        w = layer.weights
        ones13, ones2 = torch.ones_like(w.w13.wide_tiles), torch.ones_like(w.w2.wide_tiles)
        weights = dataclasses.replace(w, w13=dataclasses.replace(w.w13, wide_tiles=ones13),
                                      w2=dataclasses.replace(w.w2, wide_tiles=ones2))  # fmt: skip
        forced[arm] = bind(layer.plan, weights, torch.empty_like(layer.scratch))
    ref = wide.reference()
    for t in (1, 7, 64, 700):
        x, ids, w = synthetic_routing(geo, t, gen)
        for arm in ARMS:
            one = _poisoned_run(layers[arm], x, ids, w).clone()
            assert torch.equal(_poisoned_run(forced[arm], x, ids, w), one), f"seed {SEED} T={t} {arm}: 2 != 1 mul"
        outs = {arm: _poisoned_run(layer, x, ids, w).clone() for arm, layer in wide_layers.items()}
        for arm in ARMS:
            assert torch.equal(outs[arm], outs["native"]), f"seed {SEED} T={t}: wide {arm} != native"
        want = moe_reference(x, ref, w, ids, kind=geo.activation)
        err = float((outs["native"].float() - want).norm() / want.norm())
        assert err < REL_TOL, f"seed {SEED} T={t}: wide scales, relative error {err:.3e}"
