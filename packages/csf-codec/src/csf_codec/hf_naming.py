"""Recognise FP4 block-scale planes in Hugging Face checkpoints by tensor names, dtypes and shapes.

Three conventions are understood (K is the unpacked weight count along the reduction axis):

* gpt-oss MXFP4: ``<p>_blocks`` uint8 [.., N, K/32, 16] with ``<p>_scales`` uint8 [.., N, K/32].
* NVIDIA ModelOpt NVFP4: ``<p>.weight`` uint8 [.., N, K/2], ``<p>.weight_scale`` float8_e4m3fn [.., N, K/16]
  and the FP32 global ``<p>.weight_scale_2``.
* compressed-tensors: ``<p>.weight_packed`` uint8 [.., N, K/2] with ``<p>.weight_scale`` that is either
  float8_e4m3fn [.., N, K/16] plus ``<p>.weight_global_scale`` (NVFP4) or uint8 [.., N, K/32] (MXFP4).

A name that fits a convention whose partner tensors are absent, or whose dtypes are not FP4's (FP8
checkpoints' per-tensor ``weight_scale``, INT4 ``weight_packed`` as int32 with bf16 group scales), is not a
scale plane and passes through untouched. A pair whose names and dtypes fit but whose shapes contradict
each other is refused with :class:`ShapeMismatchError`: silently passing it through would hide a broken
checkpoint, and compressing it would mislabel its block size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from .errors import ShapeMismatchError
from .formats import MXFP4, NVFP4, ScaleFormat

__all__ = ["CONVENTIONS", "ScalePlaneSpec", "TensorLike", "find_scale_planes", "match_scale_plane"]

CONVENTIONS = ("gpt-oss", "modelopt", "compressed-tensors")

# Scale dtypes each format may be stored as (E8M0 bytes appear both as plain U8 and as F8_E8M0).
_SCALE_DTYPES: dict[str, set[str]] = {"mxfp4": {"U8", "F8_E8M0"}, "nvfp4": {"F8_E4M3"}}
_GLOBAL_DTYPES = {"F32"}


class TensorLike(Protocol):
    """Anything with a safetensors dtype string and a shape (``safetensors_io.TensorInfo`` fits)."""

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, kw_only=True)
class ScalePlaneSpec:
    """One recognised scale plane and the tensors it belongs with."""

    scale_name: str
    values_name: str
    global_scale_name: str | None
    fmt: ScaleFormat
    convention: str


@dataclass(frozen=True)
class _Meta:
    dtype: str
    shape: tuple[int, ...]


def _meta(t: object) -> _Meta:
    if isinstance(t, torch.Tensor):
        from .safetensors_io import dtype_name

        return _Meta(dtype_name(t.dtype), tuple(t.shape))
    return _Meta(str(t.dtype), tuple(int(d) for d in t.shape))  # type: ignore[attr-defined]


def _format_for(scale: _Meta, block: int) -> ScaleFormat | None:
    for fmt in (MXFP4, NVFP4):
        if fmt.block_size == block and scale.dtype in _SCALE_DTYPES[fmt.name]:
            return fmt
    return None


def _check_pair(scale_name: str, scale: _Meta, values_name: str, lead: tuple[int, ...], k: int) -> int | None:
    """Block size implied by a values tensor (leading dims ``lead``, ``k`` weights per row); refuse misfits.

    None when K = 0 and there are no scale columns: no block size is implied, and the empty pair passes
    through as it is."""
    if len(scale.shape) < 2 or tuple(scale.shape[:-1]) != lead:
        raise ShapeMismatchError(
            scale_name, f"scale shape {scale.shape} does not match {values_name} (rows {lead}, K={k})"
        )
    cols = scale.shape[-1]
    if cols == 0 and k == 0:
        return None
    if cols == 0 or k % cols:
        raise ShapeMismatchError(scale_name, f"{cols} scale columns do not divide K={k} of {values_name}")
    return k // cols


def match_scale_plane(name: str, tensors: Mapping[str, TensorLike | torch.Tensor]) -> ScalePlaneSpec | None:
    """The spec of ``name`` if it is an FP4 scale plane under a known convention, else None."""
    if name not in tensors:
        return None
    scale = _meta(tensors[name])

    if name.endswith("_scales"):  # gpt-oss
        values_name = name[: -len("_scales")] + "_blocks"
        if values_name not in tensors or scale.dtype not in _SCALE_DTYPES["mxfp4"]:
            return None
        values = _meta(tensors[values_name])
        if values.dtype != "U8" or len(values.shape) < 3:
            return None
        k = values.shape[-2] * values.shape[-1] * 2
        block = _check_pair(name, scale, values_name, tuple(values.shape[:-2]), k)
        if block is None:
            return None
        if values.shape[-1] != 16 or _format_for(scale, block) is not MXFP4:
            raise ShapeMismatchError(
                name, f"{values_name} {values.shape} with scales {scale.shape} is not 32 FP4 values per scale"
            )
        return ScalePlaneSpec(
            scale_name=name, values_name=values_name, global_scale_name=None, fmt=MXFP4, convention="gpt-oss"
        )

    if not name.endswith(".weight_scale"):
        return None
    prefix = name[: -len(".weight_scale")]
    if scale.dtype not in _SCALE_DTYPES["mxfp4"] | _SCALE_DTYPES["nvfp4"]:
        return None  # e.g. FP8 / INT4 checkpoints' float scales
    for values_name, global_name, convention in (
        (prefix + ".weight_packed", prefix + ".weight_global_scale", "compressed-tensors"),
        (prefix + ".weight", prefix + ".weight_scale_2", "modelopt"),
    ):
        if values_name not in tensors:
            continue
        values = _meta(tensors[values_name])
        if values.dtype != "U8" or len(values.shape) < 2:
            return None
        nvfp4 = scale.dtype in _SCALE_DTYPES["nvfp4"]
        has_global = global_name in tensors and _meta(tensors[global_name]).dtype in _GLOBAL_DTYPES
        if nvfp4 and not has_global:
            return None  # NVFP4 without its FP32 global scale is not a convention we know
        if not nvfp4 and convention == "modelopt":
            return None  # ModelOpt's uint8-scale pair is not an FP4 convention we know
        k = values.shape[-1] * 2
        block = _check_pair(name, scale, values_name, tuple(values.shape[:-1]), k)
        if block is None:
            return None
        fmt = _format_for(scale, block)
        if fmt is None:
            raise ShapeMismatchError(
                name, f"{scale.dtype} scales every {block} weights of {values_name} fit neither MXFP4 nor NVFP4"
            )
        return ScalePlaneSpec(
            scale_name=name,
            values_name=values_name,
            global_scale_name=global_name if fmt.has_global_scale else None,
            fmt=fmt,
            convention=convention,
        )
    return None


def find_scale_planes(tensors: Mapping[str, TensorLike | torch.Tensor]) -> dict[str, ScalePlaneSpec]:
    """Every FP4 scale plane among ``tensors`` (name -> tensor or dtype/shape record), by scale name."""
    found = {}
    for name in tensors:
        spec = match_scale_plane(name, tensors)
        if spec is not None:
            found[name] = spec
    return found
