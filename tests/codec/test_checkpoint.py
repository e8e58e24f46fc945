"""CSF checkpoints: round trips, schema, verification, inspection, online loading, tensor-parallel slices."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from csf_codec.checkpoint import (
    CSF_SUFFIX,
    META_TENSORS,
    META_VERSION,
    compress_checkpoint,
    decompress_checkpoint,
    inspect_checkpoint,
    is_csf_checkpoint,
    iter_checkpoint_tensors,
    tensor_sha256,
    tp_slice_scales,
    verify_checkpoint,
)
from csf_codec.compact import CompactScales, decode_compact, encode_compact
from csf_codec.container import CSF_FORMAT_VERSION
from csf_codec.demo import MoELayerShape, build_checkpoint
from csf_codec.errors import (
    CorruptPayloadError,
    CSFError,
    FormatVersionError,
    IncompleteOutputError,
    ShapeMismatchError,
    UsageError,
    VerificationError,
)
from csf_codec.formats import MXFP4, NVFP4
from csf_codec.safetensors_io import passthrough_entry, read_header, write_safetensors
from csf_codec.synthetic import synthetic_fp4_values, synthetic_scale_plane

TINY = MoELayerShape(experts=3, hidden=128, inter=64)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(_raw(t)).hexdigest()


def _file_sha256(path: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Independent of the code under test: safetensors' own loader."""
    from csf_codec.safetensors_io import dtype_name

    return {k: (dtype_name(v.dtype), tuple(v.shape), _sha(v)) for k, v in load_file(path).items()}


