"""What a cache is built for: the pinned toolchain, the target, and the hash of the kernel sources.

The runtime derives the same cache key from the installed package files without importing triton or
cutlass, so a cache built for other sources, another toolchain, target or manifest format is never picked up.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from csf_kernels.runtime.manifest import MANIFEST_VERSION

__all__ = ["TARGET", "TOOLCHAIN", "cache_key", "installed_toolchain", "sources_hash"]

TOOLCHAIN = {"triton": "3.6.0", "nvidia-cutlass-dsl": "4.8.1"}
TARGET = {"arch": "sm_90a", "compute_capability": [9, 0]}

_PKG = Path(__file__).resolve().parents[1]
# Kernel sources (every operation's device code and the record decoders), how they are compiled, and the format and
# operand layouts they implement: any change is a new cache key.
_SOURCE_GLOBS = (
    "*/kernels/**/*.py",
    "record/**/*.py",
    "runtime/pdl.py",
    "catalog.yaml",
    "aot/compile_*.py",
    "aot/cute_export.py",
    "mla/layout.py",
    "moe/fp4_words.py",
    # the engine programs read these layouts and tile constants while they are traced
    "moe/engine_panels.py",
    "moe/engine_rows.py",
    "moe/engine_specs.py",
    "moe/w4a8_specs.py",
    "moe/w4a8_panels.py",
)
_CODEC_FORMAT_MODULES = (
    "inline.py",
    "tile_layout.py",
    "compact.py",
    "bitfields.py",
    "container.py",
    "record_layout.py",
    "engine_record_layout.py",
)


@lru_cache(maxsize=1)
def sources_hash() -> str:
    import csf_codec

    files = sorted({p for g in _SOURCE_GLOBS for p in _PKG.glob(g) if p.is_file()})
    codec_dir = Path(csf_codec.__file__).resolve().parent
    files += [codec_dir / m for m in _CODEC_FORMAT_MODULES]
    h = hashlib.sha256()
    for f in files:
        rel = f.relative_to(_PKG) if f.is_relative_to(_PKG) else Path("csf_codec") / f.name
        h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key() -> str:
    from csf_codec import CSF_FORMAT_VERSION

    doc = {
        "sources": sources_hash(),
        "toolchain": TOOLCHAIN,
        "target": TARGET,
        "csf_format": CSF_FORMAT_VERSION,
        "manifest": MANIFEST_VERSION,  # a new manifest format is a new cache (builders rebuild a key they lack)
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:20]


def installed_toolchain() -> dict[str, str | None]:
    """Versions actually installed (build time only: reads package metadata, imports nothing)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in TOOLCHAIN:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
