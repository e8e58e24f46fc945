"""Engine plans (``plan(..., gemm="engine")``), their programs and scratch, the served layer's weights and binding,
on the CPU: the programs a plan lists are exactly those the engine layer's calls launch (checked against the launches
``EngineMoE`` builds for every token count), every served catalog geometry's are in the catalog, the weights prepared
from a serving engine's parameters equal ``engine_weights`` of the reference's experts, and binding refuses what it
cannot serve, a frozen runtime naming the first program its AOT cache lacks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from csf_codec import scale_format
from csf_kernels import runtime
from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import MoEGeometry, load_catalog
from csf_kernels.moe.engine_inline import InlineScales
from csf_moe import MoEPlan, plan
from csf_moe.engine_layer import EngineMoE, bind_engine, call_buffer_bytes, call_buffers, engine_weights, fc1_rows_for
from csf_moe.engine_plan import EnginePlan
from csf_moe.engine_prepare import prepare_engine_weights, w13_engine_rows
from csf_moe.reference import interleave_gate_up
from csf_moe.synthetic import synthetic_layer, synthetic_routing


def _geo(fmt="mxfp4", activation="silu", bias=False, experts=8, top_k=2) -> MoEGeometry:
    return MoEGeometry(model="tiny", tp=1, fmt=scale_format(fmt), experts=experts, hidden=256, intermediate=128,
                       top_k=top_k, activation=activation, bias=bias)  # fmt: skip


QWEN = ("qwen3-30b-a3b", 1)


def _scratch(nbytes: int) -> torch.Tensor:
    """A 256-byte aligned uint8 buffer (the CPU allocator aligns less than CUDA's)."""
    buf = torch.zeros(nbytes + 256, dtype=torch.uint8)
    start = -buf.data_ptr() % 256
    return buf[start : start + nbytes]


def test_the_default_plan_is_the_triton_layers_and_the_engine_plan_a_frozen_dataclass():
    geo = load_catalog().moe_geometry(*QWEN, "mxfp4")
    triton = plan(geo, 512)
    assert isinstance(triton, MoEPlan) and triton.scale_source == "inline"
    assert plan(geo, 512, scale_source="native").scale_source == "native"  # every existing call as before
    assert isinstance(plan(geo, 512, gemm="triton", activations="bf16"), MoEPlan)
    p = plan(geo, 512, gemm="engine")
    assert isinstance(p, EnginePlan) and (p.gemm, p.scale_source, p.activations, p.fmt) == (
        "engine", "inline", "bf16", "mxfp4")  # fmt: skip
    assert [b.tokens for b in p.buckets] == [t for t in load_catalog().token_buckets if t <= 512]
    assert p.bucket_for(3).tokens == 4 and p.max_tokens == 512 and p.top_k == geo.top_k
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_tokens = 1024
    w4a8 = plan(geo, 512, gemm="engine", activations="fp8_per_token")
    assert (w4a8.w4a8, w4a8.scale_source, w4a8.convention) == (True, "native", "per_token")
    assert plan(geo, 512, gemm="engine", scale_source="native").scale_source == "native"
    sized = plan(geo, 100, gemm="engine", buckets=(1, 3, 24, 96, 4096))  # graph sizes become buckets
    assert [b.tokens for b in sized.buckets] == [1, 3, 24, 96, 100] and sized.bucket_for(3).tokens == 3


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(activations="fp8_per_token"), "runs on the engine's FP8 GEMM only"),  # gemm="triton"
        (dict(gemm="triton", activations="fp8_per_token", scale_source="native"), "gemm='engine'"),
        (dict(gemm="cutlass"), "gemm must be one of"),
        (dict(gemm="engine", activations="fp8"), "activations must be one of"),
        (dict(gemm="engine", scale_source="expanded"), "the engine reads"),
        (dict(gemm="engine", activations="fp8_per_token", scale_source="inline"), "scale panels only"),
        (dict(gemm="engine", inline_token_limit=64), "inline_token_limit: options of the Triton layer"),
        (dict(gemm="engine", max_tokens=0), "max_tokens must be positive"),
    ],
)
def test_bad_combinations_are_refused_saying_why(kwargs, error):
    geo = load_catalog().moe_geometry(*QWEN, "mxfp4")
    kwargs = {"max_tokens": 64, **kwargs}
    with pytest.raises(ValueError, match=error):
        plan(geo, **kwargs)


