"""The AOT cache: deterministic, atomic builds; manifests that refuse stale or tampered caches; a
frozen runtime that names what is missing and never imports a compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
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


def _two_of_each_family(catalog) -> dict:
    """The catalog's specs thinned to the first two (by key) of each kernel family: every family's compile, check and
    load path, in a twentieth of the tiny catalog's ~480 compilations (CI builds it three times)."""
    kept: dict = {}
    per_family: Counter[str] = Counter()
    for key, (spec, geos) in sorted(catalog_specs(catalog).items()):
        per_family[spec.kernel] += 1
        if per_family[spec.kernel] <= 2:
            kept[key] = (spec, geos)
    return kept


def _build(out: Path, catalog_path: Path, *, jobs: int) -> Path:
    """``build_cache`` over the tiny catalog's sample (above)."""
    from csf_kernels.aot import build

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "catalog_specs", _two_of_each_family)
        return build.build_cache(out, catalog_path=catalog_path, jobs=jobs, progress=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_catalog) -> Path:
    pytest.importorskip("triton")
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the AOT cache cannot be built here")
    return _build(tmp_path_factory.mktemp("aot"), tiny_catalog, jobs=2)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_build_writes_a_keyed_directory_with_checked_binaries(built, tiny_catalog):
    from csf_kernels.catalog import load_catalog
    from csf_kernels.runtime.manifest import sha256_bytes

    assert built.name == cache_key()
    m = Manifest.read(built / "manifest.json")
    assert m.cache_key == built.name and m.target["arch"] == "sm_90a"
    families = {s.kernel for s, _ in catalog_specs(load_catalog(tiny_catalog)).values()}
    assert {e.spec["kernel"] for e in m.programs.values()} == families  # every family built, checked, filed
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
            # expanders and decoders: 4 warps; the engine's GEMMs: a producer and two consumer warpgroups
            want = [384, 1, 1] if e.launch["program"] in ("engine_gemm", "w4a8_gemm") else [128, 1, 1]
            assert e.kind == "cute_so" and e.launch["launch"]["block"] == want
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
    again = _build(tmp_path, tiny_catalog, jobs=1)  # one process, where the first build had two
    assert _tree(again) == _tree(built)
    # and building over an existing cache replaces it whole
    again2 = _build(tmp_path, tiny_catalog, jobs=2)
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


# ------------------------------------------------------------------------ what an adversary with write access does
#
# Each case below tampers with a copy of the tiny cache and must end in CacheIntegrityError naming the file and the
# program before the driver or the dynamic loader sees a byte (both stubbed: the loaders record what they are given).


class Tampered:
    """A copy of the built cache to tamper with, and its tiny catalog's specs."""

    def __init__(self, built: Path, root: Path, tiny_catalog: Path):
        import shutil

        from csf_kernels.catalog import load_catalog

        self.dir = root / built.name
        shutil.copytree(built, self.dir)
        self.root = root
        self.doc = json.loads((self.dir / "manifest.json").read_text())
        self.specs = {k: s for k, (s, _) in catalog_specs(load_catalog(tiny_catalog)).items()}

    def keys(self, kernel: str | None = None, kind: str | None = None) -> list[str]:
        return sorted(
            k
            for k, e in self.doc["programs"].items()
            if (kernel is None or e["spec"]["kernel"] == kernel) and (kind is None or e["kind"] == kind)
        )

    def entry(self, key: str) -> dict:
        return self.doc["programs"][key]

    def reseal(self, key: str) -> None:
        """What a careful forger does after editing an entry: recompute its seal."""
        from csf_kernels.runtime.manifest import ProgramEntry

        e = ProgramEntry.from_json(key, self.entry(key))
        self.entry(key)["entry_sha256"] = e.seal()

    def save(self) -> None:
        (self.dir / "manifest.json").write_text(json.dumps(self.doc, indent=1, sort_keys=True))

    def load(self, key: str):
        """Resolve and load the program filed under ``key`` as ``runtime.program`` does."""
        self.save()
        cache = ProgramCache(self.root)
        spec = self.specs[key]
        return cache.load(spec, cache.entry(spec), device=0)


@pytest.fixture
def tampered(built, tiny_catalog, tmp_path) -> Tampered:
    return Tampered(built, tmp_path, tiny_catalog)


