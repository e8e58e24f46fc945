"""CSF checkpoints: Hugging Face safetensors checkpoints whose FP4 scale planes are stored compact.

Layouts understood: a single ``*.safetensors`` file, or a directory holding either an index
(``*.safetensors.index.json``, normally ``model.safetensors.index.json``) and the shards it names, or, without an
index, its top-level ``*.safetensors`` files. Every other file of a directory (config.json aside, see below;
tokenizer files, generation config, READMEs, subfolders) is copied byte for byte.

Schema (``CSF_FORMAT_VERSION`` 1):

* Each scale plane ``X`` recognised by :mod:`csf_codec.hf_naming` is stored, in the shard that held ``X``, as
  ``X.csf``: a uint8 1-D tensor holding the self-describing compact payload. Planes of rank > 3 are encoded as
  ``[prod(leading), N, KB]`` (the codec takes 2-D or 3-D planes); the original shape is in the metadata.
* That shard's ``__metadata__`` keeps every original key and gains ``csf.format_version`` (``"1"``) and
  ``csf.tensors``: JSON ``{"X.csf": {"name": "X", "dtype": "F8_E4M3", "shape": [...], "format": "nvfp4",
  "values": "<values tensor>", "global_scale": "<name>" | null}}``.
* The index's ``weight_map`` maps ``X.csf`` (instead of ``X``) to the shard, and ``metadata.total_size`` is
  adjusted by the bytes saved (and adjusted back on decompression, so it round-trips exactly).
* config.json: when it has a ``quantization_config`` object, that object gains
  ``"csf": {"format_version": 1, "scale_format": "mxfp4" | "nvfp4", "tensors": N}``. When it has none, the same
  entry goes under a top-level ``"csf"`` key instead: inventing a ``quantization_config`` without a
  ``quant_method`` would make transformers refuse the model, while unknown top-level keys are ignored. A
  checkpoint mixing both formats records ``"scale_format": "mxfp4,nvfp4"``. Decompression removes the entry.
* Every other tensor is copied byte for byte with its name, dtype and shape.

Readers recognise a CSF shard by ``csf.format_version`` in its metadata and refuse any other version with
:class:`FormatVersionError` naming the file and tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from tqdm.auto import tqdm

from .compact import CompactScales, decode_compact, read_compact_header
from .container import CSF_FORMAT_VERSION
from .errors import CorruptPayloadError, CSFError, FormatVersionError, ShapeMismatchError, VerificationError
from .formats import ScaleFormat, scale_format
from .hf_naming import ScalePlaneSpec, find_scale_planes
from .safetensors_io import (
    DTYPE_SIZES,
    SafetensorsHeader,
    SafetensorsReader,
    TensorEntry,
    TensorInfo,
    iter_tensor_chunks,
    read_header,
    read_tensor_bytes,
    write_safetensors,
)
from .stats import plane_report
from .verify import encode_verified

__all__ = [
    "CONFIG_KEY",
    "CSF_SUFFIX",
    "META_TENSORS",
    "META_VERSION",
    "CheckpointLayout",
    "CompressionSummary",
    "CsfRecord",
    "TensorSummary",
    "VerificationSummary",
    "compress_checkpoint",
    "decompress_checkpoint",
    "inspect_checkpoint",
    "is_csf_checkpoint",
    "iter_checkpoint_tensors",
    "resolve_layout",
    "tensor_sha256",
    "tp_slice_scales",
    "verify_checkpoint",
]

CSF_SUFFIX = ".csf"
META_VERSION = "csf.format_version"
META_TENSORS = "csf.tensors"
CONFIG_KEY = "csf"
_CONFIG = "config.json"


# ----------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True, kw_only=True)
class CheckpointLayout:
    """Where a checkpoint's pieces live; ``shards`` and ``index`` are relative to ``root``."""

    root: Path
    shards: tuple[str, ...]
    index: str | None
    single_file: bool


