"""Checkpoint outputs as transactions: whole and verified, or absent.

An output (a directory, or one ``.safetensors`` file) is written into a temporary sibling directory,
``.<name>.csf-partial-<pid>``; every file is fsynced, a *completion record* (``csf-complete.json``:
format version, tool version, every file's relative path, size and SHA-256) is written last, and the
directory is renamed into place whole. Replacing an existing output renames the old one aside first
(``.<name>.csf-old-<pid>``), renames the new one in, then removes the old: a failure at any point
leaves either the old output or the new one, never a mix. Any exception, ``KeyboardInterrupt``
included, removes the temporary directory; one a SIGKILL leaves behind has no record, so it is never
taken for an output, and readers name it in their error.

A single-file output needs no record: the file itself is renamed into place whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .container import CSF_FORMAT_VERSION
from .errors import CheckpointIOError, FormatVersionError, IncompleteOutputError, UsageError

__all__ = [
    "COMPLETION_RECORD",
    "OutputTransaction",
    "check_complete",
    "partial_outputs",
    "tool_version",
]

COMPLETION_RECORD = "csf-complete.json"
_RECORD_KIND = "csf-complete"
_PARTIAL = ".csf-partial-"
_HASH_CHUNK = 8 << 20


def tool_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("csf-codec")
    except PackageNotFoundError:
        return "unknown (not installed)"


def partial_outputs(path: Path) -> list[Path]:
    """Temporary directories that interrupted runs left beside ``path``."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(f".{path.name}{_PARTIAL}*"))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return h.hexdigest()


def _files(root: Path) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, f), root) for f in files]
    return sorted(p for p in out if p != COMPLETION_RECORD)


def _replaceable(path: Path) -> bool:
    """--overwrite replaces whole directories, so only ones that hold an output: an earlier csf output, a
    checkpoint, or nothing."""
    return (path / COMPLETION_RECORD).is_file() or any(path.glob("*.safetensors")) or not any(path.iterdir())