@pytest.fixture
def loaders(monkeypatch):
    """Stand-ins for the driver (cubins) and the device load of a CuTe program; records what they were handed."""
    from csf_kernels import runtime
    from csf_kernels.runtime.cute_so import CuteSharedObject

    seen: list[tuple[str, bytes]] = []

    class Driver:
        def ensure_context(self, device):
            pass

        def load_function(self, data, entry, shared):
            seen.append((entry, bytes(data)))
            return "module", 0x1234

    monkeypatch.setattr(runtime.loaded, "driver", lambda: Driver())
    monkeypatch.setattr(CuteSharedObject, "load", lambda self, device=None: seen.append((self.name, b"")))
    return seen


def _two_of_one_family(t: Tampered) -> tuple[str, str]:
    """Two specializations of one Triton kernel: the same entry symbol, other facts."""
    a, b = t.keys("expand.inline_tiles")[:2]
    assert t.entry(a)["launch"]["entry"] == t.entry(b)["launch"]["entry"]
    return a, b


def test_an_intact_cache_loads_the_bytes_it_checked(tampered, loaders):
    from csf_kernels.runtime.cute_so import CuteSharedObject

    for key in tampered.keys():
        prog = tampered.load(key)
        e = tampered.entry(key)
        if e["kind"] == "triton_cubin":
            assert loaders[-1] == (e["launch"]["entry"], (tampered.dir / e["file"]).read_bytes())
            assert prog.spec.key == key
        else:
            # loaded by the real dynamic loader from a private copy of the checked bytes: the entry points resolve
            assert isinstance(prog, CuteSharedObject) and prog.meta == e["launch"]
            assert os.readlink(f"/proc/self/fd/{prog._image_fd}").startswith("/memfd:")
    assert len(loaders) == len(tampered.keys())


def test_a_shared_object_runs_from_the_checked_bytes_not_the_file(tampered, tmp_path):
    from csf_kernels.runtime.cute_so import CuteSharedObject

    key = tampered.keys(kind="cute_so")[0]
    e = tampered.entry(key)
    data = (tampered.dir / e["file"]).read_bytes()
    gone = tmp_path / "never-written.so"  # the path only names the program
    prog = CuteSharedObject(gone, metadata=e["launch"], image=data)
    assert prog._init is not None and prog.path == gone


def _swap_binary_copy_sha(t: Tampered, a: str, b: str) -> None:
    """Binary of ``b`` copied over ``a``'s file, ``b``'s sha256 and size copied into ``a``'s entry."""
    (t.dir / t.entry(a)["file"]).write_bytes((t.dir / t.entry(b)["file"]).read_bytes())
    t.entry(a)["sha256"], t.entry(a)["bytes"] = t.entry(b)["sha256"], t.entry(b)["bytes"]


