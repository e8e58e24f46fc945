"""Streaming safetensors I/O: write a shard one tensor at a time, read one lazily.

The writer exists because ``safetensors.torch.save_file`` needs every tensor in memory at once (and serialises
into a second buffer), which for a 5 GB shard of FP4 weights means ~10 GB of RAM. Here the header is written
from declared dtypes and shapes first, then each tensor's bytes are produced on demand and written straight
to the file; passthrough tensors are copied from the source file in chunks without ever becoming torch
tensors, which also keeps them byte-for-byte identical whatever their dtype.

File layout (https://github.com/huggingface/safetensors#format): 8-byte little-endian header length, the
UTF-8 JSON header (``{name: {dtype, shape, data_offsets}}`` plus an optional ``__metadata__`` str->str map),
padded with spaces so the data starts 8-byte aligned, then the tensors back to back with no gaps.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .errors import CheckpointIOError, MalformedInputError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "DTYPE_SIZES",
    "SafetensorsHeader",
    "SafetensorsReader",
    "TensorEntry",
    "TensorInfo",
    "dtype_name",
    "entry_from_tensor",
    "iter_tensor_chunks",
    "passthrough_entry",
    "read_header",
    "read_tensor_bytes",
    "torch_dtype",
    "write_safetensors",
]

_CHUNK = 64 << 20  # bytes per read/write when copying; bounds memory for multi-GB tensors
_MAX_HEADER = 100 << 20  # the reference implementation refuses larger headers

# Every dtype the spec defines, with its byte size, so unknown-to-torch tensors can still be copied raw.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

_TORCH_TO_NAME: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
if hasattr(torch, "float8_e8m0fnu"):  # torch >= 2.7
    _TORCH_TO_NAME[torch.float8_e8m0fnu] = "F8_E8M0"
_NAME_TO_TORCH = {v: k for k, v in _TORCH_TO_NAME.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors dtype string of a torch dtype."""
    try:
        return _TORCH_TO_NAME[dtype]
    except KeyError:
        raise ValueError(f"torch dtype {dtype} has no safetensors equivalent here") from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype string."""
    try:
        return _NAME_TO_TORCH[name]
    except KeyError:
        raise ValueError(f"safetensors dtype {name!r} has no torch equivalent in this build") from None


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """One tensor as the header declares it; ``begin``/``end`` are offsets from the start of the data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int = 0
    end: int = 0

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, kw_only=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, TensorInfo]  # in data (offset) order
    metadata: dict[str, str]
    data_start: int  # absolute file offset of the first tensor byte


