"""The ``csf`` entry that ``csf compress`` adds to a checkpoint's config.json, read for the engines.

``csf compress`` adds ``"csf": {"format_version": 3, "scale_format": "mxfp4" | "nvfp4", "tensors": N}`` to the
``quantization_config`` object (see :mod:`csf_codec.checkpoint`); the rest of that object is the checkpoint's
own quantization (``quant_method`` "mxfp4" for gpt-oss, "modelopt" + ``quant_algo`` "NVFP4" for ModelOpt).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from csf_codec import CSF_FORMAT_VERSION, FormatVersionError, scale_format
from csf_codec.checkpoint import CONFIG_KEY

__all__ = ["COMPRESSED_TENSORS", "CsfEntry", "base_quant_method", "csf_entry", "scale_format_of"]

# The scale format each known base quantization carries (used when a native checkpoint is served as "csf").
_BASE_FORMATS = {"mxfp4": "mxfp4", "gpt_oss_mxfp4": "mxfp4", "modelopt_fp4": "nvfp4"}
COMPRESSED_TENSORS = "compressed-tensors"
# compressed-tensors names its FP4 formats per config group: "nvfp4-pack-quantized", "mxfp4-pack-quantized"
_CT_FORMATS = {"nvfp4-pack-quantized": "nvfp4", "mxfp4-pack-quantized": "mxfp4"}


@dataclass(frozen=True, kw_only=True)
class CsfEntry:
    """A checkpoint's ``csf`` config entry."""

    format_version: int
    scale_formats: tuple[str, ...]  # "mxfp4,nvfp4" when a checkpoint mixes both
    tensors: int

    @property
    def scale_format(self) -> str:
        """The one scale format of the checkpoint; a mixed checkpoint has none."""
        if len(self.scale_formats) != 1:
            raise ValueError(f"csf checkpoint mixes scale formats {self.scale_formats}; one layer method serves one")
        return self.scale_formats[0]


def csf_entry(quant_cfg: Mapping[str, Any] | None) -> CsfEntry | None:
    """The ``csf`` entry of a ``quantization_config`` dict, or None for a native checkpoint.

    Raises :class:`csf_codec.FormatVersionError` for an entry written by another format version.
    """
    if not isinstance(quant_cfg, Mapping) or not isinstance(quant_cfg.get(CONFIG_KEY), Mapping):
        return None
    raw = quant_cfg[CONFIG_KEY]
    version = raw.get("format_version")
    if version != CSF_FORMAT_VERSION:
        raise FormatVersionError(
            "config.json", f"quantization_config.csf.format_version={version!r}; this build reads {CSF_FORMAT_VERSION}"
        )
    formats = tuple(scale_format(f.strip()).name for f in str(raw.get("scale_format", "")).split(",") if f.strip())
    if not formats:
        raise ValueError(f"config.json: quantization_config.csf has no scale_format: {dict(raw)}")
    return CsfEntry(format_version=int(version), scale_formats=formats, tensors=int(raw.get("tensors", 0)))


def base_quant_method(quant_cfg: Mapping[str, Any] | None) -> str | None:
    """The checkpoint's own quantization, as the engines name it ("mxfp4", "modelopt_fp4", ...)."""
    if not isinstance(quant_cfg, Mapping):
        return None
    method = quant_cfg.get("quant_method")
    if method == "modelopt":  # ModelOpt names FP4 by quant_algo; vLLM calls that config "modelopt_fp4"
        algo = quant_cfg.get("quant_algo") or (quant_cfg.get("quantization") or {}).get("quant_algo")
        if isinstance(algo, str) and "FP4" in algo.upper():
            return "modelopt_fp4"
    return str(method) if method else None


def scale_format_of(base: str | None, quant_cfg: Mapping[str, Any] | None = None) -> str | None:
    """The FP4 scale format a base quantization method stores, when it is one csf knows (compressed-tensors:
    from its config groups' formats, which must agree)."""
    if base == COMPRESSED_TENSORS and isinstance(quant_cfg, Mapping):
        groups = quant_cfg.get("config_groups") or {}
        formats = {g.get("format") for g in groups.values() if isinstance(g, Mapping)} | {quant_cfg.get("format")}
        found = {_CT_FORMATS[f] for f in formats if f in _CT_FORMATS}
        return found.pop() if len(found) == 1 else None
    return _BASE_FORMATS.get(base or "")