class OutputTransaction:
    """``with OutputTransaction(dst, overwrite=...) as tx:`` write under ``tx.root``; ``tx.commit()`` publishes.

    For a directory output ``tx.root`` is the temporary directory itself; for a single-file output
    (``single_file=True``) write the file at ``tx.file``. Leaving the block without ``commit()``, by
    return or by exception, removes everything written.
    """

    def __init__(self, dst: str | os.PathLike[str], *, overwrite: bool, single_file: bool = False):
        self.dst = Path(dst)
        self.overwrite = overwrite
        self.single_file = single_file
        self.root = self.dst.parent / f".{self.dst.name}{_PARTIAL}{os.getpid()}"
        self.committed = False

    @property
    def file(self) -> Path:
        return self.root / self.dst.name

    def __enter__(self) -> OutputTransaction:
        if self.dst.exists() or self.dst.is_symlink():
            if not self.overwrite:
                raise UsageError("", "exists (pass overwrite=True / --overwrite to replace it)", file=self.dst)
            if self.single_file != self.dst.is_file():
                kind = "a file" if self.dst.is_file() else "a directory"
                raise UsageError("", f"exists and is {kind}; the output is not", file=self.dst)
            if not self.single_file and not _replaceable(self.dst):
                raise UsageError(
                    "",
                    "exists and is not a checkpoint (no completion record, no *.safetensors): refusing to replace it",
                    file=self.dst,
                )
        try:
            self.dst.parent.mkdir(parents=True, exist_ok=True)
            if self.root.exists():  # left by an earlier process that had this pid
                shutil.rmtree(self.root)
            self.root.mkdir()
        except OSError as e:
            raise CheckpointIOError.from_os(e, file=self.root) from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            shutil.rmtree(self.root, ignore_errors=True)

    def commit(self, *, kind: str) -> None:
        """fsync, write the completion record (directories), rename into place."""
        try:
            if self.single_file:
                _fsync(self.file)
                os.replace(self.file, self.dst)
                self.root.rmdir()
            else:
                self._write_record(kind)
                self._swap()
            _fsync(self.dst.parent)
        except OSError as e:
            raise CheckpointIOError.from_os(e, file=e.filename or self.dst) from None
        self.committed = True

    def _write_record(self, kind: str) -> None:
        files = []
        for rel in _files(self.root):
            p = self.root / rel
            _fsync(p)
            files.append({"path": rel, "size": p.stat().st_size, "sha256": _sha256(p)})
        record = {
            "record": _RECORD_KIND,
            "format_version": CSF_FORMAT_VERSION,
            "tool": "csf-codec",
            "tool_version": tool_version(),
            "kind": kind,
            "files": files,
        }
        path = self.root / COMPLETION_RECORD
        with open(path, "w") as f:
            f.write(json.dumps(record, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for dirpath, _dirs, _names in os.walk(self.root):
            _fsync(Path(dirpath))

    def _swap(self) -> None:
        if not self.dst.exists():
            os.rename(self.root, self.dst)
            return
        old = self.dst.parent / f".{self.dst.name}.csf-old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(self.dst, old)
        try:
            os.rename(self.root, self.dst)
        except BaseException:
            os.rename(old, self.dst)
            raise
        shutil.rmtree(old, ignore_errors=True)


def _stale_note(root: Path) -> str:
    stale = partial_outputs(root)
    if not stale:
        return ""
    return f"; an interrupted run left {', '.join(p.name for p in stale)} beside it (incomplete: remove it)"


def check_complete(
    root: str | os.PathLike[str], *, hashes: bool, on_bytes: Callable[[int], None] | None = None
) -> dict:
    """Refuse a directory output without a valid completion record, or whose files disagree with it.

    Sizes are always checked (and that no file is missing or unlisted); ``hashes`` adds every SHA-256.
    Returns the record.
    """
    root = Path(root)
    path = root / COMPLETION_RECORD
    if not path.is_file():
        raise IncompleteOutputError(
            "",
            f"no completion record {COMPLETION_RECORD}: not a finished csf output (interrupted, or written by "
            f"another tool){_stale_note(root)}",
            file=root,
        )
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IncompleteOutputError("", f"{COMPLETION_RECORD} is not JSON: {e}", file=root) from None
    except OSError as e:
        raise CheckpointIOError.from_os(e, file=path) from None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, list) or record.get("record") != _RECORD_KIND:
        raise IncompleteOutputError("", f"{COMPLETION_RECORD} is not a csf completion record", file=root)
    if record.get("format_version") != CSF_FORMAT_VERSION:
        raise FormatVersionError(
            COMPLETION_RECORD,
            f"format_version {record.get('format_version')!r}; this build reads version {CSF_FORMAT_VERSION}",
            file=root,
        )
    listed: dict[str, dict] = {}
    for f in files:
        rel = f.get("path") if isinstance(f, dict) else None
        if (
            not isinstance(rel, str)
            or os.path.isabs(rel)
            or ".." in Path(rel).parts
            or not isinstance(f.get("size"), int)
            or not isinstance(f.get("sha256"), str)
        ):
            raise IncompleteOutputError("", f"{COMPLETION_RECORD} has a malformed entry {f!r}", file=root)
        listed[rel] = f
    present = set(_files(root))
    missing, unlisted = sorted(set(listed) - present), sorted(present - set(listed))
    if missing or unlisted:
        what = f"missing {missing[:5]}" if missing else f"files it does not list {unlisted[:5]} (stale?)"
        raise IncompleteOutputError("", f"{COMPLETION_RECORD} disagrees with the directory: {what}", file=root)
    for rel, f in listed.items():
        size = (root / rel).stat().st_size
        if size != f["size"]:
            raise IncompleteOutputError(rel, f"{size} bytes, the completion record says {f['size']}", file=root)
        if hashes and _sha256(root / rel, on_bytes) != f["sha256"]:
            raise IncompleteOutputError(rel, "SHA-256 differs from the completion record", file=root)
    return record