def _tamper_cases():
    """name -> (tamper(t) returning the key to load, what the refusal says)."""

    def other_specialization_binary(t):
        a, b = _two_of_one_family(t)
        _swap_binary_copy_sha(t, a, b)
        return a

    def other_specialization_file_field(t):
        a, b = _two_of_one_family(t)
        for name in ("file", "sha256", "bytes"):
            t.entry(a)[name] = t.entry(b)[name]
        t.reseal(a)
        return a

    def entry_copied_under_another_key(t):
        a, b = _two_of_one_family(t)
        t.doc["programs"][a] = dict(t.entry(b))
        return a

    def recorded_fact_edited(t):
        a, _ = _two_of_one_family(t)
        facts = t.entry(a)["spec"]["facts"]
        facts["S"] = facts["S"] + 1
        t.reseal(a)
        return a

    def recorded_fact_added(t):
        a, _ = _two_of_one_family(t)
        t.entry(a)["spec"]["facts"]["EXTRA"] = 1
        t.reseal(a)
        return a

    def version_edited(t):
        a, _ = _two_of_one_family(t)
        t.entry(a)["spec"]["version"] += 1
        t.reseal(a)
        return a

    def launch_facts_edited(t):
        a, _ = _two_of_one_family(t)
        t.entry(a)["launch"]["block"] = [1024, 1, 1]
        return a

    def other_kernel_binary_resealed(t):
        a = t.keys("expand.inline_tiles")[0]
        b = next(k for k in t.keys(kind="triton_cubin") if t.entry(k)["launch"]["entry"] != "expand_inline_tiles")
        _swap_binary_copy_sha(t, a, b)
        t.reseal(a)
        return a

    def other_cute_program_resealed(t):
        a, b = t.keys(kind="cute_so")[:2]
        _swap_binary_copy_sha(t, a, b)
        t.reseal(a)
        return a

    def other_kind_resealed(slot: str, binary: str):
        def tamper(t):
            a, b = t.keys(kind=slot)[0], t.keys(kind=binary)[0]
            _swap_binary_copy_sha(t, a, b)
            t.reseal(a)
            return a

        return tamper

    def cute_metadata_of_another_object_resealed(t):
        a = t.keys(kind="cute_so")[0]
        t.entry(a)["launch"]["sha256"]["so"] = "0" * 64
        t.reseal(a)
        return a

    def triton_version_resealed(t):
        a = t.keys(kind="triton_cubin")[0]
        t.entry(a)["launch"]["triton"] = "3.5.0"
        t.reseal(a)
        return a

    def kind_edited(t):
        a = t.keys(kind="triton_cubin")[0]
        t.entry(a)["kind"] = "ptx"
        t.reseal(a)
        return a

    def path_outside_the_cache(t):
        a = t.keys(kind="triton_cubin")[0]
        outside = t.root / "outside.cubin"
        outside.write_bytes((t.dir / t.entry(a)["file"]).read_bytes())
        t.entry(a)["file"] = "../outside.cubin"
        t.reseal(a)
        return a

    def symlink_to_identical_bytes(t):
        a = t.keys(kind="triton_cubin")[0]
        f = t.dir / t.entry(a)["file"]
        elsewhere = t.root / "elsewhere.cubin"
        elsewhere.write_bytes(f.read_bytes())
        f.unlink()
        f.symlink_to(elsewhere)
        return a

    def directory_in_the_binary_s_place(t):
        a = t.keys(kind="cute_so")[0]
        f = t.dir / t.entry(a)["file"]
        f.unlink()
        f.mkdir()
        return a

    def fifo_in_the_binary_s_place(t):
        a = t.keys(kind="triton_cubin")[0]
        f = t.dir / t.entry(a)["file"]
        f.unlink()
        os.mkfifo(f)
        return a

    def programs_folder_is_a_link(t):
        a = t.keys(kind="triton_cubin")[0]
        (t.dir / "programs").rename(t.root / "programs-elsewhere")
        (t.dir / "programs").symlink_to(t.root / "programs-elsewhere")
        return a

    def truncated(t):
        a = t.keys(kind="triton_cubin")[0]
        f = t.dir / t.entry(a)["file"]
        f.write_bytes(f.read_bytes()[:-100])
        return a

    def truncated_with_size_and_sha_recorded(t):
        from csf_kernels.runtime.manifest import sha256_bytes

        a = t.keys(kind="cute_so")[0]
        f = t.dir / t.entry(a)["file"]
        data = f.read_bytes()[:4096]
        f.write_bytes(data)
        t.entry(a)["sha256"], t.entry(a)["bytes"] = sha256_bytes(data), len(data)
        t.reseal(a)
        return a

    def missing(t):
        a = t.keys(kind="triton_cubin")[0]
        (t.dir / t.entry(a)["file"]).unlink()
        return a

    def byte_flipped(t):
        a = t.keys(kind="cute_so")[0]
        f = t.dir / t.entry(a)["file"]
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
        return a

    return {
        "other_specialization_binary": (other_specialization_binary, "altered after the build"),
        "other_specialization_file_field": (other_specialization_file_field, "names the binary"),
        "entry_copied_under_another_key": (entry_copied_under_another_key, "hashes to"),
        "recorded_fact_edited": (recorded_fact_edited, "hashes to"),
        "recorded_fact_added": (recorded_fact_added, "hashes to"),
        "version_edited": (version_edited, "hashes to"),
        "launch_facts_edited": (launch_facts_edited, "altered after the build"),
        "other_kernel_binary_resealed": (other_kernel_binary_resealed, "defines no kernel expand_inline_tiles"),
        "other_cute_program_resealed": (other_cute_program_resealed, "does not export"),
        "cute_binary_in_cubin_slot_resealed": (other_kind_resealed("triton_cubin", "cute_so"), "is not a cubin"),
        "cubin_in_cute_slot_resealed": (other_kind_resealed("cute_so", "triton_cubin"), "is not a shared object"),
        "cute_metadata_of_another_object_resealed": (cute_metadata_of_another_object_resealed, "another shared object"),
        "triton_version_resealed": (triton_version_resealed, "triton 3.5.0.*nox -s aot_build"),
        "kind_edited": (kind_edited, "unknown kind 'ptx'"),
        "path_outside_the_cache": (path_outside_the_cache, r"names the binary '\.\./outside\.cubin'"),
        "symlink_to_identical_bytes": (symlink_to_identical_bytes, "not a regular file"),
        "directory_in_the_binary_s_place": (directory_in_the_binary_s_place, "not a regular file"),
        "fifo_in_the_binary_s_place": (fifo_in_the_binary_s_place, "not a regular file"),
        "programs_folder_is_a_link": (
            programs_folder_is_a_link,
            "the programs folder, holding the binary of .* is not a directory",
        ),
        "truncated": (truncated, "truncated or replaced"),
        "truncated_with_size_and_sha_recorded": (truncated_with_size_and_sha_recorded, "does not export"),
        "missing": (missing, "is missing"),
        "byte_flipped": (byte_flipped, "sha256 of the binary"),
    }


