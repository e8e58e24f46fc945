"""The inline CSF form: fixed-size tile records that a GEMM pipeline stage copies and decodes in registers.

Storage of one plane (tile geometry and slot order: :mod:`csf_codec.tile_layout`):

* ``base_ref``   uint8 [row_blocks]: a reference byte per 128-row block.
* ``base_delta`` uint8 [row_blocks, 16 d]: each slot's row base minus the reference in d bits (slot s at
  bit s d; a quad's four rows are one little-endian u16 or u32). d = 4 for MXFP4, whose row bases
  cluster within a few binades, and 8 for NVFP4, whose E4M3 row bases span many codes.
* ``records``    uint8 [row_blocks, full_col_tiles, S]: one S-byte record per 128 x 4 tile.
* ``tail``       uint8 [row_blocks, S_tail]: records of the tail column tile (cols % 4 columns), if any.
* ``raw`` / ``tail_raw``: native bytes (slot * columns + column order) of tiles no mode fits.

S and S_tail are multiples of 16 chosen per plane, so a stage copies a record with aligned 16-byte
copies. Record layout, for a tile of ``tc`` columns, selector width w, cap = min(63, (S - 4 - 16 tc w) // 3)::

    [0, 16 tc w)                      selectors: field p = slot * tc + column at bit p * w
    [16 tc w, +2 cap)                 exception positions p, u16 little-endian, ascending
    [16 tc w + 2 cap, +cap)           exception values
    [S - 4, S)                        header u32: bits 0-1 mode (0: 1-bit, 1: 2-bit, 2: 4-bit, 3: raw);
                                      selector modes: bits 2-7 exception count, bits 8-15 origin o (int8);
                                      raw: bits 2-31 index into the raw tiles of its column class

A selector tile decodes scale = base_ref + delta[slot] + o + field, then patches its exceptions. Each
tile takes the (width, origin) window with the fewest exceptions that fits its record, so scattered
exceptions push a tile into 2-bit selectors or more exception slots long before it goes raw. An MXFP4 row
whose base lies more than 15 above its block's reference is clamped; its scales then travel as exceptions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from .bitfields import pack_fields, unpack_fields
from .container import Envelope, open_envelope, plane_digest, seal
from .errors import CorruptPayloadError, ShapeMismatchError, VerificationError
from .formats import ScaleFormat, scale_format
from .inline_decode_c import decode_class_c
from .inline_np import ClassPlan, encode_class_np
from .planes import as_rows
from .record_layout import DELTA_BITS, EXCEPTION_BYTES, HEADER_BYTES, MAX_EXCEPTIONS, MODE_RAW, MODE_WIDTH
from .rowbase import row_bases, row_bases_c
from .swar import pack_bits, unpack_bits
from .tile_layout import TILE_COLS, TILE_ROWS, InlineGeometry

__all__ = [
    "CANDIDATE_WINDOWS",
    "MODE_RAW",
    "MODE_WIDTH",
    "InlineScales",
    "clamped_row_bases",
    "decode_inline",
    "encode_inline",
    "exception_capacity",
    "inline_from_payload",
    "record_bytes_choices",
]

MAGIC = b"CSFi"
_WIDTH_MODE = {w: m for m, w in MODE_WIDTH.items()}
_HEADER = HEADER_BYTES
_EXCEPTION = EXCEPTION_BYTES  # u16 position + u8 value
_ROW_GROUP_MASK = (1 << 20) - 1  # the envelope packs row group and both record sizes into one u32

# (width, origin) windows the encoder tries, relative to the row base; the decoder accepts any legal one.
CANDIDATE_WINDOWS = {
    "mxfp4": ((1, 0), (1, -1), (1, 1), (2, -1), (2, 0), (2, -2), (2, 1), (4, -4), (4, -6)),
    "nvfp4": ((4, 0), (4, -1), (4, 1), (4, -2), (4, 2), (4, -4), (4, 4), (2, 0), (1, 0)),
}


def selector_bytes(width: int, cols: int) -> int:
    return TILE_ROWS * cols * width // 8


def exception_capacity(width: int, record_bytes: int, cols: int = TILE_COLS) -> int:
    """Exceptions a record holds in a mode of this selector width (negative: the mode does not fit).

    At most 63: the header's count field has six bits.
    """
    return min(MAX_EXCEPTIONS, (record_bytes - _HEADER - selector_bytes(width, cols)) // _EXCEPTION)


def record_bytes_choices(fmt: ScaleFormat, cols: int = TILE_COLS) -> tuple[int, ...]:
    """Record sizes a plane may choose from for tiles of ``cols`` columns (kernels are built per size)."""
    w = fmt.row_base_width
    smallest = -(-(selector_bytes(w, cols) + _HEADER + _EXCEPTION) // 16) * 16
    return tuple(smallest + 16 * i for i in range(8 if w == 1 else 6))


@dataclass(frozen=True, kw_only=True)
class InlineScales:
    fmt: ScaleFormat
    shape: tuple[int, ...]
    row_group: int
    base_ref: torch.Tensor
    base_delta: torch.Tensor
    record_bytes: int
    records: torch.Tensor
    raw: torch.Tensor
    tail_record_bytes: int
    tail: torch.Tensor
    tail_raw: torch.Tensor

    @property
    def geometry(self) -> InlineGeometry:
        return InlineGeometry.for_shape(self.shape, self.row_group)

    def arrays(self) -> tuple[torch.Tensor, ...]:
        """base_ref, base_delta, records, raw, tail, tail_raw (the order of the serialized payload)."""
        return (self.base_ref, self.base_delta, self.records, self.raw, self.tail, self.tail_raw)

    @property
    def nbytes(self) -> int:
        return sum(int(t.numel()) for t in self.arrays())

    @property
    def raw_tiles(self) -> int:
        return int(self.raw.shape[0] + self.tail_raw.shape[0])

    def headers(self) -> torch.Tensor:
        """int64 header words of every record: full column tiles first, then tail tiles."""
        out = []
        for rec, s in ((self.records, self.record_bytes), (self.tail, self.tail_record_bytes)):
            if rec.numel():
                h = rec.reshape(-1, s)[:, -_HEADER:].to(torch.int64)
                out.append(h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    def mode_counts(self) -> dict[str, int]:
        modes = self.headers() & 3
        names = {0: "sel1", 1: "sel2", 2: "sel4", 3: "raw"}
        return {names[m]: int((modes == m).sum()) for m in range(4)}

    @property
    def exceptions(self) -> int:
        h = self.headers()
        return int(torch.where((h & 3) == MODE_RAW, 0, (h >> 2) & 63).sum())

    def to_payload(self) -> torch.Tensor:
        """Serialize (header with checksums, then the six arrays) into one uint8 tensor."""
        parts = self.arrays()
        sizes = (
            parts[0].numel() + parts[1].numel(),
            parts[2].numel(),
            parts[3].numel(),
            parts[4].numel(),
            parts[5].numel(),
        )
        extra = self.row_group | (self.record_bytes // 16) << 20 | (self.tail_record_bytes // 16) << 26
        env = Envelope(magic=MAGIC, fmt=self.fmt, param=0, shape=self.shape, extra=extra, sections=sizes)
        digest = plane_digest(decode_inline(self))  # the plane these records restore
        return seal(env, torch.cat([p.reshape(-1) for p in parts]), digest=digest)


# ----------------------------------------------------------------------------------------------- bases


def _block_bases(rows: torch.Tensor, geo: InlineGeometry, fmt: ScaleFormat):
    """Row bases in slot order as (reference [RB], nibble deltas [RB, 128]) and the effective bases."""
    dev = rows.device
    br = geo.block_rows(dev)
    valid = br >= 0
    natural = row_bases(rows, fmt.row_base_width)
    slot_base = natural[br.clamp(min=0)]
    # padding slots repeat slot 0 (row 0 of a block always exists) so they do not move the reference
    slot_base = torch.where(valid, slot_base, slot_base[:, :1])
    bits = DELTA_BITS[fmt.name]
    ref = row_bases(slot_base, bits) if geo.row_blocks and bits < 8 else slot_base.new_zeros(slot_base.shape[0])
    delta = (slot_base.to(torch.int16) - ref[:, None].to(torch.int16)).clamp(0, (1 << bits) - 1)
    delta = torch.where(valid, delta, torch.zeros_like(delta))
    return ref, delta.to(torch.uint8), br


@functools.lru_cache(maxsize=16)
def _block_rows_np(geo: InlineGeometry) -> np.ndarray:
    """:meth:`InlineGeometry.block_rows` as numpy, once per geometry (planes of one shape repeat)."""
    out = geo.block_rows().numpy()
    out.flags.writeable = False
    return out


def _block_bases_np(rows: np.ndarray, geo: InlineGeometry, fmt: ScaleFormat):
    """:func:`_block_bases` in numpy, for CPU planes: (reference, deltas, block rows)."""
    br = _block_rows_np(geo)
    natural = row_bases_c(rows, (fmt.row_base_width,))[fmt.row_base_width]
    slot_base = natural[np.maximum(br, 0)] if natural.size else np.zeros(br.shape, dtype=np.uint8)
    return (*block_references_np(slot_base, br >= 0, fmt), br)


def block_references_np(slot_base: np.ndarray, valid: np.ndarray, fmt: ScaleFormat):
    """(reference uint8 [blocks], deltas uint8 [blocks, 128]) of each block's slots' row bases (uint8 [blocks,
    128]; padding slots' values are ignored): the one place that turns row bases into the stored ones."""
    slot_base = np.where(valid, slot_base, slot_base[:, :1])  # padding repeats slot 0: the reference stays
    bits = DELTA_BITS[fmt.name]
    if slot_base.shape[0] and bits < 8:
        ref = row_bases_c(slot_base, (bits,))[bits]
    else:
        ref = np.zeros(slot_base.shape[0], dtype=np.uint8)
    delta = np.clip(slot_base.astype(np.int16) - ref[:, None], 0, (1 << bits) - 1)
    return ref, np.where(valid, delta, 0).astype(np.uint8)


def clamped_row_bases(
    plane: torch.Tensor, fmt: ScaleFormat | str, *, row_group: int | None = None, name: str = "scales"
) -> torch.Tensor:
    """uint8 [rows]: each row's base as the inline form stores it, ``base_ref + delta`` (a row whose own base
    lies outside its block's window clamped into it), without encoding the records. These are the bases an engine
    that moves the row base to its epilogue reads, whatever its scale source (``docs/moe-engine.md`` §4.5)."""
    fmt = scale_format(fmt)
    rows, shape = as_rows(plane, name=name)
    geo = InlineGeometry.for_shape(shape, row_group, name=name)
    ref, delta, br = _block_bases(rows, geo, fmt)
    valid = br >= 0
    base = ref[:, None].to(torch.int16) + delta.to(torch.int16)
    out = torch.zeros(rows.shape[0], dtype=torch.uint8, device=rows.device)
    out[br[valid].to(torch.int64)] = base[valid].to(torch.uint8)
    return out


def _pack_deltas(delta: torch.Tensor, fmt: ScaleFormat) -> torch.Tensor:
    bits = DELTA_BITS[fmt.name]
    if bits == 8:
        return delta.clone()
    if delta.device.type == "cpu":  # numpy packs in place of torch's int32 shift-and-sum temporaries
        packed = pack_bits(np.ascontiguousarray(delta.numpy()).reshape(-1), bits)
        return torch.from_numpy(packed).reshape(delta.shape[0], delta.shape[1] * bits // 8)
    return pack_fields(delta, bits)


def _unpack_deltas(packed: torch.Tensor, fmt: ScaleFormat) -> torch.Tensor:
    bits = DELTA_BITS[fmt.name]
    return packed if bits == 8 else unpack_fields(packed, bits, TILE_ROWS)


def delta_bytes(fmt: ScaleFormat) -> int:
    """Bytes of ``base_delta`` per 128-row block."""
    return TILE_ROWS * DELTA_BITS[fmt.name] // 8


# ----------------------------------------------------------------------------------------------- tiles


@dataclass(frozen=True)
class _ColumnClass:
    """The tiles of one column class (full 4-column tiles, or the tail tile), flattened to [T, 128 * tc]."""

    cols: int  # tc
    tiles: torch.Tensor  # uint8 [T, 128 tc] native bytes, slot * tc + column order (empty when decoding)
    base: torch.Tensor  # int32 [T, 128 tc] effective row base of each position
    valid: torch.Tensor  # bool [T, 128 tc]


_SCALES_PER_PASS = 1 << 22  # encoder and decoder walk the plane in spans of row blocks of about this size


def _block_spans(geo: InlineGeometry):
    step = max(1, _SCALES_PER_PASS // (TILE_ROWS * max(geo.cols, 1)))
    for start in range(0, geo.row_blocks, step):
        yield start, min(start + step, geo.row_blocks)


def _column_classes(rows: torch.Tensor | None, geo, base_slot, br) -> list[_ColumnClass]:
    """Cut the row blocks ``br`` (a span of them) into column classes; ``rows=None``: bases and validity only."""
    dev = br.device
    nblocks = br.shape[0]
    padded = None
    if rows is not None:
        idx = torch.where(br < 0, torch.full_like(br, rows.shape[0]), br)
        padded = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])[idx]  # [RB, 128, C]
    slot_valid = (br >= 0)[:, :, None]
    classes = []
    spans = [(0, geo.full_col_tiles, TILE_COLS)]
    if geo.tail_cols:
        spans.append((geo.full_col_tiles * TILE_COLS, 1, geo.tail_cols))
    for start, count, tc in spans:
        t = torch.zeros(0, TILE_ROWS * tc, dtype=torch.uint8, device=dev)
        if padded is not None:
            block = padded[:, :, start : start + count * tc].reshape(nblocks, TILE_ROWS, count, tc)
            t = block.permute(0, 2, 1, 3).reshape(-1, TILE_ROWS * tc)
        base = base_slot[:, None, :, None].expand(-1, count, -1, tc).reshape(-1, TILE_ROWS * tc)
        valid = slot_valid[:, None, :, :].expand(-1, count, -1, tc).reshape(-1, TILE_ROWS * tc)
        classes.append(_ColumnClass(tc, t.contiguous(), base.contiguous(), valid.contiguous()))
    return classes


def _header_bytes(header: torch.Tensor) -> torch.Tensor:
    return torch.stack([((header >> (8 * i)) & 0xFF) for i in range(4)], dim=1).to(torch.uint8)


def _window_counts(cls: _ColumnClass, windows) -> tuple[torch.Tensor, torch.Tensor]:
    """Per candidate window and tile: exceptions it leaves ([K, T] int32) and whether it is legal ([K, T])."""
    d = cls.tiles.to(torch.int32) - cls.base
    n_list, legal_list = [], []
    for w, o in windows:
        n_list.append((cls.valid & ((d < o) | (d > o + (1 << w) - 1))).sum(dim=1, dtype=torch.int32))
        lo = cls.base + o
        legal_list.append((~cls.valid | ((lo >= 0) & (lo + (1 << w) - 1 <= 255))).all(dim=1))
    return torch.stack(n_list), torch.stack(legal_list)


def _choose(n: torch.Tensor, legal: torch.Tensor, windows, s: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each tile's window (fewest exceptions that fit an S-byte record, then list order), and which go raw."""
    dev = n.device
    caps = torch.tensor([exception_capacity(w, s, cols) for w, _ in windows], device=dev, dtype=torch.int32)
    fits = legal & (n <= caps[:, None])
    order = torch.arange(len(windows), device=dev)[:, None]
    best = torch.where(fits, n * len(windows) + order, 1 << 30).argmin(dim=0)
    return best, ~fits.any(dim=0)


def _build_records(cls: _ColumnClass, best, raw, s: int, windows, raw_start: int) -> torch.Tensor:
    """The S-byte records of a span of tiles, whose raw tiles are numbered from ``raw_start``."""
    dev = cls.tiles.device
    d = cls.tiles.to(torch.int32) - cls.base
    records = torch.zeros(cls.tiles.shape[0], s, dtype=torch.uint8, device=dev)
    header = torch.zeros(cls.tiles.shape[0], dtype=torch.int64, device=dev)
    for k, (w, o) in enumerate(windows):
        sel = ((best == k) & ~raw).nonzero().squeeze(1)
        if not sel.numel():
            continue
        dk, vk = d[sel], cls.valid[sel]
        outside = vk & ((dk < o) | (dk > o + (1 << w) - 1))
        fields = torch.where(outside | ~vk, torch.zeros_like(dk), dk - o)
        sb = selector_bytes(w, cls.cols)
        records[sel, :sb] = pack_fields(fields, w)
        cap = exception_capacity(w, s, cls.cols)
        t, p = outside.nonzero(as_tuple=True)  # ordered: ranks ascend within a tile
        nk = outside.sum(dim=1)
        rank = torch.arange(t.numel(), device=dev) - (torch.cumsum(nk, 0) - nk)[t]
        rt = sel[t]
        records[rt, sb + 2 * rank] = (p & 0xFF).to(torch.uint8)
        records[rt, sb + 2 * rank + 1] = (p >> 8).to(torch.uint8)
        records[rt, sb + 2 * cap + rank] = cls.tiles[rt, p]
        header[sel] = _WIDTH_MODE[w] | (nk.to(torch.int64) << 2) | ((o & 0xFF) << 8)
    raw_ids = raw.nonzero().squeeze(1)
    header[raw_ids] = MODE_RAW | ((raw_start + torch.arange(raw_ids.numel(), device=dev, dtype=torch.int64)) << 2)
    records[:, s - _HEADER :] = _header_bytes(header)
    return records


def _encode_plane(rows, geo, base_slot, br, fmt: ScaleFormat, record_bytes: int | None):
    """Both column classes of the plane, span by span: (S, records, raw tiles) per class."""
    windows = CANDIDATE_WINDOWS[fmt.name]
    spans = list(_block_spans(geo))
    dev = base_slot.device

    def classes(a: int, b: int) -> list[_ColumnClass]:
        return _column_classes(rows, geo, base_slot[a:b], br[a:b])

    stats = [[_window_counts(c, windows) for c in classes(a, b)] for a, b in spans]
    out = []
    for k in range(1 + bool(geo.tail_cols)):
        cols = TILE_COLS if k == 0 else geo.tail_cols
        n = torch.cat([st[k][0] for st in stats], dim=1)
        legal = torch.cat([st[k][1] for st in stats], dim=1)
        sizes = record_bytes_choices(fmt, cols) if (record_bytes is None or k) else (record_bytes,)
        if any(s % 16 or exception_capacity(1, s, cols) < 0 for s in sizes):
            raise ValueError(f"record size must be a multiple of 16 that holds a selector mode; got {sizes}")
        raw_cost = TILE_ROWS * cols
        s = min((n.shape[1] * s + int(_choose(n, legal, windows, s, cols)[1].sum()) * raw_cost, s) for s in sizes)[1]
        best, raw = _choose(n, legal, windows, s, cols)
        records, raws, t0 = [], [], 0
        for a, b in spans:
            cls = classes(a, b)[k]
            t1 = t0 + cls.tiles.shape[0]
            records.append(_build_records(cls, best[t0:t1], raw[t0:t1], s, windows, sum(x.shape[0] for x in raws)))
            raws.append(cls.tiles[raw[t0:t1]])
            t0 = t1
        rec = torch.cat(records) if records else torch.zeros(0, s, dtype=torch.uint8, device=dev)
        raw_tiles = torch.cat(raws) if raws else torch.zeros(0, raw_cost, dtype=torch.uint8, device=dev)
        out.append((s, rec, raw_tiles))
    return out


def _class_plans(geo: InlineGeometry) -> list[ClassPlan]:
    plans = [ClassPlan(0, geo.full_col_tiles, TILE_COLS)]
    if geo.tail_cols:
        plans.append(ClassPlan(geo.full_col_tiles * TILE_COLS, 1, geo.tail_cols))
    return plans


def _record_sizes(fmt: ScaleFormat, cols: int, forced: int | None) -> tuple[int, ...]:
    sizes = record_bytes_choices(fmt, cols) if forced is None else (forced,)
    if any(s % 16 or exception_capacity(1, s, cols) < 0 for s in sizes):
        raise ValueError(f"record size must be a multiple of 16 that holds a selector mode; got {sizes}")
    return sizes


def _encode_plane_np(rows, geo, base_slot, br, fmt: ScaleFormat, record_bytes: int | None):
    """:func:`_encode_plane` on the CPU, in numpy (:mod:`csf_codec.inline_np`); same bytes."""
    x, base, brn = rows, base_slot, br
    valid = brn >= 0
    out = []
    for k, plan in enumerate(_class_plans(geo)):
        sizes = _record_sizes(fmt, plan.cols, None if k else record_bytes)
        if plan.count == 0 or geo.row_blocks == 0:
            s = sizes[0]  # no tiles: every size costs nothing, the smallest wins
            empty = torch.zeros(0, s, dtype=torch.uint8)
            out.append((s, empty, torch.zeros(0, TILE_ROWS * plan.cols, dtype=torch.uint8)))
            continue
        s, rec, raw = encode_class_np(x, brn, base, valid, plan, CANDIDATE_WINDOWS[fmt.name], sizes, exception_capacity)
        out.append((s, torch.from_numpy(rec), torch.from_numpy(raw)))
    return out


def _encode_storage_torch(rows: torch.Tensor, geo: InlineGeometry, fmt: ScaleFormat, record_bytes: int | None):
    """Reference, deltas and each column class's (S, records, raw tiles), in torch on the plane's device."""
    ref, delta, br = _block_bases(rows, geo, fmt)
    base_slot = ref[:, None].to(torch.int32) + delta.to(torch.int32)
    return ref, delta, _encode_plane(rows, geo, base_slot, br, fmt, record_bytes)


def _encode_storage_np(rows: torch.Tensor, geo: InlineGeometry, fmt: ScaleFormat, record_bytes: int | None):
    """:func:`_encode_storage_torch` for CPU planes, in numpy; the same bytes."""
    ref, delta, br = _block_bases_np(rows.numpy(), geo, fmt)
    base_slot = ref[:, None].astype(np.int16) + delta  # int16: a per-row table stays small beside the plane
    encoded = _encode_plane_np(rows.numpy(), geo, base_slot, br, fmt, record_bytes)
    return torch.from_numpy(ref), torch.from_numpy(delta), encoded


def _decode_class(cls: _ColumnClass, records: torch.Tensor, s: int, raw: torch.Tensor, name: str) -> torch.Tensor:
    """Rebuild [T, 128 tc] native bytes of one column class, validating every record."""
    dev = records.device
    tc = cls.cols
    h = records[:, s - _HEADER :].to(torch.int64)
    h = h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24)
    mode = h & 3
    out = torch.zeros(records.shape[0], TILE_ROWS * tc, dtype=torch.int32, device=dev)
    for m, w in MODE_WIDTH.items():
        sel = (mode == m).nonzero().squeeze(1)
        if not sel.numel():
            continue
        hs = h[sel]
        cnt = (hs >> 2) & 63
        origin = (((hs >> 8) & 0xFF) - (((hs >> 8) & 0x80) << 1)).to(torch.int32)
        cap = exception_capacity(w, s, tc)
        if cap < 0 or bool((hs >> 16).any()) or bool((cnt > cap).any()):
            raise CorruptPayloadError(name, f"a {w}-bit tile header is impossible for {s}-byte records")
        valid = cls.valid[sel]
        lo = cls.base[sel] + origin[:, None]
        if bool((valid & ((lo < 0) | (lo + (1 << w) - 1 > 255))).any()):
            raise CorruptPayloadError(name, "a tile window leaves the byte range")
        sb = selector_bytes(w, tc)
        rest = records[sel, sb : s - _HEADER]  # positions, values, then bytes no field uses
        unused = torch.arange(cap, device=dev)[None, :] >= cnt[:, None]
        if bool(
            rest[:, : 2 * cap].reshape(-1, cap, 2)[unused].any()
            or rest[:, 2 * cap : 3 * cap][unused].any()
            or rest[:, 3 * cap :].any()
        ):
            raise CorruptPayloadError(name, "a record's unused exception slots or padding are not zero")
        fields = unpack_fields(records[sel, :sb], w, TILE_ROWS * tc).to(torch.int32)
        if bool(fields[~valid].any()):
            raise CorruptPayloadError(name, "a padding slot's selector is not zero")
        vals = lo + fields
        total = int(cnt.sum())
        if total:
            t = torch.repeat_interleave(torch.arange(sel.numel(), device=dev), cnt)
            rank = torch.arange(total, device=dev) - (torch.cumsum(cnt, 0) - cnt)[t]
            rt = sel[t]
            pos = records[rt, sb + 2 * rank].to(torch.int64) | (records[rt, sb + 2 * rank + 1].to(torch.int64) << 8)
            val = records[rt, sb + 2 * cap + rank].to(torch.int32)
            if bool((pos >= TILE_ROWS * tc).any()):
                raise CorruptPayloadError(name, "an exception position lies outside its tile")
            if bool(((t[1:] == t[:-1]) & (pos[1:] <= pos[:-1])).any()):
                raise CorruptPayloadError(name, "exception positions are not strictly ascending")
            if bool((~valid[t, pos]).any() | (fields[t, pos] != 0).any()):
                raise CorruptPayloadError(name, "an exception sits on padding or on a non-zero selector")
            lo_t = lo[t, pos]
            if bool(((val >= lo_t) & (val < lo_t + (1 << w))).any()):
                raise CorruptPayloadError(name, "an exception repeats a value its selector could express")
            vals[t, pos] = val
        out[sel] = vals
    raw_sel = (mode == MODE_RAW).nonzero().squeeze(1)
    raw_idx = h[raw_sel] >> 2  # enumerated in order across the plane: checked by decode_inline
    if bool((raw_idx >= raw.shape[0]).any()):
        raise CorruptPayloadError(name, "a raw tile index points past the raw tiles")
    if bool(records[raw_sel, : s - _HEADER].any()):
        raise CorruptPayloadError(name, "a raw tile's record holds bytes besides its header")
    out[raw_sel] = raw[raw_idx].to(torch.int32)
    if bool(out[raw_sel][~cls.valid[raw_sel]].any()):
        raise CorruptPayloadError(name, "a raw tile stores non-zero bytes for padding slots")
    return out.to(torch.uint8)


# ----------------------------------------------------------------------------------------------- API


def encode_inline(
    plane: torch.Tensor,
    fmt: ScaleFormat | str,
    *,
    row_group: int | None = None,
    record_bytes: int | None = None,
    name: str = "scales",
    verify: bool = True,
) -> InlineScales:
    """Build the inline storage of a native plane (uint8 [N, KB] or [E, N, KB]) on the plane's device.

    ``record_bytes`` forces the full tiles' record size; by default each column class takes the size
    from :func:`record_bytes_choices` with the smallest total. ``verify`` (default) decodes the result
    and compares it byte for byte with the plane.
    """
    fmt = scale_format(fmt)
    rows, shape = as_rows(plane, name=name)
    geo = InlineGeometry.for_shape(shape, row_group, name=name)
    encode = _encode_storage_np if rows.device.type == "cpu" else _encode_storage_torch
    ref, delta, encoded = encode(rows, geo, fmt, record_bytes)
    s, records, raw = encoded[0]
    dev = rows.device
    tail_s, tail = 0, torch.zeros(0, dtype=torch.uint8, device=dev)
    tail_raw = torch.zeros(0, 0, dtype=torch.uint8, device=dev)
    if len(encoded) > 1:
        tail_s, tail, tail_raw = encoded[1]
    out = InlineScales(
        fmt=fmt,
        shape=shape,
        row_group=geo.row_group,
        base_ref=ref,
        base_delta=_pack_deltas(delta, fmt),
        record_bytes=s,
        records=records.view(geo.row_blocks, geo.full_col_tiles, s),
        raw=raw,
        tail_record_bytes=tail_s,
        tail=tail.view(geo.row_blocks, tail_s) if tail_s else tail,
        tail_raw=tail_raw.view(-1, TILE_ROWS * geo.tail_cols) if tail_s else tail_raw,
    )
    if verify and not torch.equal(decode_inline(out, name=name), rows.view(shape)):
        raise VerificationError(name, "inline encoding does not decode to the native bytes")
    return out


def decode_inline(inline: InlineScales, *, name: str = "scales") -> torch.Tensor:
    """Decode inline storage to the native plane (uint8, on its device), validating every record."""
    geo = inline.geometry
    dev = inline.records.device
    rb, tcol = geo.row_blocks, geo.tail_cols
    expect = {
        "base_ref": (inline.base_ref, (rb,)),
        "base_delta": (inline.base_delta, (rb, delta_bytes(inline.fmt))),
        "records": (inline.records, (rb, geo.full_col_tiles, inline.record_bytes)),
        "tail": (inline.tail, (rb, inline.tail_record_bytes) if tcol else (0,)),
    }
    for part, (t, shape) in expect.items():
        if tuple(t.shape) != shape or t.dtype != torch.uint8:
            raise ShapeMismatchError(
                name, f"inline {part} has shape {tuple(t.shape)}, the {inline.shape} plane needs {shape}"
            )
    for raw, tc in ((inline.raw, TILE_COLS), (inline.tail_raw, tcol)):
        if raw.numel() and (raw.dim() != 2 or raw.shape[1] != TILE_ROWS * tc):
            raise ShapeMismatchError(name, f"raw tiles of shape {tuple(raw.shape)} do not hold {tc}-column tiles")
    return (_decode_np if dev.type == "cpu" else _decode_torch)(inline, geo, name)


def _decode_torch(inline: InlineScales, geo: InlineGeometry, name: str) -> torch.Tensor:
    """The decoder in torch, on the storage's device (the path for GPU payloads)."""
    dev = inline.records.device
    rb, tcol = geo.row_blocks, geo.tail_cols
    delta = _unpack_deltas(inline.base_delta, inline.fmt)
    br = geo.block_rows(dev)
    if bool(delta[br < 0].any()):
        raise CorruptPayloadError(name, "a padding slot's base delta is not zero")
    base_slot = inline.base_ref[:, None].to(torch.int32) + delta.to(torch.int32)
    full = inline.records.reshape(rb, geo.full_col_tiles * inline.record_bytes)  # no -1: empty planes
    parts = [(full, inline.record_bytes, inline.raw.reshape(-1, TILE_ROWS * TILE_COLS))]
    if tcol:
        tail_raw = inline.tail_raw.reshape(-1, TILE_ROWS * tcol)
        parts.append((inline.tail.reshape(rb, inline.tail_record_bytes), inline.tail_record_bytes, tail_raw))
    for rec, s, raw in parts:
        h = rec.reshape(-1, s)[:, -_HEADER:].to(torch.int64) if rec.numel() else torch.zeros(0, 4, dtype=torch.int64)
        h = h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24)
        raw_idx = h[(h & 3) == MODE_RAW] >> 2
        if raw_idx.numel() != raw.shape[0] or not torch.equal(raw_idx, torch.arange(raw_idx.numel(), device=h.device)):
            raise CorruptPayloadError(name, "raw tile indices do not enumerate the raw tiles in order")
    rows = torch.empty(geo.experts * geo.rows, geo.cols, dtype=torch.uint8, device=inline.records.device)
    for a, b in _block_spans(geo):
        span_br = br[a:b]
        slot_valid = span_br >= 0
        classes = _column_classes(None, geo, base_slot[a:b], span_br)
        for i, (cls, (rec, s, raw)) in enumerate(zip(classes, parts, strict=True)):
            if cls.base.shape[0] == 0:
                continue
            tiles = _decode_class(cls, rec[a:b].reshape(-1, s), s, raw, name)
            count = tiles.shape[0] // (b - a)
            block = tiles.view(b - a, count, TILE_ROWS, cls.cols).permute(0, 2, 1, 3).reshape(b - a, TILE_ROWS, -1)
            start = i * geo.full_col_tiles * TILE_COLS
            rows[span_br[slot_valid], start : start + block.shape[2]] = block[slot_valid]
    return rows.view(inline.shape)


