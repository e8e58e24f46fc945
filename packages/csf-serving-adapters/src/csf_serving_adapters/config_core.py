"""The engine-neutral half of the "csf" QuantizationConfig: what it holds, how it reads a checkpoint's
``quantization_config`` and which checkpoints it claims. Each engine's ``CsfConfig`` derives from
:class:`CsfConfigCore` and its engine's ``QuantizationConfig``, and adds only the engine's hooks."""

from __future__ import annotations

from typing import Any

import torch

from . import checkpoint_config as ckpt

__all__ = ["CsfConfigCore"]


class CsfConfigCore:
    def __init__(
        self,
        *,
        scale_format: str | None = None,
        base_quant_method: str | None = None,
        entry: ckpt.CsfEntry | None = None,
    ) -> None:
        super().__init__()
        self.scale_format = scale_format  # "mxfp4" | "nvfp4"; None when the engine built us without a config
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
    def from_config(cls, config: dict[str, Any]):
        entry = ckpt.csf_entry(config)
        base = ckpt.base_quant_method(config)
        fmt = entry.scale_format if entry is not None else ckpt.scale_format_of(base, config)
        return cls(scale_format=fmt, base_quant_method=base, entry=entry)

    @staticmethod
    def claims(hf_quant_cfg, user_quant) -> bool:
        """Whether "csf" serves the checkpoint: asked for, or written by ``csf compress``."""
        return user_quant == "csf" or ckpt.csf_entry(hf_quant_cfg) is not None
