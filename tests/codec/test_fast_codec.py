"""The CPU (numpy) encoders write the same bytes as the torch reference; every plane round-trips; empty
planes are valid payloads; non-canonical bodies are refused; the entropy bound is what stats.py defines."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csf_codec import (
    MXFP4,
    NVFP4,
    CorruptPayloadError,
    decode_compact,
    decode_inline,
    encode_compact,
    encode_inline,
    inline_from_payload,
)
from csf_codec import inline as inline_mod
from csf_codec.compact import _encode_torch, compact_layout
from csf_codec.compact_code import LOW_BITS
from csf_codec.container import HEADER_BYTES
from csf_codec.rowbase import _row_bases_torch, proven_bases, row_bases, row_bases_np
from csf_codec.stats import conditional_offset_entropy
from csf_codec.synthetic import (
    DOWN_PROJ_DENSE,
    EXCEPTION_DENSE,
    NVFP4_TYPICAL,
    SEED_REGIME,
    SPECIAL_CONTENT,
    best_row_bases,
    measure_window_fraction,
    synthetic_scale_plane,
)

from .planes_for_tests import clustered_plane, special_rows
from .planes_for_tests import reseal as _reseal

REGIMES = {"seed": SEED_REGIME, "dense": EXCEPTION_DENSE, "down_proj": DOWN_PROJ_DENSE, "special": SPECIAL_CONTENT}


def _planes():
    g = torch.Generator().manual_seed(5)
    yield "w13_seed", MXFP4, synthetic_scale_plane((3, 1152, 160), MXFP4, SEED_REGIME, seed=1), 576
    yield "w2_down_proj", MXFP4, synthetic_scale_plane((3, 5120, 18), MXFP4, DOWN_PROJ_DENSE, seed=2), None
    yield "w13_down_proj", MXFP4, synthetic_scale_plane((2, 1152, 160), MXFP4, DOWN_PROJ_DENSE, seed=3), 576
    yield "special", MXFP4, synthetic_scale_plane((2, 700, 22), MXFP4, SPECIAL_CONTENT, seed=4), None
    yield "nvfp4_w13", NVFP4, synthetic_scale_plane((2, 1152, 320), NVFP4, NVFP4_TYPICAL, seed=5), 576
    yield "nvfp4_w2", NVFP4, synthetic_scale_plane((2, 5120, 36), NVFP4, NVFP4_TYPICAL, seed=6), None
    yield "random", MXFP4, torch.randint(0, 256, (3, 300, 22), generator=g).to(torch.uint8), None
    yield "random_nv", NVFP4, torch.randint(0, 256, (2, 130, 7), generator=g).to(torch.uint8), 65
    yield "clamped_high", MXFP4, torch.randint(240, 256, (2, 200, 9), generator=g).to(torch.uint8), None
    yield "clamped_low", NVFP4, torch.randint(0, 20, (2, 200, 9), generator=g).to(torch.uint8), None
    yield "odd", MXFP4, special_rows(clustered_plane((5, 77, 13), seed=7, exception_rate=0.2), seed=8), None


PLANES = list(_planes())


def _torch_inline(plane, fmt, group):
    """The torch encoder on the CPU: the reference the GPU path runs."""
    numpy_path = inline_mod._encode_storage_np
    inline_mod._encode_storage_np = inline_mod._encode_storage_torch
    try:
        return encode_inline(plane, fmt, row_group=group, verify=False)
    finally:
        inline_mod._encode_storage_np = numpy_path


@pytest.mark.parametrize("case", PLANES, ids=[p[0] for p in PLANES])
def test_numpy_encoders_write_the_torch_bytes(case):
    _, fmt, plane, group = case
    rows = plane.reshape(-1, plane.shape[-1])
    width, body, sections = _encode_torch(rows, (1, 2, 4))
    compact = encode_compact(plane, fmt)
    assert compact.width == width
    assert torch.equal(compact.payload[HEADER_BYTES:], body)
    assert tuple(compact_layout(compact.payload).counts.shape) == (sections[3],)
    want = _torch_inline(plane, fmt, group).to_payload()
    assert torch.equal(encode_inline(plane, fmt, row_group=group).to_payload(), want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    experts=st.integers(1, 3),
    rows=st.integers(1, 300),
    cols=st.integers(1, 41),
    regime=st.sampled_from(sorted(REGIMES)),
    fmt=st.sampled_from([MXFP4, NVFP4]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fresh_random_planes_round_trip(experts, rows, cols, regime, fmt, seed):
    stats = REGIMES[regime]
    if regime == "special" and experts * rows < 16:
        stats = SEED_REGIME
    plane = synthetic_scale_plane((experts, rows, cols), fmt, stats, seed=seed)
    compact = encode_compact(plane, fmt)  # verify=True: decoded and compared inside
    assert torch.equal(decode_compact(compact.payload), plane)
    inline = encode_inline(plane, fmt)
    assert torch.equal(decode_inline(inline_from_payload(inline.to_payload())), plane)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 400), st.integers(1, 50), st.integers(0, 255), st.integers(0, 255), st.integers(0, 2**31 - 1))
def test_numpy_row_bases_match_the_histogram(rows, cols, lo, spread, seed):
    g = torch.Generator().manual_seed(seed)
    x = (lo + torch.randint(0, spread + 1, (rows, cols), generator=g)).clamp(0, 255).to(torch.uint8)
    x[torch.rand(rows, generator=g) < 0.1, 0] = 255  # some wide rows beside narrow ones
    got = row_bases_np(x.numpy(), (1, 2, 4))
    want = _row_bases_torch(x, (1, 2, 4))
    for w in (1, 2, 4):
        assert np.array_equal(got[w], want[w].numpy())


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.integers(0, 255), st.integers(0, 40), st.sampled_from([1, 2, 4]))
def test_proven_bases_prove_only_the_rule(rows, cols, lo, spread, width):
    """Whatever base a row is offered (its own, a neighbour, anything), the three counts prove only the rule's."""
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = (lo + torch.randint(0, spread + 1, (rows, cols), generator=g)).clamp(0, 255).to(torch.uint8).numpy()
    own = row_bases_np(x, (width,))[width].astype(np.int16)
    offered = own + torch.randint(-2, 3, (rows,), generator=g).numpy().astype(np.int16)
    offered[::5] = torch.randint(-1, 257, (len(offered[::5]),), generator=g).numpy()
    span = 1 << width
    v, b = x.astype(np.int16), offered[:, None]
    counts = [(v == b).sum(1), (v == b + span - 1).sum(1), ((v >= b) & (v < b + span)).sum(1)]
    ok = proven_bases(offered, *counts, cols, width)
    assert np.array_equal(offered[ok], own[ok])
    if spread == 0:  # one value a row: each row's own base is proven
        assert ok[offered == own].all()


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0), (2, 0, 5), (2, 5, 0), (0, 5, 5), (0, 0, 0)])
@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
def test_empty_planes_are_valid_payloads(shape, fmt):
    plane = torch.zeros(shape, dtype=torch.uint8)
    compact = encode_compact(plane, fmt)
    r = math.prod(shape[:-1])
    lay = compact_layout(compact.payload)
    # section sizes are the spec's formulas at R*C = 0: bases of empty rows are 0, one escape per segment
    assert (lay.codes.numel(), lay.escapes.numel(), lay.selectors.numel()) == (-(-r // 4), -(-r // 128), 0)
    assert lay.counts.numel() == 0 and lay.exceptions.numel() == 0
    assert decode_compact(compact.payload).shape == shape
    inline = encode_inline(plane, fmt)
    back = decode_inline(inline_from_payload(inline.to_payload()))
    assert back.shape == shape and back.dtype == torch.uint8


def _listed(payload):
    """The layout and the listed exceptions (flat index, far flag, chunk) of a compact payload."""
    from csf_codec.compact_torch import listed_exceptions

    lay = compact_layout(payload)
    return lay, listed_exceptions(lay.table, lay.exceptions, "scales")


def _exceptions_at(payload):
    """Byte offset in the payload of the exception section."""
    return payload.numel() - compact_layout(payload).exceptions.numel()


def _flip(payload, byte, bit):
    bad = payload.clone()
    bad[byte] = int(bad[byte]) ^ (1 << bit)
    return _reseal(bad)


def test_non_canonical_compact_bodies_are_refused():
    """Each field of the exception code, changed, is refused with a typed error naming the tensor."""
    plane = synthetic_scale_plane((2, 300, 18), MXFP4, DOWN_PROJ_DENSE, seed=9)
    payload = encode_compact(plane, MXFP4).payload
    lay, listed = _listed(payload)
    exc0 = _exceptions_at(payload)
    # every bit of the listed chunks' position codes and far flags: a typed error or the same plane
    stream_bits = lay.table.stream_bits
    caught = 0
    for bit in range(0, stream_bits, 7):
        try:
            out = decode_compact(_flip(payload, exc0 + bit // 8, bit % 8), name="w2.scales")
        except CorruptPayloadError as e:
            assert "w2.scales" in str(e)
            caught += 1
            continue
        assert torch.equal(out, plane)
    assert caught > 0.9 * len(range(0, stream_bits, 7))
    # a far flag set on a near exception: then a far code is missing, or a field disagrees
    chunk0 = int(lay.table.bit_offsets[0])
    n0 = int(lay.table.listed[0])
    low = int(LOW_BITS[n0])
    near = int((~listed.far[:n0]).nonzero()[0, 0])
    flag = chunk0 + n0 + (256 >> low) + n0 * low + near
    with pytest.raises(CorruptPayloadError):
        decode_compact(_flip(payload, exc0 + flag // 8, flag % 8), name="w2.scales")
    # an exception's side (its selector bit) flipped: the decoded value would differ; the digest or a
    # range rule refuses it, by name
    where = int(listed.where[0])
    sel = HEADER_BYTES + lay.codes.numel() + lay.escapes.numel() + where * lay.width // 8
    with pytest.raises(CorruptPayloadError, match=r"w2\.scales"):
        decode_compact(_flip(payload, sel, (where * lay.width) % 8), name="w2.scales")
    # the padding after the position codes
    if stream_bits % 8:
        with pytest.raises(CorruptPayloadError, match="padding"):
            decode_compact(_flip(payload, exc0 + stream_bits // 8, 7), name="w2.scales")


def test_far_codes_and_escapes_are_canonical():
    """Far codes and escaped bytes: changing one is refused, never decoded to another plane."""
    g = torch.Generator().manual_seed(4)
    plane = synthetic_scale_plane((1, 512, 32), MXFP4, DOWN_PROJ_DENSE, seed=4)
    rows = plane.view(-1, 32)
    bases = best_row_bases(plane, 1).reshape(-1)
    pick = torch.randint(0, rows.numel(), (40,), generator=g)
    r = pick // 32
    rows.view(-1)[pick] = (bases[r] - 30).clamp(min=0).to(torch.uint8)  # far below: escaped bytes
    payload = encode_compact(plane, MXFP4).payload
    _, listed = _listed(payload)
    assert int(listed.far.sum()) > 0 and int((listed.codes == 7).sum()) > 0
    far_start = _exceptions_at(payload) + listed.far_start
    for byte in range(far_start, payload.numel()):
        for bit in range(8):
            try:
                out = decode_compact(_flip(payload, byte, bit), name="far")
            except CorruptPayloadError as e:
                assert "far" in str(e)
                continue
            assert torch.equal(out, plane)


def test_non_canonical_inline_records_are_refused():
    plane = synthetic_scale_plane((2, 256, 16), MXFP4, DOWN_PROJ_DENSE, seed=10)
    inline = encode_inline(plane, MXFP4)
    s = inline.record_bytes
    h = inline.headers()[: inline.records.reshape(-1, s).shape[0]]
    t = int((((h & 3) != 3) & (((h >> 2) & 63) >= 2)).nonzero()[0, 0])  # a selector tile with 2+ exceptions
    w = inline_mod.MODE_WIDTH[int(h[t] & 3)]
    origin = int((h[t] >> 8) & 0xFF)
    origin -= 256 * (origin >= 128)
    sb = 128 * 4 * w // 8
    cap = inline_mod.exception_capacity(w, s)
    body = inline.to_payload()
    start = HEADER_BYTES + inline.base_ref.numel() + inline.base_delta.numel() + t * s
    p = int(body[start + sb]) | int(body[start + sb + 1]) << 8  # the first exception's position

    swapped = body.clone()
    swapped[start + sb : start + sb + 2] = body[start + sb + 2 : start + sb + 4]
    swapped[start + sb + 2 : start + sb + 4] = body[start + sb : start + sb + 2]
    with pytest.raises(CorruptPayloadError, match="ascending"):
        inline_from_payload(_reseal(swapped))

    selector = body.clone()
    selector[start + p * w // 8] = int(selector[start + p * w // 8]) | (1 << (p * w % 8))
    with pytest.raises(CorruptPayloadError, match="non-zero selector"):
        inline_from_payload(_reseal(selector))

    block, slot = t // inline.geometry.full_col_tiles, p // 4
    delta = inline_mod._unpack_deltas(inline.base_delta, MXFP4)
    low = int(inline.base_ref[block]) + int(delta[block, slot]) + origin
    inside = body.clone()
    inside[start + sb + 2 * cap] = low  # the first exception's value becomes the window's low end
    with pytest.raises(CorruptPayloadError, match="repeats a value"):
        inline_from_payload(_reseal(inside))
    assert inline_from_payload(_reseal(body.clone())) is not None  # the untouched body still decodes


def test_conditional_entropy_is_the_defined_bound():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(100, 106, (60, 7), generator=g).to(torch.uint8)
    x[:10] += 40  # rows of another base: conditioning on the base matters
    b = row_bases(x, 1)
    joint, per_base = Counter(), Counter()
    for r in range(x.shape[0]):
        for v in x[r].tolist():
            joint[int(b[r]), v - int(b[r])] += 1
            per_base[int(b[r])] += 1
    n = x.numel()
    want = -sum(c / n * math.log2(c / per_base[base]) for (base, _), c in joint.items())
    assert conditional_offset_entropy(x, b) == pytest.approx(want, rel=1e-12)


def test_down_projection_regime_is_dense_near_and_clustered_by_row():
    plane = synthetic_scale_plane((8, 1152, 160), MXFP4, DOWN_PROJ_DENSE, seed=3)
    assert 0.95 <= measure_window_fraction(plane, 1) <= 0.97  # 3-5% exceptions
    rows = plane.reshape(-1, 160).to(torch.int16)
    d = rows - best_row_bases(plane, 1).reshape(-1, 1)
    exc = (d < 0) | (d > 1)
    near = ((d == -1) | (d == 2)) & exc
    assert int(near.sum()) >= 0.85 * int(exc.sum())
    per_row = exc.sum(dim=1).sort(descending=True).values
    assert float(per_row[: len(per_row) // 4].sum()) >= 0.55 * float(per_row.sum())  # uniform would give ~0.3


def _sealed_compact(plane, secs, width):
    from csf_codec.container import Envelope, plane_digest, seal
    from csf_codec.formats import scale_format

    env = Envelope(
        magic=b"CSFc",
        fmt=scale_format(MXFP4),
        param=width,
        shape=tuple(plane.shape),
        extra=0,
        sections=tuple(int(s.size) for s in secs),
    )
    return seal(env, torch.from_numpy(np.concatenate(secs)), digest=plane_digest(plane))


def test_raw_chunks_must_be_canonical():
    from csf_codec.compact_np import encode_sections_np

    g = torch.Generator().manual_seed(11)
    plane = synthetic_scale_plane((1, 256, 16), MXFP4, DOWN_PROJ_DENSE, seed=12)
    plane[0, :16] = torch.randint(0, 256, (16, 16), generator=g).to(torch.uint8)  # chunk 0 goes raw
    width, secs = encode_sections_np(plane.reshape(-1, 16).numpy(), (1, 2, 4))
    assert width == 1 and secs[3][0] == 255 and secs[3][1] != 255
    assert torch.equal(decode_compact(_sealed_compact(plane, secs, width)), plane)

    flipped = [s.copy() for s in secs]
    flipped[2][0] ^= 1  # a selector bit inside the raw chunk: the stored bytes would still decode
    with pytest.raises(CorruptPayloadError, match="raw chunk's selectors"):
        decode_compact(_sealed_compact(plane, flipped, width))

    quiet = plane.clone()
    quiet[0, 16:32] = best_row_bases(plane)[0, 16:32, None].to(torch.uint8)  # chunk 1: no exceptions
    width, secs = encode_sections_np(quiet.reshape(-1, 16).numpy(), (1, 2, 4))
    lay = compact_layout(_sealed_compact(quiet, secs, width))
    assert secs[3][1] == 0  # listed, with no bits: stored raw instead, it must be refused
    listed = [s.copy() for s in secs]
    listed[3][1] = 255
    raw_at = lay.table.stream_bytes + 256  # after the streams and chunk 0's native bytes
    listed[4] = np.concatenate([secs[4][:raw_at], quiet.reshape(-1)[256:512].numpy(), secs[4][raw_at:]])
    with pytest.raises(CorruptPayloadError, match="few enough exceptions"):
        decode_compact(_sealed_compact(quiet, listed, width))


def test_torch_decoder_checks_raw_chunks_too():
    """The GPU payloads' decoder, run on the CPU: same planes, same refusals."""
    from csf_codec.compact import _decode_torch, _scan_bases
    from csf_codec.compact_np import encode_sections_np

    def decode(payload):
        lay = compact_layout(payload)
        bases = _scan_bases(lay.base_codes, lay.base_codes == 3, lay.escapes)
        return _decode_torch(lay, bases, "scales")

    for _, fmt, plane, _ in PLANES:
        assert torch.equal(decode(encode_compact(plane, fmt).payload), plane)
    plane = torch.randint(0, 256, (1, 64, 16), generator=torch.Generator().manual_seed(2)).to(torch.uint8)
    width, secs = encode_sections_np(plane.reshape(-1, 16).numpy(), (1, 2, 4))
    secs[2][0] ^= 1  # field 0 of a raw chunk
    with pytest.raises(CorruptPayloadError, match="raw chunk's selectors"):
        decode(_sealed_compact(plane, secs, width))


def _inline_decoders():
    """The CPU decoder, and the torch one that GPU payloads take, run on the CPU."""

    def torch_path(inline):
        return inline_mod._decode_torch(inline, inline.geometry, "scales")

    return [("numpy", decode_inline), ("torch", torch_path)]


@pytest.mark.parametrize("decoder", _inline_decoders(), ids=lambda d: d[0])
def test_inline_unused_bytes_must_be_zero(decoder):
    _, decode = decoder
    plane = synthetic_scale_plane((2, 200, 18), MXFP4, DOWN_PROJ_DENSE, seed=13)  # padding: 200 = 128 + 72
    plane[0, :128, :4] = torch.randint(0, 256, (128, 4), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    inline = encode_inline(plane, MXFP4)
    assert torch.equal(decode(inline), plane)
    s = inline.record_bytes
    h = inline.headers()[: inline.records.reshape(-1, s).shape[0]]
    sel_tile = int(((h & 3) != 3).nonzero()[0, 0])
    raw_tile = int(((h & 3) == 3).nonzero()[0, 0])

    def mutated(where, value=1):
        recs = inline.records.clone().reshape(-1, s)
        recs[where] = value
        return replace(inline, records=recs.view_as(inline.records))

    with pytest.raises(CorruptPayloadError, match="unused exception slots or padding"):
        decode(mutated((sel_tile, s - 5)))  # the byte before the header: past every value slot
    with pytest.raises(CorruptPayloadError, match="besides its header"):
        decode(mutated((raw_tile, 0)))
    with pytest.raises(CorruptPayloadError, match="enumerate the raw tiles"):
        decode(mutated((raw_tile, s - 4), int(inline.records.reshape(-1, s)[raw_tile, s - 4]) + 4))  # index + 1
    ft = inline.geometry.full_col_tiles  # block 1 of expert 0 holds rows 128..199, then padding
    pad_tile = next(t for t in range(ft, 2 * ft) if int(h[t] & 3) != 3)
    w = inline_mod.MODE_WIDTH[int(h[pad_tile] & 3)]
    bit = 127 * 4 * w  # slot 127 is the block's row 127 (global 255): padding; column 0
    with pytest.raises(CorruptPayloadError, match="padding slot's selector"):
        decode(mutated((pad_tile, bit // 8), 1 << (bit % 8)))
    delta = inline.base_delta.clone()
    delta[1, 127 // 2] |= 0xF0  # slot 127: the high nibble of byte 63
    with pytest.raises(CorruptPayloadError, match="base delta"):
        decode(replace(inline, base_delta=delta))


@pytest.mark.parametrize("decoder", _inline_decoders(), ids=lambda d: d[0])
def test_both_inline_decoders_restore_every_plane(decoder):
    _, decode = decoder
    for _, fmt, plane, group in PLANES:
        assert torch.equal(decode(encode_inline(plane, fmt, row_group=group)), plane)


@pytest.mark.parametrize("cols", [127, 128, 255, 256, 600])
def test_numpy_row_bases_match_the_histogram_on_wide_rows(cols):
    """Wide rows change the numpy path's layout (no transpose from 128 columns) and count types (from 256
    columns, and from 512 for the window keys)."""
    g = torch.Generator().manual_seed(cols)
    x = (120 + torch.randint(0, 4, (200, cols), generator=g)).to(torch.uint8)
    x[::3] = (x[::3] + torch.randint(0, 30, (1, cols), generator=g)).to(torch.uint8)  # 4 to 32 levels
    x[::7, : cols // 2] = 0  # a wide row: histogram
    x[1] = 121  # one value: the window below it wins the tie
    got = row_bases_np(x.numpy(), (1, 2, 4))
    want = _row_bases_torch(x, (1, 2, 4))
    for w in (1, 2, 4):
        assert np.array_equal(got[w], want[w].numpy())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.sampled_from([0, 3, 120, 236, 250]), st.integers(0, 2**31 - 1))
def test_numpy_row_bases_pick_the_lowest_tied_window(rows, cols, lo, seed):
    """Rows of a few sparse values (gaps inside and below the window that wins), near either end of the byte
    range: the windows tied with the best one below it, and the clamp at 0, decide the base."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.randint(0, 20, (rows, 3), generator=g)  # three values a row, anywhere in 20 levels
    x = (lo + levels.gather(1, torch.randint(0, 3, (rows, cols), generator=g))).clamp(0, 255).to(torch.uint8)
    widths = (0, 1, 2, 3, 4)
    got = row_bases_np(x.numpy(), widths)
    want = _row_bases_torch(x, widths)
    for w in widths:
        assert np.array_equal(got[w], want[w].numpy())


@pytest.mark.parametrize("width", [0, 3, 5, 8])
def test_numpy_row_bases_take_any_width(width):
    x = torch.randint(0, 256, (300, 9), generator=torch.Generator().manual_seed(width)).to(torch.uint8)
    x[:150] = (100 + x[:150] % 6).to(torch.uint8)  # narrow rows beside wide ones
    assert np.array_equal(row_bases_np(x.numpy(), (width,))[width], _row_bases_torch(x, (width,))[width].numpy())


@pytest.mark.parametrize("fmt,width", [(MXFP4, 1), (NVFP4, 2), (NVFP4, 4)], ids=["w1", "w2", "w4"])
def test_span_edges_inside_the_exception_streams(monkeypatch, fmt, width):
    """Spans of 256 rows (the smallest), so that many span edges fall inside a byte of the position codes,
    beside the previous span's far flags: both coders still agree with the plane and with torch."""
    from csf_codec import compact_np

    monkeypatch.setattr(compact_np, "_SCALES_PER_SPAN", 1)
    plane = clustered_plane((4, 700, 16), seed=21, exception_rate=0.1)
    assert len(compact_np.row_spans(2800, 16)) == 11
    payload = encode_compact(plane, fmt, widths=(width,)).payload
    width_t, body, _ = _encode_torch(plane.reshape(-1, 16), (width,))
    assert width_t == width and torch.equal(payload[HEADER_BYTES:], body)
    assert torch.equal(decode_compact(payload), plane)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.sampled_from([18, 36, 160]), st.sampled_from([1, 2, 3, 7]), st.integers(0, 2**31 - 1))
def test_far_flags_counted_in_pieces(experts, cols, piece, seed):
    """The compact decoder masks and counts the far flags a few listed chunks at a time: pieces of any size
    give the one-piece result, and the plane decodes through them."""
    from csf_codec import compact_decode_np

    plane = synthetic_scale_plane((experts, 256, cols), MXFP4, DOWN_PROJ_DENSE, seed=seed)
    lay = compact_layout(encode_compact(plane, MXFP4).payload)
    table = lay.table.numpy()
    stream = lay.exceptions.numpy()[: table.stream_bytes]
    whole = compact_decode_np._far_flags(stream, table)
    old, compact_decode_np._FLAG_CHUNKS = compact_decode_np._FLAG_CHUNKS, piece
    try:
        cut = compact_decode_np._far_flags(stream, table)
        assert all(np.array_equal(a, b) for a, b in zip(whole, cut, strict=True))
        assert torch.equal(decode_compact(encode_compact(plane, MXFP4).payload), plane)
    finally:
        compact_decode_np._FLAG_CHUNKS = old


@pytest.mark.parametrize("rebuilt", [True, False], ids=["size_changes", "size_holds"])
def test_inline_record_size_guessed_from_the_first_span(monkeypatch, rebuilt):
    """Spans of one row block. The first span's own record size is the guess its spans are built for: a clean
    first span before exception-heavy ones guesses too small, and the spans are built again; a raw tile in
    every span keeps the guess, and the raw tiles are renumbered across spans. Both write the torch bytes."""
    from csf_codec import inline_np

    monkeypatch.setattr(inline_np, "_ENCODE_SCALES", 1)
    calls = []
    build_spans = inline_np._build_spans
    monkeypatch.setattr(inline_np, "_build_spans", lambda *a: calls.append(1) or build_spans(*a))
    g = torch.Generator().manual_seed(33)
    plane = 100 + torch.randint(0, 2, (1, 1024, 8), generator=g)
    if rebuilt:
        far = torch.rand(plane.shape, generator=g) < 0.05
        far[:, :128] = False  # the first span has no exception
        plane = torch.where(far, 130, plane)
    else:
        plane[:, :, 4:] = torch.randint(0, 256, (1, 1024, 4), generator=g)  # every span's second tile goes raw
    plane = plane.to(torch.uint8)
    got = encode_inline(plane, MXFP4)
    assert len(inline_np.block_spans(8, 8, scales=1)) == 8 and bool(calls) == rebuilt
    assert rebuilt or got.raw_tiles == 8
    assert torch.equal(got.to_payload(), _torch_inline(plane, MXFP4, None).to_payload())
