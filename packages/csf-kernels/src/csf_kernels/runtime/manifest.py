"""The AOT cache manifest: one JSON per cache key, listing every program with its binary's sha256.

    aot_cache/<cache key>/manifest.json
    aot_cache/<cache key>/programs/<program key>.cubin   (Triton: SASS for sm_90a)
    aot_cache/<cache key>/programs/<program key>.so      (CuTe DSL: exported host code + embedded cubin)

The manifest holds no timestamps, so rebuilding unchanged sources gives identical bytes. Parsing is strict: a
field missing, unknown or of the wrong type is a :class:`CacheIntegrityError` naming the file and the program.
Each entry is sealed by ``entry_sha256``, the sha256 of its program key and every other field, so an entry
edited or copied under another key is told apart from what the build wrote (what the runtime checks, and in
which order, is ``runtime.integrity``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BUILD_COMMAND",
    "EXTENSIONS",
    "MANIFEST_VERSION",
    "Artifact",
    "CacheIntegrityError",
    "Manifest",
    "ProgramEntry",
    "read_regular_file",
    "sha256_bytes",
]

# 2: entries are sealed (entry_sha256) and parsed strictly; a binary lies at programs/<key>.<ext> exactly
MANIFEST_VERSION = 2
BUILD_COMMAND = "nox -s aot_build"
EXTENSIONS = {"triton_cubin": ".cubin", "cute_so": ".so"}  # program kind -> its binary's file extension

_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENTRY_FIELDS = {"spec", "kind", "file", "sha256", "bytes", "launch", "geometries", "entry_sha256"}
_MANIFEST_FIELDS = {
    "csf_aot_manifest",
    "cache_key",
    "sources_sha256",
    "toolchain",
    "target",
    "csf_format",
    "catalog_sha256",
    "programs",
}


class CacheIntegrityError(RuntimeError):
    """The AOT cache is stale, built for something else, or tampered with."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_regular_file(path: Path, what: str) -> bytes:
    """The bytes of ``path``, which must be a regular file itself (not a link, a directory or a device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CacheIntegrityError(f"{path}: {what} is missing") from None
    except OSError as e:  # ELOOP: a symbolic link
        raise CacheIntegrityError(f"{path}: {what} is not a regular file ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CacheIntegrityError(f"{path}: {what} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        return f.read()


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """What a compiler produced for one program (build time, before it is written)."""

    kind: str  # "triton_cubin" | "cute_so"
    data: bytes
    launch: dict


@dataclass(frozen=True, kw_only=True)
class ProgramEntry:
    key: str
    spec: dict  # kernel, version, facts
    kind: str
    file: str
    sha256: str
    nbytes: int
    launch: dict
    geometries: tuple[str, ...] = ()
    entry_sha256: str = ""  # the seal: sha256 of the key and every field above (see ``seal``)

    @classmethod
    def sealed(cls, **fields) -> ProgramEntry:
        """An entry with its seal computed (what the build writes)."""
        entry = cls(**fields)
        return cls(**{**fields, "entry_sha256": entry.seal()})

    def seal(self) -> str:
        """sha256 of the canonical JSON of the key and every field but the seal itself."""
        doc = {"key": self.key, **self.to_json()}
        del doc["entry_sha256"]
        return sha256_bytes(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())

    def to_json(self) -> dict:
        return {
            "spec": self.spec,
            "kind": self.kind,
            "file": self.file,
            "sha256": self.sha256,
            "bytes": self.nbytes,
            "launch": self.launch,
            "geometries": list(self.geometries),
            "entry_sha256": self.entry_sha256,
        }

    @classmethod
    def from_json(cls, key: str, d: object) -> ProgramEntry:
        """Parse one entry; ValueError says what is malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"the entry is a {type(d).__name__}, not an object")
        if set(d) != _ENTRY_FIELDS:
            missing, unknown = sorted(_ENTRY_FIELDS - set(d)), sorted(set(d) - _ENTRY_FIELDS)
            raise ValueError(f"the entry's fields differ from the format's (missing {missing}, unknown {unknown})")
        _expect(d, "spec", dict)
        _expect(d, "kind", str)
        _expect(d, "file", str)
        _expect(d, "launch", dict)
        _expect(d, "geometries", list)
        for name in ("sha256", "entry_sha256"):
            if not isinstance(d[name], str) or not _SHA256.fullmatch(d[name]):
                raise ValueError(f"{name} is not a lowercase hex sha256: {d[name]!r}")
        if type(d["bytes"]) is not int or d["bytes"] < 0:
            raise ValueError(f"bytes is not a size: {d['bytes']!r}")
        if not all(isinstance(g, str) for g in d["geometries"]):
            raise ValueError("geometries are not all strings")
        return cls(
            key=key,
            spec=d["spec"],
            kind=d["kind"],
            file=d["file"],
            sha256=d["sha256"],
            nbytes=d["bytes"],
            launch=d["launch"],
            geometries=tuple(d["geometries"]),
            entry_sha256=d["entry_sha256"],
        )


def _expect(d: dict, name: str, typ: type) -> None:
    if not isinstance(d[name], typ):
        raise ValueError(f"{name} is a {type(d[name]).__name__}, not a {typ.__name__}")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    cache_key: str
    sources_sha256: str
    toolchain: dict
    target: dict
    csf_format: int
    catalog_sha256: str
    programs: dict[str, ProgramEntry] = field(default_factory=dict)

    def to_json(self) -> str:
        doc = {
            "csf_aot_manifest": MANIFEST_VERSION,
            "cache_key": self.cache_key,
            "sources_sha256": self.sources_sha256,
            "toolchain": self.toolchain,
            "target": self.target,
            "csf_format": self.csf_format,
            "catalog_sha256": self.catalog_sha256,
            "programs": {k: e.to_json() for k, e in sorted(self.programs.items())},
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: Path) -> Manifest:
        raw = read_regular_file(Path(path), "the AOT manifest")
        try:
            d = json.loads(raw)
        except ValueError as e:
            raise CacheIntegrityError(f"{path}: unreadable AOT manifest ({e})") from None
        version = d.get("csf_aot_manifest") if isinstance(d, dict) else None
        if version != MANIFEST_VERSION:
            raise CacheIntegrityError(
                f"{path}: manifest version {version!r}, this runtime reads {MANIFEST_VERSION}; rebuild the cache "
                f"with `{BUILD_COMMAND}`"
            )
        if set(d) != _MANIFEST_FIELDS:
            raise CacheIntegrityError(
                f"{path}: malformed manifest (missing {sorted(_MANIFEST_FIELDS - set(d))}, unknown "
                f"{sorted(set(d) - _MANIFEST_FIELDS)})"
            )
        for name, typ in (("toolchain", dict), ("target", dict), ("programs", dict), ("csf_format", int)):
            if not isinstance(d[name], typ):
                raise CacheIntegrityError(f"{path}: malformed manifest ({name} is a {type(d[name]).__name__})")
        programs = {}
        for key, e in d["programs"].items():
            try:
                programs[key] = ProgramEntry.from_json(key, e)
            except ValueError as err:
                raise CacheIntegrityError(f"{path}: malformed entry for program {key}: {err}") from None
        return cls(
            cache_key=d["cache_key"],
            sources_sha256=d["sources_sha256"],
            toolchain=d["toolchain"],
            target=d["target"],
            csf_format=d["csf_format"],
            catalog_sha256=d["catalog_sha256"],
            programs=programs,
        )
