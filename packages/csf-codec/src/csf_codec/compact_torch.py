"""The compact form in torch, on the plane's device: the encoder and decoder of GPU payloads, and the
reference the numpy coder (:mod:`csf_codec.compact_np`) must match byte for byte.

Whole-plane tensor passes, written for clarity: bit streams are unpacked to one element per bit.
:func:`listed_exceptions` (the positions, far flags, far codes and escaped bytes of every listed chunk,
every rule checked) also gives the GPU expander its per-chunk tables.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .bitfields import pack_fields, packed_nbytes, unpack_fields
from .compact_code import CHUNK, ESCAPE_CODE, FAR_BITS, LISTED_BITS, LOW_BITS, MAX_LISTED, RAW, exact_distances
from .compact_np import ChunkTable
from .errors import CorruptPayloadError
from .rowbase import row_bases_for_widths

__all__ = ["ChunkTableT", "Listed", "chunk_table_torch", "decode_torch", "encode_torch", "listed_exceptions"]

SEGMENT_ROWS = 128
_SAME, _UP, _DOWN, _ESCAPE = 0, 1, 2, 3


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    if x.numel() > 1:
        out[1:] = x.cumsum(0)[:-1]
    return out


def chunk_lengths(total: int, device: torch.device) -> torch.Tensor:
    n = (total + CHUNK - 1) // CHUNK
    lens = torch.full((n,), CHUNK, dtype=torch.int64, device=device)
    if n:
        lens[-1] = total - CHUNK * (n - 1)
    return lens


def _table(t, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(t, dtype=torch.int64).to(device)


def distances(values: torch.Tensor, bases: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(above, distance) of exception bytes from their rows' windows."""
    v, b = values.to(torch.int16), bases.to(torch.int16)
    above = v > b
    return above, torch.where(above, v - b - ((1 << width) - 1), b - v)


def exception_fields(above: torch.Tensor, dist: torch.Tensor, width: int) -> torch.Tensor:
    return (above.to(torch.int16) + ((dist - 1).clamp(max=exact_distances(width)) << 1)).to(torch.uint8)


def _raw_chunks(n, far, esc, lens) -> torch.Tensor:
    bits = _table(LISTED_BITS, n.device)[n.clamp(max=CHUNK)] + FAR_BITS * far + 8 * esc
    return (n > MAX_LISTED) | (bits >= 8 * lens)


@dataclass(frozen=True)
class _Exceptions:
    outside: torch.Tensor  # bool [R*C]
    idx: torch.Tensor  # int64: flat index of each exception
    above: torch.Tensor
    dist: torch.Tensor
    n: torch.Tensor  # per chunk
    far: torch.Tensor
    esc: torch.Tensor
    raw: torch.Tensor