def read_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse and validate a safetensors header without touching tensor data.

    Raises :class:`MalformedInputError` naming the file (and tensor) for anything the format forbids:
    a header longer than the file, bad JSON, an entry without ``dtype``/``shape``/``data_offsets``,
    offsets that are reversed, overlap, leave gaps, disagree with the shape or run past the file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise MalformedInputError("", f"{size} bytes: too short to be a safetensors file", file=path)
            (n,) = struct.unpack("<Q", raw_len)
            if n > min(_MAX_HEADER, size - 8):
                raise MalformedInputError(
                    "",
                    f"header length {n} runs past the end of the {size}-byte file: not a safetensors file",
                    file=path,
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointIOError.from_os(e, file=path) from None
    if len(raw) != n:
        raise MalformedInputError("", "truncated header", file=path)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MalformedInputError("", f"header is not UTF-8 JSON: {e}", file=path) from None
    if not isinstance(doc, dict):
        raise MalformedInputError("", "header is not a JSON object", file=path)
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise MalformedInputError("__metadata__", "must map strings to strings", file=path)
    infos = sorted((_tensor_info(path, name, d) for name, d in doc.items()), key=lambda t: (t.begin, t.end))
    at = 0
    for t in infos:
        if t.begin != at:
            what = "overlaps the tensor before it" if t.begin < at else f"leaves a gap at data byte {at}"
            raise MalformedInputError(t.name, f"data_offsets [{t.begin}, {t.end}] {what}", file=path)
        at = t.end
    data = size - 8 - n
    if at != data:
        what = "run past the end of the file" if at > data else "leave trailing bytes"
        raise MalformedInputError(
            infos[-1].name if infos else "", f"tensors {what}: {at} of {data} data bytes", file=path
        )
    return SafetensorsHeader(path=path, tensors={t.name: t for t in infos}, metadata=dict(metadata), data_start=8 + n)


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor_info(path: Path, name: str, d: object) -> TensorInfo:
    """One header entry, checked against the format: known dtype, shape, offsets that hold exactly it."""
    if not isinstance(d, dict):
        raise MalformedInputError(name, "header entry is not a JSON object", file=path)
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in d]
    if missing:
        raise MalformedInputError(name, f"header entry has no {' or '.join(missing)}", file=path)
    dtype, shape, offsets = d["dtype"], d["shape"], d["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise MalformedInputError(name, f"unknown dtype {dtype!r}", file=path)
    if not isinstance(shape, list) or not all(_is_count(x) for x in shape):
        raise MalformedInputError(name, f"shape {shape!r} is not a list of non-negative integers", file=path)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(x) for x in offsets):
        raise MalformedInputError(name, f"data_offsets {offsets!r} are not two non-negative integers", file=path)
    begin, end = offsets
    if begin > end:
        raise MalformedInputError(name, f"data_offsets [{begin}, {end}] are reversed", file=path)
    want = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != want:
        raise MalformedInputError(
            name, f"data_offsets [{begin}, {end}] hold {end - begin} bytes, {dtype} {shape} needs {want}", file=path
        )
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def iter_tensor_chunks(header: SafetensorsHeader, name: str, *, chunk: int = _CHUNK) -> Iterator[bytes]:
    """A tensor's raw bytes in bounded chunks, straight from the file."""
    info = header.tensors[name]
    try:
        with open(header.path, "rb") as f:
            f.seek(header.data_start + info.begin)
            left = info.nbytes
            while left:
                buf = f.read(min(chunk, left))
                if not buf:
                    raise MalformedInputError(name, "truncated: the file ends inside this tensor", file=header.path)
                left -= len(buf)
                yield buf
    except OSError as e:
        raise CheckpointIOError.from_os(e, file=header.path, tensor=name) from None


def read_tensor_bytes(header: SafetensorsHeader, name: str) -> torch.Tensor:
    """A tensor's raw bytes as a flat uint8 CPU tensor (one copy, no dtype interpretation)."""
    info = header.tensors[name]
    out = np.empty(info.nbytes, dtype=np.uint8)
    try:
        with open(header.path, "rb") as f:
            f.seek(header.data_start + info.begin)
            got = f.readinto(memoryview(out))
    except OSError as e:
        raise CheckpointIOError.from_os(e, file=header.path, tensor=name) from None
    if got != info.nbytes:
        raise MalformedInputError(name, "truncated: the file ends inside this tensor", file=header.path)
    return torch.from_numpy(out)


