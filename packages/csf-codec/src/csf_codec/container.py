"""The self-describing envelope around every serialized CSF plane.

Layout (little-endian): a 108-byte header, then the body::

    0   magic      4s   b"CSFc" (compact) or b"CSFi" (inline)
    4   version    u16  CSF_FORMAT_VERSION
    6   format     u8   ScaleFormat.code (1 = MXFP4, 2 = NVFP4)
    7   param      u8   compact: offset width; inline: 0
    8   ndim       u8   2 or 3
    9   reserved   3x   0
    12  dims       3 x u32 (unused trailing dims are 0)
    24  extra      u32  inline: row group and record sizes; compact: 0
    28  sections   5 x u64 byte lengths of the body's sections, in order (unused ones are 0)
    68  digest     32s  SHA-256 of the restored native plane (row-major bytes)
    100 body_crc   u32  CRC-32 of the body
    104 head_crc   u32  CRC-32 of bytes 0..103

Every reader checks magic, version, header CRC, the zero fields, geometry, exact section lengths and
the body CRC before it interprets a single body byte, so a damaged payload fails loudly instead of
decoding wrong. The CRCs catch accidents early; the digest (checked by :mod:`csf_codec.payloads` once
the plane is restored) is what proves the restored plane is the one that was encoded.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from .errors import CorruptPayloadError, FormatVersionError
from .formats import ScaleFormat, scale_format
from .planes import MAX_DIM

__all__ = [
    "CSF_FORMAT_VERSION",
    "DIGEST_BYTES",
    "HEADER_BYTES",
    "Envelope",
    "open_envelope",
    "plane_digest",
    "seal",
    "seal_in_place",
    "stored_digest",
]

CSF_FORMAT_VERSION = 3
DIGEST_BYTES = 32
_HEAD = struct.Struct("<4sHBBB3s3II5Q32sI")
HEADER_BYTES = _HEAD.size + 4
_DIGEST_AT = 68
_COMPACT, _INLINE = b"CSFc", b"CSFi"


@dataclass(frozen=True, kw_only=True)
class Envelope:
    magic: bytes
    version: int = CSF_FORMAT_VERSION
    fmt: ScaleFormat
    param: int
    shape: tuple[int, ...]
    extra: int
    sections: tuple[int, ...]
    digest: bytes = b""  # SHA-256 of the native plane; empty until sealed


def _crc(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def plane_digest(plane: torch.Tensor) -> bytes:
    """SHA-256 of a native plane's bytes in row-major order (any one-byte dtype, any device)."""
    data = plane.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
    return hashlib.sha256(memoryview(data.numpy())).digest()


def _pack(env: Envelope, body_host, digest: bytes) -> bytes:
    dims = tuple(env.shape) + (0,) * (3 - len(env.shape))
    head = _HEAD.pack(
        env.magic,
        CSF_FORMAT_VERSION,
        env.fmt.code,
        env.param,
        len(env.shape),
        b"\0\0\0",
        *dims,
        env.extra,
        *env.sections,
        *(0,) * (5 - len(env.sections)),
        digest,
        _crc(body_host),
    )
    return head + struct.pack("<I", _crc(head))


def seal(env: Envelope, body: torch.Tensor, *, digest: bytes | None = None) -> torch.Tensor:
    """Prefix ``body`` (uint8 1-D, any device) with its header; returns the payload on body's device.

    ``digest`` is the SHA-256 of the native plane the body encodes (:func:`plane_digest`, or ``env.digest``): the
    encoder, which has the plane, passes it.
    """
    payload = torch.empty(HEADER_BYTES + body.numel(), dtype=torch.uint8, device=body.device)
    payload[HEADER_BYTES:] = body
    return seal_in_place(env, payload, digest=digest)


def seal_in_place(env: Envelope, payload: torch.Tensor, *, digest: bytes | None = None) -> torch.Tensor:
    """:func:`seal` for a payload whose body is already in place after ``HEADER_BYTES`` unwritten bytes
    (an encoder that writes its sections there saves a copy of the body); writes the header, returns it."""
    body = payload[HEADER_BYTES:]
    if len(env.sections) > 5 or sum(env.sections) != body.numel():
        raise AssertionError("section lengths do not add up to the body")
    digest = digest or env.digest or None
    if digest is None or len(digest) != DIGEST_BYTES:
        raise AssertionError("a plane digest is 32 bytes of SHA-256")
    head = _pack(env, body.contiguous().cpu().numpy(), digest)  # CPU: a view, no copy
    payload[:HEADER_BYTES] = torch.frombuffer(bytearray(head), dtype=torch.uint8).to(payload.device)
    return payload


def stored_digest(payload: torch.Tensor) -> bytes:
    """The plane digest of a payload whose header :func:`open_envelope` has accepted."""
    return payload[_DIGEST_AT : _DIGEST_AT + DIGEST_BYTES].cpu().numpy().tobytes()


def _form(magic: bytes) -> str:
    return "compact" if magic == _COMPACT else "inline"


def open_envelope(
    payload: torch.Tensor, magic: bytes, *, name: str, check_body: bool = True
) -> tuple[Envelope, torch.Tensor]:
    """Validate a payload's header (and body CRC); return it and the body as a view."""
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
        raise CorruptPayloadError(name, "a CSF payload must be a 1-D uint8 tensor")
    if payload.numel() >= 6:  # magic and version first: an old payload's header has another length
        lead = payload[:6].cpu().numpy().tobytes()
        if lead[:4] != magic:
            raise CorruptPayloadError(name, f"bad magic {lead[:4]!r}: not a CSF {_form(magic)} payload")
        (version,) = struct.unpack("<H", lead[4:6])
        if version != CSF_FORMAT_VERSION:
            raise FormatVersionError(
                name,
                f"CSF format version {version}; this codec reads version {CSF_FORMAT_VERSION}: "
                "decompress it with the csf version that wrote it and re-compress with this csf version",
            )
    if payload.numel() < HEADER_BYTES:
        raise CorruptPayloadError(
            name, f"truncated payload: {payload.numel()} bytes, the header alone needs {HEADER_BYTES}"
        )
    head = payload[:HEADER_BYTES].cpu().numpy().tobytes()
    fields = _HEAD.unpack(head[: _HEAD.size])
    got_magic, version, fmt_code, param, ndim, reserved = fields[:6]
    (head_crc,) = struct.unpack("<I", head[_HEAD.size :])
    if head_crc != _crc(head[: _HEAD.size]):
        raise CorruptPayloadError(name, "header checksum mismatch (corrupt header)")
    dims, extra, sections, digest, body_crc = fields[6:9], fields[9], fields[10:15], fields[15], fields[16]
    if reserved != b"\0\0\0":
        raise CorruptPayloadError(name, f"reserved header bytes {reserved.hex()} are not zero")
    if magic == _COMPACT and extra:
        raise CorruptPayloadError(name, f"unknown compact header field: extra = {extra:#x}, must be 0")
    if magic == _INLINE and param:
        raise CorruptPayloadError(name, f"unknown inline header field: param = {param}, must be 0")
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
    if check_body and _crc(memoryview(np.ascontiguousarray(body.cpu().numpy()))) != body_crc:  # no copy
        raise CorruptPayloadError(name, "body checksum mismatch (corrupt payload)")
    env = Envelope(
        magic=got_magic,
        version=version,
        fmt=fmt,
        param=param,
        shape=tuple(dims[:ndim]),
        extra=extra,
        sections=tuple(sections),
        digest=digest,
    )
    return env, body