def _exceptions(rows: torch.Tensor, bases: torch.Tensor, width: int) -> _Exceptions:
    c = rows.shape[1]
    d = rows.to(torch.int16) - bases.to(torch.int16)[:, None]
    outside = ((d < 0) | (d >= (1 << width))).reshape(-1)
    idx = outside.nonzero().squeeze(1)
    above, dist = distances(rows.reshape(-1)[idx], bases[idx // c], width)
    k = exact_distances(width)
    lens = chunk_lengths(outside.numel(), rows.device)
    ch = idx // CHUNK

    def per_chunk(mask):
        return torch.bincount(ch[mask], minlength=lens.numel())

    n, far, esc = per_chunk(torch.ones_like(above)), per_chunk(dist >= k + 2), per_chunk(dist >= k + 2 + ESCAPE_CODE)
    return _Exceptions(outside, idx, above, dist, n, far, esc, _raw_chunks(n, far, esc, lens))


@dataclass(frozen=True)
class ChunkTableT:
    """:class:`csf_codec.compact_np.ChunkTable` in torch: where each chunk's exceptions lie."""

    raw: torch.Tensor
    lens: torch.Tensor
    listed: torch.Tensor
    bit_offsets: torch.Tensor
    raw_offsets: torch.Tensor
    stream_bits: int
    stream_bytes: int
    raw_end: int

    @classmethod
    def from_numpy(cls, table: ChunkTable) -> ChunkTableT:
        return cls(*(_as_torch(getattr(table, f.name)) for f in fields(cls)))

    def numpy(self) -> ChunkTable:
        """The same table as numpy arrays (CPU tables only; no copies)."""
        return ChunkTable(*(_as_numpy(getattr(self, f.name)) for f in fields(self)))


def _as_torch(x):
    return torch.from_numpy(x) if hasattr(x, "dtype") else x


def _as_numpy(x):
    return x.numpy() if torch.is_tensor(x) else x


def chunk_table_torch(counts: torch.Tensor, lens: torch.Tensor) -> ChunkTableT:
    counts = counts.to(torch.int64)
    raw = counts == RAW
    listed = torch.where(raw, torch.zeros_like(counts), counts)
    bits = _table(LISTED_BITS, counts.device)[listed.clamp(max=CHUNK)]
    total = int(bits.sum())
    stream_bytes = -(-total // 8)
    raw_lens = torch.where(raw, lens, torch.zeros_like(lens))
    return ChunkTableT(
        raw,
        lens,
        listed,
        exclusive_cumsum(bits),
        stream_bytes + exclusive_cumsum(raw_lens),
        total,
        stream_bytes,
        stream_bytes + int(raw_lens.sum()),
    )


def _bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """[n, width] bool: bit j of each value."""
    return ((values[:, None] >> torch.arange(width, device=values.device)) & 1).bool()


def _pack_stream(nbits: int, ones: torch.Tensor, device) -> torch.Tensor:
    bits = torch.zeros(packed_nbytes(nbits, 1) * 8, dtype=torch.uint8, device=device)
    bits[ones] = 1
    return pack_fields(bits, 1)


def _size(rows, bases, codes, ex: _Exceptions, width: int) -> int:
    r, c = rows.shape
    lens = chunk_lengths(r * c, rows.device)
    listed = ~ex.raw
    bits = int(_table(LISTED_BITS, rows.device)[torch.where(ex.raw, 0, ex.n)].sum())
    exc = -(-bits // 8) + int(lens[ex.raw].sum()) + -(-FAR_BITS * int(ex.far[listed].sum()) // 8)
    exc += int(ex.esc[listed].sum())
    return packed_nbytes(r, 2) + int((codes == _ESCAPE).sum()) + packed_nbytes(r * c, width) + lens.numel() + exc


def base_codes(bases: torch.Tensor) -> torch.Tensor:
    b = bases.to(torch.int16)
    delta = torch.zeros_like(b)
    delta[1:] = b[1:] - b[:-1]
    codes = torch.full_like(bases, _ESCAPE)
    codes[delta == 0] = _SAME
    codes[delta == 1] = _UP
    codes[delta == -1] = _DOWN
    codes[::SEGMENT_ROWS] = _ESCAPE
    return codes


def encode_torch(rows: torch.Tensor, widths: tuple[int, ...]) -> tuple[int, torch.Tensor, tuple[int, ...]]:
    """The width, body and section sizes of the compact form of a uint8 [R, C] plane."""
    r, c = rows.shape
    dev = rows.device
    all_bases = row_bases_for_widths(rows, widths)
    found = {}
    for w in widths:
        ex = _exceptions(rows, all_bases[w], w)
        found[w] = (_size(rows, all_bases[w], base_codes(all_bases[w]), ex, w), ex)
    width = min(widths, key=lambda w: (found[w][0], w))
    ex, bases = found[width][1], all_bases[width]
    codes = base_codes(bases)
    k = exact_distances(width)
    flat = rows.reshape(-1)
    d = (rows.to(torch.int16) - bases.to(torch.int16)[:, None]).reshape(-1)
    fields = torch.where(ex.outside, torch.zeros_like(d), d).to(torch.uint8)
    fields[ex.idx] = exception_fields(ex.above, ex.dist, width)
    counts = torch.where(ex.raw, torch.full_like(ex.n, RAW), ex.n)
    lens = chunk_lengths(r * c, dev)
    table = chunk_table_torch(counts, lens)
    # listed exceptions: positions (unary buckets, low parts) and far flags, at their chunks' bit offsets
    ch = ex.idx // CHUNK
    keep = ~ex.raw[ch]
    idx, dist, ch = ex.idx[keep], ex.dist[keep], ch[keep]
    rank = torch.arange(idx.numel(), device=dev) - exclusive_cumsum(table.listed)[ch]
    pos, n = idx % CHUNK, table.listed[ch]
    low = _table(LOW_BITS, dev)[n]
    o = table.bit_offsets[ch]
    tail = o + n + (CHUNK >> low)
    far = dist >= k + 2
    low_bits = _bits(pos & ((1 << low) - 1), 7) & (torch.arange(7, device=dev) < low[:, None])
    low_at = (tail + rank * low)[:, None] + torch.arange(7, device=dev)
    ones = torch.cat([o + (pos >> low) + rank, low_at[low_bits], (tail + n * low + rank)[far]])
    stream = _pack_stream(table.stream_bits, ones, dev)
    raw_ids = ex.raw.nonzero().squeeze(1)
    raw_lens = lens[raw_ids]
    within = torch.arange(int(raw_lens.sum()), device=dev) - exclusive_cumsum(raw_lens).repeat_interleave(raw_lens)
    raw_at = raw_ids.repeat_interleave(raw_lens) * CHUNK + within
    far_codes = (dist[far] - (k + 2)).clamp(max=ESCAPE_CODE)
    far_ones = (FAR_BITS * torch.arange(far_codes.numel(), device=dev))[:, None] + torch.arange(FAR_BITS, device=dev)
    far_stream = _pack_stream(FAR_BITS * far_codes.numel(), far_ones[_bits(far_codes, FAR_BITS)], dev)
    escaped = flat[idx[far][far_codes == ESCAPE_CODE]]
    sections = [
        pack_fields(codes, 2),
        bases[codes == _ESCAPE],
        pack_fields(fields, width),
        counts.to(torch.uint8),
        torch.cat([stream, flat[raw_at], far_stream, escaped]),
    ]
    return width, torch.cat(sections), tuple(int(p.numel()) for p in sections)


@dataclass(frozen=True)
class Listed:
    """The listed chunks' exceptions, in chunk and position order, every rule of their codes checked."""

    where: torch.Tensor  # int64 flat index
    far: torch.Tensor  # bool
    chunk: torch.Tensor  # int64
    codes: torch.Tensor  # int64, one per far exception, in order
    escaped: torch.Tensor  # uint8, one per escape code, in order
    far_start: int  # byte of the exception section where the far codes begin
    escape_start: int


def _read_bits(bits: torch.Tensor, offsets: torch.Tensor, width: torch.Tensor | int) -> torch.Tensor:
    j = torch.arange(8, device=bits.device)
    at = (offsets[:, None] + j).clamp(max=bits.numel() - 1)
    mask = j < (width[:, None] if torch.is_tensor(width) else width)
    return ((bits[at].to(torch.int64) << j) * mask).sum(1)


def listed_exceptions(table: ChunkTableT, exceptions: torch.Tensor, name: str) -> Listed:
    dev = exceptions.device
    bits = unpack_fields(exceptions[: table.stream_bytes], 1, 8 * table.stream_bytes).bool()
    if bool(bits[table.stream_bits :].any()):
        raise CorruptPayloadError(name, "the padding after the position codes is not zero")
    has = table.listed.nonzero().squeeze(1)
    cnt = table.listed[has]
    starts = table.bit_offsets[has]
    low = _table(LOW_BITS, dev)[cnt]
    tail = starts + cnt + (CHUNK >> low)
    ones = bits.nonzero().squeeze(1)
    which = torch.searchsorted(starts, ones, right=True) - 1
    ok = which >= 0
    ones, which = ones[ok], which[ok]
    ok = ones < tail[which] if which.numel() else ones[:0].bool()
    ones, which = ones[ok], which[ok]
    if not torch.equal(torch.bincount(which, minlength=has.numel()), cnt):
        raise CorruptPayloadError(name, "a chunk's position code does not hold its count of exceptions")
    rank = torch.arange(ones.numel(), device=dev) - exclusive_cumsum(cnt)[which]
    lw = low[which]
    padded = torch.cat([bits, torch.zeros(8, dtype=torch.bool, device=dev)])
    pos = ((ones - starts[which] - rank) << lw) | _read_bits(padded, tail[which] + rank * lw, lw)
    if bool((pos >= table.lens[has][which]).any()):
        raise CorruptPayloadError(name, "an exception position lies past the end of its chunk")
    if bool(((which[1:] == which[:-1]) & (pos[1:] <= pos[:-1])).any()):
        raise CorruptPayloadError(name, "exception positions are not strictly ascending")
    far = padded[tail[which] + cnt[which] * lw + rank]
    n_far = int(far.sum())
    far_end = table.raw_end + -(-FAR_BITS * n_far // 8)
    if far_end > exceptions.numel():
        raise CorruptPayloadError(name, f"exception section holds {exceptions.numel()} bytes, its codes need {far_end}")
    far_bits = unpack_fields(exceptions[table.raw_end : far_end], 1, 8 * (far_end - table.raw_end)).bool()
    if bool(far_bits[FAR_BITS * n_far :].any()):
        raise CorruptPayloadError(name, "the padding after the far codes is not zero")
    codes = _read_bits(far_bits, FAR_BITS * torch.arange(n_far, device=dev), FAR_BITS)
    need = far_end + int((codes == ESCAPE_CODE).sum())
    if need != exceptions.numel():
        raise CorruptPayloadError(name, f"exception section holds {exceptions.numel()} bytes, its codes need {need}")
    chunk = has[which]
    return Listed(chunk * CHUNK + pos, far, chunk, codes, exceptions[far_end:], table.raw_end, far_end)


def exception_values(field, base, far, codes, escaped, width: int, name: str) -> torch.Tensor:
    """Exception bytes from their fields, far flags, far codes and escaped bytes (every rule checked)."""
    k = exact_distances(width)
    above, step = (field & 1).bool(), (field >> 1).to(torch.int16)
    if bool((far & (step < k)).any()):
        raise CorruptPayloadError(name, "an exception placed by its selector is flagged far")
    dist = step + 1 + far.to(torch.int16)
    dist[far] += codes.to(torch.int16)
    esc = torch.zeros_like(far)
    esc[far] = codes == ESCAPE_CODE
    base = base.to(torch.int16)
    value = torch.where(above, base + ((1 << width) - 1) + dist, base - dist)
    if bool(esc.any()):
        s, d = distances(escaped, base[esc], width)
        if bool((s != above[esc]).any() or (d < k + 2 + ESCAPE_CODE).any()):
            raise CorruptPayloadError(name, "an escaped exception byte lies within reach of its far code")
        value[esc] = escaped.to(torch.int16)
    if bool(((value < 0) | (value > 255)).any()):
        raise CorruptPayloadError(name, "an exception's value leaves the byte range")
    return value.to(torch.uint8)


def decode_torch(lay, bases: torch.Tensor, name: str) -> torch.Tensor:
    """The native plane of a structurally validated layout (:class:`csf_codec.compact.CompactLayout`)."""
    r, c, w = lay.rows, lay.cols, lay.width
    dev = lay.selectors.device
    fields = unpack_fields(lay.selectors, w, r * c)
    base = bases.to(torch.uint8).repeat_interleave(c) if r * c else fields
    vals = base + fields
    table = lay.table
    listed = listed_exceptions(table, lay.exceptions, name)
    at = listed.where
    vals[at] = exception_values(fields[at], base[at], listed.far, listed.codes, listed.escaped, w, name)
    raw_ids = table.raw.nonzero().squeeze(1)
    if raw_ids.numel():
        lens = table.lens[raw_ids]
        within = torch.arange(int(lens.sum()), device=dev) - exclusive_cumsum(lens).repeat_interleave(lens)
        at = raw_ids.repeat_interleave(lens) * CHUNK + within
        native = lay.exceptions[table.raw_offsets[raw_ids].repeat_interleave(lens) + within]
        b = base[at]
        d = native.to(torch.int16) - b.to(torch.int16)
        outside = (d < 0) | (d >= (1 << w))
        above, dist = distances(native[outside], b[outside], w)
        want = torch.where(outside, torch.zeros_like(d), d).to(torch.uint8)
        want[outside] = exception_fields(above, dist, w)
        if not torch.equal(fields[at], want):
            raise CorruptPayloadError(name, "a raw chunk's selectors differ from the scales it stores")
        k = exact_distances(w)
        chunk = torch.arange(raw_ids.numel(), device=dev).repeat_interleave(lens)[outside]

        def per_chunk(mask):
            return torch.bincount(chunk[mask], minlength=raw_ids.numel())

        n = per_chunk(torch.ones_like(above))
        if bool((~_raw_chunks(n, per_chunk(dist >= k + 2), per_chunk(dist >= k + 2 + ESCAPE_CODE), lens)).any()):
            raise CorruptPayloadError(name, "a raw chunk holds few enough exceptions to be listed")
        vals[at] = native
    return vals
