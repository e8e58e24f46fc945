"""Engine records: the inline form the MoE engine's inline scale source reads (``docs/csf-format.md`` section 6,
``docs/moe-engine.md`` §4.8). In memory only; not a payload form yet.

Tiles, slot order, row bases, base deltas and candidate windows are the inline form's (:mod:`csf_codec.inline`);
only the records differ: each is as long as its tile needs, a multiple of 16 bytes (byte layout:
:mod:`csf_codec.engine_record_layout`), and they follow each other, row block by row block, column tile by column
tile (the tail tile last), in one body. Storage of one plane:

* ``base_ref``     uint8 [row_blocks] and ``base_delta`` uint8 [row_blocks, 16 d]: as the inline form;
* ``block_start``  uint32 [row_blocks]: where in ``body`` each row block's first record starts, in 16-byte units
  (a body reaches 64 GiB; the encoder refuses a plane whose records need more);
* ``record_units`` uint8 [row_blocks, col_tiles]: each record's length / 16;
* ``body``         uint8 [bytes]: the records.

The encoding is canonical: each tile takes the candidate window whose record is shortest (ties: list order), and
goes raw only when no window's record is shorter than the raw one; the decoder refuses any other encoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .engine_record_layout import (
    ABOVE_CODES,
    BELOW_CODES,
    COUNT_MASK,
    COUNT_SHIFT,
    HEADER_BYTES,
    MAX_BODY_UNITS,
    MODE_RAW,
    RECORD_ALIGN,
    UNITS_MASK,
    raw_units,
)
from .engine_records_decode_c import decode_span_c
from .engine_records_decode_np import base_window_counts, decode_records
from .engine_records_np import build_records, choose_windows, join_records, offsets, split_records, thresholds
from .errors import CorruptPayloadError, ShapeMismatchError, VerificationError
from .formats import ScaleFormat, scale_format
from .inline import (
    CANDIDATE_WINDOWS,
    _block_bases_np,
    _block_rows_np,
    _class_plans,
    _pack_deltas,
    block_references_np,
    delta_bytes,
)
from .inline_np import _gather_tiles, _scatter, block_spans
from .native import native
from .planes import as_rows
from .record_layout import DELTA_BITS
from .rowbase import proven_bases, row_bases_c
from .swar import map_spans, unpack_bits
from .tile_layout import TILE_ROWS, InlineGeometry

__all__ = ["EngineRecords", "decode_engine_records", "encode_engine_records"]

# Padding positions are counted at offset 0 (engine_records_np): no candidate window may make 0 an escape.
assert all(o - BELOW_CODES <= 0 <= o + (1 << w) - 1 + ABOVE_CODES for ws in CANDIDATE_WINDOWS.values() for w, o in ws)


@dataclass(frozen=True, kw_only=True)
class EngineRecords:
    fmt: ScaleFormat
    shape: tuple[int, ...]
    row_group: int
    base_ref: torch.Tensor
    base_delta: torch.Tensor
    block_start: torch.Tensor
    record_units: torch.Tensor
    body: torch.Tensor

    @property
    def geometry(self) -> InlineGeometry:
        return InlineGeometry.for_shape(self.shape, self.row_group)

    @property
    def nbytes(self) -> int:
        """Everything the engine stores: bases, deltas, a u32 start a row block, a byte a record, the records."""
        return int(
            self.base_ref.numel()
            + self.base_delta.numel()
            + 4 * self.block_start.numel()
            + self.record_units.numel()
            + self.body.numel()
        )

    def record(self, block: int, col_tile: int) -> torch.Tensor:
        """The bytes of one record (a view of the body)."""
        units = self.record_units[block].to(torch.int64)
        start = RECORD_ALIGN * (int(self.block_start[block]) + int(units[:col_tile].sum()))
        return self.body[start : start + RECORD_ALIGN * int(units[col_tile])]

    def headers(self) -> np.ndarray:
        """uint32 header of every record, in body order."""
        units = self.record_units.numpy().reshape(-1).astype(np.int64) * RECORD_ALIGN
        starts = np.cumsum(units) - units
        body = self.body.numpy()
        h = [body[starts + i].astype(np.uint32) << (8 * i) for i in range(HEADER_BYTES)]
        return h[0] | h[1] | h[2] | h[3] if starts.size else np.zeros(0, dtype=np.uint32)

    def mode_counts(self) -> dict[str, int]:
        modes = self.headers() & 3
        return {name: int((modes == m).sum()) for m, name in enumerate(("sel1", "sel2", "sel4", "raw"))}

    @property
    def raw_tiles(self) -> int:
        return int(((self.headers() & 3) == MODE_RAW).sum())

    @property
    def exceptions(self) -> int:
        return int(((self.headers() >> COUNT_SHIFT) & COUNT_MASK).sum())


# Spans of 2M scales: their per-tile work (window lengths, canonical checks) is many small-array passes a span,
# which larger spans amortise, and two threads share the GIL between those passes (the decoder ran 30% faster on
# two threads with 2M spans than with 1M). The decoder's span temporaries (records, fields, counts, exception
# lists) are about 4 bytes a scale, so its spans are at most 1/32 of the plane (not under 1M): two threads'
# temporaries then stay near a quarter of the plane, under issue 45's bound of twice the plane in all.
_ENCODE_SCALES = 1 << 21
_DECODE_SCALES = 1 << 21
_DECODE_MIN = 1 << 20
_DECODE_SHARE = 32


def _spans(geo: InlineGeometry, scales: int) -> list[tuple[int, int]]:
    group = geo.blocks_per_group if geo.row_group % TILE_ROWS else 1
    return block_spans(geo.row_blocks, geo.cols, group, scales)


def encode_engine_records(
    plane: torch.Tensor,
    fmt: ScaleFormat | str,
    *,
    row_group: int | None = None,
    name: str = "scales",
    verify: bool = True,
) -> EngineRecords:
    """Engine records of a native plane (uint8 [N, KB] or [E, N, KB]; a device plane is copied to the CPU).
    ``verify`` (default) decodes the result, every rule checked, and compares it byte for byte with the plane."""
    return _encode_engine(plane, fmt, row_group, name, verify, _span_c)


def _span_np(rows, br, base, valid, plans, windows, base_width: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A span's record lengths / 16 (int64 [blocks, col tiles]) and body, by the numpy passes of
    :mod:`csf_codec.engine_records_np`: the reference :func:`_span_c` is compared with."""
    staged, units = [], []
    for plan in plans:
        tiles = _gather_tiles(rows, br, plan)
        e = offsets(tiles, base, valid, plan)
        choice = choose_windows(tiles, e, base, valid, plan, windows, base_width)
        staged.append(build_records(tiles, e, base, valid, plan, windows, (*choice, base_width)))
        units.append(choice[2].reshape(br.shape[0], plan.count))
    u = np.concatenate(units, axis=1) if units else np.zeros((br.shape[0], 0), dtype=np.int64)
    return u, join_records(staged, u, plans)


