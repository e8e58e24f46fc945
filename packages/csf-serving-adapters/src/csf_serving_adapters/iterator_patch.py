"""Engine safetensors weight iterators, taught to read CSF checkpoints (one mechanism for every engine).

A CSF checkpoint stores each scale plane ``X`` as ``X.csf`` (a compact payload); an engine would look for a
parameter named ``...X.csf`` and fail. Wrapping the iterators the engine's loader calls, instead of subclassing
the loader, keeps every one of its load strategies; tensors of native shards and every non-CSF tensor pass
through untouched. Loaders import the iterators by name, so every module holding them is patched;
``uninstall`` restores them (tests).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from .stored_planes import decode_stored_planes

__all__ = ["IteratorPatch"]

_ORIGINAL = "__csf_original__"


def _wrap(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def iterate(hf_weights_files, *args, **kwargs):
        return decode_stored_planes(hf_weights_files, fn(hf_weights_files, *args, **kwargs))

    setattr(iterate, _ORIGINAL, fn)
    return iterate


@dataclass(frozen=True)
class IteratorPatch:
    """The iterators ``names`` (first argument: the list of local safetensors files) in ``modules``."""

    modules: tuple[str, ...]
    names: tuple[str, ...]

    def _targets(self):
        for mod_name in self.modules:
            mod = importlib.import_module(mod_name)
            for name in self.names:
                if hasattr(mod, name):
                    yield mod, name

    def install(self) -> None:
        for mod, name in self._targets():
            fn = getattr(mod, name)
            if not hasattr(fn, _ORIGINAL):
                setattr(mod, name, _wrap(fn))

    def uninstall(self) -> None:
        for mod, name in self._targets():
            fn = getattr(mod, name)
            if hasattr(fn, _ORIGINAL):
                setattr(mod, name, getattr(fn, _ORIGINAL))

    def installed(self) -> bool:
        return all(hasattr(getattr(mod, name), _ORIGINAL) for mod, name in self._targets())
