"""Engine records (docs/csf-format.md section 6): every plane round-trips; each record is byte for byte what a
per-tile reference written from the spec builds; every non-canonical or malformed encoding is refused with a typed
error naming the tensor."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from csf_codec import MXFP4, NVFP4, CorruptPayloadError, ShapeMismatchError
from csf_codec.engine_records import EngineRecords, decode_engine_records, encode_engine_records
from csf_codec.inline import CANDIDATE_WINDOWS, _block_bases_np
from csf_codec.synthetic import (
    DOWN_PROJ_DENSE,
    EXCEPTION_DENSE,
    NVFP4_TYPICAL,
    SEED_REGIME,
    SPECIAL_CONTENT,
    synthetic_scale_plane,
)
from csf_codec.tile_layout import InlineGeometry

from .planes_for_tests import clustered_plane, special_rows

REGIMES = {
    "seed": SEED_REGIME,
    "dense": EXCEPTION_DENSE,
    "down_proj": DOWN_PROJ_DENSE,
    "special": SPECIAL_CONTENT,
    "nvfp4": NVFP4_TYPICAL,
}


def _fresh_planes():
    seed = int(np.random.SeedSequence().entropy % (1 << 31))  # fresh planes each run; the seed is in the id
    g = torch.Generator().manual_seed(seed)
    for regime, stats in REGIMES.items():
        fmt = NVFP4 if regime == "nvfp4" else MXFP4
        k = 2 if fmt is NVFP4 else 1
        yield f"{regime}-w13-{seed}", fmt, synthetic_scale_plane((2, 1152, 160 * k), fmt, stats, seed=seed), 576
        yield f"{regime}-w2-{seed}", fmt, synthetic_scale_plane((2, 640, 18 * k), fmt, stats, seed=seed + 1), None
    yield "odd", MXFP4, special_rows(clustered_plane((5, 77, 13), seed=7, exception_rate=0.2), seed=8), None
    yield "odd-nv", NVFP4, special_rows(clustered_plane((3, 70, 7), seed=9, window=4, spread=9), seed=9), 35
    yield "random", MXFP4, torch.randint(0, 256, (3, 300, 22), generator=g).to(torch.uint8), 150
    yield "random-nv", NVFP4, torch.randint(0, 256, (2, 130, 7), generator=g).to(torch.uint8), 65
    yield "clamped-high", MXFP4, torch.randint(240, 256, (2, 200, 9), generator=g).to(torch.uint8), None
    yield "clamped-low", NVFP4, torch.randint(0, 20, (2, 200, 9), generator=g).to(torch.uint8), None
    yield "wide-exceptions", MXFP4, clustered_plane((1, 256, 40), seed=seed, exception_rate=0.35), None
    yield "one-row", MXFP4, clustered_plane((1, 3), seed=3), None
    yield "empty-rows", MXFP4, torch.zeros(0, 5, dtype=torch.uint8), None
    yield "empty-experts", NVFP4, torch.zeros(0, 4, 8, dtype=torch.uint8), None
    yield "empty-cols", MXFP4, torch.zeros(3, 5, 0, dtype=torch.uint8), None


PLANES = list(_fresh_planes())


@pytest.mark.parametrize("name,fmt,plane,group", PLANES, ids=[p[0] for p in PLANES])
def test_round_trip(name, fmt, plane, group):
    rec = encode_engine_records(plane, fmt, row_group=group, name=name)  # verify=True: decoded and compared
    assert torch.equal(decode_engine_records(rec, name=name), plane)
    units = rec.record_units.to(torch.int64)
    assert rec.body.numel() == 16 * int(units.sum())
    starts = torch.cumsum(units.sum(dim=1), 0) - units.sum(dim=1)  # in 16-byte units
    assert rec.block_start.dtype == torch.uint32 and torch.equal(rec.block_start.to(torch.int64), starts)
    assert rec.nbytes == rec.base_ref.numel() * (1 + 4) + rec.base_delta.numel() + units.numel() + rec.body.numel()


# ------------------------------------------------------------------------------ reference (the spec, per tile)


def _reference_record(vals, bases, valid, tc, windows) -> bytes:
    """One tile's record as docs/csf-format.md section 6 states it, one position at a time."""
    size = 128 * tc
    raw_len = -(-(4 + size) // 16) * 16
    best = None
    for w, o in windows:
        real = [s for s in range(128) if valid[s]]
        if any(bases[s] + o < 0 or bases[s] + o + (1 << w) - 1 > 255 for s in real):
            continue
        fields, entries, escapes = [0] * size, [], []
        for p in range(size):
            s = p // tc
            if not valid[s]:
                continue
            lo, hi = bases[s] + o, bases[s] + o + (1 << w) - 1
            v = vals[p]
            if lo <= v <= hi:
                fields[p] = v - lo
                continue
            if lo - 4 <= v < lo:
                code = lo - v - 1
            elif hi < v <= hi + 3:
                code = v - hi + 3
            else:
                code = 7
                escapes.append(v)
            entries.append(p | code << 9)
        used = 4 + 16 * tc * w + (3 * len(entries) + 1) // 2 + len(escapes)
        length = -(-used // 16) * 16
        if best is None or length < best[0]:
            best = (length, w, o, fields, entries, escapes)
    if best is None or best[0] >= raw_len:
        header = 3 | (raw_len // 16) << 2
        return (header.to_bytes(4, "little") + bytes(vals) + bytes(raw_len)).ljust(raw_len, b"\0")[:raw_len]
    length, w, o, fields, entries, escapes = best
    header = {1: 0, 2: 1, 4: 2}[w] | (length // 16) << 2 | (o & 0xFF) << 8 | len(entries) << 16
    sel = sum(f << (i * w) for i, f in enumerate(fields)).to_bytes(16 * tc * w, "little")
    ent = sum(e << (12 * i) for i, e in enumerate(entries)).to_bytes((3 * len(entries) + 1) // 2, "little")
    return (header.to_bytes(4, "little") + sel + ent + bytes(escapes)).ljust(length, b"\0")


def _tiles(plane, fmt, group):
    """Per (block, column tile): slot-order values, each slot's effective base, validity, tc."""
    rows = plane.reshape(-1, plane.shape[-1]).numpy()
    geo = InlineGeometry.for_shape(tuple(plane.shape), group)
    ref, delta, br = _block_bases_np(rows, geo, fmt)
    for b in range(geo.row_blocks):
        bases = [int(ref[b]) + int(d) for d in delta[b]]
        valid = [int(r) >= 0 for r in br[b]]
        for j in range(geo.col_tiles):
            c0, tc = 4 * j, min(4, geo.cols - 4 * j)
            vals = [int(rows[br[b, s], c0 + c]) if valid[s] else 0 for s in range(128) for c in range(tc)]
            yield b, j, vals, bases, valid, tc


REFERENCE_PLANES = [
    ("odd", MXFP4, special_rows(clustered_plane((2, 200, 13), seed=11, exception_rate=0.12), seed=12), 100),
    ("far", MXFP4, clustered_plane((1, 130, 6), seed=13, exception_rate=0.3, spread=40), None),
    ("dense", MXFP4, synthetic_scale_plane((1, 256, 16), MXFP4, DOWN_PROJ_DENSE, seed=14), None),
    ("nvfp4", NVFP4, special_rows(synthetic_scale_plane((1, 192, 11), NVFP4, NVFP4_TYPICAL, seed=15), seed=16), 96),
    (
        "random",
        MXFP4,
        torch.randint(0, 256, (1, 128, 5), generator=torch.Generator().manual_seed(17)).to(torch.uint8),
        None,
    ),
]


@pytest.mark.parametrize("name,fmt,plane,group", REFERENCE_PLANES, ids=[p[0] for p in REFERENCE_PLANES])
def test_records_match_the_per_tile_reference(name, fmt, plane, group):
    rec = encode_engine_records(plane, fmt, row_group=group, name=name)
    windows = CANDIDATE_WINDOWS[fmt.name]
    for b, j, vals, bases, valid, tc in _tiles(plane, fmt, group):
        got = bytes(rec.record(b, j).numpy())
        assert got == _reference_record(vals, bases, valid, tc, windows), (b, j)
        _SEEN.add(
            (got[0] & 3, any(e >> 9 == 7 for e in _entries(got, 1 << (got[0] & 3), tc)[1]) if got[0] & 3 < 3 else 0)
        )


_SEEN: set[tuple[int, int]] = set()


def test_the_reference_planes_reach_every_mode_and_escapes():
    for name, fmt, plane, group in REFERENCE_PLANES:
        test_records_match_the_per_tile_reference(name, fmt, plane, group)
    modes = {m for m, _ in _SEEN}
    assert {0, 2, 3} <= modes, modes
    assert any(esc for _, esc in _SEEN)


# ------------------------------------------------------------------------------------------------ rejections


def _small(fmt=MXFP4):
    plane = special_rows(clustered_plane((2, 200, 13), seed=21, exception_rate=0.12), seed=22)
    return plane, encode_engine_records(plane, fmt, row_group=100, name="t")


def _with_records(rec: EngineRecords, records: dict[tuple[int, int], bytes], **fields) -> EngineRecords:
    """``rec`` with some records replaced (lengths and starts recomputed) and other fields overridden."""
    geo = rec.geometry
    parts, units = [], []
    for b in range(geo.row_blocks):
        for j in range(geo.col_tiles):
            r = records.get((b, j), bytes(rec.record(b, j).numpy()))
            parts.append(r)
            units.append(len(r) // 16)
    u = torch.tensor(units, dtype=torch.int64).view(geo.row_blocks, geo.col_tiles)
    per_block = u.sum(dim=1)
    body = torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
    starts = (torch.cumsum(per_block, 0) - per_block).to(torch.uint32)
    new = replace(rec, body=body, record_units=u.to(torch.uint8), block_start=starts)
    return replace(new, **fields)


def _edit(rec: EngineRecords, b: int, j: int, fn) -> EngineRecords:
    r = bytearray(rec.record(b, j).numpy().tobytes())
    fn(r)
    return _with_records(rec, {(b, j): bytes(r)})


def _find(rec, pred):
    geo = rec.geometry
    for b in range(geo.row_blocks):
        for j in range(geo.col_tiles):
            r = rec.record(b, j).numpy().tobytes()
            if pred(r, j):
                return b, j, r
    raise AssertionError("no record of that kind in the test plane")


def _header(r: bytes) -> int:
    return int.from_bytes(r[:4], "little")


def _count(r: bytes) -> int:
    return (_header(r) >> 16) & 0x1FF


def _refused(rec, match: str | None):
    with pytest.raises(CorruptPayloadError, match=match) as info:
        decode_engine_records(rec, name="t")
    assert info.value.tensor == "t"


def test_the_untouched_small_plane_decodes():
    plane, rec = _small()
    assert torch.equal(decode_engine_records(_with_records(rec, {}), name="t"), plane)


def test_nonzero_padding_is_refused():
    _, rec = _small()
    b, j, _ = _find(rec, lambda r, j: (_header(r) & 3) != 3 and r[-1] == 0)
    _refused(_edit(rec, b, j, lambda x: x.__setitem__(-1, 1)), "padding")


def _used(r: bytes) -> int:
    """Bytes a selector record's fields take: header, selectors, entries and escapes."""
    h, n = _header(r), _count(r)
    at = 4 + 16 * 4 * (1 << (h & 3))  # a full tile's selectors
    bits = int.from_bytes(r[at : at + (3 * n + 1) // 2], "little")
    escapes = sum((bits >> (12 * i + 9)) & 7 == 7 for i in range(n))
    return at + (3 * n + 1) // 2 + escapes


def test_padding_from_its_first_byte_is_refused():
    """The record's first padding byte (after its entries and escapes), not only its last, must be zero."""
    _, rec = _small()
    b, j, r = _find(rec, lambda r, j: j < 3 and (_header(r) & 3) != 3 and _used(r) < len(r) - 1)
    _refused(_edit(rec, b, j, lambda x: x.__setitem__(_used(r), 1)), "padding")


@pytest.mark.parametrize("fmt,mode", [(MXFP4, 0), (NVFP4, 2)], ids=["w1", "w4"])
def test_a_padding_slot_selector_is_refused(fmt, mode):
    """Every block holds 100 rows of its 100-row group: slot 127 (row 127) is padding, its fields must be 0."""
    _, rec = _small(fmt)
    width, slot = 1 << mode, 127
    try:
        b, j, _ = _find(rec, lambda r, j: j < 3 and (_header(r) & 3) == mode)
    except AssertionError:
        pytest.skip(f"no {width}-bit full tile in the test plane")
    bit = slot * 4 * width  # field p = slot * 4 + column at bit p * w: column 0's lowest bit
    _refused(_edit(rec, b, j, lambda x: x.__setitem__(4 + bit // 8, x[4 + bit // 8] | 1 << bit % 8)), "padding slot")


def test_header_length_must_match_the_offsets_byte():
    _, rec = _small()
    b, j, r = _find(rec, lambda r, j: (_header(r) & 3) != 3)
    h = _header(r) + (1 << 2)
    _refused(_edit(rec, b, j, lambda x: x.__setitem__(slice(0, 4), h.to_bytes(4, "little"))), "length")


def test_count_and_length_must_agree():
    _, rec = _small()
    b, j, r = _find(rec, lambda r, j: (_header(r) & 3) != 3 and _count(r) > 2)
    for delta, match in ((-2, None), (2, None), (200, "past its length")):  # fewer entries, more, more than it holds
        h = _header(r) + (delta << 16)
        _refused(_edit(rec, b, j, lambda x, h=h: x.__setitem__(slice(0, 4), h.to_bytes(4, "little"))), match)


def _entries(r: bytes, w: int, tc: int) -> tuple[int, list[int]]:
    start = 4 + 16 * tc * w
    n = _count(r)
    word = int.from_bytes(r[start : start + (3 * n + 1) // 2], "little")
    return start, [(word >> (12 * i)) & 0xFFF for i in range(n)]


def _put_entries(x: bytearray, start: int, entries: list[int]) -> None:
    word = sum(e << (12 * i) for i, e in enumerate(entries))
    x[start : start + (3 * len(entries) + 1) // 2] = word.to_bytes((3 * len(entries) + 1) // 2, "little")


def test_entries_out_of_order_or_range_are_refused():
    _, rec = _small()
    b, j, r = _find(rec, lambda r, j: (_header(r) & 3) == 0 and _count(r) >= 2 and j == 3)  # the 1-column tail
    start, ents = _entries(r, 1, _tc(j))
    swapped = [ents[1], ents[0], *ents[2:]]
    _refused(_edit(rec, b, j, lambda x: _put_entries(x, start, swapped)), "ascending")
    outside = [*ents[:-1], (ents[-1] & ~0x1FF) | 200]  # position 200 of a 128-position tail tile
    _refused(_edit(rec, b, j, lambda x: _put_entries(x, start, outside)), "outside its tile")


def _tc(j: int) -> int:
    return 4 if j < 3 else 1  # the small plane has 13 columns: three full tiles and a 1-column tail


def _selector_record(r: bytes, tc: int, entries: list[int], escapes: list[int]) -> bytes:
    """A 1-bit record ``r`` with its entries and escapes replaced, its length and count recomputed."""
    start = 4 + 16 * tc
    used = start + (3 * len(entries) + 1) // 2 + len(escapes)
    length = -(-used // 16) * 16
    h = (_header(r) & ~(0x3F << 2) & ~(0x1FF << 16)) | (length // 16) << 2 | len(entries) << 16
    x = bytearray(h.to_bytes(4, "little") + r[4:start] + bytes(length - 4 - 16 * tc))
    _put_entries(x, start, entries)
    x[start + (3 * len(entries) + 1) // 2 : used] = bytes(escapes)
    return bytes(x)


def _value_at(plane, rec, b: int, j: int, p: int) -> int:
    from csf_codec.inline import _block_rows_np

    row = _block_rows_np(rec.geometry)[b, p // _tc(j)]
    return int(plane.reshape(-1, 13)[row, 4 * j + p % _tc(j)]) if row >= 0 else 0


def test_an_escape_where_a_code_fits_is_refused():
    plane, rec = _small()
    b, j, r = _find(rec, lambda r, j: (_header(r) & 3) == 0 and any(e >> 9 < 7 for e in _entries(r, 1, _tc(j))[1]))
    start, ents = _entries(r, 1, _tc(j))
    escapes = list(r[start + (3 * len(ents) + 1) // 2 :][: sum(e >> 9 == 7 for e in ents)])
    i = next(k for k, e in enumerate(ents) if e >> 9 < 7)
    value = _value_at(plane, rec, b, j, ents[i] & 0x1FF)
    before = sum(e >> 9 == 7 for e in ents[:i])
    forged = [*ents[:i], (ents[i] & 0x1FF) | 7 << 9, *ents[i + 1 :]]
    record = _selector_record(r, _tc(j), forged, [*escapes[:before], value, *escapes[before:]])
    _refused(_with_records(rec, {(b, j): record}), "a code reaches")


def test_an_escape_inside_its_window_is_refused():
    _, rec = _small()
    b, j, r = _find(rec, lambda r, j: (_header(r) & 3) == 0 and any(e >> 9 == 7 for e in _entries(r, 1, _tc(j))[1]))
    start, ents = _entries(r, 1, _tc(j))
    at = start + (3 * len(ents) + 1) // 2
    faults = set()
    for v in range(256):
        try:
            decode_engine_records(_edit(rec, b, j, lambda x, v=v: x.__setitem__(at, v)), name="t")
        except CorruptPayloadError as e:
            faults.add(e.fault)
    assert "an exception repeats a value its selector could express" in faults
    assert "an escape holds a value a code reaches" in faults


def test_a_raw_record_that_a_window_beats_is_refused():
    plane, rec = _small()
    b, j, _ = _find(rec, lambda r, j: (_header(r) & 3) != 3 and j < 3)
    vals = bytes(_value_at(plane, rec, b, j, p) for p in range(512))
    native = (3 | 33 << 2).to_bytes(4, "little") + vals
    _refused(_with_records(rec, {(b, j): native.ljust(528, b"\0")}), "shortest")


def test_a_longer_window_is_refused():
    plane, rec = _small()
    windows = CANDIDATE_WINDOWS["mxfp4"]
    for b, j, vals, bases, valid, tc in _tiles(plane, MXFP4, 100):
        chosen = bytes(rec.record(b, j).numpy())
        for w, o in windows:
            other = _reference_record(vals, bases, valid, tc, [(w, o)])
            if other != chosen and (other[0] & 3) != 3:
                _refused(_with_records(rec, {(b, j): other}), "shortest")
                return
    raise AssertionError("no alternative window found")


def test_every_other_window_is_refused():
    """Each tile's record rewritten under every other candidate window that fits decodes to the same plane but is
    not the encoder's choice: refused. The decoder derives every window's length from the record it reads (1-bit
    fields by popcount, wider ones by a histogram), so each width is tried, with tail tiles and padding slots."""
    clean_nv = synthetic_scale_plane((1, 200, 10), NVFP4, NVFP4_TYPICAL, seed=18)
    tried = set()
    for name, fmt, plane, group in [*REFERENCE_PLANES, ("clean-nvfp4", NVFP4, clean_nv, 100)]:
        rec = encode_engine_records(plane, fmt, row_group=group, name=name)
        for b, j, vals, bases, valid, tc in list(_tiles(plane, fmt, group))[:8]:
            chosen = bytes(rec.record(b, j).numpy())
            for w, o in CANDIDATE_WINDOWS[fmt.name]:
                other = _reference_record(vals, bases, valid, tc, [(w, o)])
                if other != chosen and (other[0] & 3) != 3:
                    _refused(_with_records(rec, {(b, j): other}), "shortest")
                    tried.add((fmt.name, w, tc < 4, not all(valid)))
    assert {(f, w) for f, w, _, _ in tried} == {("mxfp4", 1), ("mxfp4", 2), ("mxfp4", 4), ("nvfp4", 4)}, tried
    assert {tail for _, _, tail, _ in tried} == {True, False} and {pad for *_, pad in tried} == {True, False}


def test_window_outside_the_candidates_is_refused():
    _, rec = _small()
    b, j, r = _find(rec, lambda r, j: (_header(r) & 3) == 0)
    h = (_header(r) & ~(0xFF << 8)) | (5 << 8)
    _refused(_edit(rec, b, j, lambda x: x.__setitem__(slice(0, 4), h.to_bytes(4, "little"))), "candidate")


def test_reserved_header_bits_are_refused():
    _, rec = _small()
    b, j, r = _find(rec, lambda r, j: True)
    h = _header(r) | 1 << 30
    _refused(_edit(rec, b, j, lambda x: x.__setitem__(slice(0, 4), h.to_bytes(4, "little"))), "reserved")


def test_offsets_must_match_the_body():
    _, rec = _small()
    starts = rec.block_start.to(torch.int64)
    starts[1] += 1  # one 16-byte unit
    _refused(replace(rec, block_start=starts.to(torch.uint32)), "starts")
    _refused(replace(rec, body=rec.body[:-16]), "body holds")
    _refused(replace(rec, body=torch.cat([rec.body, torch.zeros(16, dtype=torch.uint8)])), "body holds")
    units = rec.record_units.clone()
    units[0, 0] = 0
    _refused(replace(rec, record_units=units), "zero")


def test_non_canonical_bases_are_refused():
    """Bases one higher and windows one lower decode to the same plane: not the encoding the plane has."""
    _, rec = _small()
    assert all(_header(bytes(rec.record(0, j).numpy())) & 0xFF03 == 0 for j in range(4))  # 1-bit, origin 0
    ref = rec.base_ref.clone()
    ref[0] += 1
    moved = {}
    for j in range(4):
        r = bytearray(rec.record(0, j).numpy().tobytes())
        r[1] = 0xFF  # origin -1
        moved[(0, j)] = bytes(r)
    forged = _with_records(rec, moved, base_ref=ref)
    with pytest.raises(CorruptPayloadError, match=r"bases|shortest"):
        decode_engine_records(forged, name="t")
    # a padding slot's delta (block 0 holds rows 0-99 of the 100-row group: slot 127 is padding)
    delta = rec.base_delta.clone()
    delta[0, 63] |= 0x10
    _refused(replace(rec, base_delta=delta), "bases")


def test_wrong_array_shapes_are_typed_errors():
    _, rec = _small()
    with pytest.raises(ShapeMismatchError, match="record_units"):
        decode_engine_records(replace(rec, record_units=rec.record_units[:, :2]), name="t")
    for dtype in (torch.int32, torch.int64):  # u32 starts; an int64 one (the u64 of before) too is refused
        with pytest.raises(ShapeMismatchError, match="block_start"):
            decode_engine_records(replace(rec, block_start=rec.block_start.to(dtype)), name="t")
    with pytest.raises(ShapeMismatchError, match="body"):
        decode_engine_records(replace(rec, body=rec.body.view(1, -1)), name="t")


def test_a_body_past_the_reach_of_u32_starts_is_refused(monkeypatch):
    """Block starts are u32 counts of 16-byte units: a plane whose records need more is refused (a typed error)
    while it is encoded, not wrapped. The reach is lowered here to the test plane's size."""
    import csf_codec.engine_records as er

    plane = synthetic_scale_plane((2, 1152, 160), MXFP4, SEED_REGIME, seed=3)
    units = int(encode_engine_records(plane, MXFP4, row_group=576).record_units.to(torch.int64).sum())
    monkeypatch.setattr(er, "MAX_BODY_UNITS", units)
    encode_engine_records(plane, MXFP4, row_group=576)  # exactly at the reach: accepted
    monkeypatch.setattr(er, "MAX_BODY_UNITS", units - 1)
    with pytest.raises(ShapeMismatchError, match="u32 block starts"):
        encode_engine_records(plane, MXFP4, row_group=576, name="t")


@pytest.mark.parametrize("cols,count", [(4, 1), (4, 5), (4, 70), (4, 300), (2, 1), (2, 9), (1, 3), (3, 2)])
@pytest.mark.parametrize("width", [1, 4])
def test_base_window_counts_match_the_rows(cols, count, width):
    """The per-slot counts the row-base proof reads, against a direct count over each slot's scales."""
    from csf_codec.engine_records_decode_np import base_window_counts
    from csf_codec.inline_np import ClassPlan

    rng = np.random.default_rng(cols * 1000 + count + width)
    nb, span = 3, 1 << width
    base = rng.integers(-2, 258, (nb, 128))
    vals = (base.repeat(cols, axis=1)[:, None, :] + rng.integers(-3, span + 3, (nb, count, 128 * cols))) % 256
    tiles = vals.astype(np.uint8).reshape(nb * count, -1)  # overwritten by the counts
    got = base_window_counts(tiles, base, ClassPlan(0, count, cols), width)
    v = vals.reshape(nb, count, 128, cols).astype(np.int64)
    b = (base % 256)[:, None, :, None]  # the counts read the base as a byte, as the decoder's sums do
    e = (v - b) % 256
    want = [(e == 0).sum(axis=(1, 3)), (e == span - 1).sum(axis=(1, 3)), (e < span).sum(axis=(1, 3))]
    assert np.array_equal(got, np.stack(want))
