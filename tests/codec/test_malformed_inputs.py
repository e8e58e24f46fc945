"""Every malformed input gives a typed CSFError naming the file and tensor, and the CLI one line and a code."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from csf_codec.checkpoint import compress_checkpoint, decompress_checkpoint, verify_checkpoint
from csf_codec.cli import main
from csf_codec.errors import CheckpointIOError, CSFError, MalformedInputError
from csf_codec.safetensors_io import passthrough_entry, read_header, read_tensor_bytes, write_safetensors
from csf_codec.shard_schema import META_DIGEST, META_TENSORS, csf_records

from .checkpoints_for_tests import nvfp4_tensors, sharded_checkpoint

SCALE = "model.layers.0.mlp.experts.0.down_proj.weight_scale"


def _write(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _entries() -> dict:
    return {
        "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "b": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]},
    }


def _edit(**changes):
    h = _entries()
    for key, value in changes.items():
        name, field = key.split("__")
        if value is None:
            del h[name][field]
        else:
            h[name][field] = value
    return h


@pytest.mark.parametrize(
    ("header", "data", "tensor", "fault"),
    [
        (_edit(a__dtype=None), bytes(8), "a", "no dtype"),
        (_edit(b__data_offsets=None), bytes(8), "b", "no data_offsets"),
        (_edit(b__data_offsets=[8, 4]), bytes(8), "b", "reversed"),
        (_edit(b__data_offsets=[2, 6]), bytes(8), "b", "overlaps"),
        (_edit(a__data_offsets=[0, 4], b__data_offsets=[6, 10]), bytes(10), "b", "gap"),
        (_edit(b__data_offsets=[4, 8]), bytes(6), "b", "past the end"),
        (_edit(b__shape=[3]), bytes(8), "b", "needs 6"),
        (_edit(a__shape=[-4]), bytes(8), "a", "non-negative"),
        (_edit(a__dtype="Q4"), bytes(8), "a", "unknown dtype"),
        (_edit(), bytes(9), "b", "trailing"),
        ({"__metadata__": {"k": 1}, **_entries()}, bytes(8), "__metadata__", "strings"),
        ({"a": [1, 2]}, bytes(8), "a", "not a JSON object"),
    ],
)
def test_bad_safetensors_headers_are_typed_and_named(tmp_path, header, data, tensor, fault):
    path = _write(tmp_path / "m.safetensors", header, data)
    with pytest.raises(MalformedInputError, match=fault) as err:
        read_header(path)
    assert err.value.file == str(path) and err.value.tensor == tensor
    assert main(["inspect", str(path)]) == 3


def test_random_bytes_and_bad_lengths_are_typed(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    cases = {
        "random.safetensors": bytes(torch.randint(0, 256, (4096,), generator=g, dtype=torch.uint8).tolist()),
        "short.safetensors": b"\x01\x02",
        "long.safetensors": struct.pack("<Q", 1 << 40) + b"{}",
        "notjson.safetensors": struct.pack("<Q", 4) + b"{{{{",
        "array.safetensors": struct.pack("<Q", 2) + b"[]",
    }
    for name, blob in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        with pytest.raises(MalformedInputError) as err:
            read_header(path)
        assert err.value.file == str(path)
        assert main(["verify", str(path), "-q"]) == 3
        err_text = capsys.readouterr().err
        assert err_text.startswith(f"csf: {path}: ") and err_text.count("\n") == 1, err_text


def test_cli_error_lines_name_file_and_tensor(tmp_path, capsys):
    path = _write(tmp_path / "m.safetensors", _edit(a__dtype=None), bytes(8))
    assert main(["compress", str(path), str(tmp_path / "o.safetensors")]) == 3
    assert capsys.readouterr().err == f"csf: {path}: a: header entry has no dtype\n"


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for line in ("0    success", "1    integrity", "2    usage", "3    malformed input", "4    I/O error", "130"):
        assert line in out


@pytest.mark.parametrize("code", [errno.EFBIG, errno.ENOSPC, errno.EIO])
def test_os_errors_on_read_are_typed_with_the_file(tmp_path, monkeypatch, code, capsys):
    path = tmp_path / "m.safetensors"
    save_file(nvfp4_tensors(1), path)
    header = read_header(path)

    def fail(*a, **k):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr("builtins.open", fail)
    with pytest.raises(CheckpointIOError) as err:
        read_tensor_bytes(header, SCALE)
    assert err.value.file == str(path) and err.value.tensor == SCALE and os.strerror(code) in str(err.value)
    assert main(["inspect", str(path)]) == 4
    assert capsys.readouterr().err.startswith(f"csf: {path}: ")


def test_a_wrong_total_size_is_recomputed(tmp_path):
    src = sharded_checkpoint(tmp_path / "src")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    right = index["metadata"]["total_size"]
    index["metadata"]["total_size"] = 10  # far too small: the old arithmetic went negative
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    out = compress_checkpoint(src, tmp_path / "csf", progress=False).dst
    total = json.loads((out / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    stored = sum(i.nbytes for p in out.glob("*.safetensors") for i in read_header(p).tensors.values())
    assert total == stored > 0
    verify_checkpoint(out, progress=False)
    back = decompress_checkpoint(out, tmp_path / "back", progress=False).dst
    assert json.loads((back / "model.safetensors.index.json").read_text())["metadata"]["total_size"] == right


def _shard_with_meta(tmp_path: Path, edit) -> Path:
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))
    src = tmp_path / "m.safetensors"
    save_file(nvfp4_tensors(1), src)
    out = compress_checkpoint(src, tmp_path / "c.safetensors", progress=False).dst
    header = read_header(out)
    meta = edit(dict(header.metadata))
    bad = tmp_path / "bad.safetensors"
    write_safetensors(bad, [passthrough_entry(header, n) for n in header.tensors], metadata=meta)
    return bad


@pytest.mark.parametrize(
    ("edit", "fault"),
    [
        (lambda m: {**m, META_TENSORS: m[META_TENSORS][:-1]}, "not JSON"),
        (lambda m: {**m, META_TENSORS: m[META_TENSORS].replace("F8_E4M3", "U8")}, META_DIGEST),
        (lambda m: {k: v for k, v in m.items() if k != META_DIGEST}, META_DIGEST),
        (lambda m: {**m, META_TENSORS: "[]"}, "JSON object"),
    ],
)
def test_bad_csf_metadata_is_typed(tmp_path, edit, fault):
    bad = _shard_with_meta(tmp_path, edit)
    with pytest.raises(MalformedInputError, match=fault) as err:
        csf_records(read_header(bad))
    assert err.value.file == str(bad)
    for op in (lambda: verify_checkpoint(bad, progress=False), lambda: decompress_checkpoint(bad, tmp_path / "o")):
        with pytest.raises(CSFError):
            op()
    assert not (tmp_path / "o").exists()


def test_forged_metadata_fields_are_cross_checked(tmp_path):
    """Even with its digest recomputed, metadata cannot rename, reshape or re-format a stored plane."""

    def forge(m, old, new):
        doc = json.loads(m[META_TENSORS])
        text = json.dumps(doc, separators=(",", ":"), sort_keys=True).replace(old, new)
        text = json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)
        return {**m, META_TENSORS: text, META_DIGEST: hashlib.sha256(text.encode()).hexdigest()}

    for old, new, fault in (
        ('"name":"model.layers.0', '"name":"model.layers.9', "stored as <name>.csf"),
        ('"stored":"csf"', '"stored":"native"', "stored as itself"),
        ('"stored":"csf"', '"stored":"csf","extra":1', "exactly the fields"),
        ('"dtype":"F8_E4M3"', '"dtype":"BF16"', "one-byte"),
    ):
        bad = _shard_with_meta(tmp_path, lambda m, o=old, n=new: forge(m, o, n))
        with pytest.raises(MalformedInputError, match=fault):
            csf_records(read_header(bad))
    bad = _shard_with_meta(tmp_path, lambda m: forge(m, '"format":"nvfp4"', '"format":"mxfp4"'))
    with pytest.raises(CSFError, match="metadata says mxfp4"):
        verify_checkpoint(bad, progress=False)
    bad = _shard_with_meta(tmp_path, lambda m: forge(m, '"shape":[64,8]', '"shape":[32,16]'))
    with pytest.raises(CSFError, match="expected"):
        verify_checkpoint(bad, progress=False)


def test_a_scale_plane_misfit_names_its_shard(tmp_path):
    ts = nvfp4_tensors(1)
    ts[SCALE] = ts[SCALE][:, :5].contiguous()  # 5 columns do not divide K = 64
    path = tmp_path / "m.safetensors"
    save_file(ts, path)
    with pytest.raises(CSFError) as err:
        compress_checkpoint(path, tmp_path / "o.safetensors", progress=False)
    assert err.value.file == str(path) and err.value.tensor == SCALE
