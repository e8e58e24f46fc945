"""``CsfConfig``: the vLLM QuantizationConfig named "csf".

It claims a checkpoint whose ``quantization_config`` carries the ``csf`` entry ``csf compress`` writes, or any
checkpoint served with ``--quantization csf``. MoE experts get :class:`CsfMoEMethod`; linear layers stay
unquantized, as in vLLM's own MXFP4 config.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase

from .. import checkpoint_config as ckpt
from .moe_method import CsfMoEMethod

__all__ = ["CsfConfig"]


class CsfConfig(QuantizationConfig):
    def __init__(
        self,
        *,
        scale_format: str | None = None,
        base_quant_method: str | None = None,
        entry: ckpt.CsfEntry | None = None,
    ) -> None:
        super().__init__()
        self.scale_format = scale_format  # "mxfp4" | "nvfp4"; None when vLLM built us without a config
        self.base_quant_method = base_quant_method  # the checkpoint's own quant_method ("mxfp4", "modelopt_fp4")
        self.entry = entry  # None: a native checkpoint served as "csf"

    def __repr__(self) -> str:
        return f"CsfConfig(scale_format={self.scale_format!r}, base_quant_method={self.base_quant_method!r})"

    @classmethod
    def get_name(cls) -> str:
        return "csf"

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 90  # the fused kernels are Hopper (sm_90a) programs

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # everything is in config.json's quantization_config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CsfConfig:
        entry = ckpt.csf_entry(config)
        base = ckpt.base_quant_method(config)
        fmt = entry.scale_format if entry is not None else ckpt.scale_format_of(base, config)
        return cls(scale_format=fmt, base_quant_method=base, entry=entry)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> str | None:
        if user_quant == "csf" or ckpt.csf_entry(hf_quant_cfg) is not None:
            return "csf"
        return None

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, RoutedExperts):
            return CsfMoEMethod(layer.moe_config, self)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod()
        return None
