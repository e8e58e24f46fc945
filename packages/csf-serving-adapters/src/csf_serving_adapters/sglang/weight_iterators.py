"""SGLang's safetensors weight iterators, taught to read CSF checkpoints.

A CSF checkpoint stores each scale plane ``X`` as ``X.csf`` (a compact payload); SGLang would look for a parameter
named ``...X.csf`` and fail. Wrapping the iterators the default loader calls, instead of subclassing the loader,
keeps every one of SGLang's load strategies, prefetching and cache dropping; tensors of native shards and every
non-CSF tensor pass through untouched. ``loader`` imported the iterators by name, so both modules are
patched; :func:`uninstall` restores them (tests).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from ..stored_planes import decode_stored_planes

__all__ = ["install", "installed", "uninstall"]

_MODULES = ("sglang.srt.model_loader.weight_utils", "sglang.srt.model_loader.loader")
# every iterator whose first argument is the list of local safetensors files
_ITERATORS = (
    "safetensors_weights_iterator",
    "buffered_multi_thread_safetensors_weights_iterator",
    "fastsafetensors_weights_iterator",
    "instanttensor_weights_iterator",
)
_ORIGINAL = "__csf_original__"


def _wrap(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def iterate(hf_weights_files, *args, **kwargs):
        return decode_stored_planes(hf_weights_files, fn(hf_weights_files, *args, **kwargs))

    setattr(iterate, _ORIGINAL, fn)
    return iterate


def _targets():
    for mod_name in _MODULES:
        mod = importlib.import_module(mod_name)
        for name in _ITERATORS:
            if hasattr(mod, name):
                yield mod, name


def install() -> None:
    for mod, name in _targets():
        fn = getattr(mod, name)
        if not hasattr(fn, _ORIGINAL):
            setattr(mod, name, _wrap(fn))


def uninstall() -> None:
    for mod, name in _targets():
        fn = getattr(mod, name)
        if hasattr(fn, _ORIGINAL):
            setattr(mod, name, getattr(fn, _ORIGINAL))


def installed() -> bool:
    return all(hasattr(getattr(mod, name), _ORIGINAL) for mod, name in _targets())
