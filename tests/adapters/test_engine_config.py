"""CsfConfig as each engine resolves and uses it: checkpoint-method resolution, from_config, get_quant_method."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from .checkpoints import MX_CONFIG, NV_CONFIG, NV_QUANT
from .engines import only

NATIVE_MX = {"quant_method": "mxfp4"}


@pytest.fixture(scope="module", autouse=True)
def _registered(engine):
    engine.register()


def test_the_engine_resolves_a_csf_checkpoint_to_csf_before_its_base_method(engine):
    assert engine.resolve(MX_CONFIG) == "csf"
    assert engine.resolve(NV_CONFIG) == "csf"
    assert engine.config.override_quantization_method(MX_CONFIG, None) == "csf"


@only("vllm")
def test_vllm_resolves_a_csf_gpt_oss_checkpoint_to_csf_ahead_of_its_gpt_oss_override(engine):
    assert engine.resolve(MX_CONFIG, model_type="gpt_oss") == "csf"


@only("sglang")
def test_sglang_asks_csf_first(engine):
    assert next(iter(engine.quantization_methods)) == "csf"  # ModelOpt's config would claim NVFP4


def test_a_native_checkpoint_keeps_its_method_unless_csf_is_asked_for(engine):
    if "mxfp4" in engine.quantization_methods:  # SGLang lists it only where it has a kernel (CUDA, gfx95, XPU, CPU)
        assert engine.resolve(NATIVE_MX) == "mxfp4"
    assert engine.resolve(NV_QUANT) == "modelopt_fp4"
    assert engine.resolve(NATIVE_MX, user_quant="csf") == "csf"
    assert engine.config.override_quantization_method(NATIVE_MX, None) is None
    assert engine.config.override_quantization_method(None, "csf") == "csf"


def test_from_config_records_scale_format_and_base_method(engine):
    mx = engine.registered_config().from_config(MX_CONFIG)
    assert (mx.scale_format, mx.base_quant_method, mx.entry.tensors) == ("mxfp4", "mxfp4", 2)
    nv = engine.config.from_config(NV_CONFIG)
    assert (nv.scale_format, nv.base_quant_method) == ("nvfp4", "modelopt_fp4")
    native = engine.config.from_config(NATIVE_MX)
    assert (native.scale_format, native.entry) == ("mxfp4", None)
    assert engine.config.get_min_capability() == 90 and engine.config().get_name() == "csf"


def test_experts_get_the_csf_method_and_linears_stay_unquantized(engine):
    cfg = engine.config.from_config(MX_CONFIG)
    layer = engine.make_experts(cfg)
    assert isinstance(layer.quant_method, engine.moe_method)
    assert cfg.get_quant_method(layer, "model.layers.0.mlp.experts").__class__ is engine.moe_method
    linear = engine.make_linear()
    assert isinstance(cfg.get_quant_method(linear, "model.layers.0.self_attn.o_proj"), engine.unquantized_linear)
    assert cfg.get_quant_method(SimpleNamespace(), "x") is None


@only("sglang")
def test_sglang_runs_csf_without_a_moe_runner_and_scaled_activations(engine):
    cfg = engine.config.from_config(MX_CONFIG)
    layer = engine.make_experts(cfg)
    assert layer.runner_backend is None and layer.should_fuse_routed_scaling_factor_in_topk
    assert cfg.is_linear_unquantized("model.layers.0.self_attn.o_proj")
    assert engine.config().get_scaled_act_names() == []


def test_a_config_without_a_scale_format_fails_at_layer_creation(engine):
    with pytest.raises(ValueError, match="no FP4 scale format"):
        engine.make_experts(engine.config())


@only("sglang")
def test_sglang_unsupported_layers_fail_at_creation(engine):
    cfg = engine.config.from_config(MX_CONFIG)
    with pytest.raises(NotImplementedError, match="activation"):
        engine.make_experts(cfg, activation="gelu")
    biased = engine.make_experts(cfg, with_bias=True)  # expert biases load under SGLang's MXFP4 names
    assert biased.quant_method.has_bias() and biased.w13_weight_bias.shape[0] == biased.w13_weight.shape[0]
