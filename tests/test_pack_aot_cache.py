"""scripts/pack_aot_cache.py: the archive a device call carries holds this tree's cache key and nothing else."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from csf_kernels.runtime.toolchain import cache_key
from tests.repo_scripts import load_script


def _pack(monkeypatch, root: Path) -> None:
    module = load_script("scripts/pack_aot_cache.py", "pack_aot_cache")
    monkeypatch.setattr("sys.argv", ["pack_aot_cache.py", "--root", str(root)])
    module.main()


def test_packs_the_current_key_only(monkeypatch, tmp_path):
    key = cache_key()
    for k in (key, "0" * 20):  # the current key and a stale one beside it
        (tmp_path / k / "programs").mkdir(parents=True)
        (tmp_path / k / "manifest.json").write_text("{}")
        (tmp_path / k / "programs" / "p.cubin").write_bytes(k.encode())
    _pack(monkeypatch, tmp_path)
    with tarfile.open(tmp_path / "carry.tgz") as tar:
        names = set(tar.getnames())
        assert names == {key, f"{key}/manifest.json", f"{key}/programs", f"{key}/programs/p.cubin"}
        assert tar.extractfile(f"{key}/programs/p.cubin").read() == key.encode()
    assert not (tmp_path / "carry.tgz.tmp").exists()


def test_refuses_a_root_without_this_trees_cache(monkeypatch, tmp_path):
    (tmp_path / ("0" * 20)).mkdir()
    with pytest.raises(SystemExit, match="no cache built for these sources"):
        _pack(monkeypatch, tmp_path)
    assert not (tmp_path / "carry.tgz").exists()


def test_drop_leaves_out_matching_programs_and_lists_the_rest(monkeypatch, tmp_path):
    import json

    from csf_kernels.runtime.manifest import Manifest, ProgramEntry

    key = cache_key()
    folder = tmp_path / key
    (folder / "programs").mkdir(parents=True)
    specs = {
        "a" * 24: {"kernel": "moe.engine_gemm", "version": 5, "facts": {"FMT": "nvfp4", "TN": 16}},
        "b" * 24: {"kernel": "moe.engine_gemm", "version": 5, "facts": {"FMT": "mxfp4", "TN": 16}},
        "c" * 24: {"kernel": "expand.row_blocks", "version": 2, "facts": {"DB": 8}},
        "d" * 24: {"kernel": "moe.engine_gemm", "version": 5, "facts": {"FMT": "mxfp4", "TN": 16, "SRC": "inline"}},
    }
    entries = {}
    for k, spec in specs.items():
        blob = k.encode()
        (folder / "programs" / f"{k}.so").write_bytes(blob)
        entries[k] = ProgramEntry.sealed(
            key=k, kind="cute_so", spec=spec, file=f"programs/{k}.so", sha256=hashlib.sha256(blob).hexdigest(),
            nbytes=len(blob), launch={}, geometries=("any",),
        ).to_json()  # fmt: skip
    header = {"csf_aot_manifest": 2, "cache_key": key, "sources_sha256": "0", "toolchain": {}, "target": {},
              "csf_format": 3, "catalog_sha256": "0"}  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps({**header, "programs": entries}))
    module = load_script("scripts/pack_aot_cache.py", "pack_aot_cache")
    # "-": the fact is absent (the native-scale programs have no SRC)
    drops = ["--drop", "moe.engine_gemm:FMT=nvfp4", "--drop", "moe.engine_gemm:SRC=-,TN=16", "--drop", "none.kernel"]
    argv = ["pack_aot_cache.py", "--root", str(tmp_path), *drops]
    monkeypatch.setattr("sys.argv", argv)
    module.main()
    out = tmp_path / "unpacked"
    with tarfile.open(tmp_path / "carry.tgz") as tar:
        tar.extractall(out, filter="data")
    kept = sorted(p.name for p in (out / key / "programs").iterdir())
    assert kept == [f"{'c' * 24}.so", f"{'d' * 24}.so"]
    manifest = Manifest.read(out / key / "manifest.json")  # a valid manifest, every kept entry's seal intact
    assert sorted(manifest.programs) == ["c" * 24, "d" * 24]
