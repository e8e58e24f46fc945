"""The C loops past 2**31 scales: a compact span of rows whose dims stay below 2**31 (the decoder's exception
positions must not wrap). Slow and memory-hungry (a 2 GiB plane), skipped where the machine has too little memory
free."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from csf_codec import MXFP4, decode_compact, encode_compact

LONG = (1 << 31) + (1 << 20)  # scales: a window's count, or a span's positions, pass 2**31


def _free_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_free_gib() < 8, reason="needs 8 GiB of memory free"),
]


def _row(pair: tuple[int, int], first: int) -> np.ndarray:
    """One row of LONG bytes alternating the pair's two values, its first byte replaced."""
    x = np.empty((1, LONG), dtype=np.uint8)
    x.reshape(-1).view(np.uint16)[:] = pair[0] | pair[1] << 8
    x[0, 0] = first
    return x


def test_compact_round_trip_of_a_span_past_2_31_scales():
    """Two rows of LONG / 2 scales (dims below 2**31), one span: exceptions listed past its scale 2**31 decode
    where they were."""
    x = _row((100, 100), 100).reshape(2, LONG // 2)
    far = [(1 << 30) + 7, LONG // 2 - 3]
    x[1, far] = (0, 250)
    plane = torch.from_numpy(x)
    payload = encode_compact(plane, MXFP4, widths=(1,), verify=False).payload
    out = decode_compact(payload)
    assert out.shape == plane.shape and out[1, far].tolist() == [0, 250] and torch.equal(out, plane)
