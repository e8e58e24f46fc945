"""gpt-oss through SGLang 0.5.23 with csf (CPU): csf's MoE method takes gpt-oss's clamped SwiGLU, biases and
interleaved rows, and the model's own MXFP4 expert-loading path (TP slicing of whole tensors) fills csf's
parameters at 1 and 2 tensor-parallel ranks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.models.gpt_oss import GptOssForCausalLM

from csf_serving_adapters.sglang import register
from csf_serving_adapters.sglang.config import CsfConfig
from csf_serving_adapters.sglang.gpt_oss import patch_gpt_oss_loading

from .checkpoints import MX_CONFIG, NV_CONFIG
from .sglang_engine import make_experts

E, H, N = 4, 256, 128  # N: unsharded intermediate size
GPT_OSS = dict(activation="silu", with_bias=True, gemm1_alpha=1.702, gemm1_clamp_limit=7.0)
EXPERTS = "model.layers.0.mlp.experts"


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register()


def _layer(tp: int = 1, rank: int = 0, **kw):
    return make_experts(CsfConfig.from_config(MX_CONFIG), experts=E, hidden=H, inter=N, tp=tp, rank=rank,
                        **(GPT_OSS | kw))  # fmt: skip


def test_gpt_oss_layers_take_the_clamped_swiglu_biases_and_interleaved_rows():
    layer = _layer()
    method = layer.quant_method
    assert (method.activation, method.w13_layout, method.has_bias()) == ("swiglu_oai", "interleaved", True)
    assert layer.w13_weight.shape == (E, 2 * N, H // 2) and layer.w13_weight_scale.shape == (E, 2 * N, H // 32)
    assert layer.w2_weight.shape == (E, H, N // 2) and layer.w2_weight_scale.shape == (E, H, N // 32)
    # named as SGLang's MXFP4 method names them, which gpt-oss's loader writes
    assert layer.w13_weight_bias.shape == (E, 2 * N) and layer.w2_weight_bias.shape == (E, H)


def test_other_clamped_swiglus_are_refused():
    with pytest.raises(NotImplementedError, match=r"alpha 1\.5 "):
        _layer(gemm1_alpha=1.5)


def _checkpoint(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """gpt-oss's MXFP4 expert tensors as its checkpoints store them (every expert, unsharded)."""

    def u8(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)

    return {
        f"{EXPERTS}.gate_up_proj_blocks": u8(E, 2 * N, H // 32, 16),
        f"{EXPERTS}.gate_up_proj_scales": u8(E, 2 * N, H // 32),
        f"{EXPERTS}.gate_up_proj_bias": torch.randn(E, 2 * N, generator=gen).to(torch.bfloat16),
        f"{EXPERTS}.down_proj_blocks": u8(E, H, N // 32, 16),
        f"{EXPERTS}.down_proj_scales": u8(E, H, N // 32),
        f"{EXPERTS}.down_proj_bias": torch.randn(E, H, generator=gen).to(torch.bfloat16),
    }


class _Model(torch.nn.Module):
    """What GptOssForCausalLM's expert loader reads of the model: its config and the experts at their path."""

    def __init__(self, experts, config):
        super().__init__()
        self.config = config
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.model.layers[0].mlp = torch.nn.Module()
        self.model.layers[0].mlp.experts = experts


@pytest.mark.parametrize("tp", [1, 2])
def test_the_models_mxfp4_expert_path_fills_each_ranks_slice(tp):
    ckpt = _checkpoint(torch.Generator().manual_seed(tp))
    n = N // tp
    for rank in range(tp):
        layer = _layer(tp, rank)
        model = _Model(layer, SimpleNamespace(intermediate_size=N, num_local_experts=E))
        loaded = GptOssForCausalLM._load_mxfp4_experts_weights(model, iter(ckpt.items()))
        assert {name.rsplit(".", 1)[-1] for name in loaded} == {
            "w13_weight", "w13_weight_scale", "w13_weight_bias", "w2_weight", "w2_weight_scale", "w2_weight_bias"
        }  # fmt: skip
        rows = slice(2 * rank * n, 2 * (rank + 1) * n)  # gate/up rows interleaved: a rank's rows are contiguous
        assert torch.equal(layer.w13_weight, ckpt[f"{EXPERTS}.gate_up_proj_blocks"].view(E, 2 * N, -1)[:, rows])
        assert torch.equal(layer.w13_weight_scale, ckpt[f"{EXPERTS}.gate_up_proj_scales"][:, rows])
        assert torch.equal(layer.w13_weight_bias, ckpt[f"{EXPERTS}.gate_up_proj_bias"][:, rows])
        cols = slice(rank * n // 2, (rank + 1) * n // 2)
        assert torch.equal(layer.w2_weight, ckpt[f"{EXPERTS}.down_proj_blocks"].view(E, H, N // 2)[..., cols])
        blocks = slice(rank * n // 32, (rank + 1) * n // 32)
        assert torch.equal(layer.w2_weight_scale, ckpt[f"{EXPERTS}.down_proj_scales"][..., blocks])
        bias2 = ckpt[f"{EXPERTS}.down_proj_bias"]
        assert torch.equal(layer.w2_weight_bias, bias2 if rank == 0 else torch.zeros_like(bias2))  # added once


def test_a_slice_of_another_shape_is_refused():
    layer = _layer()
    with pytest.raises(ValueError, match="this rank's slice has shape"):
        layer.w2_weight.weight_loader(layer.w2_weight, torch.zeros(E, H, N // 4, dtype=torch.uint8),
                                      "experts.w2_weight", None, None)  # fmt: skip


@pytest.mark.parametrize(("config", "path"), [(MX_CONFIG, "mxfp4"), (NV_CONFIG, "normal")])
def test_gpt_oss_load_weights_sees_mxfp4_for_csf_mxfp4_configs_only(config, path):
    assert patch_gpt_oss_loading() and patch_gpt_oss_loading()  # once, and safe to repeat
    assert GptOssForCausalLM.load_weights._csf_patched
    csf = CsfConfig.from_config(config)
    calls = []
    model = SimpleNamespace(quant_config=csf)
    model._load_weights_mxfp4 = lambda weights, **kw: calls.append(("mxfp4", model.quant_config.get_name()))
    model._load_normal_weights = lambda weights, **kw: calls.append(("normal", model.quant_config.get_name()))
    GptOssForCausalLM.load_weights(model, [])
    assert calls == [(path, "mxfp4" if path == "mxfp4" else csf.get_name())]
    assert model.quant_config is csf  # restored after loading
