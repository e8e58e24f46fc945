"""CsfConfig as SGLang resolves and uses it: checkpoint-method resolution, from_config, get_quant_method."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.quantization import QUANTIZATION_METHODS
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

from csf_serving_adapters.sglang import register
from csf_serving_adapters.sglang.config import CsfConfig
from csf_serving_adapters.sglang.moe_method import CsfMoEMethod

from .sglang_layers import MX_CONFIG, NV_CONFIG, make_experts

NATIVE_MX = {"quant_method": "mxfp4"}
NATIVE_NV = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register()


def _resolve(quant_cfg, user_quant=None):
    """SGLang's own checkpoint-method resolution (ModelConfig._verify_quantization) on just what it reads."""
    cfg = SimpleNamespace(quantization=user_quant, is_draft_model=False, hf_config=SimpleNamespace())
    cfg.hf_config.quantization_config = dict(quant_cfg)
    cfg._parse_modelopt_quant_config = lambda d: ModelConfig._parse_modelopt_quant_config(cfg, d)
    cfg._parse_quant_hf_config = lambda: ModelConfig._parse_quant_hf_config(cfg)
    cfg._find_quant_modelslim_config = lambda: None
    ModelConfig._verify_quantization(cfg)
    return cfg.quantization


def test_sglang_resolves_a_csf_checkpoint_to_csf_before_its_base_method():
    assert next(iter(QUANTIZATION_METHODS)) == "csf"  # asked first: ModelOpt's config would claim NVFP4
    assert _resolve(MX_CONFIG) == "csf"
    assert _resolve(NV_CONFIG) == "csf"
    assert CsfConfig.override_quantization_method(MX_CONFIG, None) == "csf"


def test_a_native_checkpoint_keeps_its_method_unless_csf_is_asked_for():
    if "mxfp4" in QUANTIZATION_METHODS:  # SGLang lists it only where it has a kernel (CUDA, gfx95, XPU, CPU)
        assert _resolve(NATIVE_MX) == "mxfp4"
    assert _resolve(NATIVE_NV) == "modelopt_fp4"
    assert _resolve(NATIVE_MX, user_quant="csf") == "csf"
    assert CsfConfig.override_quantization_method(NATIVE_MX, None) is None
    assert CsfConfig.override_quantization_method(None, "csf") == "csf"


def test_from_config_records_scale_format_and_base_method():
    mx = QUANTIZATION_METHODS["csf"].from_config(MX_CONFIG)
    assert (mx.scale_format, mx.base_quant_method, mx.entry.tensors) == ("mxfp4", "mxfp4", 2)
    nv = CsfConfig.from_config(NV_CONFIG)
    assert (nv.scale_format, nv.base_quant_method) == ("nvfp4", "modelopt_fp4")
    native = CsfConfig.from_config(NATIVE_MX)
    assert (native.scale_format, native.entry) == ("mxfp4", None)
    assert CsfConfig.get_min_capability() == 90 and CsfConfig().get_name() == "csf"
    assert CsfConfig().get_scaled_act_names() == []


def test_fused_moe_gets_the_csf_method_and_linears_stay_unquantized():
    cfg = CsfConfig.from_config(MX_CONFIG)
    layer = make_experts(cfg)
    assert isinstance(layer.quant_method, CsfMoEMethod)
    assert layer.runner_backend is None and layer.should_fuse_routed_scaling_factor_in_topk
    assert isinstance(
        cfg.get_quant_method(LinearBase(1, 1), "model.layers.0.self_attn.o_proj"), UnquantizedLinearMethod
    )
    assert cfg.is_linear_unquantized("model.layers.0.self_attn.o_proj")
    assert cfg.get_quant_method(SimpleNamespace(), "x") is None


def test_a_config_without_a_scale_format_fails_at_layer_creation():
    with pytest.raises(ValueError, match="no FP4 scale format"):
        make_experts(CsfConfig())


def test_unsupported_layers_fail_at_creation():
    cfg = CsfConfig.from_config(MX_CONFIG)
    with pytest.raises(NotImplementedError, match="activation"):
        make_experts(cfg, activation="gelu")
    biased = make_experts(cfg, with_bias=True)  # expert biases load under SGLang's MXFP4 names
    assert biased.quant_method.has_bias() and biased.w13_weight_bias.shape[0] == biased.w13_weight.shape[0]