TAMPER_CASES = _tamper_cases()


@pytest.mark.parametrize("case", sorted(TAMPER_CASES))
def test_tampering_is_refused_before_any_load(tampered, loaders, case):
    tamper, says = TAMPER_CASES[case]
    key = tamper(tampered)
    with pytest.raises(CacheIntegrityError, match=says) as err:
        tampered.load(key)
    msg = str(err.value)
    assert str(tampered.dir) in msg, msg  # names the file
    assert f"[key {key}]" in msg, msg  # and the program
    assert loaders == [], "a tampered binary reached the driver or the loader"


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d.update(toolchain={**d["toolchain"], "triton": "3.5.0"}), "built with .*nox -s aot_build"),
        (lambda d: d.update(target={"arch": "sm_100a", "compute_capability": [10, 0]}), "built for target"),
        (lambda d: d.update(csf_format=d["csf_format"] + 1), "built for CSF format"),
        (lambda d: d.update(cache_key="0" * 20), "other sources"),
        (lambda d: d.update(csf_aot_manifest=1), "manifest version 1, this runtime reads 2.*nox -s aot_build"),
        (lambda d: d.update(extra=1), r"malformed manifest \(missing \[\], unknown \['extra'\]"),
        (lambda d: d.pop("toolchain"), r"malformed manifest \(missing \['toolchain'\]"),
        (lambda d: d.update(programs=[]), r"programs is a list"),
        (lambda d: next(iter(d["programs"].values())).update(bytes="12"), "malformed entry for program .*bytes"),
        (lambda d: next(iter(d["programs"].values())).update(sha256="X" * 64), "malformed entry .*sha256"),
        (lambda d: next(iter(d["programs"].values())).pop("entry_sha256"), r"missing \['entry_sha256'\]"),
        (lambda d: next(iter(d["programs"].values())).update(note=""), r"unknown \['note'\]"),
        (lambda d: d["programs"].update(x=[]), "malformed entry for program x: the entry is a list"),
    ],
)
def test_a_manifest_built_for_something_else_or_malformed_is_refused(tampered, edit, says):
    edit(tampered.doc)
    tampered.save()
    with pytest.raises(CacheIntegrityError, match=says) as err:
        ProgramCache(tampered.root).manifest()
    assert str(tampered.dir / "manifest.json") in str(err.value)


@pytest.mark.parametrize("what", ["not json", "a list", "a link", "a directory"])
def test_an_unreadable_manifest_is_refused(tampered, what):
    path = tampered.dir / "manifest.json"
    if what == "not json":
        path.write_bytes(b"\x00not json")
    elif what == "a list":
        path.write_text("[]")
    elif what == "a link":
        path.rename(tampered.root / "manifest.json")
        path.symlink_to(tampered.root / "manifest.json")
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(CacheIntegrityError, match=str(path)):
        ProgramCache(tampered.root).manifest()


def test_every_catalog_program_has_its_own_key():
    """Distinct specializations are distinguishable: over the whole catalog, each key is the sha256-derived key of
    its spec's canonical JSON (kernel, version, every fact) and no two specs share one."""
    import hashlib

    from csf_kernels.catalog import load_catalog

    specs = catalog_specs(load_catalog())
    for key, (spec, _) in specs.items():
        doc = {"kernel": spec.kernel, "version": spec.version, "facts": dict(spec.facts)}
        assert key == spec.key == hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]
    assert len({s.canonical() for s, _ in specs.values()}) == len(specs) > 500


def test_specs_that_share_a_key_are_refused(monkeypatch):
    from csf_kernels.catalog import load_catalog
    from csf_kernels.runtime.programs import ProgramSpec

    monkeypatch.setattr(ProgramSpec, "key", property(lambda self: "0" * 24))  # every spec collides
    with pytest.raises(ValueError, match=r"share the key 0{24}"):
        catalog_specs(load_catalog())
    with pytest.raises(ValueError, match="named twice"):
        ProgramSpec(kernel="k", version=1, facts=(("a", 1), ("a", 2)))
