"""The AOT runtime: programs loaded from ``aot_cache/`` through the CUDA driver and launched on torch's current
stream (so CUDA graphs capture them), frozen while serving. Nothing here imports triton or cutlass.

| module | job |
|---|---|
| ``config`` | the settings: frozen, dependent launches, the cache directory (set once by the process's edge) |
| ``programs`` | program specs (the compile key), Triton families, the alignment contract |
| ``toolchain``, ``manifest`` | what a cache is built for; its manifest (strictly parsed, entries sealed) |
| ``integrity`` | what the runtime checks before it trusts a cache, an entry, a binary |
| ``cache`` | the cache opened and checked; programs resolved by spec and loaded |
| ``driver``, ``loaded``, ``cute_so`` | driver calls; a loaded Triton cubin or CuTe shared object and its bound launch |
| ``launch`` | :class:`Launch` (what callers hold), :class:`BindingCache`, ``placeholder`` |
| ``l2_residency`` | access-policy windows that keep chosen buffers in L2 |
| ``pdl`` | device-side helpers of programmatic dependent launch (Triton, Gluon) |
"""

from csf_kernels.runtime.cache import (
    BUILD_COMMAND,
    ProgramCache,
    UncachedProgramError,
    compilations,
    is_cached,
    open_cache,
    program,
    set_compiler,
)
from csf_kernels.runtime.config import freeze, is_frozen, set_cache_root, set_pdl, unfreeze
from csf_kernels.runtime.launch import BindingCache, Launch, placeholder
from csf_kernels.runtime.loaded import BoundLaunch, LoadedProgram, aligned
from csf_kernels.runtime.manifest import CacheIntegrityError

__all__ = [
    "BUILD_COMMAND",
    "BindingCache",
    "BoundLaunch",
    "CacheIntegrityError",
    "Launch",
    "LoadedProgram",
    "ProgramCache",
    "UncachedProgramError",
    "aligned",
    "compilations",
    "freeze",
    "is_cached",
    "is_frozen",
    "open_cache",
    "placeholder",
    "program",
    "set_cache_root",
    "set_compiler",
    "set_pdl",
    "unfreeze",
]
