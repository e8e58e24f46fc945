"""A stored CSF checkpoint read through SGLang's own safetensors iterators and loaded into the layer."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("sglang")

import sglang.srt.model_loader.loader as loader
import sglang.srt.model_loader.weight_utils as weight_utils

from csf_codec.checkpoint import compress_checkpoint
from csf_serving_adapters.sglang import weight_iterators
from csf_serving_adapters.sglang.config import CsfConfig

from .checkpoints import NV_QUANT, expert_tensors, write_checkpoint
from .sglang_layers import load_expert_tensors, make_experts

E, H, N = 4, 256, 128
ITERATORS = {
    "safetensors_weights_iterator": {},
    "buffered_multi_thread_safetensors_weights_iterator": {"max_workers": 2},
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    native = write_checkpoint(root / "native", expert_tensors(experts=E, hidden=H, inter=N), NV_QUANT)
    return native, compress_checkpoint(native, root / "csf", progress=False).dst


@pytest.fixture
def wrapped():
    """The wrapper installed for the test, and the process left as it was found."""
    was = weight_iterators.installed()
    weight_iterators.install()
    yield
    if not was:
        weight_iterators.uninstall()


def _files(root) -> list[str]:
    return sorted(str(p) for p in root.glob("*.safetensors"))


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _original(name):
    fn = getattr(weight_utils, name)
    return getattr(fn, "__csf_original__", fn)


@pytest.mark.parametrize("iterator", sorted(ITERATORS))
def test_sglang_iterators_yield_the_native_tensors_of_a_csf_checkpoint(pair, wrapped, iterator):
    native, csf = pair
    kwargs = ITERATORS[iterator]
    want = dict(_original(iterator)(_files(native), **kwargs))
    got = dict(getattr(loader, iterator)(_files(csf), **kwargs))  # as DefaultModelLoader calls it
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert (got[name].dtype, got[name].shape, _raw(got[name])) == (t.dtype, t.shape, _raw(t)), name


def test_without_the_wrapper_sglang_would_see_csf_names(pair, wrapped):
    _, csf = pair
    names = {n for n, _ in _original("safetensors_weights_iterator")(_files(csf))}
    assert any(n.endswith(".weight_scale.csf") for n in names)
    weight_iterators.uninstall()
    try:
        assert not weight_iterators.installed()
        assert loader.safetensors_weights_iterator is _original("safetensors_weights_iterator")
    finally:
        weight_iterators.install()
    assert weight_iterators.installed()


@pytest.mark.parametrize("tp", [1, 2])
def test_a_csf_checkpoint_loads_into_every_rank_exactly_as_its_native_original(pair, wrapped, tp):
    native, csf = pair
    cfg_native = CsfConfig.from_config(json.loads((native / "config.json").read_text())["quantization_config"])
    cfg_csf = CsfConfig.from_config(json.loads((csf / "config.json").read_text())["quantization_config"])
    assert cfg_csf.entry is not None and cfg_native.entry is None
    iterate = loader.safetensors_weights_iterator
    for rank in range(tp):
        a = make_experts(cfg_native, experts=E, hidden=H, inter=N, tp=tp, rank=rank)
        b = make_experts(cfg_csf, experts=E, hidden=H, inter=N, tp=tp, rank=rank)
        loaded_a = load_expert_tensors(a, _original("safetensors_weights_iterator")(_files(native)), E)
        loaded_b = load_expert_tensors(b, iterate(_files(csf)), E)
        assert loaded_a == loaded_b == {n for n, _ in b.named_parameters()}
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
            assert _raw(pa.data) == _raw(pb.data), f"rank {rank}/{tp}: {name}"
        assert b.w2_weight_scale.view(torch.uint8).any()  # real scales arrived, not the zero init