def test_w4a8_plans_refuse_nvfp4_which_stays_w4a16():
    geo = load_catalog().moe_geometry(*QWEN, "nvfp4")
    with pytest.raises(ValueError, match="stays W4A16"):
        plan(geo, 64, gemm="engine", activations="fp8_per_token")
    assert plan(geo, 64, gemm="engine").fmt == "nvfp4"


def _launch_specs(layer: EngineMoE, geo: MoEGeometry, tokens: int, ids_dtype: torch.dtype, scratch=None):
    x = torch.zeros(tokens, geo.hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, geo.top_k, dtype=ids_dtype)
    w = torch.zeros(tokens, geo.top_k, dtype=torch.float32)
    launches, _ = layer.launches(x, ids, w, torch.empty_like(x), scratch=scratch)
    return tuple(launch.spec for launch in launches)


VARIANTS = [
    ("mxfp4", "silu", False, "bf16", "inline"),
    ("mxfp4", "swiglu_oai", True, "bf16", "native"),
    ("nvfp4", "silu", False, "bf16", "inline"),
    ("mxfp4", "swiglu_oai", True, "fp8_per_token", "native"),
    ("mxfp4", "silu", False, "fp8_per_token", "native"),
]


@pytest.mark.parametrize("fmt, act, bias, acts, source", VARIANTS, ids=["-".join(map(str, v)) for v in VARIANTS])
def test_a_plans_programs_are_exactly_what_its_calls_launch(fmt, act, bias, acts, source):
    """Every token count up to max_tokens (past every block size and the one-chunk alignment), both route id dtypes:
    the plan's call_specs are the specs of the launches EngineMoE builds, in order, and specs() their union."""
    geo = _geo(fmt, act, bias)
    max_tokens = 1100  # 2 routes a token over 8 experts: 16-route blocks to 64 tokens, 256 from 513
    p = plan(geo, max_tokens, gemm="engine", activations=acts, scale_source=source, buckets=(1, 2, 7, 96, 700))
    data = synthetic_layer(geo, seed=1)
    weights = prepare_engine_weights(p, **data.weight_kwargs())
    layer = EngineMoE(weights, geo.top_k, activations=p.convention)
    union = set()
    for t in range(1, max_tokens + 1):
        for ids_dtype in (torch.int32, torch.int64):
            got = _launch_specs(layer, geo, t, ids_dtype)
            assert got == p.call_specs(t, ids_dtype == torch.int64), (t, ids_dtype)
            union |= {s.key for s in got}
    assert union == {s.key for s in p.specs()}
    assert len(p.specs()) == len(union)
    blocks = {s.fact["TN"] for s in p.specs() if "TN" in s.fact}
    assert blocks == ({16, 32, 64, 128} if acts != "bf16" else {16, 32, 64, 128, 256})


def test_every_served_catalog_geometrys_engine_programs_are_in_the_catalog():
    """No catalog change is needed to serve the engine: each geometry's W4A16 plans (inline records, scale panels)
    and, MXFP4, its W4A8 plan list only programs ``nox -s aot_build`` builds."""
    catalog = load_catalog()
    built = set(catalog_specs(catalog, cute=True))
    for geo in catalog.moe:
        variants = [("bf16", "inline"), ("bf16", "native")] + (
            [("fp8_per_token", "native")] * (geo.fmt.name == "mxfp4")
        )
        for acts, source in variants:
            p = plan(geo, 16384, gemm="engine", activations=acts, scale_source=source, buckets=(1, 3, 24, 96, 512))
            missing = [s.describe() for s in p.specs() if s.key not in built]
            assert not missing, f"{geo.name} {acts} {source}: {missing}"


