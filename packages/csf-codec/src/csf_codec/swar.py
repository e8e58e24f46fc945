"""Whole-array byte arithmetic in numpy: counting flags in fixed-size groups, and bit fields.

Bit streams are LSB first: bit i of a stream is bit ``i % 8`` of byte ``i // 8``.

Counting sums flag bytes eight at a time as uint64 words (each byte lane counts at most 255 flags),
then folds the lanes; this is several times faster than numpy's per-row reductions over bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

__all__ = [
    "POPCOUNT",
    "gather_bits",
    "group_counts",
    "grouped_histogram",
    "map_spans",
    "pack_bits",
    "range_mask",
    "scatter_bits",
    "set_bits",
    "unpack_bits",
]

WORKERS = max(1, min(2, os.cpu_count() or 1))  # numpy releases the GIL in whole-array operations


def map_spans(fn: Callable, spans: Iterable, then: Callable | None = None) -> list:
    """``[fn(s) for s in spans]``, spread over :data:`WORKERS` threads, results in order. ``then`` is
    called on each result in order, in the calling thread, while later spans are still being worked on."""
    spans = list(spans)
    out = []
    if WORKERS == 1 or len(spans) < 2:
        for s in spans:
            out.append(fn(s))
            if then is not None:
                then(out[-1])
        return out
    with ThreadPoolExecutor(WORKERS) as pool:
        for got in pool.map(fn, spans):
            out.append(got)
            if then is not None:
                then(got)
    return out


_LO8 = np.uint64(0x00FF00FF00FF00FF)
_ONES16 = np.uint64(0x0001000100010001)


def _fold(words: np.ndarray) -> np.ndarray:
    """Sum of the eight byte lanes of each uint64 (every lane <= 255) as int64."""
    s = (words & _LO8) + ((words >> np.uint64(8)) & _LO8)
    return ((s * _ONES16) >> np.uint64(48)).astype(np.int64)


def group_counts(flags: np.ndarray, group: int) -> np.ndarray:
    """Set flags (bool or 0/1 uint8, 1-D) in consecutive groups of ``group`` (a multiple of 8, <= 2040);
    a last partial group is counted too."""
    flags = flags.view(np.uint8)
    n = flags.size
    full = n // group
    out = np.empty(full + (n % group != 0), dtype=np.int64)
    if full:
        out[:full] = _fold(flags[: full * group].view(np.uint64).reshape(full, group // 8).sum(axis=1))
    if n % group:
        out[full] = int(np.count_nonzero(flags[full * group :]))
    return out


_GRAIN = 1 << 15  # torch runs an op on fewer elements than this on the calling thread, with no OpenMP team


def grouped_histogram(values: np.ndarray, bins: int, less: np.ndarray | None = None) -> np.ndarray:
    """int64 [G, bins]: the histogram of each row of ``values`` (uint8 [G, n]) less its ``less`` (uint8 [G], or
    none), every difference in ``[0, bins)``.

    One bincount a batch of rows over ``row * bins + value`` keys (int16, built in one pass), in torch because
    numpy's holds the GIL and spans are counted on several threads. Each call stays under torch's parallel grain:
    an OpenMP team inside threads that already share the cores spins against them (many times slower on a loaded
    machine)."""
    g, n = values.shape
    out = np.empty((g, bins), dtype=np.int64)
    step = max(1, (_GRAIN - 1) // max(n, bins, 1))
    key_t = np.int16 if step * bins <= 1 << 15 else np.int32
    shift = (np.arange(g) % step) * bins
    if less is not None:
        shift -= less
    keys = np.add(values, shift.astype(key_t)[:, None], dtype=key_t)
    flat = torch.from_numpy(keys.reshape(-1))
    for a in range(0, g, step):
        m = min(step, g - a)
        hist = torch.bincount(flat[a * n : (a + m) * n], minlength=m * bins)
        out[a : a + m] = hist.numpy().reshape(m, bins)
    return out


def pack_bits(fields: np.ndarray, width: int) -> np.ndarray:
    """Pack a 1-D uint8 array of ``width``-bit fields, field i at bit i*width (LSB first)."""
    if width == 1:
        return np.packbits(fields, bitorder="little")
    per = 8 // width
    n = fields.size
    if n % per:
        fields = np.concatenate([fields, np.zeros(per - n % per, dtype=np.uint8)])
    if width == 4:  # two fields a uint16, the high one shifted down beside the low one: no strided passes
        x = np.ascontiguousarray(fields).view(np.uint16)
        return (x | (x >> np.uint16(4))).astype(np.uint8)
    f = fields.reshape(-1, per)
    out = f[:, 0].copy()
    for i in range(1, per):
        out |= f[:, i] << np.uint8(i * width)
    return out


def unpack_bits(packed: np.ndarray, width: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``count`` uint8 fields."""
    if width == 1:
        return np.unpackbits(packed, bitorder="little", count=count)
    per = 8 // width
    mask = np.uint8((1 << width) - 1)
    out = np.empty((packed.size, per), dtype=np.uint8)
    for i in range(per):
        np.bitwise_and(packed >> np.uint8(i * width), mask, out=out[:, i])
    return out.reshape(-1)[:count]


