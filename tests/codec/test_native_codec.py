"""The C loops (csf_codec._native) against the numpy reference: the same bytes on fresh random planes of every
regime the bench uses, and the same verdict (accept with the same plane, or refuse with the same error type and
message) on mutated payloads. The reference is asked for explicitly here; the codec itself never falls back."""

from __future__ import annotations

import random
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csf_codec import MXFP4, NVFP4, CSFError, compact, encode_compact, encode_inline, inline_from_payload
from csf_codec import inline as inline_mod
from csf_codec import native as native_mod
from csf_codec.compact_decode_c import decode_rows_c, scan_bases_c
from csf_codec.compact_decode_np import decode_rows_np
from csf_codec.compact_np import scan_bases_np
from csf_codec.container import HEADER_BYTES
from csf_codec.engine_records import _decode_engine, decode_engine_records, encode_engine_records
from csf_codec.engine_records_decode_np import decode_records
from csf_codec.inline_decode_c import decode_class_c
from csf_codec.inline_np import decode_class_np
from csf_codec.rowbase import _row_bases_torch, row_bases_c, row_bases_np
from csf_codec.synthetic import DOWN_PROJ_DENSE, EXCEPTION_DENSE, NVFP4_TYPICAL, SEED_REGIME, synthetic_scale_plane

from .planes_for_tests import clustered_plane, reseal, special_rows

BENCH_REGIMES = [
    ("seed", MXFP4, SEED_REGIME),
    ("dense", MXFP4, EXCEPTION_DENSE),
    ("down_proj", MXFP4, DOWN_PROJ_DENSE),
    ("nvfp4", NVFP4, NVFP4_TYPICAL),
]


def _compact_both(payload: torch.Tensor):
    """(numpy outcome, C outcome) of the CPU decoder's span work on one compact payload: the plane, or the error's
    (type, message); errors raised before the span work (layout, row bases) are the same code for both."""
    try:
        lay = compact.compact_layout(payload, name="p")
        bases = scan_bases_np(lay.base_codes.numpy(), lay.escapes.numpy())
        if lay.rows and (int(bases.min()) < 0 or int(bases.max()) > 256 - (1 << lay.width)):
            return ("shared", "base"), ("shared", "base")
    except CSFError as e:
        return (type(e), str(e)), (type(e), str(e))
    sec = (lay.selectors.numpy(), lay.table.numpy(), lay.exceptions.numpy())
    got = []
    for fn in (decode_rows_np, decode_rows_c):
        try:
            got.append(fn(bases, *sec, lay.rows, lay.cols, lay.width, "p"))
        except CSFError as e:
            got.append((type(e), str(e)))
    return tuple(got)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("widths", [(1, 2, 4), (1,), (2,), (4,)], ids=["auto", "w1", "w2", "w4"])
@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    experts=st.integers(1, 3),
    rows=st.sampled_from([1, 7, 128, 300, 1152]),
    cols=st.sampled_from([1, 5, 18, 36, 160, 320]),
    seed=st.integers(0, 2**31 - 1),
)
def test_compact_decoders_agree_on_fresh_planes(regime, widths, experts, rows, cols, seed):
    _, fmt, stats = regime
    plane = synthetic_scale_plane((experts, rows, cols), fmt, stats=stats, seed=seed)
    a, b = _compact_both(encode_compact(plane, fmt, widths=widths, verify=False).payload)
    assert isinstance(a, np.ndarray) and _same(a, b)
    assert np.array_equal(b, plane.numpy().reshape(-1))


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
def test_compact_decoders_agree_on_bench_shaped_planes(regime):
    """The bench's W13 and W2 shapes (fewer experts): several spans, two threads."""
    _, fmt, stats = regime
    k = 2 if fmt is NVFP4 else 1
    for shape in ((6, 1152, 160 * k), (6, 5120, 18 * k)):
        plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=sum(shape))
        a, b = _compact_both(encode_compact(plane, fmt, verify=False).payload)
        assert _same(a, b) and np.array_equal(b, plane.numpy().reshape(-1))
        assert torch.equal(compact.decode_compact(encode_compact(plane, fmt).payload), plane)


