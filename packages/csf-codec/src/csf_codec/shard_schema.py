"""The CSF entries of a shard's ``__metadata__``: what each stored scale plane was, checked on read.

A CSF shard's metadata holds ``csf.format_version`` (``"3"``), ``csf.tensors`` (canonical JSON: sorted
keys, no spaces) and ``csf.tensors_sha256``, the SHA-256 of that canonical JSON. Each ``csf.tensors``
entry is keyed by the stored tensor's name and has exactly the fields ``name``, ``dtype``, ``shape``,
``format``, ``values``, ``global_scale`` and ``stored``: ``"csf"`` for a compact payload stored as
``<name>.csf``, ``"native"`` for a plane kept as it was (its payload would not have been smaller) under
its own name. Readers refuse unknown fields, a digest that does not match, and entries that disagree
with the tensors actually stored.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from .container import CSF_FORMAT_VERSION
from .errors import FormatVersionError, MalformedInputError
from .formats import ScaleFormat, scale_format
from .safetensors_io import SafetensorsHeader

__all__ = [
    "CSF_SUFFIX",
    "META_DIGEST",
    "META_TENSORS",
    "META_VERSION",
    "CsfRecord",
    "codec_shape",
    "csf_metadata",
    "csf_records",
]

CSF_SUFFIX = ".csf"
META_VERSION = "csf.format_version"
META_TENSORS = "csf.tensors"
META_DIGEST = "csf.tensors_sha256"
_FIELDS = {"name", "dtype", "shape", "format", "values", "global_scale", "stored"}
_PLANE_DTYPES = {"U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0"}  # scale planes are one byte per scale


@dataclass(frozen=True, kw_only=True)
class CsfRecord:
    """One scale plane as its shard's ``csf.tensors`` metadata describes it."""

    stored_name: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    fmt: ScaleFormat
    values: str | None = None
    global_scale: str | None = None
    native: bool = False  # stored as-is (not smaller as a payload) under its own name

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "format": self.fmt.name,
            "values": self.values,
            "global_scale": self.global_scale,
            "stored": "native" if self.native else "csf",
        }

    @property
    def codec_shape(self) -> tuple[int, ...]:
        return codec_shape(self.shape)


def codec_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The codec takes [N, KB] or [E, N, KB]; deeper planes fold their leading dims into E."""
    return tuple(shape) if len(shape) <= 3 else (math.prod(shape[:-2]), *shape[-2:])


def _canonical(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def csf_metadata(metadata: dict[str, str], records: list[CsfRecord]) -> dict[str, str]:
    """A shard's metadata with its CSF entries (the original keys kept; none added without records)."""
    meta = {k: v for k, v in metadata.items() if k not in (META_VERSION, META_TENSORS, META_DIGEST)}
    if records:
        text = _canonical({r.stored_name: r.as_json() for r in records})
        meta[META_VERSION] = str(CSF_FORMAT_VERSION)
        meta[META_TENSORS] = text
        meta[META_DIGEST] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return meta


def _first_name(raw: object) -> str:
    """The original name of a shard's first CSF tensor, for errors about the shard as a whole."""
    if isinstance(raw, dict) and raw:
        stored, d = next(iter(raw.items()))
        return str(d.get("name", stored)) if isinstance(d, dict) else str(stored)
    return "__metadata__"


def csf_records(header: SafetensorsHeader) -> dict[str, CsfRecord]:
    """The CSF records of one shard by stored name ({} for a native shard), every rule checked."""
    meta, path = header.metadata, header.path
    if META_VERSION not in meta:
        if META_TENSORS in meta or META_DIGEST in meta:
            raise MalformedInputError("__metadata__", f"{META_TENSORS} without {META_VERSION}", file=path)
        return {}
    text = meta.get(META_TENSORS, "")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise MalformedInputError("__metadata__", f"{META_TENSORS} is not JSON: {e}", file=path) from None
    version = meta[META_VERSION]
    if version != str(CSF_FORMAT_VERSION):
        raise FormatVersionError(
            _first_name(raw),
            f"declares {META_VERSION}={version!r}; this build reads version {CSF_FORMAT_VERSION}",
            file=path,
        )
    if not isinstance(raw, dict):
        raise MalformedInputError("__metadata__", f"{META_TENSORS} must be a JSON object", file=path)
    if hashlib.sha256(_canonical(raw).encode("utf-8")).hexdigest() != meta.get(META_DIGEST):
        raise MalformedInputError(
            "__metadata__", f"{META_TENSORS} does not match {META_DIGEST} (damaged or edited metadata)", file=path
        )
    records = {stored: _record(header, stored, d) for stored, d in raw.items()}
    names = [r.name for r in records.values()]
    if len(set(names)) != len(names):
        raise MalformedInputError("__metadata__", f"{META_TENSORS} names a tensor twice", file=path)
    return records


def _record(header: SafetensorsHeader, stored: str, d: object) -> CsfRecord:
    path = header.path

    def bad(fault: str) -> MalformedInputError:
        return MalformedInputError(stored, f"{META_TENSORS} entry: {fault}", file=path)

    if not isinstance(d, dict) or set(d) != _FIELDS:
        raise bad(f"must have exactly the fields {sorted(_FIELDS)}")
    shape = d["shape"]
    if not isinstance(shape, list) or not 2 <= len(shape) or not all(type(x) is int and x >= 0 for x in shape):
        raise bad(f"shape {shape!r} is not a plane shape")
    if d["dtype"] not in _PLANE_DTYPES:
        raise bad(f"dtype {d['dtype']!r} is not a one-byte scale dtype")
    if not isinstance(d["name"], str) or d["stored"] not in ("csf", "native"):
        raise bad("name must be a string and stored 'csf' or 'native'")
    if not all(d[k] is None or isinstance(d[k], str) for k in ("values", "global_scale")):
        raise bad("values and global_scale must be strings or null")
    try:
        fmt = scale_format(d["format"])
    except (ValueError, TypeError):
        raise bad(f"unknown format {d['format']!r}") from None
    rec = CsfRecord(
        stored_name=stored,
        name=d["name"],
        dtype=d["dtype"],
        shape=tuple(shape),
        fmt=fmt,
        values=d["values"],
        global_scale=d["global_scale"],
        native=d["stored"] == "native",
    )
    info = header.tensors.get(stored)
    if info is None:
        raise bad("listed but not stored")
    if rec.native:
        if stored != rec.name or (info.dtype, info.shape) != (rec.dtype, rec.shape):
            raise bad(f"a native plane must be stored as itself; found {info.dtype} {list(info.shape)}")
    elif stored != rec.name + CSF_SUFFIX or info.dtype != "U8" or len(info.shape) != 1:
        raise bad(f"a CSF payload is stored as <name>{CSF_SUFFIX}, U8 1-D; found {info.dtype} {list(info.shape)}")
    return rec
