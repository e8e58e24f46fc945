"""SGLang's gpt-oss model loads MXFP4 experts only for a quantization config named "mxfp4": csf's too.

``GptOssForCausalLM.load_weights`` sends the checkpoint's ``*_proj_blocks / _scales / _bias`` tensors through its
MXFP4 expert path (TP and EP slicing of whole tensors) only when ``quant_config.get_name() == "mxfp4"``;
otherwise it expects bf16 experts. :func:`patch_gpt_oss_loading` wraps that method so that, for a csf config of an
MXFP4 checkpoint, the model sees the name "mxfp4" for the duration of the call (and only then): SGLang's own
slicing fills csf's parameters, whose loader takes the whole-tensor loads (``moe_method``). Applied when csf
builds a gpt-oss MoE layer, i.e. while the model is being constructed, before it loads.
"""

from __future__ import annotations

import functools
import sys

from ..config_core import CsfConfigCore

__all__ = ["MXFP4_NAME", "patch_gpt_oss_loading"]

MXFP4_NAME = "mxfp4"
_MODULE = "sglang.srt.models.gpt_oss"


class _NamedMxfp4:
    """A csf config that answers ``get_name()`` as SGLang's MXFP4 config does; everything else is csf's."""

    def __init__(self, config):
        self._config = config

    def get_name(self) -> str:
        return MXFP4_NAME

    def __getattr__(self, name: str):
        return getattr(self._config, name)


def _loads_as_mxfp4(config) -> bool:
    return isinstance(config, CsfConfigCore) and config.scale_format == MXFP4_NAME


def patch_gpt_oss_loading() -> bool:
    """Wrap ``GptOssForCausalLM.load_weights`` once (safe to repeat); False when SGLang's gpt-oss model is not
    imported (nothing to patch: the model being built is another one)."""
    module = sys.modules.get(_MODULE)
    model = getattr(module, "GptOssForCausalLM", None)
    if model is None:
        return False
    original = model.load_weights
    if getattr(original, "_csf_patched", False):
        return True

    @functools.wraps(original)
    def load_weights(self, weights, *args, **kwargs):
        config = self.quant_config
        if not _loads_as_mxfp4(config):
            return original(self, weights, *args, **kwargs)
        self.quant_config = _NamedMxfp4(config)
        try:
            return original(self, weights, *args, **kwargs)
        finally:
            self.quant_config = config

    load_weights._csf_patched = True
    model.load_weights = load_weights
    return True
