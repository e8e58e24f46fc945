"""Weights through each engine's own weight_loader into CsfMoEMethod's parameters, at 1 and 2 tensor-parallel
ranks, then prepared for csf-moe (CPU) and served (GPU)."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4, NVFP4
from csf_codec.synthetic import synthetic_fp4_values, synthetic_scale_plane
from csf_serving_adapters.accounting import LEDGER

from .checkpoints import MX_CONFIG, NV_CONFIG, PREFIX
from .engines import only
from .tp_shards import merge_tp, params, same

E, H, N = 4, 512, 256  # N: unsharded intermediate size (big enough that CSF beats native at TP 2)
CONFIGS = {"mxfp4": MX_CONFIG, "nvfp4": NV_CONFIG}
SCALES = ("w13_weight_scale", "w2_weight_scale")


@pytest.fixture(scope="module", autouse=True)
def _registered(engine):
    engine.register()


def _native(fmt, seed=0) -> dict[str, list[torch.Tensor]]:
    """Unsharded per-expert tensors: gate/up [N, H/..], down [H, N/..]."""
    bs = fmt.block_size
    out: dict[str, list[torch.Tensor]] = {}
    for k, (proj, rows, cols) in enumerate((("gate", N, H), ("up", N, H), ("down", H, N))):
        s = seed + 100 * k
        out[proj] = [synthetic_fp4_values((rows, cols // 2), seed=s + e) for e in range(E)]
        planes = [synthetic_scale_plane((rows, cols // bs), fmt, seed=s + 50 + e) for e in range(E)]
        out[proj + "_scale"] = [p.view(torch.float8_e4m3fn) if fmt is NVFP4 else p for p in planes]
        out[proj + "_global"] = [torch.tensor(2.0**-7 * (e + 1)) for e in range(E)]
        out[proj + "_input"] = [torch.tensor(0.5 * (e + 1)) for e in range(E)]
    return out


def _load(engine, layer, native, fmt) -> None:
    """As a model's load_weights does: one weight_loader call per expert, projection and tensor."""
    for e in range(E):
        for shard, proj in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            stem = "w2" if shard == "w2" else "w13"
            names = {"weight": proj, "weight_scale": proj + "_scale"}
            if fmt is NVFP4:
                names |= {"weight_scale_2": proj + "_global", "input_scale": proj + "_input"}
            for suffix, key in names.items():
                param = getattr(layer, f"{stem}_{suffix}")
                param.weight_loader(param, native[key][e], f"{engine.weight_prefix}.{stem}_{suffix}", shard, e)