def _decode_np(inline: InlineScales, geo: InlineGeometry, name: str, decode_class=None) -> torch.Tensor:
    """:func:`decode_inline` for CPU storage: the tiles on the C loops (``decode_class``: the numpy reference
    :func:`csf_codec.inline_np.decode_class_np` where a test asks for it), with the same checks."""
    brn = _block_rows_np(geo)
    valid = brn >= 0
    packed = inline.base_delta.numpy()
    bits = DELTA_BITS[inline.fmt.name]
    delta = packed if bits == 8 else unpack_bits(packed.reshape(-1), bits, packed.size * 8 // bits)
    delta = delta.reshape(geo.row_blocks, TILE_ROWS)
    if delta[~valid].any():
        raise CorruptPayloadError(name, "a padding slot's base delta is not zero")
    base = inline.base_ref.numpy().astype(np.int16)[:, None] + delta  # up to 510
    out = np.empty((geo.experts * geo.rows, geo.cols), dtype=np.uint8)
    parts = [
        (inline.records, inline.record_bytes, inline.raw),
        (inline.tail, inline.tail_record_bytes, inline.tail_raw),
    ]
    plans = _class_plans(geo)
    for plan, (rec, s, raw) in zip(plans, parts, strict=False):
        if plan.count == 0 or geo.row_blocks == 0:
            continue
        records = rec.numpy().reshape(-1, s)
        h = np.ascontiguousarray(records[:, s - _HEADER :]).view("<u4").reshape(-1)
        raw_idx = h[(h & 3) == MODE_RAW] >> 2
        if raw_idx.size != raw.shape[0] or (raw_idx != np.arange(raw_idx.size)).any():
            raise CorruptPayloadError(name, "raw tile indices do not enumerate the raw tiles in order")
    for plan, (rec, s, raw) in zip(plans, parts, strict=False):
        if plan.count == 0 or geo.row_blocks == 0:
            continue
        records = rec.numpy().reshape(-1, s)
        raw_tiles = raw.numpy().reshape(-1, TILE_ROWS * plan.cols)
        (decode_class or decode_class_c)(out, records, raw_tiles, brn, base, valid, plan, s, exception_capacity, name)
    return torch.from_numpy(out).view(inline.shape)


def inline_from_payload(payload: torch.Tensor, *, name: str = "scales") -> InlineScales:
    """Parse a serialized inline payload (see :meth:`InlineScales.to_payload`) and validate every record."""
    env, body = open_envelope(payload, MAGIC, name=name)
    s, tail_s = ((env.extra >> 20) & 63) * 16, (env.extra >> 26) * 16
    try:
        geo = InlineGeometry.for_shape(env.shape, (env.extra & _ROW_GROUP_MASK) or None, name=name)
    except ShapeMismatchError as e:
        raise CorruptPayloadError(name, f"impossible inline geometry: {e.fault}") from None
    rb = geo.row_blocks
    nb, nr, nraw, nt, ntraw = env.sections
    full_tile, tail_tile = TILE_ROWS * TILE_COLS, TILE_ROWS * geo.tail_cols
    if (
        nb != rb * (1 + delta_bytes(env.fmt))
        or nr != rb * geo.full_col_tiles * s
        or nraw % full_tile
        or nt != (rb * tail_s if geo.tail_cols else 0)
        or (ntraw and (not tail_tile or ntraw % tail_tile))
        or (geo.full_col_tiles and s not in record_bytes_choices(env.fmt))
        or (geo.tail_cols and tail_s not in record_bytes_choices(env.fmt, geo.tail_cols))
    ):
        raise CorruptPayloadError(name, f"record sizes {s}/{tail_s} or sections {env.sections} do not fit {env.shape}")
    cuts = torch.tensor((0, rb, nb, nb + nr, nb + nr + nraw, nb + nr + nraw + nt, body.numel())).tolist()
    part = [body[cuts[i] : cuts[i + 1]] for i in range(6)]
    out = InlineScales(
        fmt=env.fmt,
        shape=env.shape,
        row_group=geo.row_group,
        base_ref=part[0],
        base_delta=part[1].view(rb, delta_bytes(env.fmt)),
        record_bytes=s,
        records=part[2].view(rb, geo.full_col_tiles, s),
        raw=part[3].view(-1, full_tile),
        tail_record_bytes=tail_s,
        tail=part[4].view(rb, tail_s) if geo.tail_cols else part[4],
        tail_raw=part[5].view(-1, tail_tile) if tail_tile else part[5].view(0, 0),
    )
    decode_inline(out, name=name)
    return out
