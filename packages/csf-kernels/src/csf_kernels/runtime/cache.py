"""The AOT cache: ``aot_cache/<key>/`` opened and checked, programs resolved by spec and loaded on a device.

Frozen (:func:`csf_kernels.runtime.freeze`) the runtime never lowers or compiles: a program missing from the cache
raises :class:`UncachedProgramError` naming the program, the geometry and the command that would build it.
Unfrozen, a missing program goes to the development compiler set with :func:`set_compiler` (``csf_kernels``
sets the AOT build's compilers; counted by :func:`compilations`). Nothing here imports triton or cutlass.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from csf_kernels.runtime import config
from csf_kernels.runtime.cute_so import CuteSharedObject
from csf_kernels.runtime.loaded import LoadedProgram
from csf_kernels.runtime.manifest import Artifact, CacheIntegrityError, Manifest, ProgramEntry, sha256_bytes
from csf_kernels.runtime.programs import ProgramSpec
from csf_kernels.runtime.toolchain import TARGET, cache_key, sources_hash

__all__ = [
    "BUILD_COMMAND",
    "ProgramCache",
    "UncachedProgramError",
    "compilations",
    "is_cached",
    "open_cache",
    "program",
    "set_compiler",
]

BUILD_COMMAND = "nox -s aot_build"
_lock = threading.RLock()
_state = {"compilations": 0}


class UncachedProgramError(LookupError):
    """A frozen runtime was asked for a program the AOT cache does not hold."""

    def __init__(self, spec: ProgramSpec, geometry: str | None, cache_dir: Path, other_keys: list[str] = ()):
        self.spec = spec
        self.geometry = geometry
        where = f" for geometry {geometry}" if geometry else ""
        stale = (
            f" ({cache_dir.parent} holds caches built for other sources or toolchains: {', '.join(other_keys)})"
            if other_keys and not cache_dir.exists()
            else ""
        )
        super().__init__(
            f"program {spec.describe()} [key {spec.key}]{where} is not in the AOT cache {cache_dir}{stale}; "
            f"add its geometry to csf_kernels/catalog.yaml and run `{BUILD_COMMAND}` (the runtime is frozen: "
            f"it never compiles)"
        )


def compilations() -> int:
    """How many programs this process has compiled (stays 0 when serving from the cache)."""
    return _state["compilations"]


class ProgramCache:
    """One ``aot_cache/<key>/`` directory: manifest checked on open, each binary checked on load."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.key = cache_key()
        self.dir = self.root / self.key
        self._manifest: Manifest | None = None
        self._loaded: dict[tuple[int, str], LoadedProgram] = {}

    def manifest(self) -> Manifest | None:
        if self._manifest is None:
            path = self.dir / "manifest.json"
            if not path.exists():
                return None
            m = Manifest.read(path)
            if m.cache_key != self.key or m.sources_sha256 != sources_hash():
                raise CacheIntegrityError(
                    f"{self.dir}: the cache was built for other sources (manifest key {m.cache_key}, expected "
                    f"{self.key}); rebuild it with `{BUILD_COMMAND}`"
                )
            if m.target != TARGET:
                raise CacheIntegrityError(f"{self.dir}: built for target {m.target}, this runtime needs {TARGET}")
            self._manifest = m
        return self._manifest

    def other_keys(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def entry(self, spec: ProgramSpec) -> ProgramEntry | None:
        m = self.manifest()
        if m is None:
            return None
        e = m.programs.get(spec.key)
        if e is not None and (e.spec.get("kernel"), e.spec.get("version")) != (spec.kernel, spec.version):
            raise CacheIntegrityError(f"{self.dir}: manifest entry {spec.key} does not describe {spec.describe()}")
        return e

    def load(self, spec: ProgramSpec, entry: ProgramEntry, device: int):
        path = self.dir / entry.file
        data = path.read_bytes() if path.exists() else None
        if data is None:
            raise CacheIntegrityError(f"{self.dir}: {entry.file} listed in the manifest is missing")
        if sha256_bytes(data) != entry.sha256:
            raise CacheIntegrityError(f"{path}: sha256 does not match the manifest (tampered?)")
        if entry.kind == "cute_so":
            prog = CuteSharedObject(path, metadata=entry.launch)
            prog.load(device)
            return prog
        return LoadedProgram.from_cubin(spec, data, entry.launch, device)


_caches: dict[Path, ProgramCache] = {}


def open_cache(root: Path | None = None) -> ProgramCache:
    root = Path(root) if root is not None else config.cache_root()
    with _lock:
        if root not in _caches:
            _caches[root] = ProgramCache(root)
        return _caches[root]


def is_cached(spec: ProgramSpec) -> bool:
    """Whether the AOT cache holds ``spec`` (so choosing it never compiles, frozen or not)."""
    cache = open_cache()
    with _lock:
        return cache.entry(spec) is not None


def program(spec: ProgramSpec, *, geometry: str | None = None, device: int | None = None) -> LoadedProgram:
    """The loaded program for ``spec`` on ``device`` (default: torch's current device)."""
    cache = open_cache()
    with _lock:
        entry = cache.entry(spec)
        if entry is None and config.is_frozen():
            raise UncachedProgramError(spec, geometry, cache.dir, cache.other_keys())
        device = torch.cuda.current_device() if device is None else device
        key = (device, spec.key)
        hit = cache._loaded.get(key)
        if hit is not None:
            return hit
        loaded = cache.load(spec, entry, device) if entry is not None else _compile(spec, cache, geometry, device)
        cache._loaded[key] = loaded
        return loaded


_compiler: list[Callable[[ProgramSpec], Artifact]] = []


def set_compiler(compile_program: Callable[[ProgramSpec], Artifact] | None) -> None:
    """The development compiler an unfrozen runtime calls for a program the cache lacks (None: none, so a miss
    raises :class:`UncachedProgramError` frozen or not)."""
    _compiler[:] = [compile_program] if compile_program is not None else []


def _compile(spec: ProgramSpec, cache: ProgramCache, geometry: str | None, device: int):
    if not _compiler:
        raise UncachedProgramError(spec, geometry, cache.dir, cache.other_keys())
    _state["compilations"] += 1
    art = _compiler[0](spec)
    if art.kind == "triton_cubin":
        return LoadedProgram.from_cubin(spec, art.data, art.launch, device)
    path = Path(tempfile.mkdtemp(prefix="csf-jit-")) / f"{spec.key}.so"
    path.write_bytes(art.data)
    prog = CuteSharedObject(path, metadata=art.launch)
    prog.load(device)
    return prog
