"""The few CUDA driver calls the runtime needs: cuda-bindings for loading, ctypes for the hot launch."""

from __future__ import annotations

import ctypes
import threading

import torch

__all__ = [
    "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION",
    "LaunchAttribute",
    "LaunchConfig",
    "current_raw_stream",
    "driver",
    "launch_library",
    "pdl_launch_config",
    "shared_for_at_most",
]

_lock = threading.RLock()


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


class Driver:
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
        would fit need, and a grid sized to fill the SMs once then runs in two waves."""
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


_driver: Driver | None = None
_DRIVER_LIB: list = []  # the ctypes libcuda handle, once loaded (the hot launch path reads it unlocked)


def driver() -> Driver:
    global _driver
    with _lock:
        if _driver is None:
            _driver = Driver()
            _DRIVER_LIB.append(_driver.lib)
        return _driver


def launch_library() -> ctypes.CDLL:
    """libcuda through ctypes, once the driver is up (the hot launch path calls it unlocked)."""
    return _DRIVER_LIB[0] if _DRIVER_LIB else driver().lib


def current_raw_stream(device: int) -> int:
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher uses: ~10x cheaper
    return get(device) if get is not None else torch.cuda.current_stream(device).cuda_stream
