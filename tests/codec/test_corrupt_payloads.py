"""Bad payloads give a clear error naming the tensor and the fault; nothing decodes silently wrong."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csf_codec import (
    MXFP4,
    NVFP4,
    CorruptPayloadError,
    CSFError,
    FormatVersionError,
    ShapeMismatchError,
    decode_compact,
    encode_compact,
    encode_inline,
    inline_from_payload,
)
from csf_codec.container import HEADER_BYTES
from csf_codec.engine_records import encode_engine_records

from .planes_for_tests import clustered_plane, reseal, special_rows

NAME = "model.layers.3.mlp.experts.w13_weight_scale"


def _plane(seed=0, shape=(2, 200, 18), rate=0.03):
    return special_rows(clustered_plane(shape, seed=seed, exception_rate=rate), seed=seed)


def _payloads():
    plane = _plane()
    return plane, encode_compact(plane, MXFP4).payload, encode_inline(plane, MXFP4).to_payload()


@pytest.mark.parametrize("form", ["compact", "inline"])
def test_every_truncation_is_reported(form):
    _, compact, inline = _payloads()
    payload = compact if form == "compact" else inline
    decode = decode_compact if form == "compact" else inline_from_payload
    for cut in list(range(0, HEADER_BYTES + 8)) + list(range(HEADER_BYTES + 8, payload.numel(), 97)):
        with pytest.raises(CorruptPayloadError, match=NAME) as e:
            decode(payload[:cut].clone(), name=NAME)
        assert "truncated" in str(e.value) or "header" in str(e.value)


@pytest.mark.parametrize("form", ["compact", "inline"])
def test_every_flipped_byte_is_caught_by_the_checksums(form):
    _, compact, inline = _payloads()
    payload = compact if form == "compact" else inline
    decode = decode_compact if form == "compact" else inline_from_payload
    g = torch.Generator().manual_seed(1)
    for pos in torch.randint(0, payload.numel(), (60,), generator=g).tolist():
        bad = payload.clone()
        bad[pos] ^= 1 << int(torch.randint(0, 8, (1,), generator=g))
        with pytest.raises(CSFError, match=NAME):
            decode(bad, name=NAME)


def test_trailing_bytes_are_refused():
    _, compact, _ = _payloads()
    with pytest.raises(CorruptPayloadError, match="trailing"):
        decode_compact(torch.cat([compact, torch.zeros(3, dtype=torch.uint8)]), name=NAME)


def test_wrong_version_is_a_version_error():
    """Version 1 payloads (76-byte header, no digest), version 2 ones (the byte-list compact body) and
    unknown future versions are refused by version, with the way out."""
    _, compact, inline = _payloads()
    for payload, decode in ((compact, decode_compact), (inline, inline_from_payload)):
        for version in (1, 2, 4):
            bad = payload.clone()
            bad[4:6] = torch.tensor([version, 0], dtype=torch.uint8)
            with pytest.raises(
                FormatVersionError, match=rf"version {version}; this codec reads version 3: .*re-compress"
            ):
                decode(reseal(bad), name=NAME)
        with pytest.raises(FormatVersionError, match="version 1"):  # a v1 header is shorter than a v2 one
            bad = payload[:80].clone()
            bad[4:6] = torch.tensor([1, 0], dtype=torch.uint8)
            decode(bad, name=NAME)


def test_unused_header_fields_must_be_zero():
    _, compact, inline = _payloads()
    cases = (
        (compact, decode_compact, 24, "extra"),  # compact: extra u32
        (inline, inline_from_payload, 7, "param"),  # inline: param u8
        (compact, decode_compact, 9, "reserved"),
        (inline, inline_from_payload, 11, "reserved"),
    )
    for payload, decode, offset, word in cases:
        bad = payload.clone()
        bad[offset] = 1
        with pytest.raises(CorruptPayloadError, match=word):
            decode(reseal(bad), name=NAME)


def test_the_digest_names_the_plane():
    """A forged digest, or a body edit that still parses, is refused once the plane is restored."""
    plane, compact, inline = _payloads()
    for payload, decode in ((compact, decode_compact), (inline, inline_from_payload)):
        bad = payload.clone()
        bad[68] ^= 1  # first digest byte
        with pytest.raises(CorruptPayloadError, match="SHA-256"):
            decode(reseal(bad), name=NAME)
    forged = encode_compact(plane.clone().index_fill_(2, torch.tensor([0]), 7), MXFP4).payload
    bad = forged.clone()
    bad[68:100] = compact[68:100]  # another plane's digest
    with pytest.raises(CorruptPayloadError, match="SHA-256"):
        decode_compact(reseal(bad), name=NAME)


def test_wrong_magic_and_wrong_form():
    _, compact, inline = _payloads()
    with pytest.raises(CorruptPayloadError, match="magic"):
        decode_compact(inline, name=NAME)
    with pytest.raises(CorruptPayloadError, match="magic"):
        inline_from_payload(compact, name=NAME)


def test_shape_mismatch_names_both_shapes():
    _, compact, _ = _payloads()
    with pytest.raises(ShapeMismatchError, match=r"\(2, 200, 18\).*\(2, 200, 20\)"):
        decode_compact(compact, name=NAME, expected_shape=(2, 200, 20))


def test_non_byte_inputs_are_refused():
    with pytest.raises(ShapeMismatchError, match="one byte per scale"):
        encode_compact(torch.zeros(4, 4, dtype=torch.float32), MXFP4, name=NAME)
    with pytest.raises(ShapeMismatchError, match=r"\[N, KB\]"):
        encode_compact(torch.zeros(4, dtype=torch.uint8), MXFP4, name=NAME)
    with pytest.raises(CorruptPayloadError, match="1-D uint8"):
        decode_compact(torch.zeros(100, dtype=torch.int32), name=NAME)


@pytest.mark.parametrize("shape", [(0, 1 << 31), (1 << 31, 0), (0, 1 << 31, 4)])
def test_planes_with_a_dimension_past_the_header_are_refused_before_encoding(shape):
    """A header holds each dimension below 2**31 (its decoder refuses more), so encoders refuse such a plane up front
    rather than write a payload no decoder reads; an empty plane of that shape costs no memory to try."""
    plane = torch.empty(shape, dtype=torch.uint8)
    for encode in (encode_compact, encode_inline, encode_engine_records):
        with pytest.raises(ShapeMismatchError, match=r"below 2\*\*31"):
            encode(plane, MXFP4, name=NAME)


@settings(
    max_examples=int(__import__("os").environ.get("CSF_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    form=st.sampled_from(["compact", "inline"]),
    fmt=st.sampled_from([MXFP4, NVFP4]),
    edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=6),
    seed=st.integers(0, 50),
)
def test_fuzzed_bodies_with_valid_checksums_never_crash(form, fmt, edits, seed):
    """With checksums forged, the structural checks must stop every out-of-range read and every impossible
    allocation, and the plane digest every plane that differs: a CSFError, or the very plane encoded."""
    plane = _plane(seed=seed, shape=(2, 70, 6), rate=0.1)
    payload = encode_compact(plane, fmt).payload if form == "compact" else encode_inline(plane, fmt).to_payload()
    bad = payload.clone()
    for pos, value in edits:  # anywhere but the magic and version: header geometry and digest too
        bad[6 + pos % (payload.numel() - 6)] = value
    bad = reseal(bad)
    try:
        out = decode_compact(bad, name=NAME) if form == "compact" else inline_from_payload(bad, name=NAME)
    except CSFError as e:
        assert NAME in str(e)
        return
    if form == "inline":
        from csf_codec import decode_inline

        out = decode_inline(out)
    assert torch.equal(out, plane)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_arbitrary_bytes_are_refused(data):
    with pytest.raises(CSFError):
        decode_compact(torch.tensor(list(data), dtype=torch.uint8), name=NAME)