def _mutation_plane() -> torch.Tensor:
    """Exceptions of every kind: near, far, escaped, in listed and in raw chunks."""
    plane = special_rows(clustered_plane((3, 120, 16), seed=5, exception_rate=0.06), seed=5)
    g = torch.Generator().manual_seed(5)
    plane[1, 40:60] = torch.randint(0, 256, (20, 16), generator=g).to(torch.uint8)
    return plane


@pytest.mark.parametrize("small_spans", [False, True], ids=["spans", "256-row-spans"])
@pytest.mark.parametrize("fmt,width", [(MXFP4, 1), (NVFP4, 2), (NVFP4, 4)], ids=["w1", "w2", "w4"])
def test_compact_decoders_agree_on_mutations(monkeypatch, fmt, width, small_spans):
    """Bit flips in the body (CRCs recomputed): the C and numpy decoders accept with the same plane or refuse with
    the same error type and message, on every mutation; many reach the span checks."""
    from csf_codec import compact_np

    if small_spans:  # span edges inside the streams' bytes
        monkeypatch.setattr(compact_np, "_SCALES_PER_SPAN", 1)
    plane = _mutation_plane()
    payload = encode_compact(plane, fmt, widths=(width,)).payload
    lay = compact.compact_layout(payload)
    body0 = payload.numel() - lay.exceptions.numel() - lay.counts.numel() - lay.selectors.numel()
    blob = bytearray(payload.numpy().tobytes())
    rng = random.Random(f"native-{width}-{small_spans}")
    faults = set()
    for _ in range(400):
        bad = bytearray(blob)
        for _ in range(rng.randint(1, 3)):
            bit = rng.randrange(8 * body0, 8 * len(blob))
            bad[bit // 8] ^= 1 << (bit % 8)
        a, b = _compact_both(reseal(torch.frombuffer(bad, dtype=torch.uint8).clone()))
        assert _same(a, b), [x if isinstance(x, tuple) else "a plane" for x in (a, b)]
        if isinstance(a, tuple):
            faults.add(a[1])
    assert len(faults) >= 5, faults  # the mutations reach several different checks


def test_missing_extension_is_an_import_error(monkeypatch):
    """No silent fallback: without the extension the CPU decoder raises ImportError saying how to build it."""
    import csf_codec

    monkeypatch.setitem(sys.modules, "csf_codec._native", None)
    monkeypatch.delattr(csf_codec, "_native", raising=False)
    native_mod.native.cache_clear()
    try:
        with pytest.raises(ImportError, match="build_ext --inplace"):
            compact.decode_compact(encode_compact(torch.zeros(2, 256, 4, dtype=torch.uint8), MXFP4).payload)
    finally:
        native_mod.native.cache_clear()


def _inline_both(payload: torch.Tensor):
    """(numpy outcome, C outcome) of the CPU inline decoder on one payload, as :func:`_compact_both`."""
    got = []
    for fn in (decode_class_np, decode_class_c):
        try:
            inline = inline_from_payload(payload, name="p")
            g = inline.geometry
            got.append(inline_mod._decode_np(inline, g, "p", decode_class=fn).numpy().reshape(-1))
        except CSFError as e:
            got.append((type(e), str(e)))
    return tuple(got)


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    experts=st.integers(1, 3),
    rows=st.sampled_from([1, 7, 128, 300, 1152]),
    cols=st.sampled_from([1, 3, 5, 18, 36, 160]),
    group=st.sampled_from([None, 64, 576]),
    seed=st.integers(0, 2**31 - 1),
)
def test_inline_decoders_agree_on_fresh_planes(regime, experts, rows, cols, group, seed):
    _, fmt, stats = regime
    if group is not None and rows % group:
        group = None
    plane = synthetic_scale_plane((experts, rows, cols), fmt, stats=stats, seed=seed)
    a, b = _inline_both(encode_inline(plane, fmt, row_group=group, verify=False).to_payload())
    assert isinstance(a, np.ndarray) and _same(a, b)
    assert np.array_equal(b, plane.numpy().reshape(-1))


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
def test_inline_decoders_agree_on_bench_shaped_planes(regime):
    _, fmt, stats = regime
    k = 2 if fmt is NVFP4 else 1
    for shape, group in (((6, 1152, 160 * k), 576), ((6, 5120, 18 * k), None)):
        plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=sum(shape))
        a, b = _inline_both(encode_inline(plane, fmt, row_group=group, verify=False).to_payload())
        assert _same(a, b) and np.array_equal(b, plane.numpy().reshape(-1))


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("shape,group", [((3, 120, 16), None), ((2, 130, 7), 65), ((2, 200, 9), None)])
def test_inline_decoders_agree_on_mutations(fmt, shape, group):
    """Bit flips and byte overwrites in the records (CRCs recomputed): the same plane or the same error."""
    plane = special_rows(clustered_plane(shape, seed=5, exception_rate=0.08), seed=5)
    g = torch.Generator().manual_seed(5)
    plane[0, 40:60] = torch.randint(0, 256, (20, shape[2]), generator=g).to(torch.uint8)  # raw tiles
    blob = bytearray(encode_inline(plane, fmt, row_group=group).to_payload().numpy().tobytes())
    rng = random.Random(f"inline-{fmt.name}-{shape}")
    faults = set()
    for _ in range(300):
        bad = bytearray(blob)
        for _ in range(rng.randint(1, 2)):
            at = rng.randrange(HEADER_BYTES, len(bad))
            if rng.random() < 0.7:
                bad[at] ^= 1 << rng.randrange(8)
            else:
                bad[at] = rng.choice((0, 0xFF, rng.randrange(256)))
        a, b = _inline_both(reseal(torch.frombuffer(bad, dtype=torch.uint8).clone()))
        assert _same(a, b), [x if isinstance(x, tuple) else "a plane" for x in (a, b)]
        if isinstance(a, tuple):
            faults.add(a[1])
    assert len(faults) >= 4, faults


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 300),
    cols=st.sampled_from([0, 1, 2, 5, 18, 36, 160, 320, 700]),
    lo=st.integers(0, 255),
    spread=st.sampled_from([1, 2, 5, 16, 17, 33, 64, 256]),
    seed=st.integers(0, 2**31 - 1),
)
def test_row_bases_agree(rows, cols, lo, spread, seed):
    """The C row bases against the numpy reference and the torch histogram, every width 0-8."""
    g = torch.Generator().manual_seed(seed)
    x = ((lo + torch.randint(0, spread, (rows, cols), generator=g)) % 256).to(torch.uint8)
    widths = tuple(range(9))
    got, want = row_bases_c(x.numpy(), widths), row_bases_np(x.numpy(), widths)
    ref = _row_bases_torch(x, widths)
    for w in widths:
        assert np.array_equal(got[w], want[w]) and np.array_equal(got[w], ref[w].numpy()), w


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
def test_row_bases_agree_on_bench_planes(regime):
    _, fmt, stats = regime
    plane = synthetic_scale_plane((4, 1152, 160 * (2 if fmt is NVFP4 else 1)), fmt, stats=stats, seed=3)
    rows = plane.reshape(-1, plane.shape[-1]).numpy()
    got, want = row_bases_c(rows, (1, 2, 4)), row_bases_np(rows, (1, 2, 4))
    assert all(np.array_equal(got[w], want[w]) for w in (1, 2, 4))


