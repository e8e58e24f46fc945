"""The AOT runtime: load programs from ``aot_cache/`` through the CUDA driver and launch them.

Frozen (after :func:`freeze`, or with ``CSF_FROZEN=1``) the runtime never imports triton or cutlass,
never lowers or compiles, and a program missing from the cache raises :class:`UncachedProgramError`
naming the program, the geometry and the command that would build it. Unfrozen, on a machine with
triton, a missing Triton program is compiled on first use (counted by :func:`compilations`).

Launches go on torch's current stream through ``cuLaunchKernel``, so they are captured by CUDA graphs.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from . import env
from .manifest import CacheIntegrityError, Manifest, ProgramEntry, sha256_bytes
from .programs import ALIGNMENT, ProgramSpec, check_multiples
from .toolchain import TARGET, cache_key, sources_hash

__all__ = [
    "BUILD_COMMAND",
    "BindingCache",
    "BoundLaunch",
    "CacheIntegrityError",
    "Launch",
    "LoadedProgram",
    "UncachedProgramError",
    "compilations",
    "freeze",
    "is_frozen",
    "open_cache",
    "program",
    "unfreeze",
]

BUILD_COMMAND = "nox -s aot_build"
_lock = threading.RLock()
_state = {"frozen": False, "compilations": 0}


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


def freeze() -> None:
    """From now on, never lower or compile: every program must come from the AOT cache."""
    _state["frozen"] = True


def unfreeze() -> None:
    """Development and tests only: allow JIT compilation again."""
    _state["frozen"] = False


def is_frozen() -> bool:
    return _state["frozen"] or env.flag(env.FROZEN)


def compilations() -> int:
    """How many programs this process has compiled (stays 0 when serving from the cache)."""
    return _state["compilations"]


# ------------------------------------------------------------------------------------------ driver

# cuLaunchKernelEx's structs (cuda.h, CUDA 12 and 13): a programmatic dependent launch (PDL) lets a program
# start while the previous kernel on its stream finishes; it waits (griddepcontrol.wait) before it reads or
# writes anything, so only the launch latency and its setup overlap the predecessor.
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = (("pad", ctypes.c_char * 64), ("programmatic_stream_serialization_allowed", ctypes.c_int))


class LaunchAttribute(ctypes.Structure):
    _fields_ = (("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttributeValue))


class LaunchConfig(ctypes.Structure):
    _fields_ = (
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    )


def pdl_launch_config(grid: tuple[int, int, int], block: tuple[int, int, int], shared: int) -> LaunchConfig:
    """A launch config allowing programmatic dependent launch (its stream is set at each launch)."""
    attr = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value.programmatic_stream_serialization_allowed = 1
    attrs = (LaunchAttribute * 1)(attr)
    config = LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(*block), shared=shared,
                          attrs=attrs, num_attrs=1)  # fmt: skip
    config._attrs = attrs  # kept alive with the config
    return config


class _Driver:
    """The few driver calls the runtime needs: cuda-bindings for loading, ctypes for the hot launch."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.cu = driver
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernel.argtypes = (
            [ctypes.c_void_p]
            + [ctypes.c_uint] * 7
            + [
                ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_void_p),
            ]
        )
        self.lib.cuLaunchKernel.restype = ctypes.c_int
        self.lib.cuLaunchKernelEx.argtypes = [
            ctypes.POINTER(LaunchConfig),
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_void_p),
        ]
        self.lib.cuLaunchKernelEx.restype = ctypes.c_int
        self._allowed: dict[int, int] = {}  # function handle -> the dynamic shared memory it may launch with
        self._shared_per_sm: dict[int, tuple[int, int]] = {}  # device -> shared_per_sm(device), read once
        self._preferring: set[int] = set()  # functions asked for the largest shared-memory carveout

    def check(self, result, what: str):
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            _, name = self.cu.cuGetErrorName(self.cu.CUresult(int(err)))
            raise RuntimeError(f"CUDA driver: {what} failed with {name.decode() if name else int(err)}")
        return result[1] if isinstance(result, tuple) and len(result) == 2 else result

    def ensure_context(self, device: int) -> None:
        torch.cuda.init()
        ctx = self.check(self.cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(ctx) == 0:
            dev = self.check(self.cu.cuDeviceGet(device), "cuDeviceGet")
            ctx = self.check(self.cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            self.check(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load_function(self, image: bytes, entry: str, shared: int):
        module = self.check(self.cu.cuModuleLoadData(image), f"cuModuleLoadData({entry})")
        fn = self.check(self.cu.cuModuleGetFunction(module, entry.encode()), f"cuModuleGetFunction({entry})")
        self.allow_shared(int(fn), entry, shared)
        return module, fn

    def allow_shared(self, function: int, entry: str, shared: int) -> None:
        """Let the function with handle ``function`` launch with ``shared`` bytes of dynamic shared memory (past
        the default 48 KiB); the limit only rises, so launches bound before with more keep theirs."""
        with _lock:
            if shared <= max(48 * 1024, self._allowed.get(function, 0)):
                return
            attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            fn = self.cu.CUfunction(function)
            self.check(self.cu.cuFuncSetAttribute(fn, attr, shared), f"cuFuncSetAttribute({entry})")
            self._allowed[function] = shared

    def prefer_shared(self, function: int, entry: str) -> None:
        """Ask for the largest shared-memory carveout for the function with handle ``function`` (all its launches):
        left to choose, the driver may configure an SM with less shared memory than the programs its registers
        would fit need (run 272: a one-token FC1 on records, 720 programs at 7 an SM by registers, ran in two
        waves)."""
        with _lock:
            if function in self._preferring:
                return
            attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
            self.check(self.cu.cuFuncSetAttribute(self.cu.CUfunction(function), attr, 100), f"carveout({entry})")
            self._preferring.add(function)

    def shared_per_sm(self, device: int) -> tuple[int, int]:
        """(shared memory per SM, shared memory the driver reserves per program) in bytes, read once a device."""
        with _lock:
            if device not in self._shared_per_sm:
                a = self.cu.CUdevice_attribute
                dev = self.check(self.cu.cuDeviceGet(device), "cuDeviceGet")
                per_sm, reserved = (
                    self.check(self.cu.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr.name})")
                    for attr in (a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                                 a.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)
                )  # fmt: skip
                self._shared_per_sm[device] = (int(per_sm), int(reserved))
            return self._shared_per_sm[device]


def shared_for_at_most(per_sm: int, shared: int, smem_per_sm: int, reserved: int) -> int:
    """Dynamic shared memory for a program that needs ``shared`` bytes so that at most ``per_sm`` of its programs
    fit on one SM (``smem_per_sm`` bytes, ``reserved`` more per program): its own need, or just past the share of
    ``per_sm + 1``. What fits beside it is then decided by the plan, not by where the block scheduler puts it."""
    if per_sm <= 0:
        raise ValueError(f"programs per SM must be positive, got {per_sm}")
    return max(shared, smem_per_sm // (per_sm + 1) - reserved + 1)


_driver: _Driver | None = None
_DRIVER_LIB: list = []  # the ctypes libcuda handle, once loaded (the hot launch path reads it unlocked)


def _drv() -> _Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = _Driver()
            _DRIVER_LIB.append(_driver.lib)
        return _driver


_CTYPE = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u32": ctypes.c_uint32, "fp32": ctypes.c_float}


@dataclass(frozen=True, eq=False)
class LoadedProgram:
    """A Triton cubin loaded on one device, ready to launch."""

    spec: ProgramSpec
    entry: str
    function: int  # CUfunction handle
    block: tuple[int, int, int]
    shared: int
    params: tuple[str, ...]
    device: int
    _keepalive: object
    param_names: tuple[str, ...] = ()
    multiples: dict[str, int] = field(default_factory=dict)  # divisibilities compiled in (checked at bind)
    pdl: bool = False  # launched as a programmatic dependent launch (the program waits for its predecessor)

    def bind(
        self, grid: tuple[int, ...], *args, at_most_per_sm: int | None = None, prefer_shared: bool = False
    ) -> BoundLaunch:
        """Marshal the arguments once; the returned launch costs one driver call. Pointers are given as
        tensors (kept alive by the binding) or ints, scalars as Python ints. ``at_most_per_sm``: launch with
        enough shared memory that no SM holds more of these programs (``shared_for_at_most``);
        ``prefer_shared``: with the largest shared-memory carveout (``_Driver.prefer_shared``)."""
        if len(args) != len(self.params):
            raise TypeError(f"{self.spec.kernel} takes {len(self.params)} arguments, got {len(args)}")
        if self.multiples:
            check_multiples(self.spec.describe(), self.param_names, args, self.multiples)
        gx, gy, gz = (*tuple(grid), 1, 1)[:3]
        values = []
        for t, a in zip(self.params, args, strict=True):
            if t.startswith("*"):
                values.append(ctypes.c_uint64(a.data_ptr() if isinstance(a, torch.Tensor) else int(a)))
            else:
                values.append(_CTYPE[t](a))
        values += [ctypes.c_uint64(0), ctypes.c_uint64(0)]  # Triton's global and profile scratch (size 0)
        argv = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        keep = (values, [a for a in args if isinstance(a, torch.Tensor)])
        shared = self.shared
        if at_most_per_sm is not None:
            drv = _drv()
            shared = shared_for_at_most(at_most_per_sm, shared, *drv.shared_per_sm(self.device))
            drv.allow_shared(self.function, self.entry, shared)
        if prefer_shared:
            _drv().prefer_shared(self.function, self.entry)
        pdl = self.pdl and env.flag(env.PDL, default=True)
        config = pdl_launch_config((gx, gy, gz), self.block, shared) if pdl else None
        return BoundLaunch(self, (gx, gy, gz), argv, keep, config, shared)

    def launch(self, grid: tuple[int, ...], *args) -> None:
        """Bind and launch once on torch's current stream."""
        self.bind(grid, *args)()


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous at an ``ALIGNMENT``-byte address, as compiled programs assume: itself, or a copy."""
    if t.is_contiguous() and t.data_ptr() % ALIGNMENT == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def current_raw_stream(device: int) -> int:
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher uses: ~10x cheaper
    return get(device) if get is not None else torch.cuda.current_stream(device).cuda_stream


@dataclass(frozen=True, eq=False)
class BoundLaunch:
    """A program with its grid and marshalled arguments; calling it launches on the current stream. One
    binding is one launch at a time (its argument and config buffers are reused): bind per thread."""

    program: LoadedProgram
    grid: tuple[int, int, int]
    argv: object
    _keepalive: object
    config: LaunchConfig | None = None  # programs launched as programmatic dependent launches
    shared: int = 0  # dynamic shared memory of a plain launch

    def __call__(self) -> None:
        gx, gy, gz = self.grid
        if min(gx, gy, gz) <= 0:
            return
        p = self.program
        stream = current_raw_stream(p.device)
        if self.config is not None:
            self.config.stream = stream
            call = "cuLaunchKernelEx"
            err = _DRIVER_LIB[0].cuLaunchKernelEx(ctypes.byref(self.config), p.function, self.argv, None)
        else:
            call = "cuLaunchKernel"
            err = _DRIVER_LIB[0].cuLaunchKernel(p.function, gx, gy, gz, *p.block, self.shared, stream, self.argv, None)
        if err != 0:
            _drv().check(err, f"{call}({p.entry}, grid={self.grid})")

    def programs_per_sm(self) -> int:
        """How many of these programs the driver fits on one SM (their block, registers and this launch's dynamic
        shared memory): diagnostics and tests, not the launch path."""
        p, drv = self.program, _drv()
        threads = p.block[0] * p.block[1] * p.block[2]
        fn = drv.cu.CUfunction(p.function)
        return drv.check(drv.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, self.shared), p.entry)


class BindingCache:
    """Bound launch sets of a caller, the least recently used dropped beyond ``capacity``: binding resolves
    programs and marshals arguments (~100 us of host time), so a call whose key (shapes, pointers, options)
    was seen before replays the same bound launches."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._bound: OrderedDict[Hashable, tuple[BoundLaunch, ...]] = OrderedDict()

    def get(self, key: Hashable, bind: Callable[[], tuple[BoundLaunch, ...]]) -> tuple[BoundLaunch, ...]:
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = bind()
            if len(self._bound) > self.capacity:
                self._bound.popitem(last=False)
        else:
            self._bound.move_to_end(key)
        return bound


@dataclass(frozen=True, eq=False)
class Launch:
    """A program to run: its spec, grid and arguments in signature order (tensors or ints for pointers).

    :meth:`bind` resolves it through the cache; tests may also run it in Triton's interpreter."""

    spec: ProgramSpec
    grid: tuple[int, ...]
    args: tuple
    at_most_per_sm: int | None = None  # Triton programs: how many may share an SM (LoadedProgram.bind)
    prefer_shared: bool = False  # Triton programs: the largest shared-memory carveout (LoadedProgram.bind)

    def bind(self, geometry: str | None = None) -> BoundLaunch:
        prog = program(self.spec, geometry=geometry)
        if self.at_most_per_sm is None and not self.prefer_shared:
            return prog.bind(self.grid, *self.args)
        if not isinstance(prog, LoadedProgram):
            raise NotImplementedError(f"{self.spec.describe()}: shared-memory launch settings need a Triton program")
        return prog.bind(self.grid, *self.args, at_most_per_sm=self.at_most_per_sm, prefer_shared=self.prefer_shared)

    def with_pointers(self, tensors: tuple[torch.Tensor, ...]) -> Launch:
        """The same launch with ``tensors`` passed as raw addresses (Triton programs) or address-and-shape
        snapshots (CuTe programs, which check shapes), so a binding does not keep them alive."""
        from .families import FAMILIES

        ids = {id(t) for t in tensors}
        if self.spec.kernel in FAMILIES:
            args = tuple(a.data_ptr() if id(a) in ids else a for a in self.args)
        else:
            from .cute_so import TensorRef

            # CuTe launches take views (flattened, retyped) of the caller's buffers: match by storage
            storages = {t.untyped_storage().data_ptr() for t in tensors}
            args = tuple(
                TensorRef.of(a) if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in storages else a
                for a in self.args
            )
        return replace(self, args=args)


# ------------------------------------------------------------------------------------------ cache


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
            from .cute_so import CuteSharedObject

            prog = CuteSharedObject(path, metadata=entry.launch)
            prog.load(device)
            return prog
        return _load_cubin(spec, data, entry.launch, device)


def _load_cubin(spec: ProgramSpec, data: bytes, launch: dict, device: int) -> LoadedProgram:
    if launch["global_scratch"][0] or launch["profile_scratch"][0]:
        raise NotImplementedError(f"{spec.describe()}: programs that need Triton scratch memory are not supported")
    drv = _drv()
    drv.ensure_context(device)
    module, fn = drv.load_function(data, launch["entry"], launch["shared"])
    return LoadedProgram(
        spec=spec,
        entry=launch["entry"],
        function=int(fn),
        block=tuple(launch["block"]),
        shared=launch["shared"],
        params=tuple(launch["params"]),
        device=device,
        _keepalive=(module, fn),
        param_names=tuple(launch.get("param_names", ())),
        multiples=dict(launch.get("multiples", {})),
        pdl=bool(launch.get("pdl", False)),
    )


_caches: dict[Path, ProgramCache] = {}


def open_cache(root: Path | None = None) -> ProgramCache:
    root = Path(root) if root is not None else env.aot_cache_root()
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
        if entry is None and is_frozen():
            raise UncachedProgramError(spec, geometry, cache.dir, cache.other_keys())
        device = torch.cuda.current_device() if device is None else device
        key = (device, spec.key)
        hit = cache._loaded.get(key)
        if hit is not None:
            return hit
        loaded = cache.load(spec, entry, device) if entry is not None else _jit(spec, device)
        cache._loaded[key] = loaded
        return loaded


def _jit(spec: ProgramSpec, device: int):
    """Development only (unfrozen): compile a program the cache lacks (imports triton or cutlass)."""
    from .families import FAMILIES

    _state["compilations"] += 1
    if spec.kernel in FAMILIES:
        from .aot.compile_triton import compile_triton

        art = compile_triton(spec)
        return _load_cubin(spec, art.data, art.launch, device)
    import tempfile

    from .aot.compile_cute import compile_cute
    from .cute_so import CuteSharedObject

    art = compile_cute(spec)
    path = Path(tempfile.mkdtemp(prefix="csf-jit-")) / f"{spec.key}.so"
    path.write_bytes(art.data)
    prog = CuteSharedObject(path, metadata=art.launch)
    prog.load(device)
    return prog
