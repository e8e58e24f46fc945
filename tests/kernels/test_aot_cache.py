"""The AOT cache: deterministic, atomic builds; manifests that refuse stale or tampered caches; a
frozen runtime that names what is missing and never imports a compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from csf_kernels import env
from csf_kernels.aot.registry import catalog_specs
from csf_kernels.expand.specs import inline_class_spec
from csf_kernels.runtime import ProgramCache, UncachedProgramError
from csf_kernels.runtime.manifest import CacheIntegrityError, Manifest
from csf_kernels.runtime.toolchain import cache_key

ROOT = Path(__file__).resolve().parents[2]
TINY = """
moe:
  - {name: tiny, experts: 4, hidden: 576, intermediate: 256, top_k: 2, tp: [1], formats: [mxfp4]}
sparse_mla: {}
token_buckets: [1, 8]
"""


@pytest.fixture(scope="module")
def tiny_catalog(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("catalog") / "catalog.yaml"
    p.write_text(TINY)
    return p


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_catalog) -> Path:
    pytest.importorskip("triton")
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the AOT cache cannot be built here")
    from csf_kernels.aot.build import build_cache

    return build_cache(tmp_path_factory.mktemp("aot"), catalog_path=tiny_catalog, jobs=2, progress=False)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_build_writes_a_keyed_directory_with_checked_binaries(built):
    from csf_kernels.runtime.manifest import sha256_bytes

    assert built.name == cache_key()
    m = Manifest.read(built / "manifest.json")
    assert m.cache_key == built.name and m.target["arch"] == "sm_90a"
    assert len(m.programs) >= 2
    for e in m.programs.values():
        data = (built / e.file).read_bytes()
        assert sha256_bytes(data) == e.sha256 and len(data) == e.nbytes
        assert data[:4] == b"\x7fELF"  # a SASS cubin or a linked shared object, never PTX
        if e.kind == "triton_cubin":
            from csf_kernels.runtime.programs import triton_family

            _, signature, _ = triton_family(e.spec["kernel"]).source()
            assert e.launch["block"] == [32 * e.spec["facts"]["num_warps"], 1, 1]
            assert e.launch["params"] == [t for t in signature.values() if t != "constexpr"]
        else:
            assert e.kind == "cute_so" and e.launch["launch"]["block"] == [128, 1, 1]
    assert {e.kind for e in m.programs.values()} == {"triton_cubin", "cute_so"}
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")], "temporary build folders left behind"


def test_programs_do_not_depend_on_where_the_checkout_lies(built):
    import csf_kernels

    # line info would name the sources by absolute path: a shared Triton cache could then hand one checkout's
    # cubin to another checkout's build (which once made the rebuild below differ)
    src = str(Path(csf_kernels.__file__).resolve().parents[1]).encode()
    named = [p.name for p in (built / "programs").glob("*.cubin") if src in p.read_bytes()]
    assert not named, f"{len(named)} cubins name the source tree, e.g. {named[0]}"


def test_rebuilding_gives_identical_bytes(built, tiny_catalog, tmp_path):
    from csf_kernels.aot.build import build_cache

    again = build_cache(tmp_path, catalog_path=tiny_catalog, jobs=1, progress=False)
    assert _tree(again) == _tree(built)
    # and building over an existing cache replaces it whole
    again2 = build_cache(tmp_path, catalog_path=tiny_catalog, jobs=1, progress=False)
    assert _tree(again2) == _tree(built)


def test_the_catalog_determines_the_programs(tiny_catalog):
    from csf_kernels.aot.registry import geometry_specs
    from csf_kernels.catalog import load_catalog

    catalog = load_catalog(tiny_catalog)
    # W13 [4, 512, 18]: narrow rows with a 2-column tail; W2 [4, 576, 8]: 8-byte stores, 2 tiles per
    # program; both in all 8 record sizes
    needed = geometry_specs(catalog.moe[0])
    expand = [s for s in needed if s.kernel == "expand.inline_tiles"]
    kinds = sorted({(s.fact["TTC"], s.fact["NARROW"], s.fact["STORE"], s.fact["CT"]) for s in expand})
    assert kinds == [(0, 0, 8, 2), (2, 16, 2, 4)]
    assert len({s.fact["S"] for s in expand}) == 8
    specs = catalog_specs(catalog)
    assert {s.key for s in needed} <= set(specs)
    # and the format gets every tail width, with full tiles and alone, so any MXFP4 plane expands
    expand = [s for s, _ in specs.values() if s.kernel == "expand.inline_tiles"]
    assert sorted({(s.fact["S"] > 0, s.fact["TTC"]) for s in expand}) == [
        (False, 1),
        (False, 2),
        (False, 3),
        (True, 0),
        (True, 1),
        (True, 2),
        (True, 3),
    ]
    widths = sorted(s.fact["W"] for s, _ in specs.values() if s.kernel == "expand.compact_segments")
    assert widths == [1, 2, 4]


def test_tampered_binary_is_refused(built, tiny_catalog, tmp_path):
    import shutil

    from csf_kernels.catalog import load_catalog

    copy = tmp_path / built.name
    shutil.copytree(built, copy)
    m = Manifest.read(copy / "manifest.json")
    key, entry = next(iter(m.programs.items()))
    data = bytearray((copy / entry.file).read_bytes())
    data[100] ^= 0xFF
    (copy / entry.file).write_bytes(bytes(data))
    cache = ProgramCache(tmp_path)
    spec = next(s for s, _ in catalog_specs(load_catalog(tiny_catalog)).values() if s.key == key)
    with pytest.raises(CacheIntegrityError, match="sha256"):
        cache.load(spec, cache.entry(spec), device=0)


def test_cache_for_other_sources_is_refused(built, tmp_path):
    import shutil

    copy = tmp_path / built.name
    shutil.copytree(built, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["sources_sha256"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(CacheIntegrityError, match="other sources"):
        ProgramCache(tmp_path).manifest()


def test_frozen_runtime_names_the_missing_program(tmp_path, monkeypatch):
    from csf_codec import MXFP4
    from csf_kernels import runtime

    runtime.set_cache_root(tmp_path)
    runtime.cache._caches.clear()
    runtime.freeze()
    try:
        spec = inline_class_spec(MXFP4, 96)
        with pytest.raises(UncachedProgramError) as e:
            runtime.program(spec, geometry="deepseek-v4.1-flash/tp4/mxfp4")
        msg = str(e.value)
        assert "expand.inline_tiles" in msg and "deepseek-v4.1-flash/tp4/mxfp4" in msg and "nox -s aot_build" in msg
        assert runtime.compilations() == 0
        (tmp_path / "0123456789abcdef0123").mkdir()  # a cache built for other sources
        runtime.cache._caches.clear()
        with pytest.raises(UncachedProgramError, match="other sources or toolchains: 0123456789abcdef0123"):
            runtime.program(spec)
    finally:
        runtime.unfreeze()
        runtime.set_cache_root(None)
        runtime.cache._caches.clear()


def test_frozen_runtime_imports_no_compiler(tmp_path):
    """With triton and cutlass unimportable (as in a production install), the frozen runtime still resolves."""
    code = f"""
