"""``verify``: decode an encoded plane and compare it with the native bytes, byte for byte."""

from __future__ import annotations

import torch

from .compact import CompactScales, encode_compact
from .errors import ShapeMismatchError, VerificationError
from .formats import ScaleFormat
from .inline import InlineScales, decode_inline
from .payloads import decode_compact
from .planes import as_scale_bytes

__all__ = ["encode_verified", "verify"]


def verify(encoded: CompactScales | InlineScales | torch.Tensor, native: torch.Tensor, *, name: str = "scales") -> None:
    """Raise :class:`VerificationError` (with the first differing index) unless ``encoded`` decodes to ``native``.

    ``encoded`` is a compact payload tensor, :class:`CompactScales` or :class:`InlineScales`.
    """
    if isinstance(encoded, InlineScales):
        decoded = decode_inline(encoded, name=name)
    else:
        decoded = decode_compact(encoded, name=name)
    want = as_scale_bytes(native, name=name)
    if tuple(decoded.shape) != tuple(want.shape):
        raise ShapeMismatchError(name, f"decodes to shape {tuple(decoded.shape)}, native plane is {tuple(want.shape)}")
    want = want.to(decoded.device)
    if not torch.equal(decoded, want):
        diff = (decoded != want).nonzero()
        first = tuple(int(i) for i in diff[0])
        raise VerificationError(
            name,
            f"{diff.shape[0]} scale bytes differ; first at {first}: "
            f"decoded {int(decoded[first])}, native {int(want[first])}",
        )


def encode_verified(plane: torch.Tensor, fmt: ScaleFormat | str, *, name: str = "scales") -> CompactScales:
    """Encode to the compact form and verify the result (the encoder's own check, made explicit)."""
    out = encode_compact(plane, fmt, name=name, verify=False)
    verify(out, plane, name=name)
    return out
