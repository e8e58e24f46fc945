"""Programs loaded on a device and their bound launches: arguments marshalled once, one driver call a launch."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from csf_kernels.runtime import config as runtime_config
from csf_kernels.runtime.driver import (
    LaunchConfig,
    current_raw_stream,
    driver,
    launch_library,
    pdl_launch_config,
    shared_for_at_most,
)
from csf_kernels.runtime.programs import ALIGNMENT, ProgramSpec, check_multiples

__all__ = ["BoundLaunch", "LoadedProgram", "aligned"]

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
        ``prefer_shared``: with the largest shared-memory carveout (``Driver.prefer_shared``)."""
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
            drv = driver()
            shared = shared_for_at_most(at_most_per_sm, shared, *drv.shared_per_sm(self.device))
            drv.allow_shared(self.function, self.entry, shared)
        if prefer_shared:
            driver().prefer_shared(self.function, self.entry)
        pdl = self.pdl and runtime_config.pdl_enabled()
        config = pdl_launch_config((gx, gy, gz), self.block, shared) if pdl else None
        return BoundLaunch(self, (gx, gy, gz), argv, keep, config, shared)

    @classmethod
    def from_cubin(cls, spec: ProgramSpec, data: bytes, launch: dict, device: int) -> LoadedProgram:
        """Load a Triton cubin with the launch facts its build recorded."""
        if launch["global_scratch"][0] or launch["profile_scratch"][0]:
            raise NotImplementedError(f"{spec.describe()}: programs that need Triton scratch memory are not supported")
        drv = driver()
        drv.ensure_context(device)
        module, fn = drv.load_function(data, launch["entry"], launch["shared"])
        return cls(
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

    def launch(self, grid: tuple[int, ...], *args) -> None:
        """Bind and launch once on torch's current stream."""
        self.bind(grid, *args)()


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous at an ``ALIGNMENT``-byte address, as compiled programs assume: itself, or a copy."""
    if t.is_contiguous() and t.data_ptr() % ALIGNMENT == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


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
            err = launch_library().cuLaunchKernelEx(ctypes.byref(self.config), p.function, self.argv, None)
        else:
            call = "cuLaunchKernel"
            err = launch_library().cuLaunchKernel(
                p.function, gx, gy, gz, *p.block, self.shared, stream, self.argv, None
            )
        if err != 0:
            driver().check(err, f"{call}({p.entry}, grid={self.grid})")

    def programs_per_sm(self) -> int:
        """How many of these programs the driver fits on one SM (their block, registers and this launch's dynamic
        shared memory): diagnostics and tests, not the launch path."""
        p, drv = self.program, driver()
        threads = p.block[0] * p.block[1] * p.block[2]
        fn = drv.cu.CUfunction(p.function)
        return drv.check(drv.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, self.shared), p.entry)
