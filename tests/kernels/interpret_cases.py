"""Expansion test cases shared by the interpreter test (CPU) and the GPU test: fresh random planes."""

from __future__ import annotations

import torch

from ..codec.planes_for_tests import clustered_plane, special_rows


def cases(seed: int):
    """(plane, format, row group, expert ids or None, forced full-tile record bytes or None)"""
    g = torch.Generator().manual_seed(seed)
    w2 = special_rows(clustered_plane((2, 1152, 18), seed=seed, exception_rate=0.05), seed=seed)
    yield w2, "mxfp4", 576, None, None
    nv = clustered_plane((2, 200, 37), seed=seed + 1, exception_rate=0.05, window=4, spread=1)
    yield nv, "nvfp4", None, None, None
    yield (
        clustered_plane((3, 130, 6), seed=seed + 2, exception_rate=0.3),
        "mxfp4",
        None,
        torch.tensor([2, -1, 7, 0], dtype=torch.int32),
        None,
    )
    yield clustered_plane((300, 33), seed=seed + 3, exception_rate=0.01), "mxfp4", None, None, None
    # row blocks whose first byte is not 16-byte aligned (100 rows of 18 columns): the CuTe expander's
    # partial first and last chunks, with padding ids
    yield (
        special_rows(clustered_plane((4, 100, 18), seed=seed + 11, exception_rate=0.05), seed=seed),
        "mxfp4",
        None,
        torch.tensor([3, 1, 4, -2, 0], dtype=torch.int32),
        None,
    )
    yield torch.randint(0, 256, (2, 64, 9), generator=g).to(torch.uint8), "nvfp4", None, None, None
    # whole 4-column tiles only (K a multiple of 128): 8-byte stores, 2 tiles per program
    yield clustered_plane((2, 300, 40), seed=seed + 4, exception_rate=0.02), "mxfp4", 150, None, None
    # narrower than one tile: the tail tile alone
    yield clustered_plane((3, 260, 3), seed=seed + 5, exception_rate=0.1), "mxfp4", None, None, None
    # narrow without a tail: rows stored as 16-bit halves
    yield clustered_plane((2, 136, 12), seed=seed + 10, exception_rate=0.05), "mxfp4", None, None, None
    # narrow, but an odd number of rows per expert: stored tile by tile, not by row pairs
    yield clustered_plane((2, 131, 10), seed=seed + 9, exception_rate=0.05), "mxfp4", None, None, None
    # narrow rows stored as row pairs: 3 full tiles and a tail, NVFP4
    yield (
        clustered_plane((2, 136, 14), seed=seed + 8, exception_rate=0.05, window=4, spread=1),
        "nvfp4",
        None,
        None,
        None,
    )
    # 16-byte stores: 16 full tiles per program, and 8 (one program masked) with 2-bit selectors (160 bytes)
    yield clustered_plane((2, 140, 64), seed=seed + 6, exception_rate=0.02), "mxfp4", None, None, None
    yield clustered_plane((2, 130, 48), seed=seed + 7, exception_rate=0.2, window=4), "mxfp4", 65, None, 160