def resolve_layout(src: str | os.PathLike[str]) -> CheckpointLayout:
    src = Path(src)
    if src.is_file():
        if not src.name.endswith(".safetensors"):
            raise ValueError(f"{src}: not a .safetensors file")
        return CheckpointLayout(root=src.parent, shards=(src.name,), index=None, single_file=True)
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no such checkpoint file or directory")
    indexes = sorted(p.name for p in src.glob("*.safetensors.index.json"))
    if "model.safetensors.index.json" in indexes:
        indexes = ["model.safetensors.index.json"]
    if len(indexes) > 1:
        raise ValueError(f"{src}: several safetensors indexes {indexes}; pass one checkpoint at a time")
    if indexes:
        weight_map = json.loads((src / indexes[0]).read_text())["weight_map"]
        shards = tuple(dict.fromkeys(sorted(weight_map.values())))
        missing = [s for s in shards if not (src / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{src / indexes[0]} names missing shards {missing}")
        return CheckpointLayout(root=src, shards=shards, index=indexes[0], single_file=False)
    shards = tuple(sorted(p.name for p in src.glob("*.safetensors")))
    if not shards:
        raise FileNotFoundError(f"{src}: no *.safetensors files and no safetensors index")
    return CheckpointLayout(root=src, shards=shards, index=None, single_file=False)


def _destination(layout: CheckpointLayout, dst: str | os.PathLike[str], *, overwrite: bool) -> Path:
    """The directory (or, for a single file, the file) to write; refuses to clobber anything by default."""
    dst = Path(dst)
    if layout.single_file:
        out = dst if dst.name.endswith(".safetensors") else dst / layout.shards[0]
        if out.resolve() == (layout.root / layout.shards[0]).resolve():
            raise ValueError(f"{out}: destination is the source")
        if out.exists() and not overwrite:
            raise FileExistsError(f"{out} exists (pass overwrite=True / --overwrite to replace it)")
        out.parent.mkdir(parents=True, exist_ok=True)
        return out
    src_root, dst_root = layout.root.resolve(), dst.resolve()
    if dst_root == src_root or src_root in dst_root.parents:
        raise ValueError(f"{dst}: destination must lie outside the source checkpoint {layout.root}")
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise FileExistsError(f"{dst} exists and is not empty (pass overwrite=True / --overwrite)")
    dst.mkdir(parents=True, exist_ok=True)
    return dst


def _other_files(layout: CheckpointLayout) -> list[str]:
    """Every file of a directory checkpoint that is neither a shard, the index nor config.json."""
    if layout.single_file:
        return []
    skip = {*layout.shards, layout.index, _CONFIG}
    out = []
    for dirpath, _dirs, files in os.walk(layout.root):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), layout.root)
            if rel not in skip:
                out.append(rel)
    return sorted(out)


# ----------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True, kw_only=True)
class CsfRecord:
    """One compressed tensor as its shard's ``csf.tensors`` metadata describes it."""

    stored_name: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    fmt: ScaleFormat
    values: str | None = None
    global_scale: str | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "format": self.fmt.name,
            "values": self.values,
            "global_scale": self.global_scale,
        }

    @property
    def codec_shape(self) -> tuple[int, ...]:
        return _codec_shape(self.shape)


def _codec_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The codec takes [N, KB] or [E, N, KB]; deeper planes fold their leading dims into E."""
    return tuple(shape) if len(shape) <= 3 else (math.prod(shape[:-2]), *shape[-2:])


def _first_tensor(raw: object) -> str:
    """The original name of a shard's first CSF tensor, for errors about the shard as a whole."""
    if isinstance(raw, dict) and raw:
        stored, d = next(iter(raw.items()))
        return str(d.get("name", stored)) if isinstance(d, dict) else str(stored)
    return "__metadata__"