@pytest.mark.parametrize("acts", ["bf16", "fp8_per_token"])
def test_the_scratch_holds_every_calls_buffers(acts):
    geo = _geo()
    p = plan(geo, 1100, gemm="engine", activations=acts, scale_source=None)
    need = [p.call_bytes(t) for t in range(1, 1101)]
    assert p.scratch_bytes == max(need)
    # the layer carves exactly call_buffers' buffers from a shared scratch, inside it
    weights = prepare_engine_weights(p, **synthetic_layer(geo, seed=2).weight_kwargs())
    layer = EngineMoE(weights, geo.top_k, activations=p.convention)
    scratch = _scratch(p.scratch_bytes)
    for t in (1, 64, 65, 700, 1100):
        x = torch.zeros(t, geo.hidden, dtype=torch.bfloat16)
        ids, w = torch.zeros(t, geo.top_k, dtype=torch.int32), torch.zeros(t, geo.top_k, dtype=torch.bfloat16)
        _, keep = layer.launches(x, ids, w, torch.empty_like(x), scratch=scratch)
        start, end = scratch.data_ptr(), scratch.data_ptr() + scratch.numel()
        tensors = [b for b in keep if isinstance(b, torch.Tensor)]
        tensors += [v for b in keep if isinstance(b, dict) for k, v in b.items() if k != "x"]
        assert tensors and all(start <= b.data_ptr() < end for b in tensors), t
        assert keep[-1].dtype == torch.float32  # bf16 routing weights copied into the scratch
        shapes = call_buffers(t, geo.top_k, geo.experts, geo.hidden, geo.intermediate, w4a8=p.w4a8,
                              fc1_rows="pass" if p.w4a8 else fc1_rows_for(p.tile_n(t), p.scale_source),
                              float_weights=True)  # fmt: skip
        assert call_buffer_bytes(shapes) <= p.scratch_bytes
    with pytest.raises(ValueError, match="this call needs"):
        layer.launches(x, ids, w, torch.empty_like(x), scratch=scratch[: p.call_bytes(1100) - 256])


def _same(a, b, where: str) -> None:
    if isinstance(a, InlineScales):
        assert isinstance(b, InlineScales) and (a.fmt, a.experts, a.rows, a.cols) == (b.fmt, b.experts, b.rows, b.cols)
        for x, y in zip(a.tensors(), b.tensors(), strict=True):
            assert torch.equal(x, y), where
    elif a is None or b is None:
        assert a is None and b is None, where
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


PREPARED = [
    ("mxfp4", "silu", False, "bf16", "gate_up"),
    ("mxfp4", "silu", False, "bf16", "interleaved"),
    ("mxfp4", "swiglu_oai", True, "bf16", "interleaved"),  # gpt-oss checkpoints
    ("mxfp4", "swiglu_oai", True, "bf16", "gate_up"),  # vLLM's swigluoai_uninterleave
    ("nvfp4", "silu", False, "bf16", "gate_up"),
    ("mxfp4", "swiglu_oai", True, "fp8_per_token", "interleaved"),
    ("mxfp4", "silu", False, "fp8_per_token", "gate_up"),
]


# W4A16 from inline records and from scale panels; W4A8 from scale panels (its only source)
PREPARED = [(*v, src) for v in PREPARED for src in (("inline", "native") if v[3] == "bf16" else ("native",))]


@pytest.mark.parametrize(
    "fmt, act, bias, acts, layout, source", PREPARED, ids=["-".join(map(str, v)) for v in PREPARED]
)
def test_prepared_weights_equal_engine_weights_of_the_reference(fmt, act, bias, acts, layout, source):
    """From the engine's parameters (rows stored either way, NVFP4 scales as float8_e4m3fn, values handed over):
    field for field what engine_weights makes of the reference's experts, the panels in the values' own storage."""
    geo = _geo(fmt, act, bias)
    p = plan(geo, 64, gemm="engine", activations=acts, scale_source=source)
    data = synthetic_layer(geo, seed=5)
    want = engine_weights(data.reference(), act, w4a8=p.w4a8, scale_source=source)
    kw = data.weight_kwargs()
    if layout == "interleaved":
        kw |= {k: interleave_gate_up(kw[k]) for k in ("w13", "w13_scale", "w13_bias")}
    if fmt == "nvfp4":
        kw |= {k: kw[k].view(torch.float8_e4m3fn) for k in ("w13_scale", "w2_scale")}
        kw["w13_global_scale"] = kw["w13_global_scale"][:, None].expand(-1, 2)[:, 0]  # one per expert
    values = (kw["w13"].clone(), kw["w2"].clone())
    got = prepare_engine_weights(p, **(kw | {"w13": values[0], "w2": values[1]}), w13_layout=layout,
                                 values_in_place=True)  # fmt: skip
    for f in dataclasses.fields(want):
        _same(getattr(got, f.name), getattr(want, f.name), f.name)
    assert got.w13.data_ptr() == values[0].data_ptr() and got.w2.data_ptr() == values[1].data_ptr()
    copied = prepare_engine_weights(p, **kw, w13_layout=layout)
    assert torch.equal(copied.w13, want.w13) and copied.w13.data_ptr() != kw["w13"].data_ptr()
    sizes = got.scale_bytes()
    assert sizes["native"] == sum(s.numel() for s in (kw["w13_scale"], kw["w2_scale"]))
    if source == "inline":  # records: smaller than the planes
        assert 0 < sizes["stored"] < sizes["native"] and sizes["stored"] == got.s13.nbytes + got.s2.nbytes
    else:  # panels hold every byte (W4A8 adds its row bases and fold flags)
        extra = sum(t.numel() for t in (got.base13, got.base2, got.flags13, got.flags2) if t is not None)
        assert sizes["stored"] == sizes["native"] + extra and (extra > 0) == (acts != "bf16")


