"""The AOT cache: ``aot_cache/<key>/`` opened and checked, programs resolved by spec and loaded on a device.

Frozen (:func:`csf_kernels.runtime.freeze`) the runtime never lowers or compiles: a program missing from the cache
raises :class:`UncachedProgramError` naming the program, the geometry and the command that would build it.
Unfrozen, a missing program goes to the development compiler set with :func:`set_compiler` (``csf_kernels``
sets the AOT build's compilers; counted by :func:`compilations`). Nothing here imports triton or cutlass.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from csf_kernels.runtime import config
from csf_kernels.runtime.cute_so import CuteSharedObject
from csf_kernels.runtime.integrity import check_built_for, check_entry, read_binary
from csf_kernels.runtime.loaded import LoadedProgram
from csf_kernels.runtime.manifest import BUILD_COMMAND, Artifact, Manifest, ProgramEntry
from csf_kernels.runtime.programs import ProgramSpec
from csf_kernels.runtime.toolchain import cache_key

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
    """One ``aot_cache/<key>/`` directory: manifest checked on open, each entry on first use, each binary on load
    (``runtime.integrity``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.key = cache_key()
        self.dir = self.root / self.key
        self._manifest: Manifest | None = None
        self._checked: set[str] = set()  # keys of entries that passed check_entry
        self._loaded: dict[tuple[int, str], LoadedProgram] = {}

    def manifest(self) -> Manifest | None:
        if self._manifest is None:
            path = self.dir / "manifest.json"
            if not os.path.lexists(path):
                return None
            m = Manifest.read(path)
            check_built_for(m, self.dir, self.key)
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
        if e is not None and spec.key not in self._checked:
            check_entry(self.dir, e, spec)
            self._checked.add(spec.key)
        return e

    def load(self, spec: ProgramSpec, entry: ProgramEntry, device: int):
        """Load an entry's binary, entry checked again: the bytes checked are the bytes handed to the driver or the
        dynamic loader."""
        check_entry(self.dir, entry, spec)
        data = read_binary(self.dir, entry, spec)
        if entry.kind == "cute_so":
            prog = CuteSharedObject(self.dir / entry.file, metadata=entry.launch, image=data)
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
    prog = CuteSharedObject(Path(f"<compiled {spec.key}.so>"), metadata=art.launch, image=art.data)
    prog.load(device)
    return prog
