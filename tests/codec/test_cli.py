"""The ``csf`` command and the demo, end to end on tiny checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import csf_codec
from csf_codec.checkpoint import META_VERSION, tensor_sha256
from csf_codec.cli import main
from csf_codec.demo import MoELayerShape, build_checkpoint
from csf_codec.formats import MXFP4, NVFP4
from csf_codec.safetensors_io import passthrough_entry, read_header, write_safetensors

TINY = MoELayerShape(experts=2, hidden=128, inter=64)
_SRC = str(Path(csf_codec.__file__).resolve().parent.parent)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_SRC, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(scope="module", params=[MXFP4, NVFP4], ids=lambda f: f.name)
def native(request, tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("cli") / "native", request.param, TINY, max_shard_bytes=20_000)


def test_compress_verify_inspect_decompress(native, tmp_path, capsys):
    csf, back = tmp_path / "csf", tmp_path / "back"
    assert main(["compress", str(native), str(csf), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "compressed 2 scale planes" in out and str(csf) in out

    assert main(["verify", str(csf), "--against", str(native), "--no-progress"]) == 0
    assert "byte-identical" in capsys.readouterr().out
    assert main(["verify", str(csf)]) == 0
    assert capsys.readouterr().out.startswith("OK: 2 CSF tensors")

    for src in (native, csf):
        assert main(["inspect", str(src)]) == 0
        table = capsys.readouterr().out
        assert "TOTAL (2 planes)" in table and "compact/bound" in table and "raw tiles" in table
        assert main(["inspect", str(src), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert len(doc["tensors"]) == 2 and doc["totals"]["tensors"] == 2
        assert doc["totals"]["native_bytes"] == sum(r["native_bytes"] for r in doc["tensors"])
        assert {r["stored"] for r in doc["tensors"]} == {"csf" if src == csf else "native"}

    assert main(["decompress", str(csf), str(back), "--no-progress"]) == 0
    assert "restored 2 scale planes" in capsys.readouterr().out
    assert tensor_sha256(back) == tensor_sha256(native)


def test_errors_exit_non_zero_with_a_message(native, tmp_path, capsys):
    csf = tmp_path / "csf"
    assert main(["compress", str(native), str(csf), "--no-progress"]) == 0
    capsys.readouterr()

    assert main(["verify", str(native), "--no-progress"]) == 1  # CSFError: not a CSF checkpoint
    assert "not a CSF checkpoint" in capsys.readouterr().err
    assert main(["compress", str(native), str(csf), "--no-progress"]) == 2  # destination exists
    assert "exists" in capsys.readouterr().err
    assert main(["compress", str(tmp_path / "nope"), str(tmp_path / "x")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    assert main(["compress", str(native), str(csf), "--overwrite", "--no-progress"]) == 0
    capsys.readouterr()

    shard = next(p for p in sorted(csf.glob("*.safetensors")) if META_VERSION in read_header(p).metadata)
    header = read_header(shard)
    meta = {**header.metadata, META_VERSION: "7"}
    tmp = tmp_path / "tmp.safetensors"
    write_safetensors(tmp, [passthrough_entry(header, n) for n in header.tensors], metadata=meta)
    tmp.replace(shard)
    (csf / "csf-complete.json").unlink()  # as a checkpoint of another version has none: the version is named
    for argv in (["verify", str(csf)], ["inspect", str(csf)], ["decompress", str(csf), str(tmp_path / "out")]):
        assert main(argv) == 3  # malformed input: a version this build does not read
        err = capsys.readouterr().err
        assert "format_version" in err and shard.name in err and "_scale" in err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["compress", "only-src"])
    assert e.value.code == 2
    capsys.readouterr()


def test_python_dash_m_runs(native, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "csf_codec", "inspect", str(native), "--json"],
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tensors"]) == 2
    r = subprocess.run(
        [sys.executable, "-m", "csf_codec", "verify", str(native)],
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1 and r.stderr.startswith("csf: ") and "not a CSF checkpoint" in r.stderr


def test_demo_small(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "csf_codec.demo", "--small", "--workdir", str(tmp_path), "--no-progress"],
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("IDENTICAL") == 2
    assert "MXFP4 (gpt-oss naming), E=8" in r.stdout and "NVFP4 (ModelOpt naming), E=8" in r.stdout
    for fmt in ("mxfp4", "nvfp4"):
        assert tensor_sha256(tmp_path / f"{fmt}-native") == tensor_sha256(tmp_path / f"{fmt}-restored")
        index = json.loads((tmp_path / f"{fmt}-csf" / "model.safetensors.index.json").read_text())
        assert sum(name.endswith(".csf") for name in index["weight_map"]) == 2
