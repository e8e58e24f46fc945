"""Run-time loader of CuTe DSL programs exported ahead of time to a shared object (ctypes + torch only).

The GPU machines have no cutlass: a program is compiled and linked on the build machine by
:func:`csf_kernels.aot.cute_export.build_stage_decoder` into ``lib<name>.so`` (needs only libc and the CUDA driver)
plus ``<name>.json`` (launch metadata read from the generated C header). This module never imports cutlass or
triton.

What the generated header declares, and how it is called here:

* each tensor argument is a struct ``{void *data; int32_t dynamic_shapes[n]; int64_t dynamic_strides[m];}``
  (C-padded; a member is absent when there is nothing dynamic), holding the extents and strides (in elements)
  of the dims the metadata lists as dynamic;
* the entry point is ``void _mlir_<prefix>__mlir_ciface_<fn>(void **args, int32_t num_args)`` with
  ``args = {&tensor_struct_0, ..., &int32_scalar_0, ..., &stream, &ret}`` (``stream`` a ``cudaStream_t``,
  ``ret`` an ``int32_t`` the call sets to a non-zero CUDA error code on failure);
* before the first launch the embedded cubin is loaded once: ``_mlir_<prefix>_cuda_init(void **)`` with
  ``{&(cudaLibrary_t *) lib, &ret}``, then ``_mlir_<prefix>_cuda_load_to_device(void **)`` with
  ``{&(cudaLibrary_t *) lib, &(int32_t) device, &ret}`` for each device used.

Launches go on torch's current stream of the tensors' device (``torch.cuda.current_stream().cuda_stream``), so
they order with torch work and are captured by CUDA graphs like any other kernel.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from csf_kernels.runtime.driver import current_raw_stream

__all__ = ["BoundCuteLaunch", "CuteSOError", "CuteSharedObject", "TensorRef", "load_cute_so"]

_DTYPES = {
    "uint8": torch.uint8,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "int32": torch.int32,
    "uint64": torch.uint64,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
_CTYPES = {"void *": ctypes.c_void_p, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64}


class CuteSOError(RuntimeError):
    """A CuTe shared object, its metadata or one of its symbols is missing or unusable, or a launch failed."""


def _metadata_path(so_path: Path) -> Path:
    stem = so_path.name.removesuffix(".so")
    for cand in (so_path.with_name(stem.removeprefix("lib") + ".json"), so_path.with_name(so_path.name + ".json")):
        if cand.is_file():
            return cand
    raise CuteSOError(f"no launch metadata next to {so_path}: expected {stem.removeprefix('lib')}.json")


_MFD_EXEC = getattr(os, "MFD_EXEC", 0x10)  # executable memfd (Linux >= 6.3 may make them noexec by default)


def _private_copy(image: bytes, name: str) -> int:
    """A memfd holding ``image``, for ``dlopen("/proc/self/fd/N")``. It stays open for the process's life: the
    loader matches later loads by path and by inode, so neither may ever be reused for another library."""
    try:
        fd = os.memfd_create(f"csf:{name}", os.MFD_CLOEXEC | _MFD_EXEC)
    except OSError:  # kernels before 6.3 know no MFD_EXEC (and their memfds are executable)
        fd = os.memfd_create(f"csf:{name}", os.MFD_CLOEXEC)
    view = memoryview(image)
    while view:
        view = view[os.write(fd, view) :]
    return fd


def _struct_type(arg: dict) -> type[ctypes.Structure]:
    fields = []
    for name, ctype, count in arg["c_fields"]:
        base = _CTYPES.get(ctype)
        if base is None:
            raise CuteSOError(f"argument {arg['name']}: unsupported C field type {ctype!r} in {arg['c_struct']}")
        fields.append((name, base if name == "data" else base * int(count)))
    return type(arg["c_struct"], (ctypes.Structure,), {"_fields_": fields})


class CuteSharedObject:
    """One exported CuTe DSL program: ``prog(*tensors)`` launches it on torch's current stream."""

    def __init__(self, so_path: str | Path, metadata: dict | None = None, *, image: bytes | None = None):
        """``image``: the shared object's bytes, already checked; they are loaded from a private in-memory copy
        (``so_path`` only names them), so what runs is what was checked whatever happens to the file."""
        self.path = Path(so_path)
        if image is None and not self.path.is_file():
            raise CuteSOError(f"CuTe shared object {self.path} does not exist")
        if metadata is None:
            meta_path = _metadata_path(self.path)
            try:
                metadata = json.loads(meta_path.read_text())
            except (OSError, ValueError) as e:
                raise CuteSOError(f"cannot read the launch metadata {meta_path} of {self.path}: {e}") from e
        self.meta = metadata
        try:
            self._image_fd = None if image is None else _private_copy(image, self.path.name)
        except OSError as e:
            raise CuteSOError(f"cannot copy CuTe shared object {self.path} to memory: {e}") from e
        where = str(self.path.resolve()) if image is None else f"/proc/self/fd/{self._image_fd}"
        try:
            self._lib = ctypes.CDLL(where)
        except OSError as e:
            raise CuteSOError(f"cannot load CuTe shared object {self.path}: {e}") from e
        syms = metadata.get("symbols", {})
        self._entry = self._symbol(syms.get("entry"), "entry point")
        self._init = self._symbol(syms.get("init"), "module init")
        self._load = self._symbol(syms.get("load_to_device"), "module load_to_device")
        self._entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]
        self._entry.restype = None
        for f in (self._init, self._load):
            f.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            f.restype = None
        self.tensor_args = [a for a in metadata["args"] if a["kind"] == "tensor"]
        self.scalar_args = [a for a in metadata["args"] if a["kind"] == "int32"]
        kinds = [a["kind"] for a in metadata["args"]]
        if kinds != ["tensor"] * len(self.tensor_args) + ["int32"] * len(self.scalar_args) + ["stream"]:
            raise CuteSOError(f"{self.path}: only (tensors..., int32 scalars..., stream) programs are supported")
        self._structs = [_struct_type(a) for a in self.tensor_args]
        self.num_args = int(metadata["num_args"])
        if self.num_args != len(self.tensor_args) + len(self.scalar_args) + 2:
            raise CuteSOError(
                f"{self.path}: {self.num_args} packed arguments for {len(self.tensor_args)} tensors and "
                f"{len(self.scalar_args)} scalars"
            )
        self._library = ctypes.c_void_p(0)  # cudaLibrary_t, filled by init
        self._devices: set[int] = set()
        self._lock = threading.Lock()

    def _symbol(self, name: str | None, what: str):
        if not name:
            raise CuteSOError(f"the metadata of {self.path} names no {what} symbol")
        try:
            return getattr(self._lib, name)
        except AttributeError:
            raise CuteSOError(f"{self.path} does not export the {what} symbol {name}") from None

    @property
    def name(self) -> str:
        return self.meta.get("name", self.path.stem)

    def load(self, device: torch.device | int | None = None) -> None:
        """Load the embedded cubin for a device now (the first launch does it otherwise; do it before capturing
        a CUDA graph, since loading a module is not a stream operation)."""
        index = device.index if isinstance(device, torch.device) else device
        index = torch.cuda.current_device() if index is None else int(index)
        with torch.cuda.device(index):
            self._ensure_loaded(index)

    def _ensure_loaded(self, device: int) -> None:
        with self._lock:
            if device in self._devices:
                return
            ret = ctypes.c_int32(0)
            lib_ptr = ctypes.c_void_p(ctypes.addressof(self._library))  # cudaLibrary_t *
            if not self._library.value:
                args = (ctypes.c_void_p * 2)(ctypes.addressof(lib_ptr), ctypes.addressof(ret))
                self._init(args)
                if ret.value or not self._library.value:
                    raise CuteSOError(f"{self.path}: {self.meta['symbols']['init']} failed with CUDA error {ret.value}")
            dev = ctypes.c_int32(device)
            args = (ctypes.c_void_p * 3)(ctypes.addressof(lib_ptr), ctypes.addressof(dev), ctypes.addressof(ret))
            self._load(args)
            if ret.value:
                raise CuteSOError(
                    f"{self.path}: {self.meta['symbols']['load_to_device']} on device {device} failed with CUDA "
                    f"error {ret.value}"
                )
            self._devices.add(device)

    def _pack(self, tensors: tuple[torch.Tensor, ...]) -> tuple[list[ctypes.Structure], dict[str, int]]:
        if len(tensors) != len(self.tensor_args):
            raise TypeError(f"{self.name} takes {len(self.tensor_args)} tensors, got {len(tensors)}")
        sizes: dict[str, int] = {}
        structs = []
        device = tensors[0].device
        for t, arg, st in zip(tensors, self.tensor_args, self._structs, strict=True):
            label = f"{self.name} argument {arg['name']}"
            if t.device != device or t.device.type != "cuda":
                raise ValueError(f"{label} is on {t.device}; every tensor must be on one CUDA device")
            if t.dtype != _DTYPES[arg["dtype"]]:
                raise TypeError(f"{label} must be {arg['dtype']}, got {t.dtype}")
            if t.dim() != len(arg["shape"]):
                raise ValueError(f"{label} must have shape {arg['shape']}, got {tuple(t.shape)}")
            for d, want in enumerate(arg["shape"]):
                got = int(t.shape[d])
                if isinstance(want, str):
                    if sizes.setdefault(want, got) != got:
                        raise ValueError(f"{label} dim {d} ({want}) is {got}, elsewhere {want} = {sizes[want]}")
                    multiple = int(arg.get("divisible", {}).get(want, 1))
                    if got % multiple:
                        raise ValueError(f"{label} dim {d} ({want}) is {got}, not a multiple of {multiple}")
                elif got != want:
                    raise ValueError(f"{label} must have shape {arg['shape']}, got {tuple(t.shape)}")
            if arg.get("contiguous") and not t.is_contiguous():
                raise ValueError(f"{label} must be contiguous")
            if t.data_ptr() % int(arg.get("align", 1)):
                raise ValueError(f"{label} must be {arg['align']}-byte aligned (data_ptr {t.data_ptr():#x})")
            s = st()
            s.data = t.data_ptr()
            for i, d in enumerate(arg["dynamic_shape_dims"]):
                if not 0 <= t.shape[d] < 2**31:
                    raise ValueError(f"{label} dim {d} = {t.shape[d]} does not fit the int32 the program takes")
                s.dynamic_shapes[i] = int(t.shape[d])
            for i, d in enumerate(arg["dynamic_stride_dims"]):
                s.dynamic_strides[i] = int(t.stride(d))
            structs.append(s)
        return structs, sizes

    def _scalars(self, values: tuple) -> dict[str, int]:
        """The int32 scalars by name, checked."""
        names = [a["name"] for a in self.scalar_args]
        if len(values) != len(names):
            raise TypeError(
                f"{self.name} takes {len(names)} int32 scalars {names} after its tensors, got {len(values)}"
            )
        for v, name in zip(values, names, strict=True):
            if isinstance(v, bool) or not isinstance(v, int) or not -(2**31) <= v < 2**31:
                raise ValueError(f"{self.name} scalar {name} must be an int32, got {v!r}")
        return dict(zip(names, values, strict=True))

    def grid(self, sizes: dict[str, int], scalars: dict[str, int]) -> list[int]:
        """The launch grid the metadata describes: ints, or names of extents or scalars."""
        known = {**sizes, **scalars}
        return [known[g] if isinstance(g, str) else int(g) for g in self.meta["launch"]["grid"]]

    def bind(self, grid: tuple[int, ...] | None, *args) -> BoundCuteLaunch:
        """Check and marshal the tensors (or :class:`TensorRef` snapshots), then the int32 scalars, once;
        the returned launch costs one call. ``grid``: what the caller expects the program's grid to be
        (checked against the metadata's formula; None skips the check)."""
        n = len(self.tensor_args)
        tensors, values = tuple(args[:n]), tuple(args[n:])
        if len(tensors) < n or not all(isinstance(t, torch.Tensor | TensorRef) for t in tensors):
            raise TypeError(f"{self.name} takes {n} tensors first, got {[type(a).__name__ for a in args]}")
        structs, sizes = self._pack(tensors)
        named = self._scalars(values)
        scalars = [ctypes.c_int32(v) for v in named.values()]
        real = self.grid(sizes, named)
        if grid is not None and list((*tuple(grid), 1, 1)[:3]) != real:
            raise ValueError(f"{self.name}: the caller expects grid {tuple(grid)}, the program launches {real}")
        device = tensors[0].device
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.load(index)  # at bind time, not per launch (loading a module is not a stream operation)
        stream = ctypes.c_void_p(0)
        ret = ctypes.c_int32(0)
        ptrs = [ctypes.addressof(s) for s in (*structs, *scalars, stream, ret)]
        argv = (ctypes.c_void_p * self.num_args)(*ptrs)
        keep = (structs, scalars, [t for t in tensors if isinstance(t, torch.Tensor)])
        return BoundCuteLaunch(self, index, 0 in real, argv, stream, ret, keep)

    def __call__(self, *args) -> None:
        """Launch with the tensors, then the int32 scalars, in the metadata's order."""
        self.bind(None, *args)()


