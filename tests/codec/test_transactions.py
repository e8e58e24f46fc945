"""Outputs are transactions: whole and recorded, or absent; failures and signals leave nothing behind."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import csf_codec
from csf_codec import safetensors_io
from csf_codec.checkpoint import compress_checkpoint, decompress_checkpoint, tensor_sha256, verify_checkpoint
from csf_codec.cli import main
from csf_codec.errors import CheckpointIOError, IncompleteOutputError, MalformedInputError, UsageError
from csf_codec.transaction import COMPLETION_RECORD

from .checkpoints_for_tests import file_hashes, sharded_checkpoint

_SRC = str(Path(csf_codec.__file__).resolve().parent.parent)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return sharded_checkpoint(tmp_path_factory.mktemp("tx") / "native", experts=3)


@pytest.fixture(scope="module")
def small_src(tmp_path_factory) -> Path:
    return sharded_checkpoint(tmp_path_factory.mktemp("tx") / "native", experts=1, seed=5)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".csf-partial-" in p.name or ".csf-old-" in p.name)


def _fail_on_second_write(monkeypatch, exc: OSError) -> None:
    """The second shard fails part-way through its data, as a full disk would."""
    real = safetensors_io._chunks
    calls = {"files": 0}
    real_write = safetensors_io.write_safetensors

    def write(path, entries, **kw):
        calls["files"] += 1
        return real_write(path, entries, **kw)

    def chunks(data):
        for i, c in enumerate(real(data)):
            if calls["files"] >= 2 and i == 0:
                raise exc
            yield c

    monkeypatch.setattr(safetensors_io, "_chunks", chunks)
    monkeypatch.setattr("csf_codec.checkpoint.write_safetensors", write)


def test_a_complete_output_carries_a_record_of_every_file(src, tmp_path):
    out = compress_checkpoint(src, tmp_path / "csf", progress=False).dst
    record = json.loads((out / COMPLETION_RECORD).read_text())
    hashes = file_hashes(out)
    del hashes[COMPLETION_RECORD]
    assert {f["path"]: f["sha256"] for f in record["files"]} == hashes
    assert {f["path"]: f["size"] for f in record["files"]} == {p: (out / p).stat().st_size for p in hashes}
    assert record["format_version"] == csf_codec.CSF_FORMAT_VERSION and record["kind"] == "csf"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_a_failed_write_leaves_nothing(src, tmp_path, monkeypatch, code):
    _fail_on_second_write(monkeypatch, OSError(code, os.strerror(code)))
    with pytest.raises(CheckpointIOError) as err:
        compress_checkpoint(src, tmp_path / "csf", progress=False)
    assert err.value.exit_code == 4 and os.strerror(code) in str(err.value) and "model-0000" in str(err.value)
    assert not (tmp_path / "csf").exists() and _leftovers(tmp_path) == []


def test_a_failed_overwrite_keeps_the_good_output(src, tmp_path, monkeypatch):
    out = compress_checkpoint(src, tmp_path / "csf", progress=False).dst
    before = file_hashes(out)
    with monkeypatch.context() as m:
        _fail_on_second_write(m, OSError(errno.ENOSPC, "No space left on device"))
        with pytest.raises(CheckpointIOError):
            compress_checkpoint(src, out, progress=False, overwrite=True)
    assert file_hashes(out) == before and _leftovers(tmp_path) == []
    verify_checkpoint(out, against=src, progress=False)


def test_a_truncated_source_shard_fails_and_keeps_the_old_output(src, tmp_path):
    out = compress_checkpoint(src, tmp_path / "csf", progress=False).dst
    before = file_hashes(out)
    broken = tmp_path / "broken"
    os.system(f"cp -r {src} {broken}")
    shard = broken / "model-00002-of-00004.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(MalformedInputError, match=shard.name):
        compress_checkpoint(broken, out, progress=False, overwrite=True)
    assert file_hashes(out) == before and _leftovers(tmp_path) == []
    assert main(["compress", str(broken), str(tmp_path / "new"), "-q"]) == 3
    assert not (tmp_path / "new").exists()


def test_overwrite_replaces_the_whole_output(src, small_src, tmp_path):
    out = tmp_path / "csf"
    compress_checkpoint(src, out, progress=False)
    compress_checkpoint(small_src, out, progress=False, overwrite=True)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]  # no stale shard
    assert tensor_sha256(out) == tensor_sha256(small_src)
    assert verify_checkpoint(out, against=small_src, progress=False).tensors == 1
    assert _leftovers(tmp_path) == []
    back = decompress_checkpoint(out, tmp_path / "back", progress=False).dst
    decompress_checkpoint(out, back, progress=False, overwrite=True)
    assert tensor_sha256(back) == tensor_sha256(small_src) and _leftovers(tmp_path) == []


def test_a_directory_without_a_valid_record_is_refused(src, tmp_path):
    out = compress_checkpoint(src, tmp_path / "csf", progress=False).dst
    record = out / COMPLETION_RECORD
    saved = record.read_text()

    (out / "stale.safetensors").write_bytes(b"x")  # a file the record does not list
    for op in (lambda: verify_checkpoint(out, progress=False), lambda: decompress_checkpoint(out, tmp_path / "b")):
        with pytest.raises(IncompleteOutputError, match=r"stale\.safetensors"):
            op()
    (out / "stale.safetensors").unlink()

    cfg = out / "config.json"
    cfg.write_text(cfg.read_text() + " ")  # one byte more: decompress checks sizes
    with pytest.raises(IncompleteOutputError, match=r"config\.json"):
        decompress_checkpoint(out, tmp_path / "b", progress=False)
    cfg.write_text(cfg.read_text()[:-2] + "}")  # same size, other bytes: verify checks hashes
    with pytest.raises(IncompleteOutputError, match="SHA-256"):
        verify_checkpoint(out, progress=False)

    record.unlink()
    for op in (lambda: verify_checkpoint(out, progress=False), lambda: decompress_checkpoint(out, tmp_path / "b")):
        with pytest.raises(IncompleteOutputError, match="no completion record"):
            op()
    record.write_text("{not json")
    with pytest.raises(IncompleteOutputError, match="not JSON"):
        verify_checkpoint(out, progress=False)
    record.write_text(saved.replace('"path": "config.json"', '"path": "../config.json"'))
    with pytest.raises(IncompleteOutputError, match="malformed entry"):
        verify_checkpoint(out, progress=False)
    assert not (tmp_path / "b").exists()


def test_a_stale_partial_directory_is_named_and_never_taken_for_output(src, tmp_path):
    """What a SIGKILL leaves: a partial directory without a record."""
    partial = tmp_path / ".csf.csf-partial-999999"
    partial.mkdir()
    (partial / "model-00001-of-00004.safetensors").write_bytes(b"half")
    with pytest.raises(UsageError, match=r"\.csf\.csf-partial-999999"):
        verify_checkpoint(tmp_path / "csf", progress=False)
    with pytest.raises(IncompleteOutputError, match="no completion record"):
        verify_checkpoint(partial, progress=False)
    out = compress_checkpoint(src, tmp_path / "csf", progress=False).dst  # another run's partial is not ours
    verify_checkpoint(out, progress=False)


_SLOW_COMPRESS = """
import sys, time
from csf_codec import safetensors_io
real = safetensors_io._chunks
def slow(data):
    for c in real(data):
        time.sleep(0.3)
        yield c
safetensors_io._chunks = slow
from csf_codec.cli import main
sys.exit(main(["compress", sys.argv[1], sys.argv[2], "-q"]))
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_removes_the_partial_output(src, tmp_path, sig, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")]))
    dst = tmp_path / "csf"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_COMPRESS, str(src), str(dst)], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not any(p.suffix == ".tmp" for p in tmp_path.glob(".csf.csf-partial-*/*")):  # mid-shard
        assert proc.poll() is None and time.monotonic() < deadline, "compress ended before it could be interrupted"
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.count("\n") == 1 and err.startswith("csf: ")
    assert not dst.exists() and _leftovers(tmp_path) == []


def test_overwrite_replaces_only_outputs(src, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a checkpoint"):
        compress_checkpoint(src, home, progress=False, overwrite=True)
    assert (home / "notes.txt").read_text() == "mine" and _leftovers(tmp_path) == []
    (tmp_path / "empty").mkdir()
    compress_checkpoint(src, tmp_path / "empty", progress=False, overwrite=True)


def test_the_cli_restores_signal_handlers(src, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["compress", str(src), str(tmp_path / "csf"), "-q"]) == 0
    assert main(["verify", str(tmp_path / "nothing"), "-q"]) == 2
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
