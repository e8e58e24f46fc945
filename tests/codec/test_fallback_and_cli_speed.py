"""Planes that do not compress stay native (flagged), empty planes round-trip; the CLI answers fast."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import csf_codec
from csf_codec.checkpoint import (
    compress_checkpoint,
    decompress_checkpoint,
    inspect_checkpoint,
    iter_checkpoint_tensors,
    tensor_sha256,
    verify_checkpoint,
)
from csf_codec.cli import main
from csf_codec.safetensors_io import read_header
from csf_codec.shard_schema import csf_records

from .checkpoints_for_tests import nvfp4_tensors

_SRC = str(Path(csf_codec.__file__).resolve().parent.parent)
P = "model.layers.0.mlp.experts.{}.down_proj"


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _mixed(path: Path) -> Path:
    """Expert 0 compresses; expert 1's scales are uniform random bytes; expert 2 has no rows, expert 3 K = 0
    (no block size is implied: it is not recognised as a scale plane and passes through)."""
    ts = nvfp4_tensors(2)
    g = torch.Generator().manual_seed(1)
    ts[P.format(1) + ".weight_scale"] = torch.randint(0, 256, (64, 8), generator=g, dtype=torch.uint8).view(
        torch.float8_e4m3fn
    )
    for e, (rows, k) in ((2, (0, 64)), (3, (16, 0))):
        ts[P.format(e) + ".weight"] = torch.zeros(rows, k // 2, dtype=torch.uint8)
        ts[P.format(e) + ".weight_scale"] = torch.zeros(rows, k // 16, dtype=torch.uint8).view(torch.float8_e4m3fn)
        ts[P.format(e) + ".weight_scale_2"] = torch.tensor(1.0)
    save_file(ts, path)
    return path


def test_incompressible_and_empty_planes_are_stored_native(tmp_path):
    src = _mixed(tmp_path / "m.safetensors")
    s = compress_checkpoint(src, tmp_path / "c.safetensors", progress=False)
    stored = {t.name: t.stored for t in s.tensors}
    assert stored == {
        P.format(0) + ".weight_scale": "csf",
        P.format(1) + ".weight_scale": "native",
        P.format(2) + ".weight_scale": "native",
    }
    assert all(t.compact_bytes <= t.native_bytes for t in s.tensors)
    header = read_header(s.dst)
    assert P.format(1) + ".weight_scale" in header.tensors  # under its own name, no .csf twin
    assert P.format(1) + ".weight_scale.csf" not in header.tensors
    flags = {r.name: r.native for r in csf_records(header).values()}
    assert flags == {P.format(e) + ".weight_scale": e > 0 for e in range(3)}

    assert verify_checkpoint(s.dst, against=src, progress=False).tensors == 1
    back = decompress_checkpoint(s.dst, tmp_path / "back.safetensors", progress=False).dst
    want, got = load_file(src), load_file(back)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(_raw(got[k]), _raw(want[k])), k
    assert tensor_sha256(s.dst) == tensor_sha256(src)
    reports = {r["name"]: r["stored"] for r in inspect_checkpoint(s.dst)}
    assert reports[P.format(0) + ".weight_scale"] == "csf" and reports[P.format(1) + ".weight_scale"] == "native"
    names = dict(iter_checkpoint_tensors(s.dst))
    assert torch.equal(_raw(names[P.format(1) + ".weight_scale"]), _raw(want[P.format(1) + ".weight_scale"]))


def test_cli_reports_the_planes_kept_native(tmp_path, capsys):
    src = _mixed(tmp_path / "m.safetensors")
    assert main(["compress", str(src), str(tmp_path / "c.safetensors"), "-q"]) == 0
    out = capsys.readouterr().out
    assert out.count("kept native") == 2 and "compressed 1 scale planes" in out


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")]))


def test_help_is_fast_and_does_not_import_torch():
    code = "import sys, csf_codec.cli; print(sorted(m for m in ('torch', 'numpy', 'safetensors') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "csf_codec", "--help"], env=_env(), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert r.returncode == 0 and "exit status" in r.stdout
    assert elapsed < 2.0, f"csf --help took {elapsed:.2f} s"  # 0.5 s is the goal; slack for a loaded machine


@pytest.mark.parametrize("command", ["compress", "verify", "decompress", "inspect"])
def test_progress_is_silent_off_a_terminal(tmp_path, capsys, command):
    """stderr is captured here (not a TTY): no bar, whatever --quiet says."""
    src = _mixed(tmp_path / "m.safetensors")
    csf = tmp_path / "c.safetensors"
    assert main(["compress", str(src), str(csf)]) == 0
    capsys.readouterr()
    argv = {
        "compress": ["compress", str(src), str(tmp_path / "d.safetensors")],
        "verify": ["verify", str(csf)],
        "decompress": ["decompress", str(csf), str(tmp_path / "e.safetensors")],
        "inspect": ["inspect", str(csf)],
    }[command]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
