"""SGLang's safetensors weight iterators, taught to read CSF checkpoints (see
:mod:`csf_serving_adapters.iterator_patch`): the modules SGLang's loader takes them from, and their names."""

from __future__ import annotations

from ..iterator_patch import IteratorPatch

__all__ = ["install", "installed", "uninstall"]

_PATCH = IteratorPatch(
    modules=("sglang.srt.model_loader.weight_utils", "sglang.srt.model_loader.loader"),
    # every iterator whose first argument is the list of local safetensors files
    names=(
        "safetensors_weights_iterator",
        "buffered_multi_thread_safetensors_weights_iterator",
        "fastsafetensors_weights_iterator",
        "instanttensor_weights_iterator",
    ),
)
install, uninstall, installed = _PATCH.install, _PATCH.uninstall, _PATCH.installed
