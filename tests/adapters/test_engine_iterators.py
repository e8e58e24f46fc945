"""A stored CSF checkpoint read through each engine's own safetensors iterators and loaded into the layer."""

from __future__ import annotations

import json

import pytest
import torch

from .checkpoints import nv_csf_pair, shard_files

E, H, N = 4, 256, 128
# the iterators each engine's DefaultModelLoader calls, with the keyword arguments it passes them here
ITERATORS = {
    "vllm": {"safetensors_weights_iterator": {}, "multi_thread_safetensors_weights_iterator": {}},
    "sglang": {
        "safetensors_weights_iterator": {},
        "buffered_multi_thread_safetensors_weights_iterator": {"max_workers": 2},
    },
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return nv_csf_pair(tmp_path_factory.mktemp("ckpt"), experts=E, hidden=H, inter=N)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _original(engine, name):
    fn = getattr(engine.weight_utils, name)
    return getattr(fn, "__csf_original__", fn)


@pytest.mark.parametrize(
    ("engine", "iterator"), [(e, it) for e, its in ITERATORS.items() for it in sorted(its)], indirect=["engine"]
)
def test_the_engines_iterators_yield_the_native_tensors_of_a_csf_checkpoint(pair, engine, wrapped, iterator):
    native, csf = pair
    args, kwargs = engine.iterator_args, ITERATORS[engine.name][iterator]
    want = dict(_original(engine, iterator)(shard_files(native), *args, **kwargs))
    got = dict(getattr(engine.loader, iterator)(shard_files(csf), *args, **kwargs))  # as DefaultModelLoader calls it
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert (got[name].dtype, got[name].shape, _raw(got[name])) == (t.dtype, t.shape, _raw(t)), name


def test_without_the_wrapper_the_engine_would_see_csf_names(pair, engine, wrapped):
    _, csf = pair
    names = {n for n, _ in _original(engine, "safetensors_weights_iterator")(shard_files(csf), *engine.iterator_args)}
    assert any(n.endswith(".weight_scale.csf") for n in names)
    engine.weight_iterators.uninstall()
    try:
        assert not engine.weight_iterators.installed()
        assert engine.loader.safetensors_weights_iterator is _original(engine, "safetensors_weights_iterator")
    finally:
        engine.weight_iterators.install()
    assert engine.weight_iterators.installed()


@pytest.mark.parametrize("tp", [1, 2])
def test_a_csf_checkpoint_loads_into_every_rank_exactly_as_its_native_original(pair, engine, wrapped, tp):
    native, csf = pair
    cfg_native = engine.config.from_config(json.loads((native / "config.json").read_text())["quantization_config"])
    cfg_csf = engine.config.from_config(json.loads((csf / "config.json").read_text())["quantization_config"])
    assert cfg_csf.entry is not None and cfg_native.entry is None
    iterate = engine.loader.safetensors_weights_iterator
    for rank in range(tp):
        a = engine.make_experts(cfg_native, experts=E, hidden=H, inter=N, tp=tp, rank=rank)
        b = engine.make_experts(cfg_csf, experts=E, hidden=H, inter=N, tp=tp, rank=rank)
        native_pairs = _original(engine, "safetensors_weights_iterator")(shard_files(native), *engine.iterator_args)
        loaded_a = engine.load_expert_tensors(a, native_pairs, E)
        loaded_b = engine.load_expert_tensors(b, iterate(shard_files(csf), *engine.iterator_args), E)
        assert loaded_a == loaded_b == {n for n, _ in b.named_parameters()}
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            assert _raw(pa.data) == _raw(pb.data), f"rank {rank}/{tp}: {name}"
        assert b.w2_weight_scale.view(torch.uint8).any()  # real scales arrived, not the zero init
