"""What callers hold: a program to run (:class:`Launch`, resolved through the AOT cache when bound), a cache of
bound launch sets, and the placeholder for pointer arguments a program never dereferences."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

import torch

from csf_kernels.runtime.cache import program
from csf_kernels.runtime.cute_so import TensorRef
from csf_kernels.runtime.loaded import BoundLaunch, LoadedProgram
from csf_kernels.runtime.programs import ProgramSpec, is_triton

__all__ = ["BindingCache", "Launch", "placeholder"]

_PLACEHOLDERS: dict[torch.device, torch.Tensor] = {}


def placeholder(device: torch.device) -> torch.Tensor:
    """A 16-byte aligned dummy for pointer arguments a program never dereferences."""
    device = torch.device(device)
    if device not in _PLACEHOLDERS:
        _PLACEHOLDERS[device] = torch.zeros(16, dtype=torch.uint8, device=device)
    return _PLACEHOLDERS[device]


class BindingCache:
    """Bound launch sets of a caller, the least recently used dropped beyond ``capacity``: binding resolves
    programs and marshals arguments, which costs far more host time than the launches (``docs/perf-notes.md``,
    "Bind once, launch many"), so a call whose key (shapes, pointers, options) was seen before replays the same
    bound launches."""

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
        ids = {id(t) for t in tensors}
        if is_triton(self.spec):
            args = tuple(a.data_ptr() if id(a) in ids else a for a in self.args)
        else:
            # CuTe launches take views (flattened, retyped) of the caller's buffers: match by storage
            storages = {t.untyped_storage().data_ptr() for t in tensors}
            args = tuple(
                TensorRef.of(a) if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in storages else a
                for a in self.args
            )
        return replace(self, args=args)