def _csf_records(header: SafetensorsHeader) -> dict[str, CsfRecord]:
    """The CSF records of one shard ({} for a native shard); checks the format version first."""
    meta = header.metadata
    if META_VERSION not in meta:
        return {}
    try:
        raw = json.loads(meta.get(META_TENSORS, "{}"))
    except json.JSONDecodeError as e:
        raise CorruptPayloadError(header.path.name, f"{META_TENSORS} metadata is not JSON: {e}") from None
    version = meta[META_VERSION]
    if version != str(CSF_FORMAT_VERSION):
        raise FormatVersionError(
            _first_tensor(raw),
            f"{header.path} declares {META_VERSION}={version!r}; this build reads version {CSF_FORMAT_VERSION}",
        )
    if not isinstance(raw, dict):
        raise CorruptPayloadError(header.path.name, f"{META_TENSORS} metadata must be a JSON object")
    records = {}
    for stored, d in raw.items():
        try:
            rec = CsfRecord(
                stored_name=stored,
                name=str(d["name"]),
                dtype=str(d["dtype"]),
                shape=tuple(int(x) for x in d["shape"]),
                fmt=scale_format(d["format"]),
                values=d.get("values"),
                global_scale=d.get("global_scale"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptPayloadError(stored, f"{header.path}: bad {META_TENSORS} entry {d!r}: {e}") from None
        info = header.tensors.get(stored)
        if info is None:
            raise CorruptPayloadError(stored, f"{header.path}: listed in {META_TENSORS} but not stored")
        if info.dtype != "U8" or len(info.shape) != 1:
            raise CorruptPayloadError(stored, f"{header.path}: a CSF payload must be U8 1-D, not {info.dtype}")
        records[stored] = rec
    return records


@dataclass(frozen=True, kw_only=True)
class _Stored:
    """A tensor of a checkpoint as its users see it: original name, dtype and shape, wherever it is stored."""

    info: TensorInfo  # logical: original name/dtype/shape
    shard: str
    header: SafetensorsHeader
    stored_name: str
    record: CsfRecord | None = None


def _logical_tensors(layout: CheckpointLayout) -> dict[str, _Stored]:
    """Every tensor of the checkpoint by original name, in shard then file order."""
    out: dict[str, _Stored] = {}
    for shard in layout.shards:
        header = read_header(layout.root / shard)
        records = _csf_records(header)
        for stored, info in header.tensors.items():
            rec = records.get(stored)
            if rec is not None:
                native = math.prod(rec.shape) * DTYPE_SIZES.get(rec.dtype, 1)
                info = TensorInfo(name=rec.name, dtype=rec.dtype, shape=rec.shape, begin=0, end=native)
            if info.name in out:
                raise CSFError(info.name, f"stored in both {out[info.name].shard} and {shard}")
            out[info.name] = _Stored(info=info, shard=shard, header=header, stored_name=stored, record=rec)
    return out


def is_csf_checkpoint(src: str | os.PathLike[str]) -> bool:
    """True when any shard carries CSF metadata."""
    layout = resolve_layout(src)
    return any(META_VERSION in read_header(layout.root / s).metadata for s in layout.shards)


def _read_plane(t: _Stored) -> torch.Tensor:
    """A native (stored as-is) one-byte-per-scale tensor as uint8 in its codec shape, on the CPU."""
    raw = read_tensor_bytes(t.header, t.stored_name)
    if raw.numel() != math.prod(t.info.shape):
        raise ShapeMismatchError(t.info.name, f"{t.info.dtype} is not one byte per scale")
    return raw.reshape(_codec_shape(t.info.shape))


def _decode_stored(t: _Stored, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """Decode a CSF tensor to its native uint8 plane (original shape) on ``device``."""
    rec = t.record
    assert rec is not None
    payload = read_tensor_bytes(t.header, t.stored_name).to(device)
    try:
        head = read_compact_header(payload, name=rec.name)
        if head.fmt != rec.fmt:
            raise CorruptPayloadError(rec.name, f"payload is {head.fmt.name}, metadata says {rec.fmt.name}")
        return decode_compact(payload, name=rec.name, expected_shape=rec.codec_shape).reshape(rec.shape)
    except CSFError as e:  # the codec names the tensor; add the file it came from
        raise type(e)(e.tensor, f"{t.header.path} ({t.stored_name}): {e.fault}") from e


def _native_bytes(t: _Stored, *, device: str | torch.device = "cpu") -> Iterator[bytes | memoryview]:
    """A tensor's original bytes in bounded chunks, decoding it when it is stored compact."""
    if t.record is None:
        yield from iter_tensor_chunks(t.header, t.stored_name)
    else:
        yield memoryview(_decode_stored(t, device=device).cpu().reshape(-1).numpy())


def _compact_from_payload(payload: torch.Tensor, *, name: str) -> CompactScales:
    return CompactScales.from_payload(payload, name=name)


def _encode_plane(plane: torch.Tensor, fmt: ScaleFormat, *, name: str, device: str | torch.device) -> CompactScales:
    return encode_verified(plane.to(device), fmt, name=name)


# ---------------------------------------------------------------------------------------------- progress


def _bar(total: int, desc: str, enabled: bool) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        leave=False,
        disable=not (enabled and sys.stderr.isatty()),
    )


def _counted(chunks: Iterable[bytes | memoryview], bar: tqdm) -> Iterator[bytes | memoryview]:
    for c in chunks:
        bar.update(len(memoryview(c).cast("B")))
        yield c


# --------------------------------------------------------------------------------------------- summaries


@dataclass(frozen=True, kw_only=True)
class TensorSummary:
    name: str
    stored_name: str
    file: str
    fmt: str
    shape: tuple[int, ...]
    native_bytes: int
    compact_bytes: int

    @property
    def ratio(self) -> float:
        return self.native_bytes / self.compact_bytes if self.compact_bytes else float("inf")


@dataclass(frozen=True, kw_only=True)
class CompressionSummary:
    """What compress/decompress did; ``tensors`` are the scale planes converted."""

    src: Path
    dst: Path
    tensors: tuple[TensorSummary, ...]
    passthrough_tensors: int
    passthrough_bytes: int
    copied_files: tuple[str, ...] = field(default=())

    @property
    def native_scale_bytes(self) -> int:
        return sum(t.native_bytes for t in self.tensors)

    @property
    def compact_scale_bytes(self) -> int:
        return sum(t.compact_bytes for t in self.tensors)

    @property
    def scale_ratio(self) -> float:
        return self.native_scale_bytes / self.compact_scale_bytes if self.compact_scale_bytes else float("inf")

    @property
    def native_total_bytes(self) -> int:
        return self.passthrough_bytes + self.native_scale_bytes

    @property
    def csf_total_bytes(self) -> int:
        return self.passthrough_bytes + self.compact_scale_bytes


@dataclass(frozen=True, kw_only=True)
class VerificationSummary:
    src: Path
    against: Path | None
    tensors: int  # CSF tensors decoded and checked
    native_bytes: int
    compact_bytes: int
    compared_tensors: int  # tensors compared byte for byte with ``against`` (0 without it)


# -------------------------------------------------------------------------------------------- operations


def _rewrite_index(src: Path, dst: Path, rename: dict[str, str], size_delta: int) -> None:
    index = json.loads(src.read_text())
    index["weight_map"] = {rename.get(k, k): v for k, v in index["weight_map"].items()}
    meta = index.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("total_size"), int):
        meta["total_size"] += size_delta
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(index, indent=2) + "\n")


