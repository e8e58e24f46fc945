"""Seeded, bounded fuzzing of everything csf reads: payloads of both forms, safetensors files, CSF shards
and their metadata. The property throughout: a typed CSFError, or (for a change that keeps the meaning)
the very same output; never another exception, never a silently different plane."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from csf_codec import (
    MXFP4,
    NVFP4,
    CSFError,
    compact,
    decode_compact,
    decode_inline,
    encode_compact,
    encode_inline,
    inline_from_payload,
)
from csf_codec.checkpoint import compress_checkpoint, tensor_sha256, verify_checkpoint
from csf_codec.compact_torch import decode_torch, listed_exceptions
from csf_codec.container import HEADER_BYTES
from csf_codec.errors import CorruptPayloadError
from csf_codec.safetensors_io import SafetensorsHeader, read_header, read_tensor_bytes
from csf_codec.shard_schema import META_TENSORS, csf_records

from .checkpoints_for_tests import nvfp4_tensors
from .planes_for_tests import clustered_plane, reseal, special_rows

ROUNDS = 150


def _mutate(blob: bytes, rng: random.Random, header_end: int) -> bytes:
    """One random mutation: bit flips, truncation, extension or a header field overwritten."""
    b = bytearray(blob)
    kind = rng.choice(("flip", "flip", "truncate", "extend", "field"))
    if kind == "flip":
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del b[rng.randrange(len(b)) :]
    elif kind == "extend":
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    else:
        at = rng.randrange(min(header_end, len(b)))
        width = rng.choice((1, 2, 4, 8))
        value = rng.choice((0, 1, 0xFF, rng.getrandbits(8 * width)))
        b[at : at + width] = value.to_bytes(width, "little")[: len(b) - at]
    return bytes(b)


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("form", ["compact", "inline"])
@pytest.mark.parametrize("forge", [False, True], ids=["crc-kept", "crc-forged"])
def test_payload_mutations(form, fmt, forge):
    plane = special_rows(clustered_plane((2, 70, 6), seed=3, exception_rate=0.08), seed=3)
    payload = encode_compact(plane, fmt).payload if form == "compact" else encode_inline(plane, fmt).to_payload()
    blob = payload.numpy().tobytes()
    rng = random.Random(f"{form}-{fmt.name}-{forge}")
    decoded = 0
    for _ in range(ROUNDS):
        bad = torch.from_numpy(np.frombuffer(_mutate(blob, rng, HEADER_BYTES), dtype=np.uint8).copy())
        if forge:
            bad = reseal(bad)
        try:
            out = (
                decode_compact(bad, name="p")
                if form == "compact"
                else decode_inline(inline_from_payload(bad, name="p"))
            )
        except CSFError:
            continue
        decoded += 1
        assert torch.equal(out, plane), "a mutated payload decoded to a different plane"
    assert decoded < ROUNDS  # the mutations do reach the checks


def _streams_plane() -> torch.Tensor:
    """Exceptions of every kind: near, far, escaped (the 200 jumps), in listed and in raw chunks."""
    plane = special_rows(clustered_plane((3, 120, 16), seed=5, exception_rate=0.06), seed=5)
    g = torch.Generator().manual_seed(5)
    plane[1, 40:60] = torch.randint(0, 256, (20, 16), generator=g).to(torch.uint8)  # dense: raw chunks
    return plane


def _decode_torch_reference(payload: torch.Tensor) -> torch.Tensor:
    """The torch decoder (the GPU path and the numpy decoder's reference), run on the CPU."""
    lay = compact.compact_layout(payload, name="p")
    bases = compact._scan_bases(lay.base_codes, lay.base_codes == 3, lay.escapes)
    if lay.rows and (int(bases.min()) < 0 or int(bases.max()) > 256 - (1 << lay.width)):
        raise CorruptPayloadError("p", "a row base leaves the byte range of its window")
    return decode_torch(lay, bases, "p").reshape(lay.shape)


def _outcome(decode, payload):
    try:
        return decode(payload)
    except CSFError:
        return None


@pytest.mark.parametrize("fmt,width", [(MXFP4, 1), (NVFP4, 2), (NVFP4, 4)], ids=["w1", "w2", "w4"])
def test_compact_stream_mutations(fmt, width):
    """Bit flips aimed at the version-3 compact body's parts (CRCs recomputed): position codes and far
    flags, raw chunks, far codes, escaped bytes, chunk counts, exceptions' selector fields. The numpy
    decoder and the torch reference agree on every mutated payload (both refuse it, or both give the
    same plane), and the checked decode refuses it or restores the original plane."""
    plane = _streams_plane()
    payload = encode_compact(plane, fmt, widths=(width,)).payload
    lay = compact.compact_layout(payload)
    table = lay.table
    listed = listed_exceptions(table, lay.exceptions, "p")
    exc0 = payload.numel() - lay.exceptions.numel()
    sel0 = exc0 - lay.counts.numel() - lay.selectors.numel()
    fields = (sel0 * 8 + listed.where[:40] * width).tolist()
    parts = {  # bit ranges of the payload
        "positions": [(8 * exc0, 8 * exc0 + table.stream_bits)],
        "raw": [(8 * (exc0 + table.stream_bytes), 8 * (exc0 + table.raw_end))],
        "far codes": [(8 * (exc0 + listed.far_start), 8 * (exc0 + listed.escape_start))],
        "escaped": [(8 * (exc0 + listed.escape_start), 8 * payload.numel())],
        "counts": [(8 * (exc0 - lay.counts.numel()), 8 * exc0)],
        "fields": [(f, f + width) for f in fields],
    }
    assert all(hi > lo for ranges in parts.values() for lo, hi in ranges), "the plane lacks a part"
    blob = bytearray(payload.numpy().tobytes())
    rng = random.Random(f"streams-{width}")
    refused = dict.fromkeys(parts, 0)
    for i in range(2 * ROUNDS):
        part = list(parts)[i % len(parts)]
        bad = bytearray(blob)
        for _ in range(rng.randint(1, 2)):
            lo, hi = rng.choice(parts[part])
            bit = rng.randrange(lo, hi)
            bad[bit // 8] ^= 1 << (bit % 8)
        bad = reseal(torch.frombuffer(bad, dtype=torch.uint8).clone())
        got = _outcome(lambda p: compact.decode_compact(p, name="p"), bad)
        ref = _outcome(_decode_torch_reference, bad)
        assert (got is None) == (ref is None), f"{part}: the numpy and torch decoders disagree on validity"
        assert got is None or torch.equal(got, ref), f"{part}: the numpy and torch decoders disagree"
        checked = _outcome(lambda p: decode_compact(p, name="p"), bad)
        assert checked is None or torch.equal(checked, plane), f"{part}: a mutated payload decoded differently"
        refused[part] += checked is None
    assert all(refused.values()), f"some part's mutations never reach a check: {refused}"


def _safetensors(tmp_path: Path) -> Path:
    path = tmp_path / "native.safetensors"
    save_file(nvfp4_tensors(2), path, metadata={"format": "pt"})
    return path


def _contents(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    header = read_header(path)
    return {n: (i.dtype, i.shape, read_tensor_bytes(header, n).numpy().tobytes()) for n, i in header.tensors.items()}


def _respaced(blob: bytes) -> bytes:
    """The same header JSON, re-serialised with other whitespace: a change that keeps the meaning."""
    (n,) = struct.unpack("<Q", blob[:8])
    doc = json.loads(blob[8 : 8 + n])
    raw = json.dumps(doc, indent=1).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw + blob[8 + n :]


def test_safetensors_mutations(tmp_path):
    """The reader gives a CSFError or a header whose every tensor reads back; whitespace changes nothing.

    Plain safetensors carry no checksum, so a flipped data byte reads back flipped: integrity of scale
    planes comes from the CSF digests, of whole outputs from the completion record (tests below)."""
    path = _safetensors(tmp_path)
    blob = path.read_bytes()
    want = _contents(path)
    (n,) = struct.unpack("<Q", blob[:8])
    rng = random.Random(7)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(_respaced(blob))
    assert _contents(bad) == want
    for _ in range(ROUNDS):
        bad.write_bytes(_mutate(blob, rng, 8 + n))
        try:
            _contents(bad)
        except CSFError:
            continue


def test_csf_shard_mutations(tmp_path):
    """A mutated single-file CSF checkpoint: verify raises a CSFError, or every scale plane (name, dtype,
    shape, bytes) is exactly the original. Unprotected passthrough bytes may change (see above)."""
    src = _safetensors(tmp_path)
    csf = compress_checkpoint(src, tmp_path / "csf.safetensors", progress=False).dst
    blob = csf.read_bytes()
    header = read_header(csf)
    planes = {r.name for r in csf_records(header).values()}
    want = {k: v for k, v in tensor_sha256(src).items() if k in planes}
    rng = random.Random(11)
    bad = tmp_path / "bad.safetensors"
    for _ in range(120):
        bad.write_bytes(_mutate(blob, rng, header.data_start))
        try:
            verify_checkpoint(bad, progress=False)
            got = tensor_sha256(bad)
        except CSFError:
            continue
        assert {k: got.get(k) for k in want} == want, "a mutated CSF shard restored a different scale plane"


def test_csf_directory_mutations(tmp_path):
    """In a directory output the completion record covers every byte: any mutation of a shard is refused."""
    root = tmp_path / "src"
    root.mkdir()
    save_file(nvfp4_tensors(2), root / "model.safetensors")
    out = compress_checkpoint(root, tmp_path / "csf", progress=False).dst
    shard = out / "model.safetensors"
    blob = shard.read_bytes()
    rng = random.Random(13)
    for _ in range(40):
        mutated = _mutate(blob, rng, 8)
        if mutated == blob:
            continue
        shard.write_bytes(mutated)
        with pytest.raises(CSFError):
            verify_checkpoint(out, progress=False)
    shard.write_bytes(blob)
    verify_checkpoint(out, progress=False)


def test_csf_metadata_mutations(tmp_path):
    """Edits to csf.tensors (digest kept): a CSFError, or (whitespace only) the same records."""
    src = _safetensors(tmp_path)
    csf = compress_checkpoint(src, tmp_path / "csf.safetensors", progress=False).dst
    header = read_header(csf)
    want = csf_records(header)
    text = header.metadata[META_TENSORS]
    alphabet = '{}[],:"0123456789 abcdefxyz_.-'
    rng = random.Random(17)

    def records(t: str):
        return csf_records(SafetensorsHeader(**{**header.__dict__, "metadata": {**header.metadata, META_TENSORS: t}}))

    assert records(json.dumps(json.loads(text), indent=2)) == want
    for _ in range(ROUNDS):
        i = rng.randrange(len(text))
        op = rng.choice(("replace", "insert", "delete"))
        c = rng.choice(alphabet)
        t = {
            "replace": text[:i] + c + text[i + 1 :],
            "insert": text[:i] + c + text[i:],
            "delete": text[:i] + text[i + 1 :],
        }[op]
        try:
            got = records(t)
        except CSFError:
            continue
        assert got == want, f"{op} {c!r} at {i} changed the records"


def _engine_mutation(rec, rng: random.Random):
    """One random change to engine records: body bytes, a length byte, a start, a base; lengths kept or not."""
    from dataclasses import replace

    kind = rng.choice(("body", "body", "body", "units", "start", "base", "truncate"))
    if kind == "body":
        body = rec.body.clone()
        for _ in range(rng.randint(1, 3)):
            body[rng.randrange(body.numel())] ^= 1 << rng.randrange(8)
        return replace(rec, body=body)
    if kind == "units":
        units = rec.record_units.clone()
        units.view(-1)[rng.randrange(units.numel())] = rng.choice((0, 1, 2, 33, 63, 255))
        return replace(rec, record_units=units)
    if kind == "start":
        starts = rec.block_start.to(torch.int64)  # 16-byte units, u32
        i = rng.randrange(starts.numel())
        starts[i] = (starts[i] + rng.choice((-1, 1, 1 << 31))) % (1 << 32)
        return replace(rec, block_start=starts.to(torch.uint32))
    if kind == "base":
        part = rng.choice(("base_ref", "base_delta"))
        t = getattr(rec, part).clone()
        t.view(-1)[rng.randrange(t.numel())] ^= 1 << rng.randrange(8)
        return replace(rec, **{part: t})
    return replace(rec, body=rec.body[: rng.randrange(rec.body.numel())])


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
def test_engine_record_mutations(fmt):
    """Engine records carry no digest (not a payload form yet): a change may give another plane, but only one whose
    own encoding is exactly the changed records (canonical); anything else is a typed CSFError."""
    from csf_codec.engine_records import decode_engine_records, encode_engine_records

    plane = special_rows(clustered_plane((2, 70, 6), seed=3, exception_rate=0.08), seed=3)
    rec = encode_engine_records(plane, fmt, row_group=35)
    rng = random.Random(f"engine-{fmt.name}")
    decoded = 0
    for _ in range(ROUNDS):
        bad = _engine_mutation(rec, rng)
        try:
            out = decode_engine_records(bad, name="p")
        except CSFError:
            continue
        decoded += 1
        again = encode_engine_records(out, fmt, row_group=35)
        for part in ("base_ref", "base_delta", "block_start", "record_units", "body"):
            assert torch.equal(getattr(again, part), getattr(bad, part)), f"non-canonical records accepted ({part})"
    assert decoded < ROUNDS