@settings(max_examples=30, deadline=None)
@given(codes=st.lists(st.integers(0, 3), max_size=600), seed=st.integers(0, 2**31 - 1))
def test_scan_bases_agree(codes, seed):
    codes = np.array(codes, dtype=np.uint8)
    escapes = np.random.default_rng(seed).integers(0, 256, int((codes == 3).sum()), dtype=np.uint8)
    assert np.array_equal(scan_bases_c(codes, escapes), scan_bases_np(codes, escapes))


# ------------------------------------------------------------------------------------------- engine records


def _engine_both(rec):
    """(numpy outcome, C outcome) of engine decode: the plane, or the error's (type, message). The C outcome is the
    production decoder's (a span a C call)."""
    got = []
    for decode in (lambda: _decode_engine(rec, "p", decode_records), lambda: decode_engine_records(rec, name="p")):
        try:
            got.append(decode().numpy().reshape(-1))
        except CSFError as e:
            got.append((type(e), str(e)))
    return tuple(got)


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    experts=st.integers(1, 3),
    rows=st.sampled_from([1, 7, 128, 300, 1152]),
    cols=st.sampled_from([1, 3, 5, 18, 36, 160]),
    group=st.sampled_from([None, 64, 576]),
    seed=st.integers(0, 2**31 - 1),
)
def test_engine_decoders_agree_on_fresh_planes(regime, experts, rows, cols, group, seed):
    _, fmt, stats = regime
    if group is not None and rows % group:
        group = None
    plane = synthetic_scale_plane((experts, rows, cols), fmt, stats=stats, seed=seed)
    a, b = _engine_both(encode_engine_records(plane, fmt, row_group=group, verify=False))
    assert isinstance(a, np.ndarray) and _same(a, b)
    assert np.array_equal(b, plane.numpy().reshape(-1))


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
def test_engine_decoders_agree_on_bench_shaped_planes(regime):
    _, fmt, stats = regime
    k = 2 if fmt is NVFP4 else 1
    for shape, group in (((6, 1152, 160 * k), 576), ((6, 5120, 18 * k), None)):
        plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=sum(shape))
        a, b = _engine_both(encode_engine_records(plane, fmt, row_group=group, verify=False))
        assert _same(a, b) and np.array_equal(b, plane.numpy().reshape(-1))


