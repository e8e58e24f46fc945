"""CSF planes as a shard stores them: ``X.csf`` payloads, decoded back to the native ``X`` a loader expects.

Only the shard metadata (``csf.format_version`` / ``csf.tensors``, see :mod:`csf_codec.shard_schema`) is read
here; payloads come from whatever reader the engine uses, so its prefetching and filtering are kept.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from csf_codec import decode_compact
from csf_codec.safetensors_io import read_header, torch_dtype
from csf_codec.shard_schema import csf_records

__all__ = ["StoredPlane", "decode_stored_planes", "stored_planes"]


@dataclass(frozen=True, kw_only=True)
class StoredPlane:
    """One compressed plane: stored as ``stored_name`` (uint8 1-D), originally ``name`` of dtype and shape."""

    stored_name: str
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    def decode(self, payload: torch.Tensor) -> torch.Tensor:
        """The native plane, with the original dtype and shape, on the payload's device."""
        # the codec takes [N, KB] or [E, N, KB]; deeper planes were encoded with their leading dims folded
        codec = self.shape if len(self.shape) <= 3 else (math.prod(self.shape[:-2]), *self.shape[-2:])
        plane = decode_compact(payload.contiguous(), name=self.name, expected_shape=codec)
        return plane.reshape(self.shape).view(self.dtype)


def _shard_planes(path: str | os.PathLike[str]) -> dict[str, StoredPlane]:
    """The shard's compact planes; the codec checks the version, the metadata digest and every field."""
    return {
        stored: StoredPlane(stored_name=stored, name=r.name, dtype=torch_dtype(r.dtype), shape=r.shape)
        for stored, r in csf_records(read_header(path)).items()
        if not r.native  # planes kept native are stored under their own name, as the loader expects
    }


def stored_planes(files: Iterable[str | os.PathLike[str]]) -> dict[str, StoredPlane]:
    """Every CSF plane of these safetensors files by stored name ({} for a native checkpoint)."""
    out: dict[str, StoredPlane] = {}
    for f in files:
        if str(f).endswith(".safetensors"):
            out.update(_shard_planes(f))
    return out


def decode_stored_planes(
    files: Iterable[str | os.PathLike[str]], weights: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` (name, tensor) read from ``files``, with each ``X.csf`` replaced by ``X`` decoded."""
    planes = stored_planes(files)
    for name, tensor in weights:
        plane = planes.get(name)
        yield (name, tensor) if plane is None else (plane.name, plane.decode(tensor))