@dataclass(frozen=True, eq=False)
class TensorRef:
    """What a launch needs of a tensor (address, shape, strides, dtype, device) without keeping it alive: for
    bindings replayed on caller-owned buffers (the caller keeps them alive)."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorRef:
        return cls(t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    def data_ptr(self) -> int:
        return self.ptr

    def dim(self) -> int:
        return len(self.shape)

    def stride(self, d: int) -> int:
        return self.strides[d]

    def is_contiguous(self) -> bool:
        expect = 1
        for size, stride in reversed(tuple(zip(self.shape, self.strides, strict=True))):
            if size != 1 and stride != expect:
                return False
            expect *= size
        return True


@dataclass(frozen=True, eq=False)
class BoundCuteLaunch:
    """A CuTe program with its arguments marshalled; calling it launches on torch's current stream."""

    program: CuteSharedObject
    device: int
    empty: bool  # a zero-sized grid: nothing to do (launching it would be an error)
    argv: object
    stream: ctypes.c_void_p
    ret: ctypes.c_int32
    _keepalive: object

    def __call__(self) -> None:
        if self.empty:
            return
        prog = self.program
        with torch.cuda.device(self.device):  # torch's primary context is current for the static CUDA runtime
            self.stream.value = current_raw_stream(self.device)
            self.ret.value = 0
            prog._entry(self.argv, prog.num_args)
        if self.ret.value:
            raise CuteSOError(f"{prog.name} ({prog.path}) launch failed with CUDA error {self.ret.value}")


_cache: dict[Path, CuteSharedObject] = {}
_cache_lock = threading.Lock()


def load_cute_so(so_path: str | Path) -> CuteSharedObject:
    """Load (once per path) an exported CuTe program and its ``<name>.json`` launch metadata."""
    key = Path(so_path).resolve()
    with _cache_lock:
        prog = _cache.get(key)
        if prog is None:
            prog = _cache[key] = CuteSharedObject(key)
        return prog