def _rewrite_config(src: Path, dst: Path, entry: dict[str, object] | None) -> None:
    """Copy config.json, adding (entry) or removing (None) the CSF entry; see the module docstring."""
    cfg = json.loads(src.read_text())
    qc = cfg.get("quantization_config")
    if entry is None:
        if isinstance(qc, dict):
            qc.pop(CONFIG_KEY, None)
        cfg.pop(CONFIG_KEY, None)
    elif isinstance(qc, dict):
        qc[CONFIG_KEY] = entry
    else:
        cfg[CONFIG_KEY] = entry
    dst.write_text(json.dumps(cfg, indent=2) + "\n")


def _finish_directory(
    layout: CheckpointLayout, out: Path, rename: dict[str, str], size_delta: int, entry: dict[str, object] | None
) -> tuple[str, ...]:
    """Index, config.json and every other file of a directory checkpoint."""
    if layout.single_file:
        return ()
    if layout.index is not None:
        _rewrite_index(layout.root / layout.index, out / layout.index, rename, size_delta)
    if (layout.root / _CONFIG).is_file():
        _rewrite_config(layout.root / _CONFIG, out / _CONFIG, entry)
    copied = _other_files(layout)
    for rel in copied:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(layout.root / rel, out / rel)  # follows symlinks (HF cache snapshots are symlinks)
    return tuple(copied)