def _flip(t: torch.Tensor, rng: random.Random, lo: int = 0) -> torch.Tensor:
    a = bytearray(t.numpy().tobytes())
    for _ in range(rng.randint(1, 2)):
        at = rng.randrange(lo, len(a))
        if rng.random() < 0.7:
            a[at] ^= 1 << rng.randrange(8)
        else:
            a[at] = rng.choice((0, 0xFF, rng.randrange(256)))
    return torch.frombuffer(a, dtype=t.dtype).clone().view(t.shape)


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@pytest.mark.parametrize("shape,group", [((3, 120, 16), None), ((2, 130, 7), 65), ((2, 200, 9), None)])
def test_engine_decoders_agree_on_mutations(regime, shape, group):
    """Bit flips and byte overwrites in the records' body, and in the row bases' deltas (forged bases): the same
    plane or the same error."""
    name, fmt, stats = regime
    plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=sum(shape))
    g = torch.Generator().manual_seed(5)
    plane[0, 40:60] = torch.randint(0, 256, (20, shape[2]), generator=g).to(torch.uint8)  # raw tiles
    rec = encode_engine_records(plane, fmt, row_group=group)
    rng = random.Random(f"engine-{name}-{shape}")
    faults = set()
    for i in range(300):
        if i % 10 == 9:
            bad = replace(rec, base_delta=_flip(rec.base_delta, rng))
        else:
            bad = replace(rec, body=_flip(rec.body, rng))
        a, b = _engine_both(bad)
        assert _same(a, b), [x if isinstance(x, tuple) else "a plane" for x in (a, b)]
        if isinstance(a, tuple):
            faults.add(a[1])
    assert len(faults) >= 4, faults


def test_engine_span_falls_back_to_numpy_when_c_says_so(monkeypatch):
    """A span the C call leaves to numpy (a table index numpy would refuse) is decoded again, whole, by the numpy
    path: the plane comes out the same."""
    from csf_codec import engine_records_decode_c as dc

    plane = synthetic_scale_plane((2, 300, 7), MXFP4, stats=SEED_REGIME, seed=3)
    rec = encode_engine_records(plane, MXFP4)
    real = dc.native()

    class Bounds:
        def __getattr__(self, name):
            return getattr(real, name)

        def decode_engine_rows(self, out, *args):
            real.decode_engine_rows(out, *args)
            out[:] = 0xAB  # whatever C wrote is overwritten by the numpy path
            return 61, -1, 0

    monkeypatch.setattr(dc, "native", lambda: Bounds())
    assert torch.equal(decode_engine_records(rec, name="p"), plane)


