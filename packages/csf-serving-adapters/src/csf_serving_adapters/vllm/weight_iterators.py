"""vLLM's safetensors weight iterators, taught to read CSF checkpoints (see
:mod:`csf_serving_adapters.iterator_patch`): the modules vLLM's default loader takes them from, and their names."""

from __future__ import annotations

from ..iterator_patch import IteratorPatch

__all__ = ["install", "installed", "uninstall"]

_PATCH = IteratorPatch(
    modules=("vllm.model_executor.model_loader.weight_utils", "vllm.model_executor.model_loader.default_loader"),
    # every iterator whose first argument is the list of local safetensors files
    names=(
        "safetensors_weights_iterator",
        "multi_thread_safetensors_weights_iterator",
        "fastsafetensors_weights_iterator",
        "instanttensor_weights_iterator",
    ),
)
install, uninstall, installed = _PATCH.install, _PATCH.uninstall, _PATCH.installed
