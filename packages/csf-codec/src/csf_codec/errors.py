"""Every error the codec raises names the tensor and the fault."""

from __future__ import annotations

__all__ = [
    "CSFError",
    "CorruptPayloadError",
    "FormatVersionError",
    "ShapeMismatchError",
    "VerificationError",
]


class CSFError(ValueError):
    """Base class: a CSF payload, plane or checkpoint is not what it must be."""

    def __init__(self, tensor: str, fault: str):
        self.tensor = tensor
        self.fault = fault
        super().__init__(f"{tensor}: {fault}")


class CorruptPayloadError(CSFError):
    """Truncated, checksum-failing or structurally impossible payload."""


class FormatVersionError(CSFError):
    """A payload or checkpoint written by an unknown CSF format version."""


class ShapeMismatchError(CSFError):
    """A plane, slice or payload whose geometry disagrees with what was asked for."""


class VerificationError(CSFError):
    """Decoding an encoded plane did not give back the native bytes."""