def _engine_entry_args(plane, fmt):
    """Consistent arguments of the two engine span entries (decode_engine_rows, encode_engine_rows) for a plane."""
    from csf_codec.engine_records_np import thresholds
    from csf_codec.inline import CANDIDATE_WINDOWS, _block_bases_np

    rec = encode_engine_records(plane, fmt)
    rows = np.ascontiguousarray(plane.reshape(-1, plane.shape[-1]).numpy())
    ref, delta, br = _block_bases_np(rows, rec.geometry, fmt)
    base = ref[:, None].astype(np.int16) + delta
    windows = np.array(CANDIDATE_WINDOWS[fmt.name], dtype=np.int64).reshape(-1)
    ks = np.array(thresholds(CANDIDATE_WINDOWS[fmt.name]), dtype=np.int32)
    units = rec.record_units.numpy().astype(np.int64)
    common = dict(
        rows=rows, br=np.ascontiguousarray(br, dtype=np.int64), base=base, valid=br >= 0, units=units, ref=ref
    )
    return common, windows, ks, rec.body.numpy(), fmt.row_base_width


def _decode_entry(a, windows, ks, body, wb):
    out = np.zeros_like(a["rows"])
    args = (out, body, a["units"], a["base"], a["valid"], a["br"], windows, ks, a["rows"].shape[1], wb, 1, a["ref"], 4)
    return native_mod.native().decode_engine_rows(*args), out


def _encode_entry(a, windows, ks, body, wb):
    units = np.zeros_like(a["units"])
    room = np.zeros(2 * body.size + 4096 * a["units"].size, dtype=np.uint8)
    args = (a["rows"], a["br"], a["base"], a["valid"], windows, ks, a["rows"].shape[1], wb, units, room)
    return native_mod.native().encode_engine_rows(*args), units


