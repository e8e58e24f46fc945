"""gpt-oss through SGLang 0.5.23 with csf (CPU): csf's MoE method takes gpt-oss's clamped SwiGLU, biases and
interleaved rows, and the model's own MXFP4 expert-loading path (TP and EP slicing of whole tensors) fills csf's
parameters at 1 and 2 tensor-parallel ranks, and at 2 expert-parallel ranks from a stored CSF checkpoint."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.model_loader import loader
from sglang.srt.models.gpt_oss import GptOssForCausalLM

from csf_codec import MXFP4
from csf_codec.checkpoint import compress_checkpoint
from csf_codec.synthetic import synthetic_scale_plane
from csf_serving_adapters.sglang import register, weight_iterators
from csf_serving_adapters.sglang.config import CsfConfig
from csf_serving_adapters.sglang.gpt_oss import patch_gpt_oss_loading
from csf_serving_adapters.stored_planes import stored_planes

from .checkpoints import MX_CONFIG, NV_CONFIG, shard_files, write_checkpoint
from .ep_ranks import CASES, EP
from .sglang_engine import make_experts
from .tp_shards import params, same

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


def _checkpoint(gen: torch.Generator, real_scales: bool = False) -> dict[str, torch.Tensor]:
    """gpt-oss's MXFP4 expert tensors as its checkpoints store them (every expert, unsharded); ``real_scales``:
    scale planes of a trained model's statistics (which ``csf compress`` stores as CSF), else random bytes."""

    def u8(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)

    def scales(*shape):
        return synthetic_scale_plane(shape, MXFP4, seed=int(u8(1))) if real_scales else u8(*shape)

    return {
        f"{EXPERTS}.gate_up_proj_blocks": u8(E, 2 * N, H // 32, 16),
        f"{EXPERTS}.gate_up_proj_scales": scales(E, 2 * N, H // 32),
        f"{EXPERTS}.gate_up_proj_bias": torch.randn(E, 2 * N, generator=gen).to(torch.bfloat16),
        f"{EXPERTS}.down_proj_blocks": u8(E, H, N // 32, 16),
        f"{EXPERTS}.down_proj_scales": scales(E, H, N // 32),
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


@pytest.fixture
def csf_iterators():
    """SGLang's safetensors iterators CSF-aware for the test, and the process left as it was found."""
    was = weight_iterators.installed()
    weight_iterators.install()
    yield
    if not was:
        weight_iterators.uninstall()


def _load(layer, weights) -> set[str]:
    model = _Model(layer, SimpleNamespace(intermediate_size=N, num_local_experts=E))
    return GptOssForCausalLM._load_mxfp4_experts_weights(model, weights)


@pytest.mark.parametrize("case", ["without_tp", "with_tp"])
def test_ep_ranks_load_their_slice_of_a_stored_csf_checkpoint(tmp_path, csf_iterators, case):
    """gpt-oss's fused MXFP4 planes (every expert in one tensor) stored as CSF, read through SGLang's CSF-aware
    iterator and its model's EP/TP slicing: each rank holds its experts' slice of the single-rank layer and of
    the checkpoint (values, decoded scale planes, biases)."""
    ckpt = _checkpoint(torch.Generator().manual_seed(7), real_scales=True)
    native = write_checkpoint(tmp_path / "native", ckpt, {"quant_method": "mxfp4"})
    csf = compress_checkpoint(native, tmp_path / "csf", progress=False).dst
    files = shard_files(csf)
    planes = {p.name for p in stored_planes(files).values()}
    assert planes == {f"{EXPERTS}.gate_up_proj_scales", f"{EXPERTS}.down_proj_scales"}  # loading must decode them
    whole = _layer()
    _load(whole, iter(ckpt.items()))
    single = params(whole)
    for kwargs, shard in CASES["sglang"][case]:
        layer = _layer(**kwargs)
        assert layer.w13_weight.shape[0] == E // EP  # the rank's local experts only
        loaded = _load(layer, loader.safetensors_weights_iterator(files))  # as SGLang's DefaultModelLoader calls it
        assert {name.rsplit(".", 1)[-1] for name in loaded} == {n for n, _ in layer.named_parameters()}
        held, n, t = shard.experts(E), N // shard.tp, shard.tp_rank
        experts = slice(held.start, held.stop)
        rows = slice(2 * t * n, 2 * (t + 1) * n)  # interleaved gate/up rows: a rank's rows are contiguous
        cols, blocks = slice(t * n // 2, (t + 1) * n // 2), slice(t * n // 32, (t + 1) * n // 32)
        bias2 = ckpt[f"{EXPERTS}.down_proj_bias"][experts]
        want = {  # from the checkpoint
            "w13_weight": ckpt[f"{EXPERTS}.gate_up_proj_blocks"].view(E, 2 * N, -1)[experts, rows],
            "w13_weight_scale": ckpt[f"{EXPERTS}.gate_up_proj_scales"][experts, rows],
            "w13_weight_bias": ckpt[f"{EXPERTS}.gate_up_proj_bias"][experts, rows],
            "w2_weight": ckpt[f"{EXPERTS}.down_proj_blocks"].view(E, H, N // 2)[experts, :, cols],
            "w2_weight_scale": ckpt[f"{EXPERTS}.down_proj_scales"][experts, :, blocks],
            "w2_weight_bias": bias2 if t == 0 else torch.zeros_like(bias2),  # added once over the TP ranks
        }
        from_single = {
            "w13_weight": single["w13_weight"][experts, rows],
            "w13_weight_scale": single["w13_weight_scale"][experts, rows],
            "w13_weight_bias": single["w13_weight_bias"][experts, rows],
            "w2_weight": single["w2_weight"][experts, :, cols],
            "w2_weight_scale": single["w2_weight_scale"][experts, :, blocks],
            "w2_weight_bias": single["w2_weight_bias"][experts] if t == 0 else torch.zeros_like(bias2),
        }
        got = params(layer)
        assert got.keys() == want.keys() == from_single.keys()
        for name in want:
            assert same(got[name], want[name]) and same(got[name], from_single[name]), f"{case} {shard}: {name}"
