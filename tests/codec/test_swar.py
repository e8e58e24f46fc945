"""The byte-array helpers the CPU coders build on, against plain per-bit references."""

from __future__ import annotations

import numpy as np
import pytest

from csf_codec.compact_code import CHUNK, LOW_BITS, MAX_LISTED
from csf_codec.swar import grouped_histogram, range_mask, set_bits


def _ranges(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """Ascending non-empty bit ranges at least 8 bits apart, in a stream with some slack at its end."""
    k = int(rng.integers(1, 8))
    starts, ends, at = [], [], int(rng.integers(0, 16))
    for gap, length in zip(rng.integers(8, 40, k), rng.integers(1, 60, k), strict=True):
        starts.append(at)
        ends.append(at + int(length))
        at += int(length) + int(gap)
    nbytes = -(-ends[-1] // 8) + int(rng.integers(0, 3))
    return np.array(starts), np.array(ends), nbytes


def test_range_mask_sets_exactly_the_ranges():
    rng = np.random.default_rng(0)
    for _ in range(500):
        starts, ends, nbytes = _ranges(rng)
        want = np.zeros(8 * nbytes, dtype=np.uint8)
        for a, b in zip(starts, ends, strict=True):
            want[a:b] = 1
        assert np.array_equal(np.unpackbits(range_mask(starts, ends, nbytes), bitorder="little"), want)


def test_position_code_parts_are_far_enough_apart_for_range_mask():
    """The decoder masks each chunk's unary buckets, and separately its far flags: between one chunk's
    buckets and the next chunk's lie its low parts and flags, between one chunk's flags and the next's lie
    the next chunk's buckets and low parts; both gaps must be at least 8 bits for every count."""
    n = np.arange(1, MAX_LISTED + 1)
    low = LOW_BITS[n]
    assert (n * low + n).min() >= 8
    assert (n + (CHUNK >> low) + n * low).min() >= 8


def test_set_bits_finds_every_set_bit():
    rng = np.random.default_rng(1)
    for density in (0.0, 0.01, 0.3, 1.0):
        data = np.packbits(rng.random(8 * 777) < density, bitorder="little")
        want = np.flatnonzero(np.unpackbits(data, bitorder="little"))
        got = set_bits(data)
        assert got.dtype == np.int64 and np.array_equal(got, want)


@pytest.mark.parametrize(
    "groups,n,bins",
    [(0, 5, 4), (3, 0, 4), (1, 1, 1), (700, 320, 32), (5000, 18, 16), (300, 129, 256), (2, 40000, 2), (9, 7, 300)],
)
def test_grouped_histogram_counts_each_row(groups, n, bins):
    """Rows batched into bincount calls of either key width, a row longer than one call, more bins than values."""
    rng = np.random.default_rng(groups * 7 + n)
    values = rng.integers(0, bins, (groups, n)).astype(np.uint8)
    want = np.zeros((groups, bins), dtype=np.int64)
    for r in range(groups):
        want[r] = np.bincount(values[r], minlength=bins)
    assert np.array_equal(grouped_histogram(values, bins), want)
