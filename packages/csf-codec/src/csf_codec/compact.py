"""The compact CSF form: the smallest lossless form, for checkpoints and bulk expansion.

A plane of R rows (experts x N, flattened) and C scale columns is stored as five body sections
(docs/csf-format.md has the normative description):

1. ``base codes``: one 2-bit code per row, four per byte: 0 = same base as the row above, 1 = +1,
   2 = -1, 3 = escape (the base is the next byte of section 2). Row 0 of every 128-row segment is an
   escape, so segments decode independently (one GPU program per segment).
2. ``escapes``: the escaped base bytes, in row order.
3. ``selectors``: R*C fields of ``width`` bits, row-major: scale = base + field for in-window scales.
   An exception's field holds which side of the window its value lies on and, for w > 1, its distance
   up to 2**(w-1) (:mod:`csf_codec.compact_code`).
4. ``chunk counts``: the flat plane is cut into 256-scale chunks; one byte each: the number n of
   exceptions (scales outside their row's window), or 255 = raw chunk (where listing would not save).
5. ``exceptions``: the listed chunks' position codes and far flags, bit-packed (each chunk's size a
   function of its count, so any chunk is found by a prefix sum); the raw chunks' native bytes; the
   far exceptions' 3-bit distance codes; the bytes of the farthest ones.

The encoder picks the offset width (1, 2 or 4 bits) that gives the smallest payload. Encoding is plain
deterministic torch, so it produces the same bytes on the CPU and on a GPU.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .bitfields import packed_nbytes, unpack_fields
from .compact_code import CHUNK, MAX_LISTED, RAW
from .compact_decode_c import decode_rows_c, scan_bases_c
from .compact_np import chunk_lengths_np, chunk_table, encode_body_np
from .compact_torch import ChunkTableT, chunk_lengths, chunk_table_torch, decode_torch, encode_torch
from .container import HEADER_BYTES, Envelope, open_envelope, plane_digest, seal, seal_in_place
from .errors import CorruptPayloadError, ShapeMismatchError, VerificationError
from .formats import ScaleFormat, scale_format
from .planes import as_rows
from .swar import unpack_bits

__all__ = [
    "CHUNK_SCALES",
    "SEGMENT_ROWS",
    "CompactHeader",
    "CompactLayout",
    "CompactScales",
    "compact_layout",
    "decode_compact",
    "decode_compact_digest",
    "encode_compact",
    "read_compact_header",
]

MAGIC = b"CSFc"
SEGMENT_ROWS = 128
CHUNK_SCALES = CHUNK
RAW_CHUNK = RAW
_SAME, _UP, _DOWN, _ESCAPE = 0, 1, 2, 3
_WIDTHS = (1, 2, 4)


@dataclass(frozen=True, kw_only=True)
class CompactHeader:
    fmt: ScaleFormat
    shape: tuple[int, ...]
    width: int
    sections: tuple[int, ...]

    version: int


@dataclass(frozen=True, kw_only=True)
class CompactScales:
    """A compact-form plane: ``payload`` is self-describing (header, checksums, geometry)."""

    payload: torch.Tensor
    shape: tuple[int, ...]
    fmt: ScaleFormat
    width: int

    @property
    def nbytes(self) -> int:
        return int(self.payload.numel())

    @classmethod
    def from_payload(cls, payload: torch.Tensor, *, name: str = "scales") -> CompactScales:
        """Wrap a stored payload after checking its header (the body is checked when decoded)."""
        head = read_compact_header(payload, name=name)
        return cls(payload=payload, shape=head.shape, fmt=head.fmt, width=head.width)

    @property
    def native_nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def encode_compact(
    plane: torch.Tensor,
    fmt: ScaleFormat | str,
    *,
    name: str = "scales",
    widths: tuple[int, ...] = _WIDTHS,
    verify: bool = True,
) -> CompactScales:
    """Encode a native scale plane (uint8 [N, KB] or [E, N, KB]) into the compact form.

    ``verify`` (the default) decodes the result and compares it byte for byte with ``plane``.
    """
    fmt = scale_format(fmt)
    rows, shape = as_rows(plane, name=name)
    if rows.device.type == "cpu":
        with ThreadPoolExecutor(1) as pool:  # hashlib releases the GIL: the digest overlaps the encoding
            digest = pool.submit(plane_digest, rows)
            width, sections, payload = encode_body_np(rows.numpy(), tuple(widths), HEADER_BYTES)  # in place
            env = Envelope(magic=MAGIC, fmt=fmt, param=width, shape=shape, extra=0, sections=sections)
            sealed = seal_in_place(env, torch.from_numpy(payload), digest=digest.result())
    else:
        width, body, sections = encode_torch(rows, tuple(widths))
        env = Envelope(magic=MAGIC, fmt=fmt, param=width, shape=shape, extra=0, sections=sections)
        sealed = seal(env, body, digest=plane_digest(rows))
    out = CompactScales(payload=sealed, shape=shape, fmt=fmt, width=width)
    if verify:
        back = decode_compact(out.payload, name=name)
        if not torch.equal(back, rows.view(shape)):
            raise VerificationError(name, "compact encoding does not decode to the native bytes")
    return out


def _encode_torch(rows: torch.Tensor, widths: tuple[int, ...]) -> tuple[int, torch.Tensor, tuple[int, ...]]:
    """The compact body in torch, on the plane's device (the numpy path's reference on the CPU)."""
    return encode_torch(rows, widths)


def read_compact_header(payload: torch.Tensor, *, name: str = "scales") -> CompactHeader:
    env, _ = open_envelope(payload, MAGIC, name=name, check_body=False)
    return _header(env, name)


def _header(env: Envelope, name: str) -> CompactHeader:
    if env.param not in _WIDTHS:
        raise CorruptPayloadError(name, f"impossible offset width {env.param}")
    return CompactHeader(fmt=env.fmt, shape=env.shape, width=env.param, sections=env.sections, version=env.version)


@dataclass(frozen=True, kw_only=True)
class CompactLayout:
    """A compact payload checked structurally, as views: what the decoder and the GPU expander read.

    Everything here is validated (checksums, geometry, section sizes, segment escapes, chunk counts, the
    exception section long enough for the listed streams and raw chunks), so offsets derived from it stay
    inside the payload.
    """

    fmt: ScaleFormat
    shape: tuple[int, ...]
    width: int
    rows: int
    cols: int
    codes: torch.Tensor  # section 1, packed
    escapes: torch.Tensor
    selectors: torch.Tensor
    counts: torch.Tensor  # section 4, uint8
    exceptions: torch.Tensor
    base_codes: torch.Tensor  # uint8 [rows], unpacked
    table: ChunkTableT  # where each chunk's exceptions lie in ``exceptions``


def compact_layout(
    payload: torch.Tensor | CompactScales, *, name: str = "scales", expected_shape: tuple[int, ...] | None = None
) -> CompactLayout:
    """Open and structurally validate a compact payload (see :class:`CompactLayout`)."""
    if isinstance(payload, CompactScales):
        payload = payload.payload
    env, body = open_envelope(payload, MAGIC, name=name)
    head = _header(env, name)
    if expected_shape is not None and tuple(expected_shape) != head.shape:
        raise ShapeMismatchError(name, f"payload holds a plane of shape {head.shape}, expected {tuple(expected_shape)}")
    shape, w = head.shape, head.width
    c = shape[-1]
    r = 1
    for dim in shape[:-1]:
        r *= dim
    total = r * c
    # sizes first, in Python integers: a forged geometry must fail here, before anything is allocated
    want = (packed_nbytes(r, 2), None, packed_nbytes(total, w), -(-total // CHUNK_SCALES), None)
    for i, (got, exp) in enumerate(zip(head.sections, want, strict=True)):
        if exp is not None and got != exp:
            raise CorruptPayloadError(name, f"section {i} holds {got} bytes, the geometry {shape} needs {exp}")
    bounds = torch.tensor((0, *head.sections), dtype=torch.int64).cumsum(0).tolist()
    sec = [body[bounds[i] : bounds[i + 1]] for i in range(5)]
    # the per-row and per-chunk checks below read numpy arrays for CPU payloads (no torch intra-op thread
    # handoffs, which stall on a shared machine) and tensors elsewhere: the same expressions serve both
    host = body.device.type == "cpu"
    if host:
        codes = unpack_bits(sec[0].numpy(), 2, r)
        counts, chunk_len = sec[3].numpy(), chunk_lengths_np(total)
    else:
        codes = unpack_fields(sec[0], 2, r)
        counts, chunk_len = sec[3].to(torch.int64), chunk_lengths(total, body.device)
    if r and bool((codes[::SEGMENT_ROWS] != _ESCAPE).any()):
        raise CorruptPayloadError(name, "a 128-row segment does not start with an escaped base")
    escapes = int((codes == _ESCAPE).sum())
    if escapes != sec[1].numel():
        raise CorruptPayloadError(name, f"{escapes} escaped bases announced, {sec[1].numel()} stored")
    if bool(((counts != RAW_CHUNK) & ((counts > chunk_len) | (counts > MAX_LISTED))).any()):
        raise CorruptPayloadError(name, "a chunk lists more exceptions than it has scales")
    if host:
        table = ChunkTableT.from_numpy(chunk_table(counts, chunk_len))
        codes = torch.from_numpy(codes)
    else:
        table = chunk_table_torch(counts, chunk_len)
    if table.raw_end > sec[4].numel():
        raise CorruptPayloadError(
            name, f"exception section holds {sec[4].numel()} bytes, its chunks need at least {table.raw_end}"
        )
    return CompactLayout(
        fmt=head.fmt,
        shape=shape,
        width=w,
        rows=r,
        cols=c,
        codes=sec[0],
        escapes=sec[1],
        selectors=sec[2],
        counts=sec[3],
        exceptions=sec[4],
        base_codes=codes,
        table=table,
    )


def decode_compact(
    payload: torch.Tensor | CompactScales,
    *,
    name: str = "scales",
    expected_shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Decode a compact payload to its native plane (uint8, on the payload's device).

    Raises :class:`CorruptPayloadError`, :class:`FormatVersionError` or :class:`ShapeMismatchError`
    naming ``name``; every index is validated before use, so no input reads out of bounds.
    """
    return decode_compact_digest(payload, name=name, expected_shape=expected_shape, digest=False)[0]