def _span_c(rows, br, base, valid, plans, windows, base_width: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_span_np` in one C call (GIL released): tiles gathered, windows chosen and records written a tile at a
    time, straight into the body."""
    nb = br.shape[0]
    if not plans:  # no columns: no records
        return np.zeros((nb, 0), dtype=np.int64), np.zeros(0, dtype=np.uint8)
    units = np.empty((nb, sum(p.count for p in plans)), dtype=np.int64)
    body = np.empty(nb * RECORD_ALIGN * sum(p.count * raw_units(p.cols) for p in plans), dtype=np.uint8)
    used = native().encode_engine_rows(
        rows,
        np.ascontiguousarray(br, dtype=np.int64),
        np.ascontiguousarray(base, dtype=np.int16),
        np.ascontiguousarray(valid, dtype=np.bool_),
        np.ascontiguousarray(windows, dtype=np.int64).reshape(-1),
        np.array(thresholds(tuple(windows)), dtype=np.int32),
        cols,
        base_width,
        units,
        body,
    )
    return units, body[:used].copy()  # a copy: the span's buffer (raw length a tile) is freed at once


def _encode_engine(plane, fmt, row_group, name: str, verify: bool, encode_span) -> EngineRecords:
    """:func:`encode_engine_records` with a span encoder: the C one, or the numpy reference (:func:`_span_np`),
    which the tests compare."""
    fmt = scale_format(fmt)
    rows_t, shape = as_rows(plane, name=name)
    rows = np.ascontiguousarray(rows_t.cpu().numpy())
    geo = InlineGeometry.for_shape(shape, row_group, name=name)
    ref, delta, br = _block_bases_np(rows, geo, fmt)
    base = ref[:, None].astype(np.int16) + delta
    valid = br >= 0
    plans = [p for p in _class_plans(geo) if p.count]
    windows = CANDIDATE_WINDOWS[fmt.name]

    def span(sp: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        a, b = sp
        return encode_span(rows, br[a:b], base[a:b], valid[a:b], plans, windows, fmt.row_base_width, geo.cols)

    done = map_spans(span, _spans(geo, _ENCODE_SCALES), then=_within_reach(name))
    units = np.concatenate([u for u, _ in done]) if done else np.zeros((0, geo.col_tiles), dtype=np.int64)
    body = np.concatenate([r for _, r in done]) if done else np.zeros(0, dtype=np.uint8)
    per_block = units.sum(axis=1)
    out = EngineRecords(
        fmt=fmt,
        shape=shape,
        row_group=geo.row_group,
        base_ref=torch.from_numpy(ref),
        base_delta=_pack_deltas(torch.from_numpy(delta), fmt),
        block_start=torch.from_numpy((np.cumsum(per_block) - per_block).astype(np.uint32)),
        record_units=torch.from_numpy(units.astype(np.uint8)),
        body=torch.from_numpy(body),
    )
    if verify and not torch.equal(decode_engine_records(out, name=name), rows_t.cpu().view(shape)):
        raise VerificationError(name, "engine records do not decode to the native bytes")
    return out


def _within_reach(name: str):
    """A callback for each span's (units, records) in order: refuses the plane as soon as its body passes the
    reach of u32 block starts, before the rest is encoded."""
    total = 0

    def check(done) -> None:
        nonlocal total
        total += int(done[0].sum())
        if total > MAX_BODY_UNITS:
            raise ShapeMismatchError(
                name,
                f"the engine records take more than {MAX_BODY_UNITS} 16-byte units, past what u32 block "
                "starts reach (64 GiB): split the plane",
            )

    return check


def _check_arrays(rec: EngineRecords, geo: InlineGeometry, name: str) -> None:
    rb = geo.row_blocks
    expect = {
        "base_ref": (rec.base_ref, (rb,), torch.uint8),
        "base_delta": (rec.base_delta, (rb, delta_bytes(rec.fmt)), torch.uint8),
        "block_start": (rec.block_start, (rb,), torch.uint32),
        "record_units": (rec.record_units, (rb, geo.col_tiles), torch.uint8),
    }
    for part, (t, shape, dtype) in expect.items():
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ShapeMismatchError(
                name, f"engine {part} is {t.dtype} {tuple(t.shape)}; the {rec.shape} plane needs {dtype} {shape}"
            )
    if rec.body.dim() != 1 or rec.body.dtype != torch.uint8:
        raise ShapeMismatchError(name, f"engine record body is {rec.body.dtype} {tuple(rec.body.shape)}, not 1-D uint8")


def decode_engine_records(rec: EngineRecords, *, name: str = "scales") -> torch.Tensor:
    """The native plane (uint8, CPU) of engine records, refusing every encoding but the canonical one."""
    return _decode_engine(rec, name)


def _decode_engine(rec: EngineRecords, name: str, decode_class=None) -> torch.Tensor:
    """:func:`decode_engine_records`: each span in one C call (:func:`decode_span_c`), or with ``decode_class`` (the
    numpy reference, :func:`csf_codec.engine_records_decode_np.decode_records`, which the tests compare) class by
    class in numpy. A span the C call leaves to numpy is decoded again that way."""
    geo = rec.geometry
    _check_arrays(rec, geo, name)
    units = rec.record_units.numpy().astype(np.int64)
    if units.size and (units.min() < 1 or units.max() > UNITS_MASK):
        raise CorruptPayloadError(name, "a record length of zero, or past the header's length field")
    per_block = units.sum(axis=1) * RECORD_ALIGN
    starts = rec.block_start.numpy().astype(np.int64) * RECORD_ALIGN
    if not np.array_equal(starts, np.cumsum(per_block) - per_block):
        raise CorruptPayloadError(name, "row block starts disagree with the record lengths")
    if int(per_block.sum()) != rec.body.numel():
        raise CorruptPayloadError(
            name, f"the records take {int(per_block.sum())} bytes; the body holds {rec.body.numel()}"
        )
    fmt = rec.fmt
    bits = DELTA_BITS[fmt.name]
    packed = rec.base_delta.numpy()
    delta = packed if bits == 8 else unpack_bits(packed.reshape(-1), bits, packed.size * 8 // bits)
    delta = delta.reshape(geo.row_blocks, TILE_ROWS)
    base_ref = rec.base_ref.numpy()
    base = base_ref.astype(np.int16)[:, None] + delta
    br = _block_rows_np(geo)
    valid = br >= 0
    plans = [p for p in _class_plans(geo) if p.count]
    windows = CANDIDATE_WINDOWS[fmt.name]
    body = rec.body.numpy()
    out = np.zeros((geo.experts * geo.rows, geo.cols), dtype=np.uint8)
    wb = fmt.row_base_width

    def span(sp: tuple[int, int]) -> bool:
        """Decodes row blocks [a, b); whether their stored bases are the ones their rows give."""
        a, b = sp
        seg = body[starts[a] : starts[a] + int(per_block[a:b].sum())]
        if decode_class is None and units.size:  # in one C call, records read in place, bases checked
            ok = decode_span_c(out, seg, units[a:b], base[a:b], valid[a:b], br[a:b], base_ref[a:b], windows, fmt, name)
            if ok is not None:
                return ok
        cls = decode_records if decode_class is None else decode_class  # numpy decides what C leaves
        counts = np.zeros((3, b - a, TILE_ROWS), dtype=np.int32)
        staged = split_records(seg, units[a:b], plans)
        for i, plan in enumerate(plans):
            u = units[a:b, _columns(plans, plan)].reshape(-1)
            vals = cls(staged[i], u, base[a:b], valid[a:b], plan, windows, wb, name)
            _scatter(out, vals, br[a:b], plan)
            if wb == 1:  # the tiles are in the plane now: the counts may overwrite them
                counts += base_window_counts(vals, base[a:b], plan, wb)
        # three counts a row prove its base for 1-bit windows (all but a few rows); a 16-value window leaves half
        # the rows of NVFP4's W13 open, and those are cheaper to recompute from the rows
        proven = proven_bases(base[a:b], *counts, geo.cols, wb) if wb == 1 else np.zeros((b - a, TILE_ROWS), bool)
        return _span_bases_ok(out, fmt, base_ref[a:b], delta[a:b], base[a:b], proven, br[a:b])

    scales = min(_DECODE_SCALES, max(_DECODE_MIN, geo.experts * geo.rows * geo.cols // _DECODE_SHARE))
    if not all(map_spans(span, _spans(geo, scales))):  # after every span: a record's fault comes first
        raise CorruptPayloadError(name, "row bases or base deltas are not the ones the plane gives")
    return torch.from_numpy(out).view(rec.shape)


def _span_bases_ok(out: np.ndarray, fmt: ScaleFormat, base_ref, delta, base, proven, br) -> bool:
    """The stored references and deltas of a span's row blocks are the ones the decoded plane gives (format section
    6): each row's base is its stored one where the counts prove it (``proven``), else recomputed from its row."""
    valid = br >= 0
    wb = fmt.row_base_width
    natural = np.clip(base, 0, 255).astype(np.uint8)
    open_rows = valid & ~proven
    if open_rows.any():
        natural[open_rows] = row_bases_c(out[br[open_rows]], (wb,))[wb]
    ref, delta2 = block_references_np(natural, valid, fmt)
    return bool(np.array_equal(ref, base_ref) and np.array_equal(delta2, delta))


def _columns(plans, plan) -> slice:
    start = 0
    for p in plans:
        if p is plan:
            return slice(start, start + p.count)
        start += p.count
    raise AssertionError("plan not among the plans")
