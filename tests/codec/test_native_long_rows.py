"""The C loops past 2**31 scales: a compact span of rows whose dims stay below 2**31 (the decoder's exception
positions), and rows longer than that (the row rule, which row_bases_c and the row pass run on any rows before a
header is written). Counts and positions must not wrap. Slow and memory-hungry (2 GiB planes), skipped where the
machine has too little memory free."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from csf_codec import MXFP4, decode_compact, encode_compact
from csf_codec.compact_encode_c import width_stats_c
from csf_codec.compact_np import row_spans
from csf_codec.rowbase import row_bases_c

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


def test_row_bases_of_a_row_past_2_31_scales():
    """[100, 101] holds every byte but one: the rule's 1-bit base is 100, whatever the count's width."""
    assert row_bases_c(_row((100, 101), 0), (1,))[1].tolist() == [100]


def test_compact_row_pass_of_a_row_past_2_31_scales():
    """A row of 255s but one 0: base 254 and one exception (far, escaped) in chunk 0, none elsewhere."""
    x = _row((255, 255), 0)
    bases, _, counts = width_stats_c(x, (1,), row_spans(*x.shape))
    assert bases[1].tolist() == [254]
    for part in counts[1]:  # exceptions, far ones, escaped ones
        assert part.size == LONG // 256 and int(part[0]) == 1 and int(part.sum(dtype=np.int64)) == 1


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
