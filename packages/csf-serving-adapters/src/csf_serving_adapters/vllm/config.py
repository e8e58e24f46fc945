"""``CsfConfig``: the vLLM QuantizationConfig named "csf".

It claims a checkpoint whose ``quantization_config`` carries the ``csf`` entry ``csf compress`` writes, or any
checkpoint served with ``--quantization csf``. MoE experts get :class:`CsfMoEMethod`; linear layers stay
unquantized, as in vLLM's own MXFP4 config.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase

from ..config_core import CsfConfigCore
from .moe_method import CsfMoEMethod

__all__ = ["CsfConfig"]


class CsfConfig(CsfConfigCore, QuantizationConfig):
    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> str | None:
        return "csf" if cls.claims(hf_quant_cfg, user_quant) else None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, RoutedExperts):
            return CsfMoEMethod(layer.moe_config, self)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        return None
