"""CSF checkpoints: Hugging Face safetensors checkpoints whose FP4 scale planes are stored compact.

Layouts understood: a single ``*.safetensors`` file, or a directory holding either an index
(``*.safetensors.index.json``, normally ``model.safetensors.index.json``) and the shards it names, or, without an
index, its top-level ``*.safetensors`` files. Every other file of a directory (config.json aside, see below;
tokenizer files, generation config, READMEs, subfolders) is copied byte for byte.

Schema (``CSF_FORMAT_VERSION`` 3):

* Each scale plane ``X`` recognised by :mod:`csf_codec.hf_naming` is stored, in the shard that held ``X``, as
  ``X.csf``: a uint8 1-D tensor holding the self-describing compact payload. Planes of rank > 3 are encoded as
  ``[prod(leading), N, KB]`` (the codec takes 2-D or 3-D planes); the original shape is in the metadata. A
  plane whose payload would not be smaller (incompressible or empty) stays native under its own name.
* That shard's ``__metadata__`` keeps every original key and gains ``csf.format_version``, ``csf.tensors`` and
  ``csf.tensors_sha256`` (:mod:`csf_codec.shard_schema`).
* The index's ``weight_map`` maps ``X.csf`` (instead of ``X``) to the shard, and ``metadata.total_size`` is
  recomputed from the tensors written (on compression and on decompression).
* A directory output carries a completion record (:mod:`csf_codec.transaction`); every output is written
  under a temporary sibling and renamed into place whole.
* config.json: when it has a ``quantization_config`` object, that object gains
  ``"csf": {"format_version": 3, "scale_format": "mxfp4" | "nvfp4", "tensors": N}``. When it has none, the same
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from .compact import CompactScales
from .container import CSF_FORMAT_VERSION
from .errors import (
    CSFError,
    FormatVersionError,
    IncompleteOutputError,
    MalformedInputError,
    ShapeMismatchError,
    UsageError,
    VerificationError,
)
from .formats import ScaleFormat
from .hf_naming import ScalePlaneSpec, find_scale_planes
from .payloads import decode_compact
from .progress import Progress, counted
from .safetensors_io import (
    SafetensorsHeader,
    SafetensorsReader,
    TensorEntry,
    TensorInfo,
    iter_tensor_chunks,
    read_header,
    read_tensor_bytes,
    write_safetensors,
)
from .shard_schema import (
    CSF_SUFFIX,
    META_DIGEST,
    META_TENSORS,
    META_VERSION,
    CsfRecord,
    codec_shape,
    csf_metadata,
    csf_records,
)
from .stats import plane_report
from .transaction import COMPLETION_RECORD, OutputTransaction, check_complete, partial_outputs
from .verify import encode_verified

__all__ = [
    "CONFIG_KEY",
    "CSF_SUFFIX",
    "META_DIGEST",
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


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MalformedInputError("", f"not JSON: {e}", file=path) from None


def _weight_map(path: Path) -> dict[str, str]:
    index = _read_json(path)
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise MalformedInputError("", "a safetensors index needs a weight_map of tensor -> shard", file=path)
    return wm


def resolve_layout(src: str | os.PathLike[str]) -> CheckpointLayout:
    src = Path(src)
    if src.is_file():
        if not src.name.endswith(".safetensors"):
            raise UsageError("", "not a .safetensors file or checkpoint directory", file=src)
        return CheckpointLayout(root=src.parent, shards=(src.name,), index=None, single_file=True)
    if not src.is_dir():
        stale = partial_outputs(src)
        note = f"; an interrupted run left {', '.join(p.name for p in stale)} (incomplete: remove it)" if stale else ""
        raise UsageError("", f"no such checkpoint file or directory{note}", file=src)
    indexes = sorted(p.name for p in src.glob("*.safetensors.index.json"))
    if "model.safetensors.index.json" in indexes:
        indexes = ["model.safetensors.index.json"]
    if len(indexes) > 1:
        raise UsageError("", f"several safetensors indexes {indexes}; pass one checkpoint at a time", file=src)
    if indexes:
        shards = tuple(dict.fromkeys(sorted(_weight_map(src / indexes[0]).values())))
        bad = [s for s in shards if Path(s).is_absolute() or ".." in Path(s).parts]
        missing = [s for s in shards if not (src / s).is_file()]
        if bad or missing:
            raise MalformedInputError(
                "", f"names missing or outside shards {(bad or missing)[:5]}", file=src / indexes[0]
            )
        return CheckpointLayout(root=src, shards=shards, index=indexes[0], single_file=False)
    shards = tuple(sorted(p.name for p in src.glob("*.safetensors")))
    if not shards:
        raise UsageError("", "no *.safetensors files and no safetensors index", file=src)
    return CheckpointLayout(root=src, shards=shards, index=None, single_file=False)


def _output_path(layout: CheckpointLayout, dst: str | os.PathLike[str]) -> Path:
    """The directory (or, for a single file, the file) to write; never the source or inside it."""
    dst = Path(dst)
    if layout.single_file:
        out = dst if dst.name.endswith(".safetensors") else dst / layout.shards[0]
        if out.resolve() == (layout.root / layout.shards[0]).resolve():
            raise UsageError("", "destination is the source", file=out)
        return out
    src_root, dst_root = layout.root.resolve(), dst.resolve()
    if dst_root == src_root or src_root in dst_root.parents or dst_root in src_root.parents:
        raise UsageError("", f"destination must lie outside the source checkpoint {layout.root}", file=dst)
    return dst


def _other_files(layout: CheckpointLayout) -> list[str]:
    """Every file of a directory checkpoint that is neither a shard, the index, config.json nor the record."""
    if layout.single_file:
        return []
    skip = {*layout.shards, layout.index, _CONFIG, COMPLETION_RECORD}
    out = []
    for dirpath, _dirs, files in os.walk(layout.root):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), layout.root)
            if rel not in skip:
                out.append(rel)
    return sorted(out)


# ------------------------------------------------------------------------------------------ stored tensors


@dataclass(frozen=True, kw_only=True)
class _Stored:
    """A tensor of a checkpoint as its users see it: original name, dtype and shape, wherever it is stored."""

    info: TensorInfo  # logical: original name/dtype/shape
    shard: str
    header: SafetensorsHeader
    stored_name: str
    record: CsfRecord | None = None

    @property
    def compact(self) -> bool:
        """Stored as a compact payload (not as its native bytes)."""
        return self.record is not None and not self.record.native


def _logical_tensors(layout: CheckpointLayout) -> dict[str, _Stored]:
    """Every tensor of the checkpoint by original name, in shard then file order."""
    out: dict[str, _Stored] = {}
    for shard in layout.shards:
        header = read_header(layout.root / shard)
        records = csf_records(header)
        for stored, info in header.tensors.items():
            rec = records.get(stored)
            if rec is not None and not rec.native:
                native = math.prod(rec.shape)  # scale planes are one byte per scale
                info = TensorInfo(name=rec.name, dtype=rec.dtype, shape=rec.shape, begin=0, end=native)
            if info.name in out:
                raise MalformedInputError(info.name, f"also stored in {out[info.name].shard}", file=header.path)
            out[info.name] = _Stored(info=info, shard=shard, header=header, stored_name=stored, record=rec)
    return out


def _scale_planes(tensors: dict[str, _Stored]) -> dict[str, ScalePlaneSpec]:
    """The FP4 scale planes among ``tensors``; a misfit names the shard that holds it."""
    try:
        return find_scale_planes({n: t.info for n, t in tensors.items()})
    except CSFError as e:
        t = tensors.get(e.tensor)
        raise (e.in_file(t.header.path) if t is not None else e) from e


def is_csf_checkpoint(src: str | os.PathLike[str]) -> bool:
    """True when any shard carries CSF metadata."""
    layout = resolve_layout(src)
    return any(META_VERSION in read_header(layout.root / s).metadata for s in layout.shards)


def _read_plane(t: _Stored) -> torch.Tensor:
    """A native (stored as-is) one-byte-per-scale tensor as uint8 in its codec shape, on the CPU."""
    raw = read_tensor_bytes(t.header, t.stored_name)
    if raw.numel() != math.prod(t.info.shape):
        raise ShapeMismatchError(t.info.name, f"{t.info.dtype} is not one byte per scale", file=t.header.path)
    return raw.reshape(codec_shape(t.info.shape))


def _decode_stored(t: _Stored, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """Decode a CSF tensor to its native uint8 plane (original shape) on ``device``; digest-checked."""
    rec = t.record
    assert rec is not None and not rec.native
    try:
        payload = read_tensor_bytes(t.header, t.stored_name).to(device)
        lay = CompactScales.from_payload(payload, name=rec.name)
        if lay.fmt != rec.fmt:
            raise MalformedInputError(rec.name, f"payload is {lay.fmt.name}, metadata says {rec.fmt.name}")
        return decode_compact(payload, name=rec.name, expected_shape=rec.codec_shape).reshape(rec.shape)
    except CSFError as e:  # the codec names the tensor; add the file it came from
        raise e.in_file(t.header.path) from e


def _native_bytes(t: _Stored, *, device: str | torch.device = "cpu") -> Iterator[bytes | memoryview]:
    """A tensor's original bytes in bounded chunks, decoding it when it is stored compact."""
    if not t.compact:
        yield from iter_tensor_chunks(t.header, t.stored_name)
    else:
        yield memoryview(_decode_stored(t, device=device).cpu().reshape(-1).numpy())


