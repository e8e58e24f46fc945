"""Decoding that proves itself: every payload decoded here is checked against its stored plane digest.

The form modules (:mod:`csf_codec.compact`, :mod:`csf_codec.inline`) validate structure and checksums;
this layer adds the last check, that the restored plane's SHA-256 equals the digest sealed into the
header, so a damaged or forged payload whose structure still parses can never decode to a different
plane. ``csf_codec.decode_compact`` and ``csf_codec.inline_from_payload`` are these functions.
"""

from __future__ import annotations

import torch

from . import compact as _compact
from . import inline as _inline
from .container import plane_digest, stored_digest
from .errors import CorruptPayloadError, ShapeMismatchError

__all__ = ["check_digest", "decode_compact", "decode_payload", "inline_from_payload"]


def check_digest(payload: torch.Tensor, plane: torch.Tensor, *, name: str = "scales") -> None:
    """Raise :class:`CorruptPayloadError` unless ``plane`` is the plane ``payload``'s digest names."""
    _check(payload, plane_digest(plane), name)


def _check(payload: torch.Tensor, digest: bytes, name: str) -> None:
    if digest != stored_digest(payload):
        raise CorruptPayloadError(
            name, "the restored plane does not match the payload's SHA-256 digest (damaged or forged payload)"
        )


def decode_compact(
    payload: torch.Tensor | _compact.CompactScales,
    *,
    name: str = "scales",
    expected_shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """:func:`csf_codec.compact.decode_compact`, then the plane digest check."""
    raw = payload.payload if isinstance(payload, _compact.CompactScales) else payload
    plane, digest = _compact.decode_compact_digest(raw, name=name, expected_shape=expected_shape)
    _check(raw, digest, name)
    return plane


def inline_from_payload(payload: torch.Tensor, *, name: str = "scales") -> _inline.InlineScales:
    """:func:`csf_codec.inline.inline_from_payload`, then the plane digest check."""
    out = _inline.inline_from_payload(payload, name=name)
    check_digest(payload, _inline.decode_inline(out, name=name), name=name)
    return out


def decode_payload(
    payload: torch.Tensor, *, name: str = "scales", expected_shape: tuple[int, ...] | None = None
) -> torch.Tensor:
    """Decode either form (by its magic) to the native plane, digest-checked."""
    if isinstance(payload, torch.Tensor) and payload.dim() == 1 and payload.numel() >= 4:
        if payload[:4].cpu().numpy().tobytes() == _inline.MAGIC:
            inl = _inline.inline_from_payload(payload, name=name)
            plane = _inline.decode_inline(inl, name=name)
            check_digest(payload, plane, name=name)
            if expected_shape is not None and tuple(plane.shape) != tuple(expected_shape):
                raise ShapeMismatchError(
                    name, f"payload holds a plane of shape {tuple(plane.shape)}, expected {tuple(expected_shape)}"
                )
            return plane
    return decode_compact(payload, name=name, expected_shape=expected_shape)
