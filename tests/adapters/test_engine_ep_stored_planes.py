"""Expert parallelism from a stored CSF checkpoint (CPU, the real engines): two EP ranks, with and without MoE
tensor parallelism, read a ``csf compress`` checkpoint through the engine's own (CSF-aware) safetensors iterator
and its own MoE weight loader, and hold exactly their experts' slice of the single-rank layer and of the
checkpoint: values, decoded scale planes and global scales. (Native planes, compressed online after loading:
test_engine_expert_parallel.py; gpt-oss's fused MXFP4 planes under SGLang's EP: test_sglang_gpt_oss.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from csf_serving_adapters.stored_planes import stored_planes

from .checkpoints import PREFIX, nv_csf_pair, shard_files
from .ep_ranks import CASES, EP, expected_rank_params
from .tp_shards import params, same

E, H, N = 4, 256, 128  # N: unsharded intermediate size; E splits over EP 2
BLOCK = 16  # NVFP4


@pytest.fixture(scope="module", autouse=True)
def _registered(engine):
    engine.register()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return nv_csf_pair(tmp_path_factory.mktemp("ep-ckpt"), experts=E, hidden=H, inter=N)


def _config(engine, root):
    return engine.config.from_config(json.loads((root / "config.json").read_text())["quantization_config"])


def _original_iterator(engine):
    fn = engine.weight_utils.safetensors_weights_iterator
    return getattr(fn, "__csf_original__", fn)


@pytest.mark.parametrize("case", ["without_tp", "with_tp"])
def test_ep_ranks_load_their_slice_of_a_stored_csf_checkpoint(pair, engine, wrapped, case):
    native, csf = pair
    # the scale planes really are stored as CSF payloads, so loading must decode them
    planes = stored_planes(shard_files(csf))
    assert {p.name for p in planes.values()} == {
        f"{PREFIX}.{e}.{proj}.weight_scale" for e in range(E) for proj in ("gate_proj", "up_proj", "down_proj")
    }
    cfg = _config(engine, csf)
    assert cfg.entry is not None and cfg.scale_format == "nvfp4"
    # the single-rank layer, from the native checkpoint through the engine's unwrapped iterator
    whole = engine.make_experts(cfg, experts=E, hidden=H, inter=N)
    engine.load_expert_tensors(whole, _original_iterator(engine)(shard_files(native), *engine.iterator_args), E)
    single = params(whole)
    ckpt = {n: t for f in shard_files(native) for n, t in load_file(f).items()}
    iterate = engine.loader.safetensors_weights_iterator  # as the engine's DefaultModelLoader calls it
    for kwargs, shard in CASES[engine.name][case]:
        layer = engine.make_experts(cfg, experts=E, hidden=H, inter=N, **kwargs)
        loaded = engine.load_expert_tensors(layer, iterate(shard_files(csf), *engine.iterator_args), E)
        assert loaded == {n for n, _ in layer.named_parameters()}
        assert layer.w13_weight.shape[0] == E // EP  # the rank's local experts only
        got, want = params(layer), expected_rank_params(single, shard)
        assert got.keys() == want.keys()
        for name in want:
            assert same(got[name], want[name]), f"{case} {shard}: {name}"
        # and the bytes are the checkpoint's, expert by expert (local j is the model's expert g)
        n, r = N // shard.tp, shard.tp_rank
        for j, g in enumerate(shard.experts(E)):
            src = f"{PREFIX}.{g}"
            for k, proj in enumerate(("gate_proj", "up_proj")):
                rows = slice(k * n, (k + 1) * n)
                assert same(got["w13_weight"][j, rows], ckpt[f"{src}.{proj}.weight"][r * n : (r + 1) * n])
                assert same(got["w13_weight_scale"][j, rows], ckpt[f"{src}.{proj}.weight_scale"][r * n : (r + 1) * n])
            assert same(got["w2_weight"][j], ckpt[f"{src}.down_proj.weight"][:, r * n // 2 : (r + 1) * n // 2])
            blocks = slice(r * n // BLOCK, (r + 1) * n // BLOCK)
            assert same(got["w2_weight_scale"][j], ckpt[f"{src}.down_proj.weight_scale"][:, blocks])
            assert got["w13_weight_scale_2"][j].tolist() == [ckpt[f"{src}.gate_proj.weight_scale_2"].item()] * 2
            assert got["w2_weight_scale_2"][j].item() == ckpt[f"{src}.down_proj.weight_scale_2"].item()
        assert layer.w2_weight_scale.view(torch.uint8).any()  # real scales arrived, not the zero init