def _shard_path(layout: CheckpointLayout, out: Path, shard: str) -> Path:
    path = out if layout.single_file else out / shard
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def compress_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
    overwrite: bool = False,
) -> CompressionSummary:
    """Write a CSF copy of the native checkpoint ``src`` to ``dst``.

    Each shard's compact payloads are encoded (and verified) first, since the header must know their sizes,
    then the shard is streamed out one tensor at a time; only one native plane and the shard's payloads are
    ever in memory.
    """
    layout = resolve_layout(src)
    tensors = _logical_tensors(layout)
    if any(t.record is not None for t in tensors.values()):
        raise CSFError(str(src), "already a CSF checkpoint")
    specs = find_scale_planes({n: t.info for n, t in tensors.items()})
    for name in specs:
        if name + CSF_SUFFIX in tensors:
            raise CSFError(name, f"cannot store it as {name + CSF_SUFFIX}: a tensor of that name exists")
    out = _destination(layout, dst, overwrite=overwrite)

    summaries: list[TensorSummary] = []
    passthrough = passthrough_bytes = 0
    bar = _bar(sum(t.info.nbytes for t in tensors.values()), "csf compress", progress)
    with bar:
        for shard in layout.shards:
            header = read_header(layout.root / shard)
            entries: list[TensorEntry] = []
            records: dict[str, dict[str, object]] = {}
            for stored in header.tensors:
                t = tensors[stored]
                spec: ScalePlaneSpec | None = specs.get(stored)
                if spec is None:
                    entries.append(_passthrough(header, stored, bar))
                    passthrough += 1
                    passthrough_bytes += t.info.nbytes
                    continue
                bar.set_postfix_str(stored, refresh=False)
                compact = _encode_plane(_read_plane(t), spec.fmt, name=stored, device=device)
                payload = compact.payload.cpu()
                bar.update(t.info.nbytes)
                new = stored + CSF_SUFFIX
                rec = CsfRecord(
                    stored_name=new,
                    name=stored,
                    dtype=t.info.dtype,
                    shape=t.info.shape,
                    fmt=spec.fmt,
                    values=spec.values_name,
                    global_scale=spec.global_scale_name,
                )
                records[new] = rec.as_json()
                entries.append(TensorEntry(name=new, dtype="U8", shape=(payload.numel(),), load=lambda p=payload: p))
                summaries.append(
                    TensorSummary(
                        name=stored,
                        stored_name=new,
                        file=shard,
                        fmt=spec.fmt.name,
                        shape=t.info.shape,
                        native_bytes=t.info.nbytes,
                        compact_bytes=payload.numel(),
                    )
                )
            meta = dict(header.metadata)
            if records:
                meta[META_VERSION] = str(CSF_FORMAT_VERSION)
                meta[META_TENSORS] = json.dumps(records, separators=(",", ":"), sort_keys=True)
            write_safetensors(_shard_path(layout, out, shard), entries, metadata=meta)

    rename = {s.name: s.stored_name for s in summaries}
    delta = sum(s.compact_bytes - s.native_bytes for s in summaries)
    entry = None
    if summaries:
        entry = {
            "format_version": CSF_FORMAT_VERSION,
            "scale_format": ",".join(sorted({s.fmt for s in summaries})),
            "tensors": len(summaries),
        }
    copied = _finish_directory(layout, out, rename, delta, entry)
    return CompressionSummary(
        src=Path(src),
        dst=out,
        tensors=tuple(summaries),
        passthrough_tensors=passthrough,
        passthrough_bytes=passthrough_bytes,
        copied_files=copied,
    )


def _passthrough(header: SafetensorsHeader, name: str, bar: tqdm) -> TensorEntry:
    info = header.tensors[name]
    return TensorEntry(
        name=name, dtype=info.dtype, shape=info.shape, load=lambda: _counted(iter_tensor_chunks(header, name), bar)
    )


def decompress_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
    overwrite: bool = False,
) -> CompressionSummary:
    """Write the native checkpoint a CSF checkpoint came from: every tensor's bytes, name and dtype restored.

    Planes are decoded lazily, one at a time, while their shard is written.
    """
    layout = resolve_layout(src)
    tensors = _logical_tensors(layout)
    if not any(t.record is not None for t in tensors.values()):
        raise CSFError(str(src), f"not a CSF checkpoint: no shard carries {META_VERSION}")
    out = _destination(layout, dst, overwrite=overwrite)

    summaries: list[TensorSummary] = []
    passthrough = passthrough_bytes = 0
    bar = _bar(sum(t.info.nbytes for t in tensors.values()), "csf decompress", progress)
    with bar:
        for shard in layout.shards:
            header = read_header(layout.root / shard)
            entries: list[TensorEntry] = []
            for t in (t for t in tensors.values() if t.shard == shard):
                if t.record is None:
                    entries.append(_passthrough(header, t.stored_name, bar))
                    passthrough += 1
                    passthrough_bytes += t.info.nbytes
                    continue
                entries.append(
                    TensorEntry(
                        name=t.info.name,
                        dtype=t.info.dtype,
                        shape=t.info.shape,
                        load=lambda t=t: _counted(_native_bytes(t, device=device), bar),
                    )
                )
                summaries.append(
                    TensorSummary(
                        name=t.info.name,
                        stored_name=t.stored_name,
                        file=shard,
                        fmt=t.record.fmt.name,
                        shape=t.info.shape,
                        native_bytes=t.info.nbytes,
                        compact_bytes=header.tensors[t.stored_name].nbytes,
                    )
                )
            meta = {k: v for k, v in header.metadata.items() if k not in (META_VERSION, META_TENSORS)}
            write_safetensors(_shard_path(layout, out, shard), entries, metadata=meta)

    rename = {s.stored_name: s.name for s in summaries}
    delta = sum(s.native_bytes - s.compact_bytes for s in summaries)
    copied = _finish_directory(layout, out, rename, delta, None)
    return CompressionSummary(
        src=Path(src),
        dst=out,
        tensors=tuple(summaries),
        passthrough_tensors=passthrough,
        passthrough_bytes=passthrough_bytes,
        copied_files=copied,
    )