def _encode_plane(plane: torch.Tensor, fmt: ScaleFormat, *, name: str, device: str | torch.device) -> CompactScales:
    return encode_verified(plane.to(device), fmt, name=name)


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
    stored: str = "csf"  # "native": kept as-is, its payload would not have been smaller

    @property
    def ratio(self) -> float:
        return self.native_bytes / self.compact_bytes if self.compact_bytes else float("inf")


@dataclass(frozen=True, kw_only=True)
class CompressionSummary:
    """What compress/decompress did; ``tensors`` are the scale planes (``stored`` says which stay native)."""

    src: Path
    dst: Path
    tensors: tuple[TensorSummary, ...]
    passthrough_tensors: int
    passthrough_bytes: int
    copied_files: tuple[str, ...] = field(default=())

    @property
    def compressed(self) -> tuple[TensorSummary, ...]:
        """The planes stored as CSF payloads."""
        return tuple(t for t in self.tensors if t.stored == "csf")

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


def _rewrite_index(src: Path, dst: Path, rename: dict[str, str], total_size: int) -> None:
    index = _read_json(src)
    assert isinstance(index, dict)  # resolve_layout has read its weight_map
    index["weight_map"] = {rename.get(k, k): v for k, v in index["weight_map"].items()}
    meta = index.get("metadata")
    if isinstance(meta, dict) and "total_size" in meta:
        meta["total_size"] = total_size  # recomputed: a wrong source value is not carried over
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(index, indent=2) + "\n")


