"""scripts/pack_aot_cache.py: the archive a device call carries holds this tree's cache key and nothing else."""

from __future__ import annotations

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
