"""Expansion test cases shared by the interpreter test (CPU) and the GPU test: fresh random planes."""

from __future__ import annotations

import torch

from ..codec.planes_for_tests import clustered_plane, special_rows


def cases(seed: int):
    g = torch.Generator().manual_seed(seed)
    yield special_rows(clustered_plane((2, 1152, 18), seed=seed, exception_rate=0.05), seed=seed), "mxfp4", 576, None
    yield clustered_plane((2, 200, 37), seed=seed + 1, exception_rate=0.05, window=4, spread=1), "nvfp4", None, None
    yield (
        clustered_plane((3, 130, 6), seed=seed + 2, exception_rate=0.3),
        "mxfp4",
        None,
        torch.tensor([2, -1, 7, 0], dtype=torch.int32),
    )
    yield clustered_plane((300, 33), seed=seed + 3, exception_rate=0.01), "mxfp4", None, None
    yield torch.randint(0, 256, (2, 64, 9), generator=g).to(torch.uint8), "nvfp4", None, None
    # whole 4-column tiles only (K a multiple of 128): the 32-bit store path
    yield clustered_plane((2, 300, 40), seed=seed + 4, exception_rate=0.02), "mxfp4", 150, None
    # narrower than one tile: the tail program alone, row blocks not a multiple of its row blocks per program
    yield clustered_plane((3, 260, 3), seed=seed + 5, exception_rate=0.1), "mxfp4", None, None