def _layer(engine, fmt_name: str, **kw):
    return engine.make_experts(engine.config.from_config(CONFIGS[fmt_name]), experts=E, hidden=H, inter=N, **kw)


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
def test_parameters_have_the_names_shapes_and_slicing_attributes_of_the_engines_fp4_methods(engine, fmt):
    layer = _layer(engine, fmt.name)
    shapes = {n: (tuple(p.shape), p.dtype) for n, p in layer.named_parameters()}
    sdt = torch.float8_e4m3fn if fmt is NVFP4 else torch.uint8
    bs = fmt.block_size
    want = {
        "w13_weight": ((E, 2 * N, H // 2), torch.uint8),
        "w13_weight_scale": ((E, 2 * N, H // bs), sdt),
        "w2_weight": ((E, H, N // 2), torch.uint8),
        "w2_weight_scale": ((E, H, N // bs), sdt),
    }
    if fmt is NVFP4:
        want |= {
            "w13_weight_scale_2": ((E, 2), torch.float32),
            "w2_weight_scale_2": ((E,), torch.float32),
            "w13_input_scale": ((E,), torch.float32),
            "w2_input_scale": ((E,), torch.float32),
        }
    assert shapes == want
    assert all(getattr(layer, s).quant_method == engine.scale_quant_method for s in SCALES)


@only("sglang")
@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
def test_sglang_parameters_keep_sglangs_loader_behind_csfs_whole_tensor_path(engine, fmt):
    layer = _layer(engine, fmt.name)
    # csf's whole-tensor path serves gpt-oss (see test_sglang_gpt_oss.py)
    assert all(p.weight_loader.engine_loader == layer.weight_loader for p in layer.parameters())


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
def test_two_tp_ranks_load_exactly_the_halves_of_one(engine, fmt):
    native = _native(fmt)
    whole = _layer(engine, fmt.name)
    _load(engine, whole, native, fmt)
    tp1 = params(whole)
    ranks = []
    for rank in range(2):
        layer = _layer(engine, fmt.name, tp=2, rank=rank)
        assert layer.w2_weight_scale.shape == (E, H, N // 2 // fmt.block_size)
        _load(engine, layer, native, fmt)
        ranks.append(params(layer))
    merged = merge_tp(ranks)
    assert merged.keys() == tp1.keys()
    for name in tp1:
        assert same(merged[name], tp1[name]), name
    # and TP 1 holds the checkpoint exactly: [gate; up] rows, scale bytes untouched
    e = 2
    assert same(tp1["w13_weight"][e, :N], native["gate"][e])
    assert same(tp1["w13_weight_scale"][e, :N], native["gate_scale"][e])
    assert same(tp1["w13_weight_scale"][e, N:], native["up_scale"][e])
    assert same(tp1["w2_weight_scale"][e], native["down_scale"][e])
    if fmt is NVFP4:
        assert tp1["w13_weight_scale_2"][e].tolist() == [native["gate_global"][e].item()] * 2
        assert tp1["w2_weight_scale_2"][e].item() == native["down_global"][e].item()


@only("vllm")
def test_vllm_gpt_oss_style_layers_carry_biases_and_keep_interleaved_rows(engine):
    layer = _layer(engine, "mxfp4", has_bias=True, activation="swigluoai")
    assert layer.w13_bias.shape == (E, 2 * N) and layer.w2_bias.shape == (E, H)
    assert (layer.quant_method.activation, layer.quant_method.w13_layout) == ("swiglu_oai", "interleaved")
    assert layer.quant_method.geometry(layer).bias


def test_processing_on_the_cpu_fails_clearly(engine):
    layer = _layer(engine, "mxfp4")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        layer.quant_method.process_weights_after_loading(layer)
    assert not hasattr(layer, engine.bound_attr)
    with pytest.raises(RuntimeError, match="not processed"):
        engine.apply(layer, torch.zeros(1, H), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.int32))


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("tp", [1, 2])
def test_prepared_weights_release_the_native_scales_and_are_accounted(engine, fmt, tp):
    """Everything process_weights_after_loading does except binding (which needs CUDA memory)."""
    layer = _layer(engine, fmt.name, tp=tp, rank=tp - 1)
    _load(engine, layer, _native(fmt), fmt)
    method = layer.quant_method
    p, w = method.prepare(layer)
    geo = p.geometry
    assert (geo.experts, geo.hidden, geo.intermediate, geo.tp, geo.fmt) == (E, H, N // tp, tp, fmt)
    native_bytes = sum(getattr(layer, s).numel() for s in SCALES)
    LEDGER.clear()
    entry = method.release_native(layer, w)
    assert entry.layer == PREFIX
    assert entry.native_bytes == native_bytes and 0 < entry.stored_bytes < native_bytes
    assert LEDGER.report()["total"]["returned"] == native_bytes - entry.stored_bytes
    assert all(getattr(layer, s).numel() == 0 for s in SCALES)
    assert layer.w13_weight.data_ptr() == w.w13.values.data_ptr()


@only("vllm")
def test_vllm_graph_sizes_become_planned_buckets(engine):
    layer = _layer(engine, "mxfp4", capture_sizes=[1, 3, 24, 96])
    method = layer.quant_method
    assert method.capture_sizes == (1, 3, 24, 96)
    _load(engine, layer, _native(MXFP4), MXFP4)
    p, _ = method.prepare(layer)
    sizes = {b.tokens for b in p.buckets}
    assert {t for t in (1, 3, 24, 96) if t <= p.max_tokens} <= sizes
    assert p.bucket_for(3).tokens == 3  # a captured size runs its own bucket, not the next one


@only("sglang")
def test_sglang_servers_token_limits_size_the_plan(engine):
    layer = _layer(engine, "mxfp4", chunked_prefill_size=4096)
    method = layer.quant_method
    assert method.prefill_tokens == 4096 and method.max_tokens() == 4096
    method.capture_sizes = (1, 3, 24, 96)  # as a published cuda_graph_config.decode.bs would set them
    _load(engine, layer, _native(MXFP4), MXFP4)
    p, _ = method.prepare(layer)
    assert p.max_tokens == 4096
    assert {1, 3, 24, 96} <= {b.tokens for b in p.buckets}
    assert p.bucket_for(3).tokens == 3  # a captured size runs its own bucket, not the next one


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_served_layer_equals_csf_moe_with_native_scales(engine, fmt):
    """On the H200 (AOT cache built): the engine's layer's output is bit-identical to csf-moe's native-scale arm."""
    from csf_kernels.catalog import load_catalog
    from csf_moe import bind, plan, prepare_weights
    from csf_moe.synthetic import synthetic_layer

    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, fmt)
    cfg = engine.config.from_config(CONFIGS[fmt])
    layer = engine.make_experts(
        cfg, experts=geo.experts, hidden=geo.hidden, inter=geo.intermediate, top_k=geo.top_k, device="cuda"
    )
    data = synthetic_layer(geo, seed=3, device="cuda")
    layer.w13_weight.data.copy_(data.w13)
    layer.w2_weight.data.copy_(data.w2)
    sdt = layer.w13_weight_scale.dtype
    layer.w13_weight_scale.data.copy_(data.w13_scale.view(sdt))
    layer.w2_weight_scale.data.copy_(data.w2_scale.view(sdt))
    if fmt == "nvfp4":
        layer.w13_weight_scale_2.data.copy_(data.w13_global_scale[:, None].expand(-1, 2))
        layer.w2_weight_scale_2.data.copy_(data.w2_global_scale)
    layer.quant_method.process_weights_after_loading(layer)
    assert all(getattr(layer, s).numel() == 0 for s in SCALES)

    # vLLM's method reads its layer's moe_config.max_num_tokens; SGLang's the published server limits
    p = plan(geo, layer.quant_method.max_tokens(), scale_source="native")
    ref = bind(
        p, prepare_weights(p, **data.weight_kwargs()), torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda")
    )
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (1, 7, 64, 300):
        x = torch.randn(t, geo.hidden, device="cuda", generator=gen).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(geo.experts, device="cuda", generator=gen)[: geo.top_k] for _ in range(t)])
        w = torch.rand(t, geo.top_k, device="cuda", generator=gen).to(torch.bfloat16)  # apply converts to fp32
        got = engine.apply(layer, x, w, ids.to(torch.int32))
        assert torch.equal(got, ref.run(x, ids.to(torch.int32), w.float())), f"T={t}"
