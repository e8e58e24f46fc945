"""CsfConfig as vLLM resolves and uses it: override detection, from_config, get_quant_method."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.config.model import ModelConfig
from vllm.model_executor.layers.linear import ReplicatedLinear, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import get_quantization_config

from csf_serving_adapters.vllm import register
from csf_serving_adapters.vllm.config import CsfConfig
from csf_serving_adapters.vllm.moe_method import CsfMoEMethod

from .vllm_layers import MX_CONFIG, NV_CONFIG, make_experts

NATIVE_MX = {"quant_method": "mxfp4"}


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register()


def _resolve(quant_cfg, user_quant=None, model_type="deepseek_v3"):
    """vLLM's own checkpoint-method resolution (ModelConfig._verify_quantization) on just what it reads."""
    cfg = SimpleNamespace(
        quantization=user_quant,
        model_arch_config=SimpleNamespace(quantization_config=quant_cfg),
        hf_config=SimpleNamespace(model_type=model_type),
        allow_deprecated_quantization=False,
    )
    ModelConfig._verify_quantization(cfg)
    return cfg.quantization


def test_vllm_resolves_a_csf_checkpoint_to_csf_before_its_base_method():
    assert _resolve(MX_CONFIG) == "csf"
    assert _resolve(NV_CONFIG) == "csf"
    assert _resolve(MX_CONFIG, model_type="gpt_oss") == "csf"  # ahead of vLLM's gpt_oss_mxfp4 override


def test_a_native_checkpoint_keeps_its_method_unless_csf_is_asked_for():
    assert _resolve(NATIVE_MX) == "mxfp4"
    assert _resolve(NATIVE_MX, user_quant="csf") == "csf"
    assert CsfConfig.override_quantization_method(NATIVE_MX, None) is None
    assert CsfConfig.override_quantization_method(None, "csf") == "csf"


def test_from_config_records_scale_format_and_base_method():
    mx = get_quantization_config("csf").from_config(MX_CONFIG)
    assert (mx.scale_format, mx.base_quant_method, mx.entry.tensors) == ("mxfp4", "mxfp4", 2)
    nv = CsfConfig.from_config(NV_CONFIG)
    assert (nv.scale_format, nv.base_quant_method) == ("nvfp4", "modelopt_fp4")
    native = CsfConfig.from_config(NATIVE_MX)
    assert (native.scale_format, native.entry) == ("mxfp4", None)
    assert CsfConfig.get_min_capability() == 90 and CsfConfig().get_name() == "csf"


def test_routed_experts_get_the_csf_method_and_linears_stay_unquantized():
    cfg = CsfConfig.from_config(MX_CONFIG)
    layer = make_experts(cfg)
    assert isinstance(layer.quant_method, CsfMoEMethod)
    assert cfg.get_quant_method(layer, "model.layers.0.mlp.experts").__class__ is CsfMoEMethod
    linear = ReplicatedLinear.__new__(ReplicatedLinear)  # only its type matters (building one needs a TP group)
    assert isinstance(cfg.get_quant_method(linear, "model.layers.0.self_attn.o_proj"), UnquantizedLinearMethod)
    assert cfg.get_quant_method(SimpleNamespace(), "x") is None


def test_a_config_without_a_scale_format_fails_at_layer_creation():
    with pytest.raises(ValueError, match="no FP4 scale format"):
        make_experts(CsfConfig())