def _check_index(layout: CheckpointLayout) -> None:
    """The index must name exactly the stored tensors, each in its shard."""
    if layout.index is None:
        return
    weight_map = json.loads((layout.root / layout.index).read_text())["weight_map"]
    stored = {n: s for s in layout.shards for n in read_header(layout.root / s).tensors}
    if weight_map != stored:
        wrong = sorted(set(weight_map.items()) ^ set(stored.items()))[:5]
        raise CorruptPayloadError(layout.index, f"weight_map disagrees with the shards, e.g. {wrong}")


def _same_bytes(a: Iterable[bytes | memoryview], b: Iterable[bytes | memoryview]) -> bool:
    """Compare two chunked byte streams without materialising either (chunks need not align)."""
    ha, hb = hashlib.sha256(), hashlib.sha256()
    for c in a:
        ha.update(c)
    for c in b:
        hb.update(c)
    return ha.digest() == hb.digest()


def verify_checkpoint(
    src: str | os.PathLike[str],
    *,
    against: str | os.PathLike[str] | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> VerificationSummary:
    """Decode every CSF tensor of ``src`` and check its header against the metadata; raise on any fault.

    With ``against`` (a native checkpoint, or another CSF one), also require the same tensor names, dtypes and
    shapes, and every tensor's original bytes to be identical.
    """
    layout = resolve_layout(src)
    tensors = _logical_tensors(layout)
    csf = [t for t in tensors.values() if t.record is not None]
    if not csf:
        raise CSFError(str(src), f"not a CSF checkpoint: no shard carries {META_VERSION}")
    _check_index(layout)
    native = _logical_tensors(resolve_layout(against)) if against is not None else None
    if native is not None and set(native) != set(tensors):
        diff = sorted(set(native) ^ set(tensors))[:5]
        raise VerificationError(str(src), f"tensor names differ from {against}, e.g. {diff}")

    compared = 0
    todo = tensors.values() if native is not None else csf
    with _bar(sum(t.info.nbytes for t in todo), "csf verify", progress) as bar:
        for t in todo:
            bar.set_postfix_str(t.info.name, refresh=False)
            plane = _decode_stored(t, device=device).cpu() if t.record is not None else None
            if native is not None:
                ref = native[t.info.name]
                if (ref.info.dtype, ref.info.shape) != (t.info.dtype, t.info.shape):
                    raise VerificationError(
                        t.info.name,
                        f"{t.info.dtype} {t.info.shape} here, {ref.info.dtype} {ref.info.shape} in {against}",
                    )
                ours = [memoryview(plane.reshape(-1).numpy())] if plane is not None else _native_bytes(t)
                if not _same_bytes(ours, _native_bytes(ref, device=device)):
                    raise VerificationError(t.info.name, f"bytes differ from {against}")
                compared += 1
            bar.update(t.info.nbytes)
    return VerificationSummary(
        src=Path(src),
        against=Path(against) if against is not None else None,
        tensors=len(csf),
        native_bytes=sum(t.info.nbytes for t in csf),
        compact_bytes=sum(t.header.tensors[t.stored_name].nbytes for t in csf),
        compared_tensors=compared,
    )


def inspect_checkpoint(src: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> list[dict[str, object]]:
    """A :func:`csf_codec.stats.plane_report` dict per FP4 scale plane, native or CSF (decoded first).

    Each dict also carries ``file``, ``convention``, ``stored`` ("native" or "csf") and ``stored_bytes``.
    """
    layout = resolve_layout(src)
    tensors = _logical_tensors(layout)
    specs = find_scale_planes({n: t.info for n, t in tensors.items()})
    reports = []
    for name, spec in specs.items():
        t = tensors[name]
        if t.record is not None:
            plane = _decode_stored(t, device=device).reshape(t.record.codec_shape)
        else:
            plane = _read_plane(t).to(device)
        d = dict(plane_report(plane, spec.fmt, name=name).as_dict())
        d.update(
            file=t.shard,
            convention=spec.convention,
            stored="csf" if t.record is not None else "native",
            stored_bytes=t.header.tensors[t.stored_name].nbytes,
        )
        reports.append(d)
    return reports


def iter_checkpoint_tensors(
    src: str | os.PathLike[str], *, compress_scales: bool = False, device: str | torch.device = "cpu"
) -> Iterator[tuple[str, torch.Tensor | CompactScales]]:
    """Yield ``(name, tensor)`` for every tensor of a checkpoint, one at a time, on ``device``.

    Stored ``X.csf`` tensors come back as :class:`CompactScales` under their original name ``X``; with
    ``compress_scales`` native FP4 scale planes are encoded (and verified) on the fly, so a loader can keep
    only compact scales resident whichever kind of checkpoint it was given.
    """
    layout = resolve_layout(src)
    tensors = _logical_tensors(layout)
    specs = find_scale_planes({n: t.info for n, t in tensors.items()}) if compress_scales else {}
    for shard in layout.shards:
        with SafetensorsReader(layout.root / shard, device=str(device)) as reader:
            for t in (t for t in tensors.values() if t.shard == shard):
                name = t.info.name
                if t.record is not None:
                    payload = read_tensor_bytes(t.header, t.stored_name).to(device)
                    yield name, _compact_from_payload(payload, name=name)
                elif name in specs:
                    yield name, _encode_plane(_read_plane(t), specs[name].fmt, name=name, device=device)
                else:
                    yield name, reader.get(t.stored_name)


def tensor_sha256(src: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> dict[str, tuple]:
    """``{name: (dtype, shape, sha256 of the original bytes)}`` for every tensor; CSF tensors are decoded."""
    out = {}
    for name, t in _logical_tensors(resolve_layout(src)).items():
        h = hashlib.sha256()
        for chunk in _native_bytes(t, device=device):
            h.update(chunk)
        out[name] = (t.info.dtype, t.info.shape, h.hexdigest())
    return out


# ------------------------------------------------------------------------------------ tensor parallelism


def tp_slice_scales(
    compact: CompactScales, *, rank: int, world_size: int, kind: Literal["w13", "w2"], name: str = "scales"
) -> CompactScales:
    """The compact scales of one tensor-parallel rank's slice of an MoE weight.

    ``w13`` planes are [E, 2N, KB] with gate rows stacked over up rows: each half is cut along N. ``w2``
    planes are [E, H, N/block]: cut along the scale columns, which must split evenly (a rank's share of N
    must be whole blocks). The result is byte for byte ``encode_compact`` of the sliced native plane: row
    bases depend only on their own row, but the 128-row segments and 256-scale exception chunks are laid out
    over the flattened plane, so a slice has to be re-encoded rather than cut out of the payload. The compact
    decoder takes whole planes, so peak memory is one native plane plus one rank's slice.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"{name}: rank {rank} is not in a world of size {world_size}")
    if kind not in ("w13", "w2"):
        raise ValueError(f"{name}: kind must be 'w13' or 'w2', not {kind!r}")
    plane = decode_compact(compact.payload, name=name, expected_shape=tuple(compact.shape))
    squeeze = plane.dim() == 2
    if squeeze:
        plane = plane.unsqueeze(0)
    if kind == "w13":
        rows = plane.shape[1]
        if rows % 2 or (rows // 2) % world_size:
            raise ShapeMismatchError(
                name, f"W13 rows {rows} are not [gate; up] halves that split over {world_size} ranks"
            )
        n, per = rows // 2, rows // 2 // world_size
        lo = rank * per
        part = torch.cat([plane[:, lo : lo + per], plane[:, n + lo : n + lo + per]], dim=1)
    else:
        cols = plane.shape[2]
        if cols % world_size:
            raise ShapeMismatchError(name, f"W2 has {cols} scale columns, which do not split over {world_size} ranks")
        per = cols // world_size
        part = plane[:, :, rank * per : (rank + 1) * per].contiguous()
    del plane
    if squeeze:
        part = part.squeeze(0)
    return encode_verified(part, compact.fmt, name=name)