def _rewrite_config(src: Path, dst: Path, entry: dict[str, object] | None) -> None:
    """Copy config.json, adding (entry) or removing (None) the CSF entry; see the module docstring."""
    cfg = _read_json(src)
    if not isinstance(cfg, dict):
        raise MalformedInputError("", "config.json is not a JSON object", file=src)
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
    layout: CheckpointLayout, out: Path, rename: dict[str, str], total_size: int, entry: dict[str, object] | None
) -> tuple[str, ...]:
    """Index, config.json and every other file of a directory checkpoint."""
    if layout.single_file:
        return ()
    if layout.index is not None:
        _rewrite_index(layout.root / layout.index, out / layout.index, rename, total_size)
    if (layout.root / _CONFIG).is_file():
        _rewrite_config(layout.root / _CONFIG, out / _CONFIG, entry)
    copied = _other_files(layout)
    for rel in copied:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(layout.root / rel, out / rel)  # follows symlinks (HF cache snapshots are symlinks)
    return tuple(copied)


def _shard_path(layout: CheckpointLayout, tx: OutputTransaction, shard: str) -> Path:
    path = tx.file if layout.single_file else tx.root / shard
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _compress_plane(
    t: _Stored, spec: ScalePlaneSpec, header: SafetensorsHeader, *, device: str | torch.device
) -> tuple[TensorEntry, CsfRecord, TensorSummary]:
    """One scale plane as it is stored: a compact payload, or itself when the payload would not be smaller."""
    name = t.stored_name
    plane = _read_plane(t)
    payload = None
    if plane.numel():
        payload = _encode_plane(plane, spec.fmt, name=name, device=device).payload.cpu()
    native = payload is None or payload.numel() >= t.info.nbytes
    rec = CsfRecord(
        stored_name=name if native else name + CSF_SUFFIX,
        name=name,
        dtype=t.info.dtype,
        shape=t.info.shape,
        fmt=spec.fmt,
        values=spec.values_name,
        global_scale=spec.global_scale_name,
        native=native,
    )
    if native:
        entry = TensorEntry(name=name, dtype=t.info.dtype, shape=t.info.shape, load=lambda: plane)
    else:
        entry = TensorEntry(name=rec.stored_name, dtype="U8", shape=(payload.numel(),), load=lambda: payload)
    summary = TensorSummary(
        name=name,
        stored_name=rec.stored_name,
        file=t.shard,
        fmt=spec.fmt.name,
        shape=t.info.shape,
        native_bytes=t.info.nbytes,
        compact_bytes=entry.nbytes,
        stored="native" if native else "csf",
    )
    return entry, rec, summary