def scatter_bits(nbytes: int, offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A bit stream of ``nbytes`` holding each value (< 256) at its bit offset, zeros elsewhere.

    Fields must not overlap: then each byte's sum of shifted field parts is their bitwise or, which
    ``np.bincount`` adds without a per-field loop."""
    if not offsets.size:
        return np.zeros(nbytes, dtype=np.uint8)
    byte = offsets >> 3
    shifted = values.astype(np.int64) << (offsets & 7)
    out = np.bincount(byte, weights=shifted & 0xFF, minlength=nbytes + 1)
    out[1:] += np.bincount(byte, weights=shifted >> 8, minlength=nbytes + 1)[:-1]
    return out[:nbytes].astype(np.uint8)


def gather_bits(stream: np.ndarray, offsets: np.ndarray, width) -> np.ndarray:
    """The ``width``-bit fields (width <= 9, scalar or per field) at bit ``offsets`` of ``stream``, as
    int64. Offsets must lie inside the stream; a field's bits past its end read as zero."""
    byte = offsets >> 3
    padded = np.concatenate([stream, np.zeros(2, dtype=np.uint8)])
    word = padded[byte].astype(np.int64) | (padded[byte + 1].astype(np.int64) << 8)
    return (word >> (offsets & 7)) & ((np.int64(1) << width) - 1)


def range_mask(starts: np.ndarray, ends: np.ndarray, nbytes: int) -> np.ndarray:
    """uint8 [nbytes], the bits of the ranges ``[starts[i], ends[i])`` set. The ranges must be non-empty,
    ascending, inside ``8 * nbytes`` bits and at least 8 bits apart, so that no byte holds bits of two.

    Built from per-range writes and one running sum over the bytes, never an array per bit."""
    sb, tb = starts >> 3, ends >> 3
    edge = np.zeros(nbytes + 1, dtype=np.int8)
    inner = tb > sb + 1  # whole bytes sb + 1 .. tb - 1 lie inside the range
    edge[sb[inner] + 1] = 1
    edge[tb[inner]] = -1
    mask = np.cumsum(edge[:nbytes], dtype=np.int8).view(np.uint8) * np.uint8(0xFF)
    head_end = np.minimum(ends, (sb + 1) << 3)
    mask[sb] = ((1 << (head_end - starts)) - 1) << (starts & 7)
    tail = (tb > sb) & (ends & 7 != 0)
    mask[tb[tail]] = (1 << (ends[tail] & 7)) - 1
    return mask


POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)  # set bits by byte value


def set_bits(data: np.ndarray) -> np.ndarray:
    """Indices (int64, ascending) of the set bits of a byte string, LSB first. For sparse bits: only the
    nonzero bytes are unpacked."""
    nz = np.flatnonzero(data != 0)
    row, col = np.nonzero(np.unpackbits(data[nz][:, None], axis=1, bitorder="little").view(bool))
    return nz[row] * 8 + col