def test_engine_rows_compose_the_stored_layout_with_the_engine_order():
    for act in ("silu", "swiglu_oai"):
        same = w13_engine_rows(64, act, "interleaved" if act == "swiglu_oai" else "gate_up")
        other = w13_engine_rows(64, act, "gate_up" if act == "swiglu_oai" else "interleaved")
        assert sorted(same.tolist()) == sorted(other.tolist()) == list(range(128))
        rows = torch.arange(128)  # each row's index in the activation's layout, stored in the other layout ...
        stored = interleave_gate_up(rows[None])[0] if act == "silu" else torch.cat((rows[0::2], rows[1::2]))
        assert torch.equal(stored[other], rows[same])  # ... and read through it: the same rows
    with pytest.raises(ValueError, match="w13_layout"):
        w13_engine_rows(64, "silu", "up_gate")


def test_prepare_refuses_what_the_plan_does_not_fit():
    geo = _geo()
    p = plan(geo, 64, gemm="engine")
    kw = synthetic_layer(geo, seed=0).weight_kwargs()
    with pytest.raises(ValueError, match="expected packed FP4"):
        prepare_engine_weights(p, **(kw | {"w2": kw["w2"][:, :128]}))
    with pytest.raises(ValueError, match="does not match"):
        prepare_engine_weights(p, **(kw | {"w13_scale": kw["w13_scale"][:, :, :4]}))
    with pytest.raises(ValueError, match="takes no w13_bias"):
        prepare_engine_weights(p, **(kw | {"w13_bias": torch.zeros(8, 256)}))
    values = kw["w13"].clone()
    with pytest.raises(TypeError, match="scale plane"):
        prepare_engine_weights(p, **(kw | {"w13": values, "w2_scale": kw["w2_scale"].float()}), values_in_place=True)
    assert torch.equal(values, kw["w13"])  # refused before anything was rewritten


def test_binding_checks_scratch_and_weights_and_names_a_missing_program(tmp_path):
    geo = _geo()
    p = plan(geo, 64, gemm="engine")
    weights = prepare_engine_weights(p, **synthetic_layer(geo, seed=0).weight_kwargs())
    scratch = _scratch(p.scratch_bytes)
    with pytest.raises(ValueError, match="the plan needs"):
        bind_engine(p, weights, scratch[:-256])
    native = plan(geo, 64, gemm="engine", scale_source="native")
    with pytest.raises(ValueError, match="were not prepared for the plan"):
        bind_engine(native, weights, _scratch(native.scratch_bytes))
    was = runtime.is_frozen()
    runtime.set_cache_root(tmp_path)  # an empty cache: every program missing
    runtime.freeze()
    try:
        with pytest.raises(
            runtime.UncachedProgramError, match=r"program moe\..* for geometry tiny/tp1/mxfp4 is not in"
        ):
            bind_engine(p, weights, scratch)
    finally:
        runtime.set_cache_root(None)
        if not was:
            runtime.unfreeze()


def test_served_calls_check_their_operands():
    """What EngineLayer.run refuses before it binds anything (on the CPU nothing can launch)."""
    from csf_moe.engine_layer import EngineLayer

    geo = _geo()
    p = plan(geo, 64, gemm="engine")
    weights = prepare_engine_weights(p, **synthetic_layer(geo, seed=0).weight_kwargs())
    layer = EngineLayer(p, weights, _scratch(p.scratch_bytes))
    x, ids, w = synthetic_routing(geo, 65, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="exceed the plan's max_tokens=64"):
        layer.run(x, ids, w)
    with pytest.raises(ValueError, match="bf16"):
        layer.run(x[:4].float(), ids[:4], w[:4])
    with pytest.raises(ValueError, match="topk_ids"):
        layer.run(x[:4], ids[:3], w[:4])
    assert layer.run(x[:0], ids[:0], w[:0]).shape == (0, geo.hidden) and not layer.expands(8)
