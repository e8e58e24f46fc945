"""Engine-independent adapter pieces: the config entry, stored planes, accounting, scratch (no vLLM needed)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from csf_codec import CSF_FORMAT_VERSION, FormatVersionError
from csf_codec.checkpoint import compress_checkpoint
from csf_serving_adapters.accounting import LayerScaleMemory, ScaleMemoryLedger
from csf_serving_adapters.checkpoint_config import base_quant_method, csf_entry, scale_format_of
from csf_serving_adapters.scratch import SharedScratch
from csf_serving_adapters.stored_planes import decode_stored_planes, stored_planes

from .checkpoints import NV_QUANT, expert_tensors, write_checkpoint


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def nv_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("nv")
    native = write_checkpoint(root / "native", expert_tensors(experts=3, hidden=128, inter=64), NV_QUANT)
    csf = compress_checkpoint(native, root / "csf", progress=False).dst
    return native, csf


def test_the_entry_csf_compress_writes_is_read_back(nv_pair):
    _, csf = nv_pair
    qc = json.loads((csf / "config.json").read_text())["quantization_config"]
    entry = csf_entry(qc)
    assert entry is not None and entry.scale_format == "nvfp4" and entry.tensors == 9
    assert base_quant_method(qc) == "modelopt_fp4"


def test_native_configs_have_no_entry_and_their_base_format_is_known():
    assert csf_entry({"quant_method": "mxfp4"}) is None and csf_entry(None) is None
    assert scale_format_of(base_quant_method({"quant_method": "mxfp4"})) == "mxfp4"
    assert scale_format_of(base_quant_method(NV_QUANT)) == "nvfp4"
    assert scale_format_of(base_quant_method({"quant_method": "fp8"})) is None


def test_an_unknown_format_version_and_a_mixed_checkpoint_are_refused():
    for old_or_new in (1, 2, 4):
        with pytest.raises(FormatVersionError, match="format_version"):
            csf_entry({"quant_method": "mxfp4", "csf": {"format_version": old_or_new, "scale_format": "mxfp4"}})
    mixed = csf_entry({"csf": {"format_version": CSF_FORMAT_VERSION, "scale_format": "mxfp4,nvfp4", "tensors": 2}})
    assert mixed.scale_formats == ("mxfp4", "nvfp4")
    with pytest.raises(ValueError, match="mixes"):
        mixed.scale_format  # noqa: B018


def test_stored_planes_decode_to_the_native_tensors(nv_pair):
    native, csf = nv_pair
    files = sorted(csf.glob("*.safetensors"))
    planes = stored_planes(files)
    assert planes and all(name.endswith(".csf") for name in planes)
    stored = {n: t for f in files for n, t in load_file(f).items()}
    want = {n: t for f in sorted(native.glob("*.safetensors")) for n, t in load_file(f).items()}
    got = dict(decode_stored_planes(files, stored.items()))
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert _raw(got[name]) == _raw(t), name
    assert stored_planes(sorted(native.glob("*.safetensors"))) == {}


def test_the_ledger_reports_each_layer_once_and_the_total():
    ledger = ScaleMemoryLedger()
    ledger.record(LayerScaleMemory(layer="a", native_bytes=100, stored_bytes=30, form="triton-inline"))
    ledger.record(LayerScaleMemory(layer="b", native_bytes=50, stored_bytes=20, form="triton-inline"))
    ledger.record(LayerScaleMemory(layer="a", native_bytes=100, stored_bytes=25, form="triton-inline"))  # a reload
    report = ledger.report()
    assert [r["layer"] for r in report["layers"]] == ["a", "b"]
    assert report["total"] == {"layer": "total", "form": "triton-inline", "native": 150, "stored": 45, "returned": 105}


def test_shared_scratch_grows_only_when_asked_for_more():
    pool = SharedScratch()
    a = pool.get("cpu", 100)
    assert pool.get("cpu", 50) is a and pool.get("cpu", 100) is a
    b = pool.get("cpu", 200)
    assert b.numel() == 200 and b.dtype == torch.uint8 and pool.get("cpu", 10) is b


def test_compressed_tensors_formats_come_from_the_config_groups():
    from csf_serving_adapters.checkpoint_config import scale_format_of

    from .ct_checkpoints import CT_NV_CONFIG

    assert scale_format_of("compressed-tensors", CT_NV_CONFIG) == "nvfp4"
    mx = {"quant_method": "compressed-tensors", "config_groups": {"g": {"format": "mxfp4-pack-quantized"}}}
    assert scale_format_of("compressed-tensors", mx) == "mxfp4"
    mixed = {"config_groups": {"a": {"format": "mxfp4-pack-quantized"}, "b": {"format": "nvfp4-pack-quantized"}}}
    assert scale_format_of("compressed-tensors", mixed) is None  # one layer method serves one format
    assert scale_format_of("compressed-tensors", {"config_groups": {"a": {"format": "float-quantized"}}}) is None
    assert scale_format_of("compressed-tensors") is None