@pytest.mark.parametrize("entry", [_decode_entry, _encode_entry], ids=["decode", "encode"])
def test_engine_entries_check_their_shared_arguments(entry):
    """Both engine span entries check what they share in one helper: each inconsistency below is a ValueError naming
    the entry (never a read past a buffer), and the consistent arguments run."""
    plane = synthetic_scale_plane((2, 300, 7), MXFP4, stats=SEED_REGIME, seed=3)
    a, windows, ks, body, wb = _engine_entry_args(plane, MXFP4)
    fn = "decode_engine_rows" if entry is _decode_entry else "encode_engine_rows"
    (got, _), want_units = entry(a, windows, ks, body, wb), a["units"]
    if entry is _decode_entry:
        assert got == (0, -1, 1) and np.array_equal(_, a["rows"])
    else:
        assert got == body.size and np.array_equal(_, want_units)
    past = a["br"].copy()
    past[1, 5] = a["rows"].shape[0]  # a slot's row past the plane
    rowless = a["br"].copy()
    rowless[0, 3] = -1  # a real slot without a row
    bad = {
        "a slot's row past the plane": (dict(a, br=past), windows, ks),
        "a real slot without a row": (dict(a, br=rowless), windows, ks),
        "units of another shape": (dict(a, units=a["units"][:, :1].copy()), windows, ks),
        "bases of another shape": (dict(a, base=a["base"][:-1].copy()), windows, ks),
        "valid flags of another shape": (dict(a, valid=a["valid"][:, :64].copy()), windows, ks),
    }
    for _what, (args, win, k) in bad.items():
        with pytest.raises(ValueError, match=f"^{fn}: inconsistent arguments$"):
            entry(args, win, k, body, wb)
    for win, k, why in (
        (windows[:-1].copy(), ks, "windows are not \\(width, origin\\) pairs"),
        (np.array([3, 0], dtype=np.int64), ks, "a window is not \\(1\\|2\\|4, int8\\)"),
        (windows, ks[1:].copy(), "a window's threshold is missing"),
    ):
        with pytest.raises(ValueError, match=f"^{fn}: {why}$"):
            entry(a, win, k, body, wb)


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@pytest.mark.parametrize("shape,group", [((3, 120, 16), None), ((2, 130, 7), 65), ((2, 200, 9), None)])
def test_engine_span_base_check_agrees(regime, shape, group):
    """The C span call's rows and verdict on each row block's stored bases are numpy's (decode_records, _scatter,
    base_window_counts, proven_bases, then _span_bases_ok), for the stored bases and for forged ones: slots' bases
    moved, some out of the byte range, and blocks' references moved (or the same error)."""
    from csf_codec.engine_records import _span_bases_ok
    from csf_codec.engine_records_decode_c import decode_span_c
    from csf_codec.engine_records_decode_np import base_window_counts
    from csf_codec.engine_records_np import split_records
    from csf_codec.inline import CANDIDATE_WINDOWS, _block_bases_np, _class_plans
    from csf_codec.inline_np import _scatter
    from csf_codec.rowbase import proven_bases

    _, fmt, stats = regime
    plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=sum(shape))
    rec = encode_engine_records(plane, fmt, row_group=group)
    geo = rec.geometry
    ref0, delta, br = _block_bases_np(plane.reshape(-1, shape[2]).numpy(), geo, fmt)
    valid = br >= 0
    plans = [p for p in _class_plans(geo) if p.count]
    windows = CANDIDATE_WINDOWS[fmt.name]
    units = rec.record_units.numpy().astype(np.int64)
    body = rec.body.numpy()
    wb = fmt.row_base_width
    rng = np.random.default_rng(sum(shape))
    base0 = ref0[:, None].astype(np.int16) + delta
    verdicts = []
    for trial in range(8):
        base, ref = base0.copy(), ref0.copy()
        if trial % 4:  # forged: some slots' bases moved, a few out of the byte range
            hit = rng.random(base.shape) < 0.3 / trial
            base[hit] += rng.integers(-3, 4, size=int(hit.sum())).astype(np.int16)
            base[rng.random(base.shape) < 0.02 / trial] = 300
        if trial >= 4:  # a block's reference moved, its bases with it or not
            blk = rng.integers(0, ref.size)
            ref[blk] = (int(ref[blk]) + 1) % 256
            if trial % 2:
                base[blk] += 1
        out_np = np.zeros((geo.experts * geo.rows, geo.cols), dtype=np.uint8)
        counts = np.zeros((3, *br.shape), dtype=np.int32)
        staged = split_records(body, units, plans)
        col, want = 0, None
        for i, plan in enumerate(plans):
            u = units[:, col : col + plan.count].reshape(-1)
            col += plan.count
            try:
                vals = decode_records(staged[i], u, base, valid, plan, windows, wb, "p")
            except CSFError as e:
                want = (type(e), str(e))
                break
            _scatter(out_np, vals, br, plan)
            counts += base_window_counts(vals, base, plan, wb)
        if want is None:
            proven = proven_bases(base, *counts, geo.cols, wb) if wb == 1 else np.zeros(br.shape, dtype=bool)
            want = _span_bases_ok(out_np, fmt, ref, base - ref.astype(np.int16)[:, None], base, proven, br)
        out_c = np.zeros_like(out_np)
        try:
            got = decode_span_c(out_c, body, units, base, valid, br, ref, windows, fmt, "p")
        except CSFError as e:
            got = (type(e), str(e))
        assert got == want, trial
        if isinstance(want, bool):
            assert np.array_equal(out_np, out_c)
        verdicts.append(want)
    assert True in verdicts and (False in verdicts or any(isinstance(v, tuple) for v in verdicts)), verdicts


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    experts=st.integers(1, 3),
    rows=st.sampled_from([1, 7, 128, 300, 1152]),
    cols=st.sampled_from([1, 2, 3, 4, 5, 18, 36, 160]),
    group=st.sampled_from([None, 64, 576]),
    seed=st.integers(0, 2**31 - 1),
)
def test_engine_encoders_agree_on_fresh_planes(regime, experts, rows, cols, group, seed):
    """The C span encoder writes the numpy reference's records byte for byte."""
    from csf_codec.engine_records import _encode_engine, _span_c, _span_np

    _, fmt, stats = regime
    if group is not None and rows % group:
        group = None
    plane = synthetic_scale_plane((experts, rows, cols), fmt, stats=stats, seed=seed)
    if seed % 3 == 0:  # raw tiles too
        g = torch.Generator().manual_seed(seed)
        plane.view(-1, cols)[: min(40, experts * rows)] = torch.randint(
            0, 256, (min(40, experts * rows), cols), generator=g
        ).to(torch.uint8)
    a = _encode_engine(plane, fmt, group, "p", False, _span_np)
    b = _encode_engine(plane, fmt, group, "p", True, _span_c)
    for f in ("base_ref", "base_delta", "block_start", "record_units", "body"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
def test_engine_encoders_agree_on_bench_shaped_planes(regime):
    from csf_codec.engine_records import _encode_engine, _span_c, _span_np

    _, fmt, stats = regime
    k = 2 if fmt is NVFP4 else 1
    for shape, group in (((6, 1152, 160 * k), 576), ((6, 5120, 18 * k), None)):
        plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=sum(shape) + 1)
        a = _encode_engine(plane, fmt, group, "p", False, _span_np)
        b = _encode_engine(plane, fmt, group, "p", False, _span_c)
        for f in ("base_ref", "base_delta", "block_start", "record_units", "body"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f


# ------------------------------------------------------------------------------------------- compact encoder


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 700),
    cols=st.sampled_from([0, 1, 5, 18, 36, 64, 65, 160, 320]),
    lo=st.integers(0, 255),
    spread=st.sampled_from([1, 2, 3, 5, 16, 17, 40, 256]),
    widths=st.sampled_from([(1, 2, 4), (1,), (2,), (4,), (4, 1)]),
    seed=st.integers(0, 2**31 - 1),
)
def test_compact_row_pass_agrees(rows, cols, lo, spread, widths, seed):
    """The C row pass against the numpy reference (compact_np.width_stats_np: row_bases_np, base_codes_np and
    _chunk_counts): every width's row bases, base codes and per-chunk counts over every span, with rows whose windows
    sit at both ends of the byte range (their far windows clipped) and rows crossing chunk edges."""
    from csf_codec.compact_encode_c import width_stats_c
    from csf_codec.compact_np import row_spans, width_stats_np

    g = torch.Generator().manual_seed(seed)
    x = ((lo + torch.randint(0, spread, (rows, cols), generator=g)) % 256).to(torch.uint8).numpy()
    if cols:
        x[::7] = torch.randint(0, 3, x[::7].shape, generator=g).numpy()  # base 0
        x[3::7] = torch.randint(253, 256, x[3::7].shape, generator=g).numpy()  # base 256 - 2**w
        x[::7, 0], x[3::7, 0] = 200, 30  # far exceptions beside them
    spans = row_spans(rows, cols)
    got, want = width_stats_c(x, widths, spans), width_stats_np(x, widths, spans)
    for w in widths:
        assert np.array_equal(got[0][w], want[0][w]), ("bases", w)
        assert np.array_equal(got[1][w], want[1][w]), ("codes", w)
        for q, part in enumerate(("exceptions", "far", "escaped")):
            assert np.array_equal(got[2][w][q], want[2][w][q]), (part, w)


