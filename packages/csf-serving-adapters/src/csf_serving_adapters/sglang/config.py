"""``CsfConfig``: the SGLang QuantizationConfig named "csf".

It claims a checkpoint whose ``quantization_config`` carries the ``csf`` entry ``csf compress`` writes, or any
checkpoint served with ``--quantization csf``. MoE experts get :class:`CsfMoEMethod`; linear layers stay
unquantized, as in SGLang's own MXFP4 config.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

from ..config_core import CsfConfigCore
from .moe_method import CsfMoEMethod

__all__ = ["CsfConfig"]


class CsfConfig(CsfConfigCore, QuantizationConfig):
    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant) -> str | None:
        return "csf" if cls.claims(hf_quant_cfg, user_quant) else None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, FusedMoE):
            return CsfMoEMethod(self, prefix=prefix)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        return None

    def get_scaled_act_names(self) -> list[str]:
        return []
