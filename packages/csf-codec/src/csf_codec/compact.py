"""The compact CSF form: the smallest lossless form, for checkpoints and bulk expansion.

A plane of R rows (experts x N, flattened) and C scale columns is stored as five body sections
(docs/csf-format.md has the normative description):

1. ``base codes``: one 2-bit code per row, four per byte: 0 = same base as the row above, 1 = +1,
   2 = -1, 3 = escape (the base is the next byte of section 2). Row 0 of every 128-row segment is an
   escape, so segments decode independently (one GPU program per segment).
2. ``escapes``: the escaped base bytes, in row order.
3. ``selectors``: R*C fields of ``width`` bits, row-major: scale = base + field for in-window scales.
4. ``chunk counts``: the flat plane is cut into 256-scale chunks; one byte each: the number n of
   exceptions (scales outside their row's window) when 2n < chunk length, else 255 = raw chunk.
5. ``exceptions``: per chunk in order, n position bytes (ascending, within the chunk) then n value
   bytes; or, for a raw chunk, the chunk's native bytes.

The encoder picks the offset width (1, 2 or 4 bits) that gives the smallest payload. Encoding is plain
deterministic torch, so it produces the same bytes on the CPU and on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .bitfields import pack_fields, packed_nbytes, unpack_fields
from .compact_np import decode_rows_np, encode_sections_np, scan_bases_np
from .container import HEADER_BYTES, Envelope, open_envelope, plane_digest, seal, seal_in_place
from .errors import CorruptPayloadError, ShapeMismatchError, VerificationError
from .formats import ScaleFormat, scale_format
from .planes import as_rows
from .rowbase import row_bases_for_widths

__all__ = [
    "CHUNK_SCALES",
    "SEGMENT_ROWS",
    "CompactHeader",
    "CompactLayout",
    "CompactScales",
    "compact_layout",
    "decode_compact",
    "encode_compact",
    "read_compact_header",
]

MAGIC = b"CSFc"
SEGMENT_ROWS = 128
CHUNK_SCALES = 256
RAW_CHUNK = 255
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


_SCALES_PER_PASS = 1 << 22  # encoders and decoders walk the plane in row spans of about this many scales


def _row_spans(rows: int, cols: int):
    """Row ranges of a multiple of 256 rows: every section (2-bit codes, w-bit selectors, 256-scale
    chunks, 128-row segments) splits on their boundaries, so spans encode and decode independently."""
    step = 256 * max(1, _SCALES_PER_PASS // (256 * max(cols, 1)))
    for start in range(0, rows, step):
        yield start, min(start + step, rows)


@dataclass(frozen=True)
class _Span:
    """The exception structure of one row span for one offset width."""

    outside: torch.Tensor  # bool [span rows * C]
    counts: torch.Tensor  # int64 [chunks]
    raw: torch.Tensor  # bool [chunks]
    chunk_len: torch.Tensor  # int64 [chunks]
    chunk_bytes: torch.Tensor  # int64 [chunks]


def _chunk_lengths(total: int, device: torch.device) -> torch.Tensor:
    n = (total + CHUNK_SCALES - 1) // CHUNK_SCALES
    lens = torch.full((n,), CHUNK_SCALES, dtype=torch.int64, device=device)
    if n:
        lens[-1] = total - CHUNK_SCALES * (n - 1)
    return lens


def _base_codes(bases: torch.Tensor) -> torch.Tensor:
    b = bases.to(torch.int16)
    delta = torch.zeros_like(b)
    delta[1:] = b[1:] - b[:-1]
    codes = torch.full_like(bases, _ESCAPE)
    codes[delta == 0] = _SAME
    codes[delta == 1] = _UP
    codes[delta == -1] = _DOWN
    codes[::SEGMENT_ROWS] = _ESCAPE
    return codes


def _span(rows: torch.Tensor, bases: torch.Tensor, width: int) -> _Span:
    d = rows.to(torch.int16) - bases.to(torch.int16)[:, None]
    outside = ((d < 0) | (d >= (1 << width))).reshape(-1)
    total = outside.numel()
    chunk_len = _chunk_lengths(total, rows.device)
    padded = torch.nn.functional.pad(outside, (0, chunk_len.numel() * CHUNK_SCALES - total))
    counts = padded.view(-1, CHUNK_SCALES).sum(dim=1, dtype=torch.int64)
    raw = 2 * counts >= chunk_len
    return _Span(outside, counts, raw, chunk_len, torch.where(raw, chunk_len, 2 * counts))


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    if x.numel() > 1:
        out[1:] = x.cumsum(0)[:-1]
    return out


def _span_sections(rows: torch.Tensor, bases: torch.Tensor, sp: _Span, width: int) -> tuple[torch.Tensor, ...]:
    """Selectors, chunk counts and exception bytes of one row span."""
    flat = rows.reshape(-1)
    dev = rows.device
    d = (rows.to(torch.int16) - bases.to(torch.int16)[:, None]).reshape(-1)
    selectors = pack_fields(torch.where(sp.outside, torch.zeros_like(d), d).to(torch.uint8), width)
    counts = torch.where(sp.raw, torch.full_like(sp.counts, RAW_CHUNK), sp.counts).to(torch.uint8)
    exc = torch.zeros(int(sp.chunk_bytes.sum()), dtype=torch.uint8, device=dev)
    offsets = _exclusive_cumsum(sp.chunk_bytes)
    chunk_of = torch.arange(flat.numel(), device=dev) // CHUNK_SCALES
    in_raw = sp.raw[chunk_of] if flat.numel() else torch.zeros(0, dtype=torch.bool, device=dev)
    raw_idx = in_raw.nonzero().squeeze(1)  # raw chunks: their native bytes
    exc[offsets[chunk_of[raw_idx]] + raw_idx % CHUNK_SCALES] = flat[raw_idx]
    # listed chunks: positions, then values (nonzero() is ordered, so ranks ascend within a chunk)
    idx = (sp.outside & ~in_raw).nonzero().squeeze(1)
    ch = chunk_of[idx]
    listed = torch.where(sp.raw, torch.zeros_like(sp.counts), sp.counts)
    rank = torch.arange(idx.numel(), device=dev) - _exclusive_cumsum(listed)[ch]
    exc[offsets[ch] + rank] = (idx % CHUNK_SCALES).to(torch.uint8)
    exc[offsets[ch] + sp.counts[ch] + rank] = flat[idx]
    return selectors, counts, exc


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
        width, secs = encode_sections_np(rows.numpy(), tuple(widths))
        sections = tuple(int(p.size) for p in secs)
        payload = np.empty(HEADER_BYTES + sum(sections), dtype=np.uint8)  # the body written once, in place
        np.concatenate(secs, out=payload[HEADER_BYTES:])
        env = Envelope(magic=MAGIC, fmt=fmt, param=width, shape=shape, extra=0, sections=sections)
        sealed = seal_in_place(env, torch.from_numpy(payload), digest=plane_digest(rows))
    else:
        width, body, sections = _encode_torch(rows, widths)
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
    r, c = rows.shape
    bases = row_bases_for_widths(rows, widths)
    spans = list(_row_spans(r, c))

    def size(w: int) -> int:
        codes = _base_codes(bases[w])
        n = packed_nbytes(r, 2) + int((codes == _ESCAPE).sum()) + packed_nbytes(r * c, w)
        for a, b in spans:
            sp = _span(rows[a:b], bases[w][a:b], w)
            n += sp.counts.numel() + int(sp.chunk_bytes.sum())
        return n

    width = min(widths, key=lambda w: (size(w), w)) if len(widths) > 1 else widths[0]
    codes = _base_codes(bases[width])
    parts: list[list[torch.Tensor]] = [[pack_fields(codes, 2)], [bases[width][codes == _ESCAPE]], [], [], []]
    for a, b in spans:
        span_rows, span_bases = rows[a:b], bases[width][a:b]
        for i, t in enumerate(_span_sections(span_rows, span_bases, _span(span_rows, span_bases, width), width)):
            parts[2 + i].append(t)
    empty = torch.zeros(0, dtype=torch.uint8, device=rows.device)
    pieces = [torch.cat(p) if p else empty for p in parts]
    return width, torch.cat(pieces), tuple(int(p.numel()) for p in pieces)


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

    Everything here is validated (checksums, geometry, section sizes, segment escapes, chunk counts), so
    offsets derived from it stay inside the payload.
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
    raw: torch.Tensor  # bool [chunks]
    chunk_len: torch.Tensor  # int64 [chunks]
    chunk_offsets: torch.Tensor  # int64 [chunks]: where each chunk's bytes start in ``exceptions``


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
    chunk_len = _chunk_lengths(total, body.device)
    bounds = torch.tensor((0, *head.sections), dtype=torch.int64).cumsum(0).tolist()
    sec = [body[bounds[i] : bounds[i + 1]] for i in range(5)]

    codes = unpack_fields(sec[0], 2, r)
    if r and bool((codes[::SEGMENT_ROWS] != _ESCAPE).any()):
        raise CorruptPayloadError(name, "a 128-row segment does not start with an escaped base")
    escapes = int((codes == _ESCAPE).sum())
    if escapes != sec[1].numel():
        raise CorruptPayloadError(name, f"{escapes} escaped bases announced, {sec[1].numel()} stored")
    counts = sec[3].to(torch.int64)
    raw = counts == RAW_CHUNK
    if bool((~raw & (2 * counts >= chunk_len)).any()):
        raise CorruptPayloadError(name, "a chunk lists more exceptions than a raw chunk would hold")
    chunk_bytes = torch.where(raw, chunk_len, 2 * counts)
    if int(chunk_bytes.sum()) != sec[4].numel():
        raise CorruptPayloadError(
            name, f"exception section holds {sec[4].numel()} bytes, chunk counts need {int(chunk_bytes.sum())}"
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
        raw=raw,
        chunk_len=chunk_len,
        chunk_offsets=_exclusive_cumsum(chunk_bytes),
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
    lay = compact_layout(payload, name=name, expected_shape=expected_shape)
    r, c, w = lay.rows, lay.cols, lay.width
    if lay.codes.device.type == "cpu":
        bases = torch.from_numpy(scan_bases_np(lay.base_codes.numpy(), lay.escapes.numpy()))
    else:
        bases = _scan_bases(lay.base_codes, lay.base_codes == _ESCAPE, lay.escapes)
    if r and (int(bases.min()) < 0 or int(bases.max()) > 256 - (1 << w)):
        raise CorruptPayloadError(name, "a row base leaves the byte range of its window")
    if lay.codes.device.type == "cpu":
        flat = decode_rows_np(
            bases.numpy(),
            lay.selectors.numpy(),
            lay.counts.numpy(),
            lay.exceptions.numpy(),
            lay.chunk_offsets.numpy(),
            r,
            c,
            w,
            name,
        )
        return torch.from_numpy(flat).reshape(lay.shape)
    return _decode_torch(lay, bases, name)


def _decode_torch(lay: CompactLayout, bases: torch.Tensor, name: str) -> torch.Tensor:
    """The decoder in torch, on the payload's device (the path for GPU payloads)."""
    r, c, w = lay.rows, lay.cols, lay.width
    counts = lay.counts.to(torch.int64)
    flat = torch.empty(r * c, dtype=torch.uint8, device=lay.codes.device)
    for a, b in _row_spans(r, c):
        lo, hi = a * c, b * c  # span spans are whole bytes of selectors and whole 256-scale chunks
        fields = unpack_fields(lay.selectors[lo * w // 8 : -(-hi * w // 8)], w, hi - lo).to(torch.int32)
        vals = (bases[a:b, None] + fields.view(b - a, c)).reshape(-1).to(torch.int32)
        c0, c1 = lo // CHUNK_SCALES, -(-hi // CHUNK_SCALES)
        _patch_span(
            vals,
            fields,
            bases[a:b],
            c,
            w,
            counts[c0:c1],
            lay.raw[c0:c1],
            lay.chunk_len[c0:c1],
            lay.chunk_offsets[c0:c1],
            lay.exceptions,
            name,
        )
        flat[lo:hi] = vals.to(torch.uint8)
    return flat.reshape(lay.shape)


def _patch_span(vals, fields, bases, c, w, counts, raw, chunk_len, offsets, exc, name) -> None:
    """Apply one row span's listed exceptions and raw chunks to its decoded values, validating each."""
    dev = vals.device
    listed = torch.where(raw, torch.zeros_like(counts), counts)
    n_listed = int(listed.sum())
    if n_listed:
        ch = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), listed)
        rank = torch.arange(n_listed, device=dev) - _exclusive_cumsum(listed)[ch]
        pos = exc[offsets[ch] + rank].to(torch.int64)
        val = exc[offsets[ch] + counts[ch] + rank]
        if bool((pos >= chunk_len[ch]).any()):
            raise CorruptPayloadError(name, "an exception position lies past the end of its chunk")
        if bool(((ch[1:] == ch[:-1]) & (pos[1:] <= pos[:-1])).any()):
            raise CorruptPayloadError(name, "exception positions are not strictly ascending")
        where = ch * CHUNK_SCALES + pos
        if bool((fields[where] != 0).any()):
            raise CorruptPayloadError(name, "an exception's selector is not zero")
        base = bases[where // c]
        v = val.to(torch.int32)
        if bool(((v >= base) & (v < base + (1 << w))).any()):
            raise CorruptPayloadError(name, "an exception repeats a value its selector could express")
        vals[where] = v
    raw_chunks = raw.nonzero().squeeze(1)
    if raw_chunks.numel():
        lens = chunk_len[raw_chunks]
        ch = torch.repeat_interleave(raw_chunks, lens)
        within = torch.arange(int(lens.sum()), device=dev) - _exclusive_cumsum(lens).repeat_interleave(lens)
        where = ch * CHUNK_SCALES + within
        native = exc[offsets[ch] + within].to(torch.int32)
        d = native - bases[where // c]
        inside = (d >= 0) & (d < (1 << w))
        if bool((fields[where].to(torch.int32) != torch.where(inside, d, 0)).any()):
            raise CorruptPayloadError(name, "a raw chunk's selectors differ from the scales it stores")
        outside = torch.zeros(raw_chunks.numel(), dtype=torch.int64, device=dev)
        outside.index_add_(
            0, torch.repeat_interleave(torch.arange(raw_chunks.numel(), device=dev), lens), (~inside).long()
        )
        if bool((2 * outside < lens).any()):
            raise CorruptPayloadError(name, "a raw chunk holds few enough exceptions to be listed")
        vals[where] = native


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
