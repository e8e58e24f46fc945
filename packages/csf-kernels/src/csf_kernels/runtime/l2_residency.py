"""Keep one region of device memory in the L2 cache's persisting set-aside (Hopper's L2 residency control).

Why: an inline MoE call that expands its routed experts' scales writes them into scratch planes that its GEMMs then
read back. Against native's calls that is the planes' bytes written and read again on top of the records read, 1.25x
the native planes' bytes of DRAM traffic more (the reason inline is slower than native at 8-512 tokens:
``docs/perf-notes.md``, "Inline plans expand scales; the GEMM reads a native-layout plane"). The planes are a
per-call temporary at the same addresses for every layer (one scratch per device, ``csf_serving_adapters.scratch``),
so with their accesses marked persisting the expansion's writes stay in L2, the GEMMs' reads hit, and no persisting
line is written back: the next call's expansion overwrites it.

How: a set-aside for persisting lines (``cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE)``, a setting of this
process's context, only ever raised here) and an access policy window over the region, set on the streams a call
launches on and restored after it. Kernels launched meanwhile, and under CUDA-graph capture the kernel nodes
captured meanwhile, carry the window. A window wider than the set-aside marks only a fraction of its lines
persisting (``hit_ratio``), so that they do not evict one another; a window is at most the device's largest.

Cost: persisting lines are not evicted by other accesses, so while the region holds them the rest of the model
has that much less L2. Opt in (``CSF_L2_SCALES``); :func:`reset` turns every persisting line back to normal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from csf_kernels.runtime.driver import driver as runtime_driver

__all__ = ["InL2Window", "L2Limits", "L2Window", "limits", "reserve", "reset", "window_over"]

_lock = threading.Lock()
_limits: dict[int, L2Limits] = {}


@dataclass(frozen=True)
class L2Limits:
    """A device's L2 residency limits, in bytes (read off the device once)."""

    l2_bytes: int
    max_persisting_bytes: int  # the largest set-aside for persisting lines
    max_window_bytes: int  # the largest access policy window


@dataclass(frozen=True)
class L2Window:
    """An access policy window: accesses to ``[base, base + num_bytes)`` persist with probability ``hit_ratio``
    (the others are normal accesses)."""

    base: int
    num_bytes: int
    hit_ratio: float

    def __post_init__(self) -> None:
        if self.num_bytes <= 0 or self.base <= 0:
            raise ValueError(f"an L2 window needs a base and a positive size, got {self.base:#x} + {self.num_bytes}")
        if not 0.0 < self.hit_ratio <= 1.0:
            raise ValueError(f"an L2 window's hit ratio lies in (0, 1], got {self.hit_ratio}")


def window_over(base: int, num_bytes: int, set_aside: int, max_window_bytes: int) -> L2Window | None:
    """The window for ``num_bytes`` at ``base`` given ``set_aside`` persisting bytes: the region's first
    ``max_window_bytes`` at most, each line persisting with probability set-aside / window (at most 1, so the
    persisting lines fit the set-aside). None where there is no set-aside or no region."""
    size = min(num_bytes, max_window_bytes)
    if size <= 0 or set_aside <= 0:
        return None
    return L2Window(base=base, num_bytes=size, hit_ratio=min(1.0, set_aside / size))


def _driver():
    """cuda-bindings' driver module (the structures; no driver library needed to build them)."""
    from cuda.bindings import driver

    return driver


def _check(result, what: str):
    """A driver call's result checked as the runtime checks its own (``Driver.check``)."""
    return runtime_driver().check(result, what)


def limits(device: int) -> L2Limits:
    """``device``'s L2 residency limits (read once a device)."""
    with _lock:
        if device not in _limits:
            d = _driver()
            torch.cuda.init()
            dev = _check(d.cuDeviceGet(device), "cuDeviceGet")
            a = d.CUdevice_attribute
            l2, persisting, window = (
                int(_check(d.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr.name})"))
                for attr in (a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, a.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
                             a.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE)
            )  # fmt: skip
            _limits[device] = L2Limits(l2, persisting, window)
        return _limits[device]


def reserve(device: int, num_bytes: int) -> int:
    """Raise the set-aside for persisting lines of ``device``'s context to ``num_bytes`` (at most the device's
    largest; never lowered, as another caller may rely on it); returns the set-aside now in force."""
    d = _driver()
    want = min(num_bytes, limits(device).max_persisting_bytes)
    limit = d.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE
    with _lock, torch.cuda.device(device):
        torch.cuda.init()
        have = int(_check(d.cuCtxGetLimit(limit), "cuCtxGetLimit(PERSISTING_L2_CACHE_SIZE)"))
        if want > have:
            _check(d.cuCtxSetLimit(limit, want), "cuCtxSetLimit(PERSISTING_L2_CACHE_SIZE)")
            have = int(_check(d.cuCtxGetLimit(limit), "cuCtxGetLimit(PERSISTING_L2_CACHE_SIZE)"))
        return have


def reset(device: int) -> None:
    """Turn every persisting line of ``device``'s L2 back to normal (benchmarks: so arms without a window are not
    timed beside another arm's resident lines)."""
    with torch.cuda.device(device):
        _check(_driver().cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")


def _window_attr(ids=None):
    """The access-policy-window member of the attribute enum ``ids`` (default: the streams'; graph kernel nodes have
    their own enum class): its name differs across cuda-bindings versions, its value does not."""
    ids = _driver().CUstreamAttrID if ids is None else ids
    return getattr(ids, next(n for n in dir(ids) if n.endswith("ACCESS_POLICY_WINDOW")))


def _attr_value(window: L2Window):
    d = _driver()
    value = d.CUstreamAttrValue()
    w = value.accessPolicyWindow
    w.base_ptr = window.base
    w.num_bytes = window.num_bytes
    w.hitRatio = window.hit_ratio
    w.hitProp = d.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
    w.missProp = d.CUaccessProperty.CU_ACCESS_PROPERTY_NORMAL  # the lines past the hit ratio: as without a window
    return value


@dataclass(frozen=True, eq=False)
class InL2Window:
    """Launches run with ``window`` set on torch's current stream and on ``side`` streams (those the launches fork
    onto), each stream's previous window restored after them."""

    launches: tuple[Callable[[], object], ...]
    window: L2Window
    side: tuple[torch.cuda.Stream, ...] = ()

    def __post_init__(self) -> None:  # what every call sets, and the side streams' handles, made once
        object.__setattr__(self, "_attr", _window_attr())
        object.__setattr__(self, "_value", _attr_value(self.window))
        object.__setattr__(self, "_side", [_driver().CUstream(s.cuda_stream) for s in self.side])

    def __call__(self) -> None:
        d = _driver()
        handles = [d.CUstream(torch.cuda.current_stream().cuda_stream), *self._side]
        before = [_check(d.cuStreamGetAttribute(h, self._attr), "cuStreamGetAttribute") for h in handles]
        for h in handles:
            _check(d.cuStreamSetAttribute(h, self._attr, self._value), "cuStreamSetAttribute(access policy window)")
        try:
            for launch in self.launches:
                launch()
        finally:
            for h, value in zip(handles, before, strict=True):
                _check(d.cuStreamSetAttribute(h, self._attr, value), "cuStreamSetAttribute(restore)")