class SafetensorsReader:
    """Thin wrapper over ``safetensors.safe_open(framework="pt")``: list tensors, load them one at a time."""

    def __init__(self, path: str | os.PathLike[str], *, device: str = "cpu"):
        from safetensors import safe_open

        self.path = Path(path)
        self._handle = safe_open(str(self.path), framework="pt", device=str(device))
        self._file = self._handle.__enter__()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.__exit__(None, None, None)
            self._handle = None

    def names(self) -> list[str]:
        return list(self._file.keys())

    def metadata(self) -> dict[str, str]:
        return dict(self._file.metadata() or {})

    def info(self, name: str) -> TensorInfo:
        sl = self._file.get_slice(name)
        return TensorInfo(name=name, dtype=sl.get_dtype(), shape=tuple(sl.get_shape()))

    def infos(self) -> dict[str, TensorInfo]:
        return {n: self.info(n) for n in self.names()}

    def get(self, name: str) -> torch.Tensor:
        return self._file.get_tensor(name)

    def tensors(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` lazily; only the tensor being yielded is materialised."""
        for name in self.names() if names is None else names:
            yield name, self._file.get_tensor(name)


# What a TensorEntry's loader may return: a tensor (any device/dtype, written as its raw bytes), a bytes-like
# object, or an iterable of bytes-like chunks (for copies that must not sit in memory whole).
TensorData = torch.Tensor | bytes | bytearray | memoryview | Iterable[bytes | bytearray | memoryview]


@dataclass(frozen=True, kw_only=True)
class TensorEntry:
    """A tensor to write: declared up front (the header needs it), materialised only when its turn comes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    load: Callable[[], TensorData]

    @property
    def nbytes(self) -> int:
        try:
            return math.prod(self.shape) * DTYPE_SIZES[self.dtype]
        except KeyError:
            raise ValueError(f"{self.name}: unknown safetensors dtype {self.dtype!r}") from None


def entry_from_tensor(name: str, tensor: torch.Tensor) -> TensorEntry:
    return TensorEntry(name=name, dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape), load=lambda: tensor)


def passthrough_entry(header: SafetensorsHeader, name: str, *, rename: str | None = None) -> TensorEntry:
    """Copy a tensor from an existing file byte for byte, in chunks."""
    info = header.tensors[name]
    return TensorEntry(
        name=rename or name, dtype=info.dtype, shape=info.shape, load=lambda: iter_tensor_chunks(header, name)
    )


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().to("cpu").contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _chunks(data: TensorData) -> Iterator[memoryview]:
    if isinstance(data, torch.Tensor):
        if data.numel():
            yield _tensor_bytes(data)
    elif isinstance(data, (bytes, bytearray, memoryview)):
        yield memoryview(data).cast("B")
    else:
        for c in data:
            yield memoryview(c).cast("B")


def write_safetensors(
    path: str | os.PathLike[str],
    entries: Sequence[TensorEntry],
    *,
    metadata: Mapping[str, str] | None = None,
    align_order: bool = True,
    on_bytes: Callable[[int], None] | None = None,
) -> dict[str, TensorInfo]:
    """Write ``entries`` to ``path``, materialising one tensor at a time; returns the header written.

    ``align_order`` stably sorts tensors by descending element size (as the reference writer does) so every
    tensor starts aligned to its element size — mmap loaders need that and safetensors forbids gaps.
    The file is written to ``path + '.tmp'``, fsynced and renamed, so a crash never leaves a plausible half
    shard; an operating-system failure (no space, file too large) raises :class:`CheckpointIOError`.
    """
    path = Path(path)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate tensor names")
    if "__metadata__" in names:
        raise ValueError(f"{path}: '__metadata__' is not a valid tensor name")
    order = list(entries)
    if align_order:
        order.sort(key=lambda e: -DTYPE_SIZES.get(e.dtype, 1))
    doc: dict[str, object] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ValueError(f"{path}: __metadata__ must map str to str; offending keys {bad}")
        doc["__metadata__"] = dict(metadata)
    infos: dict[str, TensorInfo] = {}
    offset = 0
    for e in order:
        n = e.nbytes
        infos[e.name] = TensorInfo(name=e.name, dtype=e.dtype, shape=tuple(e.shape), begin=offset, end=offset + n)
        doc[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    header += b" " * (-(8 + len(header)) % 8)  # spec-sanctioned space padding: data starts 8-byte aligned

    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            for e in order:
                want, got = e.nbytes, 0
                for chunk in _chunks(e.load()):
                    got += chunk.nbytes
                    if got > want:
                        break
                    f.write(chunk)
                    if on_bytes is not None:
                        on_bytes(chunk.nbytes)
                if got != want:
                    raise ValueError(f"{path}: {e.name} produced {got} bytes, header declares {want}")
            f.flush()
            os.fsync(f.fileno())  # durable before it is renamed into place
        os.replace(tmp, path)
    except OSError as e:
        raise CheckpointIOError.from_os(e, file=path) from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return infos
