"""SGLang plugin: the ``csf`` quantization method for FP4 MoE checkpoints with CSF-compressed scales.

``register`` is the ``sglang.srt.plugins`` entry point ``csf``. SGLang's ``load_plugins()`` calls it once per
process (launcher, engine and every scheduler) and honours ``SGLANG_PLUGINS`` itself; it is safe to call again.
Importing this module imports nothing of SGLang.

SGLang 0.5.23 has no register function: ``QUANTIZATION_METHODS`` is a plain dict that ``ModelConfig`` walks in
order, asking each config's ``override_quantization_method`` to claim the checkpoint. ModelOpt's config claims a
ModelOpt NVFP4 checkpoint, so ``csf`` is put first: a checkpoint written by ``csf compress`` resolves to it before
its base method does. The CLI choices list is extended in place, as SGLang's extension points expect.
"""

from __future__ import annotations

import threading

__all__ = ["register"]

NAME = "csf"
_lock = threading.Lock()


def register() -> None:
    """Register the ``csf`` QuantizationConfig, its CLI choice and the CSF-aware safetensors iterators, and with
    ``CSF_SPARSE_MLA=1`` csf's sparse MLA decode behind the "dsa" attention backend (idempotent)."""
    from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES, add_quantization_method_choices
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    from csf_kernels import env

    from ..sparse_mla import enabled
    from . import weight_iterators
    from .config import CsfConfig

    with _lock:
        env.configure_runtime()  # CSF_FROZEN, CSF_AOT_CACHE, CSF_PDL: read once, here at the edge
        if next(iter(QUANTIZATION_METHODS), None) != NAME or QUANTIZATION_METHODS[NAME] is not CsfConfig:
            # reorder in place: other modules hold this same dict object
            rest = {k: v for k, v in QUANTIZATION_METHODS.items() if k != NAME}
            QUANTIZATION_METHODS.clear()
            QUANTIZATION_METHODS[NAME] = CsfConfig
            QUANTIZATION_METHODS.update(rest)
        if NAME not in QUANTIZATION_CHOICES:
            add_quantization_method_choices([NAME])
        weight_iterators.install()
        if enabled():
            _register_sparse_mla()


SPARSE_BACKEND_NAMES = ("dsa", "nsa")  # the registry names DeepSeek-V3.2's model code asks for


def _register_sparse_mla() -> None:
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from .attention import create_backend

    for name in SPARSE_BACKEND_NAMES:
        ATTENTION_BACKENDS[name] = create_backend