def _compact_both_encoders(monkeypatch, plane, fmt, widths=(1, 2, 4)):
    """(C payload, numpy reference payload) of one plane: the row pass and the span sections swapped together."""
    from csf_codec import compact_np

    got = encode_compact(plane, fmt, widths=widths, verify=False).payload
    assert compact_np.WIDTH_STATS is compact_np.width_stats_c
    assert compact_np.SPAN_SECTIONS is compact_np.span_sections_c
    with monkeypatch.context() as m:
        m.setattr(compact_np, "WIDTH_STATS", compact_np.width_stats_np)
        m.setattr(compact_np, "SPAN_SECTIONS", compact_np.span_sections_np)
        want = encode_compact(plane, fmt, widths=widths, verify=False).payload
    return got, want


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    experts=st.integers(1, 3),
    rows=st.sampled_from([1, 7, 128, 300, 1152]),
    cols=st.sampled_from([1, 5, 18, 36, 160, 320]),
    widths=st.sampled_from([(1, 2, 4), (1,), (2,), (4,)]),
    seed=st.integers(0, 2**31 - 1),
)
def test_compact_encoders_agree_on_fresh_planes(monkeypatch, regime, experts, rows, cols, widths, seed):
    """The C encoder's payload is byte for byte the numpy reference's."""
    _, fmt, stats = regime
    plane = synthetic_scale_plane((experts, rows, cols), fmt, stats=stats, seed=seed)
    if seed % 3 == 0:  # raw chunks too
        g = torch.Generator().manual_seed(seed)
        n = min(40, experts * rows)
        plane.view(-1, cols)[:n] = torch.randint(0, 256, (n, cols), generator=g).to(torch.uint8)
    got, want = _compact_both_encoders(monkeypatch, plane, fmt, widths)
    assert torch.equal(got, want)


