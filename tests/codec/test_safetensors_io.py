"""The streaming safetensors writer and the lazy reader."""

from __future__ import annotations

import itertools
import json
import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from csf_codec.safetensors_io import (
    SafetensorsReader,
    TensorEntry,
    dtype_name,
    entry_from_tensor,
    passthrough_entry,
    read_header,
    read_tensor_bytes,
    torch_dtype,
    write_safetensors,
)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _all_dtypes() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ts = {
        "u8": torch.randint(0, 256, (3, 5), generator=g, dtype=torch.uint8),
        "i8": torch.randint(-128, 128, (7,), generator=g, dtype=torch.int8),
        "i32": torch.randint(-(2**31), 2**31 - 1, (2, 3), generator=g, dtype=torch.int32),
        "i64": torch.randint(-(2**62), 2**62, (5,), generator=g, dtype=torch.int64),
        "f16": torch.randn(3, 1, generator=g).half(),
        "bf16": torch.randn(4, 3, generator=g).bfloat16(),
        "f32_scalar": torch.tensor(3.5),
        "f8_e4m3": torch.randint(0, 256, (2, 9), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "empty": torch.zeros(0, 4),
        "odd_u8": torch.randint(0, 256, (3,), generator=g, dtype=torch.uint8),
    }
    if hasattr(torch, "float8_e8m0fnu"):
        ts["f8_e8m0"] = torch.randint(0, 256, (5,), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return ts


def test_dtype_names_round_trip():
    for name in ("U8", "I8", "I32", "I64", "F16", "BF16", "F32", "F8_E4M3"):
        assert dtype_name(torch_dtype(name)) == name
    assert dtype_name(torch.float8_e4m3fn) == "F8_E4M3"
    if hasattr(torch, "float8_e8m0fnu"):
        assert dtype_name(torch.float8_e8m0fnu) == "F8_E8M0"
    with pytest.raises(ValueError):
        torch_dtype("F4_NOPE")


def test_written_file_loads_byte_identical(tmp_path):
    ts = _all_dtypes()
    path = tmp_path / "a.safetensors"
    write_safetensors(path, [entry_from_tensor(k, v) for k, v in ts.items()], metadata={"format": "pt", "x": "y"})
    back = load_file(path)
    assert set(back) == set(ts)
    for k, v in ts.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert _raw(back[k]) == _raw(v), k
    with SafetensorsReader(path) as r:
        assert r.metadata() == {"format": "pt", "x": "y"}
        assert set(r.names()) == set(ts)
        assert r.info("f8_e4m3").dtype == "F8_E4M3" and r.info("f8_e4m3").shape == (2, 9)
        for name, t in r.tensors(["bf16", "i64"]):
            assert _raw(t) == _raw(ts[name])


def test_header_is_aligned_space_padded_and_data_contiguous(tmp_path):
    path = tmp_path / "a.safetensors"
    write_safetensors(path, [entry_from_tensor(k, v) for k, v in _all_dtypes().items()], metadata={"format": "pt"})
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    assert (8 + n) % 8 == 0
    text = blob[8 : 8 + n].decode()
    assert text == text.rstrip(" ") + " " * (len(text) - len(text.rstrip(" ")))
    doc = json.loads(text)
    spans = sorted(tuple(v["data_offsets"]) for k, v in doc.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(blob) - 8 - n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    # element-size ordering keeps every tensor aligned to its element size
    for k, v in doc.items():
        if k != "__metadata__":
            size = torch_dtype(v["dtype"]).itemsize
            assert v["data_offsets"][0] % size == 0, k


def test_lazy_loaders_and_chunked_passthrough(tmp_path):
    src = tmp_path / "src.safetensors"
    ts = _all_dtypes()
    save_file(ts, src, metadata={"format": "pt"})
    header = read_header(src)
    assert header.metadata == {"format": "pt"}
    for k, v in ts.items():
        assert read_tensor_bytes(header, k).numpy().tobytes() == _raw(v)
    loaded: list[str] = []

    def lazy(name: str):
        def load():
            loaded.append(name)
            return ts[name]

        return load

    entries = [passthrough_entry(header, "bf16", rename="bf16_copy")]
    entries += [
        TensorEntry(name=k, dtype=dtype_name(v.dtype), shape=tuple(v.shape), load=lazy(k)) for k, v in ts.items()
    ]
    entries.append(
        TensorEntry(name="chunks", dtype="U8", shape=(6,), load=lambda: iter([b"abc", bytearray(b"de"), b"f"]))
    )
    dst = tmp_path / "dst.safetensors"
    write_safetensors(dst, entries)
    assert sorted(loaded) == sorted(ts)  # each loader ran exactly once
    back = load_file(dst)
    assert _raw(back["bf16_copy"]) == _raw(ts["bf16"])
    assert back["chunks"].numpy().tobytes() == b"abcdef"


def test_writer_refuses_bad_input(tmp_path):
    path = tmp_path / "bad.safetensors"
    wrong = TensorEntry(name="a", dtype="U8", shape=(4,), load=lambda: b"abc")
    with pytest.raises(ValueError, match="3 bytes"):
        write_safetensors(path, [wrong])
    assert not path.exists() and not (tmp_path / "bad.safetensors.tmp").exists()
    t = entry_from_tensor("a", torch.zeros(2))
    with pytest.raises(ValueError, match="duplicate"):
        write_safetensors(path, [t, t])
    with pytest.raises(ValueError, match="str"):
        write_safetensors(path, [t], metadata={"k": 1})  # type: ignore[dict-item]


_DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32]
_DTYPES += [torch.float8_e4m3fn] + ([torch.float8_e8m0fnu] if hasattr(torch, "float8_e8m0fnu") else [])


@settings(max_examples=40, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), max_size=3), st.integers(0, 2**31)),
        max_size=6,
    )
)
def test_random_files_load_byte_identical(tmp_path_factory, specs):
    ts = {}
    for i, (dtype, shape, seed) in enumerate(specs):
        g = torch.Generator().manual_seed(seed)
        n = math.prod(shape) * dtype.itemsize
        ts[f"t{i}"] = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape)
    path = tmp_path_factory.mktemp("h") / "r.safetensors"
    write_safetensors(path, [entry_from_tensor(k, v) for k, v in ts.items()])
    back = load_file(path)
    assert {k: (v.dtype, v.shape, _raw(v)) for k, v in back.items()} == {
        k: (v.dtype, v.shape, _raw(v)) for k, v in ts.items()
    }