def _dir_sha256(root: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for shard in sorted(root.glob("*.safetensors")):
        out.update(_file_sha256(shard))
    return out


@pytest.fixture(scope="module")
def mx_native(tmp_path_factory) -> Path:
    """gpt-oss naming, three shards (values and their scales land in different shards), with an index."""
    root = build_checkpoint(tmp_path_factory.mktemp("mx") / "native", MXFP4, TINY, max_shard_bytes=25_000)
    (root / "tokenizer.json").write_bytes(b'{"version": "1.0", "model": {}}\n')
    (root / "extra").mkdir()
    (root / "extra" / "notes.bin").write_bytes(bytes(range(256)))
    return root


@pytest.fixture(scope="module")
def nv_native(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("nv") / "native", NVFP4, TINY, max_shard_bytes=60_000)


@pytest.fixture(scope="module")
def mx_csf(mx_native, tmp_path_factory) -> Path:
    return compress_checkpoint(mx_native, tmp_path_factory.mktemp("mxcsf") / "csf", progress=False).dst


def _single_file_tensors() -> dict[str, torch.Tensor]:
    """One file mixing ModelOpt per-expert 2-D NVFP4, compressed-tensors NVFP4 with two leading dims (rank 4)
    and compressed-tensors MXFP4 as F8_E8M0, plus FP8 / BF16 tensors that must pass through."""
    ts: dict[str, torch.Tensor] = {}
    for e in range(2):
        p = f"model.layers.0.mlp.experts.{e}.down_proj"
        ts[f"{p}.weight"] = synthetic_fp4_values((64, 64), seed=e)
        ts[f"{p}.weight_scale"] = synthetic_scale_plane((64, 8), NVFP4, seed=e).view(torch.float8_e4m3fn)
        ts[f"{p}.weight_scale_2"] = torch.tensor(0.001 * (e + 1))
        ts[f"{p}.input_scale"] = torch.tensor(0.5)
    q = "model.layers.1.mlp.experts.w13"
    ts[f"{q}.weight_packed"] = synthetic_fp4_values((2, 3, 40, 32), seed=7)
    ts[f"{q}.weight_scale"] = (
        synthetic_scale_plane((6, 40, 4), NVFP4, seed=7).view(2, 3, 40, 4).view(torch.float8_e4m3fn)
    )
    ts[f"{q}.weight_global_scale"] = torch.tensor([3.0])
    r = "model.layers.1.mlp.experts.w2"
    ts[f"{r}.weight_packed"] = synthetic_fp4_values((3, 24, 64), seed=8)
    e8 = synthetic_scale_plane((3, 24, 4), MXFP4, seed=8)
    ts[f"{r}.weight_scale"] = e8.view(torch.float8_e8m0fnu) if hasattr(torch, "float8_e8m0fnu") else e8
    ts["model.layers.2.self_attn.o_proj.weight"] = torch.randn(16, 16).to(torch.float8_e4m3fn)
    ts["model.layers.2.self_attn.o_proj.weight_scale"] = torch.tensor(0.25)  # FP8 per-tensor: not FP4
    ts["model.embed_tokens.weight"] = torch.randn(10, 8).bfloat16()
    return ts


@pytest.fixture(scope="module")
def single_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("single") / "model.safetensors"
    save_file(_single_file_tensors(), path, metadata={"format": "pt"})
    return path


# ------------------------------------------------------------------------------------------- round trips


def test_sharded_round_trip_is_byte_identical(mx_native, mx_csf, tmp_path):
    assert is_csf_checkpoint(mx_csf) and not is_csf_checkpoint(mx_native)
    back = decompress_checkpoint(mx_csf, tmp_path / "back", progress=False).dst
    assert _dir_sha256(back) == _dir_sha256(mx_native)
    assert tensor_sha256(back) == tensor_sha256(mx_native) == tensor_sha256(mx_csf)
    for f in ("model.safetensors.index.json", "config.json"):
        assert json.loads((back / f).read_text()) == json.loads((mx_native / f).read_text()), f
    for f in ("tokenizer.json", "generation_config.json", "tokenizer_config.json", "extra/notes.bin"):
        assert (back / f).read_bytes() == (mx_native / f).read_bytes(), f
        assert (mx_csf / f).read_bytes() == (mx_native / f).read_bytes(), f
    for shard in back.glob("*.safetensors"):
        assert read_header(shard).metadata == {"format": "pt"}


def test_sharded_schema(mx_native, mx_csf):
    scales = ["model.layers.0.mlp.experts.gate_up_proj_scales", "model.layers.0.mlp.experts.down_proj_scales"]
    native_index = json.loads((mx_native / "model.safetensors.index.json").read_text())
    index = json.loads((mx_csf / "model.safetensors.index.json").read_text())
    # the W13 values and scales sit in different shards (pairing works across shards)
    assert native_index["weight_map"][scales[0]] != native_index["weight_map"][scales[0][: -len("scales")] + "blocks"]
    expected_map = {(k + CSF_SUFFIX if k in scales else k): v for k, v in native_index["weight_map"].items()}
    assert index["weight_map"] == expected_map
    stored_total = sum(sum(t.nbytes for t in read_header(p).tensors.values()) for p in mx_csf.glob("*.safetensors"))
    assert index["metadata"]["total_size"] == stored_total

    cfg = json.loads((mx_csf / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "mxfp4"
    assert cfg["quantization_config"]["csf"] == {
        "format_version": CSF_FORMAT_VERSION,
        "scale_format": "mxfp4",
        "tensors": 2,
    }
    assert "csf" not in cfg

    for name in scales:
        header = read_header(mx_csf / index["weight_map"][name + CSF_SUFFIX])
        assert header.metadata[META_VERSION] == str(CSF_FORMAT_VERSION)
        assert header.metadata["format"] == "pt"
        rec = json.loads(header.metadata[META_TENSORS])[name + CSF_SUFFIX]
        assert rec["name"] == name and rec["dtype"] == "U8" and rec["format"] == "mxfp4"
        assert rec["values"] == name[: -len("scales")] + "blocks" and rec["global_scale"] is None
        info = header.tensors[name + CSF_SUFFIX]
        assert info.dtype == "U8" and len(info.shape) == 1
        assert name not in header.tensors


def test_passthrough_tensors_are_untouched(mx_native, mx_csf):
    native, csf = _dir_sha256(mx_native), _dir_sha256(mx_csf)
    passthrough = {k for k in native if not k.endswith("_scales")}
    assert len(passthrough) == 7
    assert {k: csf[k] for k in passthrough} == {k: native[k] for k in passthrough}
    assert set(csf) == passthrough | {k + CSF_SUFFIX for k in native if k.endswith("_scales")}


def test_nvfp4_sharded_round_trip(nv_native, tmp_path):
    summary = compress_checkpoint(nv_native, tmp_path / "csf", progress=False)
    assert sorted(t.name for t in summary.tensors) == [
        "model.layers.0.mlp.experts.w13.weight_scale",
        "model.layers.0.mlp.experts.w2.weight_scale",
    ]
    assert all(t.fmt == "nvfp4" and t.compact_bytes < t.native_bytes for t in summary.tensors)
    assert summary.passthrough_tensors == 9
    cfg = json.loads((summary.dst / "config.json").read_text())
    assert cfg["quantization_config"]["csf"]["scale_format"] == "nvfp4"
    assert cfg["quantization_config"]["quant_algo"] == "NVFP4"
    verify_checkpoint(summary.dst, against=nv_native, progress=False)
    back = decompress_checkpoint(summary.dst, tmp_path / "back", progress=False)
    assert {t.name for t in back.tensors} == {t.name for t in summary.tensors}
    assert _dir_sha256(back.dst) == _dir_sha256(nv_native)


def test_single_file_round_trip(single_file, tmp_path):
    summary = compress_checkpoint(single_file, tmp_path / "c.safetensors", progress=False)
    assert summary.dst == tmp_path / "c.safetensors"
    names = sorted(t.name for t in summary.tensors)
    assert names == [
        "model.layers.0.mlp.experts.0.down_proj.weight_scale",
        "model.layers.0.mlp.experts.1.down_proj.weight_scale",
        "model.layers.1.mlp.experts.w13.weight_scale",
        "model.layers.1.mlp.experts.w2.weight_scale",
    ]
    assert {t.name: t.fmt for t in summary.tensors}["model.layers.1.mlp.experts.w2.weight_scale"] == "mxfp4"
    stored = load_file(summary.dst)
    assert stored["model.layers.2.self_attn.o_proj.weight_scale"].dtype == torch.float32
    assert "model.layers.1.mlp.experts.w13.weight_scale.csf" in stored
    # a directory destination keeps the file name
    in_dir = compress_checkpoint(single_file, tmp_path / "outdir", progress=False).dst
    assert in_dir == tmp_path / "outdir" / "model.safetensors"

    back = decompress_checkpoint(summary.dst, tmp_path / "back.safetensors", progress=False).dst
    assert _file_sha256(back) == _file_sha256(single_file)
    assert read_header(back).metadata == {"format": "pt"}
    verify_checkpoint(summary.dst, against=single_file, progress=False)


def test_directory_without_index_or_quantization_config(single_file, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(single_file, src / "model.safetensors")
    config = {"model_type": "toy", "hidden_size": 8}
    (src / "config.json").write_text(json.dumps(config))
    csf = compress_checkpoint(src, tmp_path / "csf", progress=False).dst
    cfg = json.loads((csf / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["csf"] == {"format_version": CSF_FORMAT_VERSION, "scale_format": "mxfp4,nvfp4", "tensors": 4}
    assert not (csf / "model.safetensors.index.json").exists()
    back = decompress_checkpoint(csf, tmp_path / "back", progress=False).dst
    assert json.loads((back / "config.json").read_text()) == config
    assert _file_sha256(back / "model.safetensors") == _file_sha256(single_file)


def test_checkpoint_without_scale_planes_is_copied(tmp_path):
    src = tmp_path / "m.safetensors"
    save_file({"w": torch.randn(4, 4).bfloat16()}, src)
    summary = compress_checkpoint(src, tmp_path / "out.safetensors", progress=False)
    assert summary.tensors == () and summary.passthrough_tensors == 1
    assert _file_sha256(summary.dst) == _file_sha256(src)


# ---------------------------------------------------------------------------------------------- refusals


def test_refusals(mx_native, mx_csf, tmp_path):
    with pytest.raises(CSFError, match="already a CSF"):
        compress_checkpoint(mx_csf, tmp_path / "x", progress=False)
    with pytest.raises(CSFError, match="not a CSF"):
        decompress_checkpoint(mx_native, tmp_path / "y", progress=False)
    with pytest.raises(CSFError, match="not a CSF"):
        verify_checkpoint(mx_native, progress=False)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "f").write_text("x")
    with pytest.raises(UsageError, match="exists"):
        compress_checkpoint(mx_native, busy, progress=False)
    with pytest.raises(UsageError, match="outside"):
        compress_checkpoint(mx_native, mx_native / "sub", progress=False)
    with pytest.raises(UsageError, match="no such checkpoint"):
        compress_checkpoint(tmp_path / "missing", tmp_path / "z", progress=False)


def _rewrite_shard(path: Path, dst: Path, metadata: dict[str, str]) -> None:
    header = read_header(path)
    write_safetensors(dst, [passthrough_entry(header, n) for n in header.tensors], metadata=metadata)


def reseal_record(root: Path) -> None:
    """Rewrite a directory's completion record for its current files, as a forger would: the checks
    inside the shards must then stand on their own."""
    path = root / "csf-complete.json"
    record = json.loads(path.read_text())
    for f in record["files"]:
        data = (root / f["path"]).read_bytes()
        f["size"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    path.write_text(json.dumps(record))


def _csf_shard(root: Path) -> Path:
    return next(p for p in sorted(root.glob("*.safetensors")) if META_VERSION in read_header(p).metadata)


def test_wrong_format_version_names_file_and_tensor(mx_csf, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(mx_csf, bad)
    shard = _csf_shard(bad)
    meta = dict(read_header(shard).metadata)
    tensor = json.loads(meta[META_TENSORS])
    first = next(iter(tensor.values()))["name"]
    meta[META_VERSION] = "99"
    _rewrite_shard(shard, tmp_path / "tmp.safetensors", meta)
    shutil.move(tmp_path / "tmp.safetensors", shard)
    reseal_record(bad)
    for op in (
        lambda: decompress_checkpoint(bad, tmp_path / "out", progress=False),
        lambda: verify_checkpoint(bad, progress=False),
        lambda: inspect_checkpoint(bad),
        lambda: list(iter_checkpoint_tensors(bad)),
    ):
        with pytest.raises(FormatVersionError) as err:
            op()
        assert err.value.tensor == first
        assert shard.name in str(err.value) and "99" in str(err.value)


def test_verify_detects_corruption_and_differences(mx_native, mx_csf, tmp_path):
    ok = verify_checkpoint(mx_csf, against=mx_native, progress=False)
    assert ok.tensors == 2 and ok.compared_tensors == 9 and ok.compact_bytes < ok.native_bytes
    assert verify_checkpoint(mx_csf, progress=False).compared_tensors == 0

    # a native checkpoint that differs in one scale byte
    other = tmp_path / "other"
    shutil.copytree(mx_native, other)
    name = "model.layers.0.mlp.experts.down_proj_scales"
    shard = other / json.loads((other / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(shard)
    tensors[name] = tensors[name].clone()
    tensors[name][1, 2, 0] ^= 1
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(VerificationError) as err:
        verify_checkpoint(mx_csf, against=other, progress=False)
    assert err.value.tensor == name

    # a flipped byte inside a stored payload
    bad = tmp_path / "bad"
    shutil.copytree(mx_csf, bad)
    shard = _csf_shard(bad)
    header = read_header(shard)
    stored = next(n for n in header.tensors if n.endswith(CSF_SUFFIX))
    blob = bytearray(shard.read_bytes())
    blob[header.data_start + header.tensors[stored].end - 3] ^= 0x10
    shard.write_bytes(bytes(blob))
    with pytest.raises(IncompleteOutputError, match=shard.name):
        verify_checkpoint(bad, progress=False)
    reseal_record(bad)
    with pytest.raises(CorruptPayloadError) as err:
        verify_checkpoint(bad, progress=False)
    assert err.value.tensor == stored[: -len(CSF_SUFFIX)] and err.value.file == str(shard)


# --------------------------------------------------------------------------------------------- inspect


def test_inspect_native_and_csf_agree(mx_native, mx_csf):
    native, csf = inspect_checkpoint(mx_native), inspect_checkpoint(mx_csf)
    assert [r["name"] for r in native] == [r["name"] for r in csf]
    assert len(native) == 2
    for a, b in zip(native, csf, strict=True):
        assert a["stored"] == "native" and b["stored"] == "csf"
        assert a["stored_bytes"] == a["native_bytes"] and b["stored_bytes"] == a["compact_bytes"]
        assert a["convention"] == "gpt-oss" and a["format"] == "mxfp4"
        for k in ("native_bytes", "compact_bytes", "inline_bytes", "exceptions", "raw_tiles", "entropy_bits_per_scale"):
            assert a[k] == b[k], k


# ---------------------------------------------------------------------------------------- online loading


def test_iter_checkpoint_tensors(mx_native, mx_csf):
    native = dict(iter_checkpoint_tensors(mx_native))
    assert all(isinstance(t, torch.Tensor) for t in native.values())
    assert {k: _sha(v) for k, v in native.items()} == {k: v[2] for k, v in tensor_sha256(mx_native).items()}

    stored = dict(iter_checkpoint_tensors(mx_csf))
    online = dict(iter_checkpoint_tensors(mx_native, compress_scales=True))
    assert list(stored) == list(online) == list(native)
    for name, t in stored.items():
        if name.endswith("_scales"):
            assert isinstance(t, CompactScales) and isinstance(online[name], CompactScales)
            assert t.fmt is MXFP4 and t.shape == tuple(native[name].shape)
            assert torch.equal(t.payload, online[name].payload)
            assert torch.equal(decode_compact(t.payload, name=name), native[name])
        else:
            assert _raw(t) == _raw(native[name]) and t.dtype == native[name].dtype


# ------------------------------------------------------------------------------------- tensor parallel


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_tp_slices_equal_encoding_the_native_slice(fmt, world_size):
    e, n, h = 3, 40, 96
    w13 = synthetic_scale_plane((e, 2 * n, h // fmt.block_size), fmt, seed=1)
    w2 = synthetic_scale_plane((e, h, 8), fmt, seed=2)  # W2 over N=256 (MXFP4) / 128 (NVFP4)
    c13, c2 = encode_compact(w13, fmt, name="w13"), encode_compact(w2, fmt, name="w2")
    per, cols = n // world_size, w2.shape[-1] // world_size
    for rank in range(world_size):
        lo = rank * per
        native13 = torch.cat([w13[:, lo : lo + per], w13[:, n + lo : n + lo + per]], dim=1)
        got13 = tp_slice_scales(c13, rank=rank, world_size=world_size, kind="w13", name="w13")
        assert got13.shape == (e, 2 * per, w13.shape[-1]) and got13.fmt is fmt
        assert torch.equal(got13.payload, encode_compact(native13, fmt, name="w13").payload)
        native2 = w2[:, :, rank * cols : (rank + 1) * cols].contiguous()
        got2 = tp_slice_scales(c2, rank=rank, world_size=world_size, kind="w2", name="w2")
        assert torch.equal(got2.payload, encode_compact(native2, fmt, name="w2").payload)
        assert torch.equal(decode_compact(got2.payload), native2)


def test_tp_slices_of_2d_planes_and_refusals():
    plane = synthetic_scale_plane((24, 6), MXFP4, seed=3)
    c = encode_compact(plane, MXFP4)
    got = tp_slice_scales(c, rank=1, world_size=2, kind="w13")
    assert torch.equal(got.payload, encode_compact(torch.cat([plane[6:12], plane[18:24]]), MXFP4).payload)
    got = tp_slice_scales(c, rank=2, world_size=3, kind="w2")
    assert torch.equal(got.payload, encode_compact(plane[:, 4:6].contiguous(), MXFP4).payload)
    with pytest.raises(ShapeMismatchError, match="scale columns"):
        tp_slice_scales(c, rank=0, world_size=4, kind="w2", name="w2")  # 6 columns over 4 ranks
    with pytest.raises(ShapeMismatchError, match="W13"):
        tp_slice_scales(c, rank=0, world_size=5, kind="w13", name="w13")  # 12 gate rows over 5 ranks
    odd = encode_compact(synthetic_scale_plane((5, 4), MXFP4, seed=3), MXFP4)
    with pytest.raises(ShapeMismatchError):
        tp_slice_scales(odd, rank=0, world_size=1, kind="w13")
    with pytest.raises(ValueError):
        tp_slice_scales(c, rank=2, world_size=2, kind="w2")
    with pytest.raises(ValueError):
        tp_slice_scales(c, rank=0, world_size=1, kind="w3")  # type: ignore[arg-type]