def compress_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
    overwrite: bool = False,
) -> CompressionSummary:
    """Write a CSF copy of the native checkpoint ``src`` to ``dst``, as a transaction (:mod:`csf_codec.transaction`).

    Shards are processed one at a time: a shard's compact payloads are encoded (and verified) first, since
    its header must know their sizes, then the shard is streamed out one tensor at a time; only one native
    plane and one shard's payloads are ever in memory. ``dst`` appears whole or not at all; with
    ``overwrite`` an existing output is replaced only once the new one is complete.
    """
    layout = resolve_layout(src)
    tensors = _logical_tensors(layout)
    if any(t.record is not None for t in tensors.values()):
        raise UsageError("", "already a CSF checkpoint", file=src)
    specs = _scale_planes(tensors)
    for name in specs:
        if name + CSF_SUFFIX in tensors:
            raise UsageError(name, f"cannot store it as {name + CSF_SUFFIX}: a tensor of that name exists", file=src)
    out = _output_path(layout, dst)

    summaries: list[TensorSummary] = []
    passthrough = passthrough_bytes = total_size = 0
    with (
        OutputTransaction(out, overwrite=overwrite, single_file=layout.single_file) as tx,
        Progress(sum(t.info.nbytes for t in tensors.values()), "csf compress", progress) as bar,
    ):
        for shard in layout.shards:
            header = read_header(layout.root / shard)
            entries: list[TensorEntry] = []
            records: list[CsfRecord] = []
            for stored in header.tensors:
                t = tensors[stored]
                spec = specs.get(stored)
                if spec is None:
                    entries.append(_passthrough(header, stored, bar))
                    passthrough += 1
                    passthrough_bytes += t.info.nbytes
                    continue
                bar.note(stored)
                entry, rec, summary = _compress_plane(t, spec, header, device=device)
                bar.update(t.info.nbytes)
                entries.append(entry)
                records.append(rec)
                summaries.append(summary)
            written = write_safetensors(
                _shard_path(layout, tx, shard), entries, metadata=csf_metadata(header.metadata, records)
            )
            total_size += sum(i.nbytes for i in written.values())

        compressed = [s for s in summaries if s.stored == "csf"]
        entry = None
        if summaries:
            entry = {
                "format_version": CSF_FORMAT_VERSION,
                "scale_format": ",".join(sorted({s.fmt for s in summaries})),
                "tensors": len(compressed),
            }
        rename = {s.name: s.stored_name for s in compressed}
        copied = _finish_directory(layout, tx.root, rename, total_size, entry)
        tx.commit(kind="csf")
    return CompressionSummary(
        src=Path(src),
        dst=out,
        tensors=tuple(summaries),
        passthrough_tensors=passthrough,
        passthrough_bytes=passthrough_bytes,
        copied_files=copied,
    )


def _passthrough(header: SafetensorsHeader, name: str, bar: Progress) -> TensorEntry:
    info = header.tensors[name]
    return TensorEntry(
        name=name, dtype=info.dtype, shape=info.shape, load=lambda: counted(iter_tensor_chunks(header, name), bar)
    )