import sys
sys.modules['triton'] = None  # what an install without them looks like: import fails, find_spec is None
sys.modules['cutlass'] = None
import os
os.environ['CSF_FROZEN'] = '1'
os.environ['CSF_AOT_CACHE'] = {str(tmp_path)!r}
import csf_kernels, csf_kernels.runtime as rt, csf_kernels.expand.launch
from csf_kernels import env
env.configure_runtime()  # the process's edge reads the switches
from csf_kernels.expand.specs import inline_class_spec
from csf_codec import MXFP4
try:
    rt.program(inline_class_spec(MXFP4, 96))
except rt.UncachedProgramError:
    pass
assert sys.modules['triton'] is None and sys.modules['cutlass'] is None
assert not [m for m in sys.modules if m.split('.')[0] in ('triton', 'cutlass') and '.' in m]
print('ok')
"""
    pp = os.pathsep.join([str(ROOT / "packages" / p / "src") for p in ("csf-codec", "csf-kernels")])
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=pp)
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("TRUE", True), ("on", True), ("0", False), ("", False)])
def test_env_flags_have_one_meaning_of_true(monkeypatch, raw, want):
    monkeypatch.setenv("CSF_TEST_FLAG", raw)
    assert env.flag("CSF_TEST_FLAG") is want


def test_env_flag_typos_are_errors(monkeypatch):
    monkeypatch.setenv("CSF_TEST_FLAG", "ture")
    with pytest.raises(ValueError, match="CSF_TEST_FLAG"):
        env.flag("CSF_TEST_FLAG")


def test_cubin_loading_and_argument_marshalling(monkeypatch):
    """The launch path without a GPU: a stand-in driver records what the runtime hands to the driver."""
    import ctypes

    import torch

    from csf_codec import MXFP4
    from csf_kernels import runtime

    class Recorder:
        def __init__(self):
            self.loaded = []

        def ensure_context(self, device):
            self.device = device

        def load_function(self, data, entry, shared):
            self.loaded.append((data, entry, shared))
            return "module", 0x1234

    rec = Recorder()
    monkeypatch.setattr(runtime.loaded, "driver", lambda: rec)
    launch = {
        "entry": "k",
        "block": [128, 1, 1],
        "shared": 0,
        "global_scratch": [0, 1],
        "profile_scratch": [0, 1],
        "params": ["*u8", "i32", "i64"],
    }
    prog = runtime.LoadedProgram.from_cubin(inline_class_spec(MXFP4, 96), b"\x7fELF", launch, device=3)
    assert (prog.function, prog.device, prog.block, rec.loaded[0][1]) == (0x1234, 3, (128, 1, 1), "k")
    t = torch.zeros(4, dtype=torch.uint8)
    bound = prog.bind((5, 2), t, -7, 1 << 40)
    assert bound.grid == (5, 2, 1)
    words = [ctypes.cast(bound.argv[i], ctypes.POINTER(ctypes.c_uint64)).contents.value for i in (0, 3, 4)]
    assert words == [t.data_ptr(), 0, 0]  # the pointer, then Triton's two scratch pointers
    assert ctypes.cast(bound.argv[1], ctypes.POINTER(ctypes.c_int32)).contents.value == -7
    assert ctypes.cast(bound.argv[2], ctypes.POINTER(ctypes.c_int64)).contents.value == 1 << 40
    with pytest.raises(TypeError, match="takes 3 arguments"):
        prog.bind((1,), t)