@pytest.mark.parametrize("small_spans", [False, True], ids=["spans", "256-row-spans"])
@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
def test_compact_encoders_agree_on_bench_shaped_planes(monkeypatch, regime, small_spans):
    """The bench's W13 and W2 shapes (fewer experts): several spans on two threads; with 256-row spans, span edges
    fall inside the listed streams' and far codes' bytes, which neighbouring spans share."""
    from csf_codec import compact_np

    if small_spans:
        monkeypatch.setattr(compact_np, "_SCALES_PER_SPAN", 1)
    _, fmt, stats = regime
    k = 2 if fmt is NVFP4 else 1
    for shape in ((6, 1152, 160 * k), (6, 5120, 18 * k)):
        plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=sum(shape) + 2)
        got, want = _compact_both_encoders(monkeypatch, plane, fmt)
        assert torch.equal(got, want)
        assert torch.equal(compact.decode_compact(got), plane)


# -------------------------------------------------------------------------------------------- inline encoder


@settings(max_examples=30, deadline=None)
@given(
    tiles=st.integers(1, 40),
    cols=st.integers(1, 4),
    spread=st.sampled_from([2, 16, 40, 64, 256]),
    seed=st.integers(0, 2**31 - 1),
)
def test_inline_level_counts_agree(tiles, cols, spread, seed):
    """The C level counts against inline_np._level_counts_np: every format's levels, offsets past every bin."""
    from csf_codec.inline import CANDIDATE_WINDOWS
    from csf_codec.inline_np import _level_counts_c, _level_counts_np, _levels

    g = torch.Generator().manual_seed(seed)
    e = torch.randint(0, spread, (tiles, 128 * cols), generator=g).to(torch.uint8).numpy()
    e[:, ::7] = 255  # padding reads 255
    for windows in CANDIDATE_WINDOWS.values():
        levels = _levels(windows)
        a, b = _level_counts_np(e, 128 * cols, levels), _level_counts_c(e, 128 * cols, levels)
        assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) and b[k].dtype == a[k].dtype for k in a)


@pytest.mark.parametrize("regime", BENCH_REGIMES, ids=[r[0] for r in BENCH_REGIMES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    experts=st.integers(1, 3),
    rows=st.sampled_from([1, 7, 128, 300, 1152]),
    cols=st.sampled_from([1, 3, 5, 18, 36, 160]),
    group=st.sampled_from([None, 64, 576]),
    seed=st.integers(0, 2**31 - 1),
)
def test_inline_encoders_agree_on_fresh_planes(regime, experts, rows, cols, group, seed):
    """The inline payload with the C level counts is byte for byte the one with the numpy reference's."""
    from csf_codec import inline_np

    _, fmt, stats = regime
    if group is not None and rows % group:
        group = None
    plane = synthetic_scale_plane((experts, rows, cols), fmt, stats=stats, seed=seed)
    got = encode_inline(plane, fmt, row_group=group, verify=False).to_payload()
    assert inline_np.LEVEL_COUNTS is inline_np._level_counts_c
    inline_np.LEVEL_COUNTS = inline_np._level_counts_np
    try:
        want = encode_inline(plane, fmt, row_group=group, verify=False).to_payload()
    finally:
        inline_np.LEVEL_COUNTS = inline_np._level_counts_c
    assert torch.equal(got, want)