def decode_compact_digest(
    payload: torch.Tensor | CompactScales,
    *,
    name: str = "scales",
    expected_shape: tuple[int, ...] | None = None,
    digest: bool = True,
) -> tuple[torch.Tensor, bytes | None]:
    """:func:`decode_compact`, and the restored plane's SHA-256 (:func:`csf_codec.container.plane_digest`)
    when ``digest``. On the CPU the plane is hashed span by span as the decoder finishes each span, so
    hashing overlaps decoding."""
    lay = compact_layout(payload, name=name, expected_shape=expected_shape)
    r, c, w = lay.rows, lay.cols, lay.width
    if lay.codes.device.type != "cpu":
        bases = _scan_bases(lay.base_codes, lay.base_codes == _ESCAPE, lay.escapes)
        if r and (int(bases.min()) < 0 or int(bases.max()) > 256 - (1 << w)):
            raise CorruptPayloadError(name, "a row base leaves the byte range of its window")
        plane = _decode_torch(lay, bases, name)
        return plane, plane_digest(plane) if digest else None
    bases = scan_bases_c(lay.base_codes.numpy(), lay.escapes.numpy())
    if r and (int(bases.min()) < 0 or int(bases.max()) > 256 - (1 << w)):
        raise CorruptPayloadError(name, "a row base leaves the byte range of its window")
    hasher = hashlib.sha256() if digest else None
    sec = (lay.selectors.numpy(), lay.table.numpy(), lay.exceptions.numpy())
    plane = torch.from_numpy(decode_rows_c(bases, *sec, r, c, w, name, hasher)).reshape(lay.shape)
    return plane, hasher.digest() if digest else None


def _decode_torch(lay: CompactLayout, bases: torch.Tensor, name: str) -> torch.Tensor:
    """The decoder in torch, on the payload's device (the path for GPU payloads)."""
    return decode_torch(lay, bases, name).reshape(lay.shape)


def _scan_bases(codes: torch.Tensor, is_esc: torch.Tensor, escapes: torch.Tensor) -> torch.Tensor:
    """Row bases from 2-bit delta codes: each row adds its delta to the last escaped base above it."""
    r = codes.numel()
    dev = codes.device
    if r == 0:
        return torch.zeros(0, dtype=torch.int32, device=dev)
    delta = torch.zeros(r, dtype=torch.int32, device=dev)
    delta[codes == _UP] = 1
    delta[codes == _DOWN] = -1
    cum = delta.cumsum(0)
    idx = torch.arange(r, device=dev)
    last_esc = torch.where(is_esc, idx, torch.full_like(idx, -1)).cummax(0).values
    esc_value = torch.zeros(r, dtype=torch.int32, device=dev)
    esc_value[is_esc] = escapes.to(torch.int32)
    return esc_value[last_esc] + cum - cum[last_esc]
