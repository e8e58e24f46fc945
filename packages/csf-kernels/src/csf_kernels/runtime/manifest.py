"""The AOT cache manifest: one JSON per cache key, listing every program with its binary's sha256.

    aot_cache/<cache key>/manifest.json
    aot_cache/<cache key>/programs/<program key>.cubin   (Triton: SASS for sm_90a)
    aot_cache/<cache key>/programs/<program key>.so      (CuTe DSL: exported host code + embedded cubin)

The manifest holds no timestamps, so rebuilding unchanged sources gives identical bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MANIFEST_VERSION", "Artifact", "CacheIntegrityError", "Manifest", "ProgramEntry", "sha256_bytes"]

MANIFEST_VERSION = 1


class CacheIntegrityError(RuntimeError):
    """The AOT cache is stale, built for something else, or tampered with."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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

    def to_json(self) -> dict:
        return {
            "spec": self.spec,
            "kind": self.kind,
            "file": self.file,
            "sha256": self.sha256,
            "bytes": self.nbytes,
            "launch": self.launch,
            "geometries": list(self.geometries),
        }

    @classmethod
    def from_json(cls, key: str, d: dict) -> ProgramEntry:
        return cls(
            key=key,
            spec=d["spec"],
            kind=d["kind"],
            file=d["file"],
            sha256=d["sha256"],
            nbytes=d["bytes"],
            launch=d["launch"],
            geometries=tuple(d.get("geometries", ())),
        )


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
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise CacheIntegrityError(f"unreadable AOT manifest {path}: {e}") from None
        if d.get("csf_aot_manifest") != MANIFEST_VERSION:
            raise CacheIntegrityError(
                f"{path}: manifest version {d.get('csf_aot_manifest')}, expected {MANIFEST_VERSION}"
            )
        try:
            return cls(
                cache_key=d["cache_key"],
                sources_sha256=d["sources_sha256"],
                toolchain=d["toolchain"],
                target=d["target"],
                csf_format=d["csf_format"],
                catalog_sha256=d["catalog_sha256"],
                programs={k: ProgramEntry.from_json(k, e) for k, e in d["programs"].items()},
            )
        except (KeyError, TypeError) as e:
            raise CacheIntegrityError(f"{path}: malformed manifest ({e!r})") from None
