"""csf-serving-adapters: vLLM and SGLang plugins that serve CSF checkpoints through csf-moe and
csf-attention.

Engine-independent pieces live at the top level (the checkpoint's ``csf`` config entry, stored CSF
planes, scale-memory accounting, shared scratch); each engine has its own subpackage, imported only
by that engine's plugin entry point:

* :mod:`csf_serving_adapters.vllm` -- ``register()``, the ``vllm.general_plugins`` entry point ``csf``;
* :mod:`csf_serving_adapters.sglang` -- ``register()``, the ``sglang.srt.plugins`` entry point ``csf``.

The sparse-MLA attention backends come with csf-attention (not built yet).
"""