def _open_csf(
    src: str | os.PathLike[str], *, hashes: bool, progress: bool, not_csf: type[CSFError]
) -> tuple[CheckpointLayout, dict[str, _Stored]]:
    """A CSF checkpoint to read: a directory must carry a valid completion record (sizes, and with
    ``hashes`` every SHA-256, checked first); single files are whole by rename."""
    layout = resolve_layout(src)
    if not layout.single_file:
        size = sum(p.stat().st_size for p in layout.root.rglob("*") if p.is_file()) if hashes else 0
        try:
            with Progress(size, "csf verify (files)", progress and hashes) as bar:
                check_complete(layout.root, hashes=hashes, on_bytes=bar.update)
        except IncompleteOutputError as e:
            if not (layout.root / COMPLETION_RECORD).exists():
                _explain_missing_record(layout, e, not_csf)
            raise
    tensors = _logical_tensors(layout)
    if not any(t.record is not None for t in tensors.values()):
        raise not_csf("", f"not a CSF checkpoint: no shard carries {META_VERSION}", file=src)
    return layout, tensors


def _explain_missing_record(layout: CheckpointLayout, missing: IncompleteOutputError, not_csf: type[CSFError]) -> None:
    """Without a record, a clearer cause wins: a format version this build does not read, or a native checkpoint."""
    carries = []
    for shard in layout.shards:
        try:
            header = read_header(layout.root / shard)
            csf_records(header)
        except FormatVersionError:
            raise
        except CSFError:
            raise missing from None
        carries.append(META_VERSION in header.metadata)
    if not any(carries):
        raise not_csf("", f"not a CSF checkpoint: no shard carries {META_VERSION}", file=layout.root)


def decompress_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
    overwrite: bool = False,
) -> CompressionSummary:
    """Write the native checkpoint a CSF checkpoint came from: every tensor's bytes, name and dtype restored.

    A directory ``src`` must carry a valid completion record (sizes checked). Planes are decoded lazily, one
    at a time, while their shard is written; the output is a transaction like :func:`compress_checkpoint`'s.
    """
    layout, tensors = _open_csf(src, hashes=False, progress=False, not_csf=UsageError)
    out = _output_path(layout, dst)

    summaries: list[TensorSummary] = []
    passthrough = passthrough_bytes = total_size = 0
    with (
        OutputTransaction(out, overwrite=overwrite, single_file=layout.single_file) as tx,
        Progress(sum(t.info.nbytes for t in tensors.values()), "csf decompress", progress) as bar,
    ):
        for shard in layout.shards:
            header = read_header(layout.root / shard)
            entries: list[TensorEntry] = []
            for t in (t for t in tensors.values() if t.shard == shard):
                total_size += t.info.nbytes
                if not t.compact:
                    entries.append(_passthrough(header, t.stored_name, bar))
                    if t.record is None:
                        passthrough += 1
                        passthrough_bytes += t.info.nbytes
                        continue
                else:
                    entries.append(
                        TensorEntry(
                            name=t.info.name,
                            dtype=t.info.dtype,
                            shape=t.info.shape,
                            load=lambda t=t: counted(_native_bytes(t, device=device), bar),
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
                        stored="csf" if t.compact else "native",
                    )
                )
            meta = {k: v for k, v in header.metadata.items() if k not in (META_VERSION, META_TENSORS, META_DIGEST)}
            write_safetensors(_shard_path(layout, tx, shard), entries, metadata=meta)

        rename = {s.stored_name: s.name for s in summaries}
        copied = _finish_directory(layout, tx.root, rename, total_size, None)
        tx.commit(kind="native")
    return CompressionSummary(
        src=Path(src),
        dst=out,
        tensors=tuple(summaries),
        passthrough_tensors=passthrough,
        passthrough_bytes=passthrough_bytes,
        copied_files=copied,
    )


