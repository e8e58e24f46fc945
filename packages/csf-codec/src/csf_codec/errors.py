"""Every error the codec raises names the file (when there is one), the tensor and the fault.

Each class carries the exit status the ``csf`` command ends with when it is raised (``exit_code``), so
the CLI maps errors to statuses in one place and the codes stay documented here:

    0  success
    1  integrity: a payload, digest, completion record or comparison does not check out
    2  usage: bad arguments, a destination that exists (without --overwrite) or is the source
    3  malformed input: not a checkpoint this build reads (bad header, JSON, version, geometry)
    4  I/O error: reading or writing failed (no space, file too large, permissions, ...)
    130 interrupted (SIGINT), 143 terminated (SIGTERM)
"""

from __future__ import annotations

import os

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "CSFError",
    "CheckpointIOError",
    "CorruptPayloadError",
    "FormatVersionError",
    "IncompleteOutputError",
    "MalformedInputError",
    "ShapeMismatchError",
    "UsageError",
    "VerificationError",
]

EXIT_OK = 0
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class CSFError(ValueError):
    """Base class: a CSF payload, plane or checkpoint is not what it must be.

    ``str(error)`` is one line: ``<file>: <tensor>: <fault>`` (parts that are unknown are left out).
    """

    exit_code = 3

    def __init__(self, tensor: str, fault: str, *, file: str | os.PathLike[str] | None = None):
        self.tensor = tensor
        self.fault = fault
        self.file = os.fspath(file) if file is not None else None
        super().__init__(": ".join(p for p in (self.file, tensor, " ".join(fault.split())) if p))

    def in_file(self, file: str | os.PathLike[str]) -> CSFError:
        """The same error naming ``file`` (unchanged when it already names one)."""
        if self.file is not None:
            return self
        return type(self)(self.tensor, self.fault, file=file)


class CorruptPayloadError(CSFError):
    """Truncated, checksum-failing, digest-failing or structurally impossible payload."""

    exit_code = 1


class VerificationError(CSFError):
    """Decoding an encoded plane did not give back the native bytes, or two checkpoints differ."""

    exit_code = 1


class IncompleteOutputError(CSFError):
    """A directory without a valid completion record, or whose files disagree with it."""

    exit_code = 1


class FormatVersionError(CSFError):
    """A payload or checkpoint written by an unknown CSF format version."""


class ShapeMismatchError(CSFError):
    """A plane, slice or payload whose geometry disagrees with what was asked for."""


class MalformedInputError(CSFError):
    """A file that is not what it claims: a bad safetensors header, index or metadata JSON."""


class UsageError(CSFError):
    """A request that cannot be carried out as asked (destination exists, destination is the source)."""

    exit_code = 2


class CheckpointIOError(CSFError):
    """Reading or writing a file failed at the operating-system level."""

    exit_code = 4

    @classmethod
    def from_os(cls, e: OSError, *, file: str | os.PathLike[str] | None = None, tensor: str = "") -> CheckpointIOError:
        what = e.strerror or str(e)
        return cls(tensor, f"{what} (errno {e.errno})" if e.errno else what, file=file or e.filename)
