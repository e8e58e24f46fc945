"""vLLM plugin: the ``csf`` quantization method for FP4 MoE checkpoints with CSF-compressed scales.

``register`` is the ``vllm.general_plugins`` entry point ``csf``. vLLM calls it once per process (front end,
engine core and every worker) and honours ``VLLM_PLUGINS`` itself; it is safe to call again. Importing this
module imports nothing of vLLM: the entry point is loaded before the engine needs it.
"""

from __future__ import annotations

import threading

__all__ = ["register"]

NAME = "csf"
_lock = threading.Lock()


def register() -> None:
    """Register the ``csf`` QuantizationConfig and the CSF-aware safetensors iterators, and with
    ``CSF_SPARSE_MLA=1`` csf's sparse MLA decode as the ``FLASHMLA_SPARSE`` backend (idempotent)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    from csf_kernels import env

    from ..sparse_mla import enabled
    from . import weight_iterators
    from .config import CsfConfig

    with _lock:
        env.configure_runtime()  # CSF_FROZEN, CSF_AOT_CACHE, CSF_PDL: read once, here at the edge
        # registering twice is harmless in vLLM but logs an "overwritten" message; skip when already ours
        if NAME not in QUANTIZATION_METHODS or not _is_registered(CsfConfig):
            register_quantization_config(NAME)(CsfConfig)
        weight_iterators.install()
        if enabled():
            _register_sparse_mla()


def _register_sparse_mla() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from .attention import CLASS_PATH

    register_backend(AttentionBackendEnum.FLASHMLA_SPARSE, CLASS_PATH)


def _is_registered(cls: type) -> bool:
    from vllm.model_executor.layers import quantization

    # vLLM keeps custom configs in this dict; get_quantization_config would import every built-in config
    return getattr(quantization, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {}).get(NAME) is cls