def _check_index(layout: CheckpointLayout, tensors: dict[str, _Stored]) -> None:
    """The index must name exactly the stored tensors, each in its shard, and their total size."""
    if layout.index is None:
        return
    path = layout.root / layout.index
    index = _read_json(path)
    weight_map = _weight_map(path)
    stored = {t.stored_name: t.shard for t in tensors.values()}
    if weight_map != stored:
        wrong = sorted(set(weight_map.items()) ^ set(stored.items()))[:5]
        raise VerificationError("", f"weight_map disagrees with the shards, e.g. {wrong}", file=path)
    meta = index.get("metadata") if isinstance(index, dict) else None
    if isinstance(meta, dict) and "total_size" in meta:
        total = sum(t.header.tensors[t.stored_name].nbytes for t in tensors.values())
        if meta["total_size"] != total:
            raise VerificationError("", f"total_size {meta['total_size']!r}, the shards hold {total}", file=path)


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
    """Prove ``src`` whole and lossless on its own; raise on any fault.

    A directory's completion record is checked (every file's size and SHA-256), then the index, then every
    CSF tensor is decoded and its restored plane checked against the digest sealed into its payload.
    With ``against`` (a native checkpoint, or another CSF one), also require the same tensor names, dtypes
    and shapes, and every tensor's original bytes to be identical.
    """
    layout, tensors = _open_csf(src, hashes=True, progress=progress, not_csf=VerificationError)
    csf = [t for t in tensors.values() if t.compact]
    _check_index(layout, tensors)
    native = _logical_tensors(resolve_layout(against)) if against is not None else None
    if native is not None and set(native) != set(tensors):
        diff = sorted(set(native) ^ set(tensors))[:5]
        raise VerificationError("", f"tensor names differ from {against}, e.g. {diff}", file=src)

    compared = 0
    todo = tensors.values() if native is not None else csf
    with Progress(sum(t.info.nbytes for t in todo), "csf verify", progress) as bar:
        for t in todo:  # shard by shard: _logical_tensors is in shard order
            bar.note(t.info.name)
            plane = _decode_stored(t, device=device).cpu() if t.compact else None
            if native is not None:
                ref = native[t.info.name]
                if (ref.info.dtype, ref.info.shape) != (t.info.dtype, t.info.shape):
                    raise VerificationError(
                        t.info.name,
                        f"{t.info.dtype} {t.info.shape} here, {ref.info.dtype} {ref.info.shape} in {against}",
                        file=t.header.path,
                    )
                ours = [memoryview(plane.reshape(-1).numpy())] if plane is not None else _native_bytes(t)
                if not _same_bytes(ours, _native_bytes(ref, device=device)):
                    raise VerificationError(t.info.name, f"bytes differ from {against}", file=t.header.path)
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


def inspect_checkpoint(
    src: str | os.PathLike[str], *, device: str | torch.device = "cpu", progress: bool = False
) -> list[dict[str, object]]:
    """A :func:`csf_codec.stats.plane_report` dict per FP4 scale plane, native or CSF (decoded first).

    Each dict also carries ``file``, ``convention``, ``stored`` ("native" or "csf") and ``stored_bytes``.
    Planes are read one at a time, in shard order.
    """
    layout = resolve_layout(src)
    tensors = _logical_tensors(layout)
    specs = _scale_planes(tensors)
    names = [n for n in tensors if n in specs]
    reports = []
    with Progress(sum(tensors[n].info.nbytes for n in names), "csf inspect", progress) as bar:
        for name in names:
            t, spec = tensors[name], specs[name]
            bar.note(name)
            if t.compact:
                plane = _decode_stored(t, device=device).reshape(t.record.codec_shape)
            else:
                plane = _read_plane(t).to(device)
            d = dict(plane_report(plane, spec.fmt, name=name).as_dict())
            d.update(
                file=t.shard,
                convention=spec.convention,
                stored="csf" if t.compact else "native",
                stored_bytes=t.header.tensors[t.stored_name].nbytes,
            )
            reports.append(d)
            bar.update(t.info.nbytes)
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
    specs = _scale_planes(tensors) if compress_scales else {}
    for shard in layout.shards:
        with SafetensorsReader(layout.root / shard, device=str(device)) as reader:
            for t in (t for t in tensors.values() if t.shard == shard):
                name = t.info.name
                if t.compact:
                    payload = read_tensor_bytes(t.header, t.stored_name).to(device)
                    yield name, CompactScales.from_payload(payload, name=name)
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
