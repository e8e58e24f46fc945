"""The self-describing envelope around every serialized CSF plane.

Layout (little-endian): a 76-byte header, then the body::

    0  magic      4s   b"CSFc" (compact) or b"CSFi" (inline)
    4  version    u16  CSF_FORMAT_VERSION
    6  format     u8   ScaleFormat.code (1 = MXFP4, 2 = NVFP4)
    7  param      u8   compact: offset width; inline: record bytes / 16
    8  ndim       u8   2 or 3
    9  reserved   3x
    12 dims       3 x u32 (unused trailing dims are 0)
    24 extra      u32  inline: rows per tiling group; compact: 0
    28 sections   5 x u64 byte lengths of the body's sections, in order (unused ones are 0)
    68 body_crc   u32  CRC-32 of the body
    72 head_crc   u32  CRC-32 of bytes 0..71

Every reader checks magic, version, header CRC, geometry, exact section lengths and the body CRC
before it interprets a single body byte, so a damaged payload fails loudly instead of decoding wrong.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import torch

from .errors import CorruptPayloadError, FormatVersionError
from .formats import ScaleFormat, scale_format

__all__ = ["CSF_FORMAT_VERSION", "HEADER_BYTES", "Envelope", "open_envelope", "seal"]

CSF_FORMAT_VERSION = 1
_HEAD = struct.Struct("<4sHBBB3x3II5QI")
HEADER_BYTES = _HEAD.size + 4
MAX_DIM = 1 << 31


@dataclass(frozen=True, kw_only=True)
class Envelope:
    magic: bytes
    version: int = CSF_FORMAT_VERSION
    fmt: ScaleFormat
    param: int
    shape: tuple[int, ...]
    extra: int
    sections: tuple[int, ...]


def _crc(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def seal(env: Envelope, body: torch.Tensor) -> torch.Tensor:
    """Prefix ``body`` (uint8 1-D, any device) with its header; returns the payload on body's device."""
    if len(env.sections) > 5 or sum(env.sections) != body.numel():
        raise AssertionError("section lengths do not add up to the body")
    dims = tuple(env.shape) + (0,) * (3 - len(env.shape))
    body_host = body.cpu().numpy().tobytes()
    head = _HEAD.pack(
        env.magic,
        CSF_FORMAT_VERSION,
        env.fmt.code,
        env.param,
        len(env.shape),
        *dims,
        env.extra,
        *env.sections,
        *(0,) * (5 - len(env.sections)),
        _crc(body_host),
    )
    head += struct.pack("<I", _crc(head))
    header = torch.frombuffer(bytearray(head), dtype=torch.uint8).to(body.device)
    return torch.cat([header, body])


def open_envelope(
    payload: torch.Tensor, magic: bytes, *, name: str, check_body: bool = True
) -> tuple[Envelope, torch.Tensor]:
    """Validate a payload's header (and body CRC); return it and the body as a view."""
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
        raise CorruptPayloadError(name, "a CSF payload must be a 1-D uint8 tensor")
    if payload.numel() < HEADER_BYTES:
        raise CorruptPayloadError(
            name, f"truncated payload: {payload.numel()} bytes, the header alone needs {HEADER_BYTES}"
        )
    head = payload[:HEADER_BYTES].cpu().numpy().tobytes()
    fields = _HEAD.unpack(head[: _HEAD.size])
    got_magic, version, fmt_code, param, ndim = fields[:5]
    if got_magic != magic:
        raise CorruptPayloadError(
            name, f"bad magic {got_magic!r}: not a CSF {'compact' if magic == b'CSFc' else 'inline'} payload"
        )
    if version != CSF_FORMAT_VERSION:
        raise FormatVersionError(name, f"CSF format version {version}; this codec reads version {CSF_FORMAT_VERSION}")
    (head_crc,) = struct.unpack("<I", head[_HEAD.size :])
    if head_crc != _crc(head[: _HEAD.size]):
        raise CorruptPayloadError(name, "header checksum mismatch (corrupt header)")
    dims, extra, sections, body_crc = fields[5:8], fields[8], fields[9:14], fields[14]
    try:
        fmt = scale_format(fmt_code)
    except ValueError:
        raise CorruptPayloadError(name, f"unknown scale format code {fmt_code}") from None
    if ndim not in (2, 3) or any(d >= MAX_DIM for d in dims) or any(dims[ndim:]):
        raise CorruptPayloadError(name, f"impossible geometry: ndim {ndim}, dims {dims}")
    body_len = payload.numel() - HEADER_BYTES
    if sum(sections) != body_len:
        fault = "truncated payload" if sum(sections) > body_len else "trailing bytes after the payload"
        raise CorruptPayloadError(name, f"{fault}: header promises {sum(sections)} body bytes, found {body_len}")
    body = payload[HEADER_BYTES:]
    if check_body and _crc(body.cpu().numpy().tobytes()) != body_crc:
        raise CorruptPayloadError(name, "body checksum mismatch (corrupt payload)")
    env = Envelope(
        magic=got_magic,
        version=version,
        fmt=fmt,
        param=param,
        shape=tuple(dims[:ndim]),
        extra=extra,
        sections=tuple(sections),
    )
    return env, body
