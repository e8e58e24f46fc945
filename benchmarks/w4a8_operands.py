"""How much of a W4A8 weight operand folds exactly (issue 47, ``docs/moe-engine.md`` "W4A8"), on synthetic planes.

For each peer geometry (gpt-oss-120b, DeepSeek-V4.1-Flash TP4, Qwen3-30B-A3B; MXFP4) and each csf_codec.synthetic
preset, W13's and W2's E8M0 planes (drawn as csf_moe.synthetic.synthetic_layer draws them: the same shapes and
seeds; ``seed_regime`` is that layer's plane), and three choices of the per-row base ``b``:

* ``rowbase``: the codec's row base (``csf_codec.rowbase``, offset width 1);
* ``inline``: the base the inline form stores (``csf_codec.inline.clamped_row_bases``: clamped into its 128-row
  block's window), which native, expanded and inline engine plans share; W13 in the engine's fused row order, one
  row group per expert;
* ``fold_window``: the smallest base whose fold window ``[b - 8, b + 6]`` holds the most of the row's scales.

Reported: the fraction of (row, 32-K block) units that fold (``FOLD_MIN <= s - b <= FOLD_MAX``, no NaN) and of
engine tiles (128 weight rows x 64 K, W13 in engine order) all of whose blocks fold. NVFP4 (DeepSeek and Qwen3
NVFP4 planes, ``nvfp4_typical``): the fraction of (row, 16-K block) units and 128 x 64-K tiles whose E4M3 block
factor ``scale / 2**eb`` (``eb``: the binade of the row's NVFP4 codec base) times every E2M1 value is an E4M3 value.

    python benchmarks/w4a8_operands.py --out benchmarks/results/w4a8-operands-DATE-COMMIT.json [--experts E]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance

from csf_codec.fp4 import e4m3_bytes_to_float
from csf_codec.inline import clamped_row_bases
from csf_codec.rowbase import row_bases
from csf_codec.synthetic import (
    DOWN_PROJ_DENSE,
    EXCEPTION_DENSE,
    NVFP4_TYPICAL,
    SEED_REGIME,
    SPECIAL_CONTENT,
    synthetic_scale_plane,
)
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.engine_panels import fc1_engine_rows
from csf_kernels.moe.w4a8_operands import FOLD_MAX, FOLD_MIN, fold_mask, nvfp4_block_folds, tile_fold

PEERS = (("gpt-oss-120b", 1), ("deepseek-v4.1-flash", 4), ("qwen3-30b-a3b", 1))
PRESETS = {
    "seed_regime": SEED_REGIME,
    "exception_dense": EXCEPTION_DENSE,
    "down_proj_dense": DOWN_PROJ_DENSE,
    "special_content": SPECIAL_CONTENT,
}
SEED = 0  # csf_moe.synthetic.synthetic_layer's default: W13's plane from seed + 1, W2's from seed + 3


def fold_window_bases(rows: torch.Tensor) -> torch.Tensor:
    """uint8 [R]: per row the smallest ``b`` in [0, 254] whose window ``[b + FOLD_MIN, b + FOLD_MAX]`` holds the
    most non-NaN scale bytes of the row."""
    out = torch.empty(rows.shape[0], dtype=torch.uint8)
    span = FOLD_MAX - FOLD_MIN + 1
    for start in range(0, rows.shape[0], 1 << 14):
        chunk = rows[start : start + (1 << 14)].long()
        hist = torch.zeros(chunk.shape[0], 256, dtype=torch.int32)
        hist.scatter_add_(1, chunk, torch.ones_like(chunk, dtype=torch.int32))
        hist[:, 255] = 0  # NaN never folds
        # windows starting at byte w = b + FOLD_MIN for b in [0, 254]: pad so every start is a column
        padded = torch.nn.functional.pad(hist, (-FOLD_MIN, span))
        cum = torch.nn.functional.pad(padded.cumsum(1, dtype=torch.int32), (1, 0))
        counts = cum[:, span : span + 255] - cum[:, :255]  # counts[:, b] = scales in [b + FOLD_MIN, b + FOLD_MAX]
        out[start : start + chunk.shape[0]] = counts.argmax(dim=1).to(torch.uint8)
    return out


def _fractions(fold: torch.Tensor, block_k: int) -> dict[str, float]:
    tiles = tile_fold(fold, block_k)
    return {
        "units": round(float(fold.float().mean()), 6),
        "tiles": round(float(tiles.float().mean()), 6),
        "units_promoted": int((~fold).sum()),
        "tiles_promoting": int((~tiles).sum()),
        "tiles_total": tiles.numel(),
    }


def _mxfp4_plane(plane: torch.Tensor, row_group: int | None) -> dict:
    """Fold fractions of one [E, R, C] plane (rows already in engine order) for each base choice."""
    e, r, c = plane.shape
    rows = plane.reshape(-1, c)
    bases = {
        "rowbase": row_bases(rows, 1),
        "inline": clamped_row_bases(plane, "mxfp4", row_group=row_group),
        "fold_window": fold_window_bases(rows),
    }
    return {name: _fractions(fold_mask(plane, b.view(e, r)), 32) for name, b in bases.items()}


def _nvfp4_plane(plane: torch.Tensor) -> dict:
    e, r, c = plane.shape
    base = row_bases(plane.reshape(-1, c), 4)
    eb = torch.frexp(e4m3_bytes_to_float(base).clamp(min=2.0**-9)).exponent - 1  # binade: 2**eb <= base value
    return _fractions(nvfp4_block_folds(plane, eb.view(e, r)), 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--experts", type=int, default=0, help="experts per plane (0: the geometry's own)")
    args = ap.parse_args()
    cat = load_catalog()
    doc = {"provenance": provenance(), "fold_range": [FOLD_MIN, FOLD_MAX], "mxfp4": [], "nvfp4": []}
    started = time.time()
    for model, tp in PEERS:
        for fmt in ("mxfp4", "nvfp4"):
            try:
                geo = cat.moe_geometry(model, tp, fmt)
            except KeyError:
                continue
            e = args.experts or geo.experts
            n = geo.intermediate
            w13_shape = (e, *geo.w13_scale_shape[1:])
            w2_shape = (e, *geo.w2_scale_shape[1:])
            perm = fc1_engine_rows(n, interleaved=False)  # synthetic W13 rows are [gate; up]
            presets = PRESETS if fmt == "mxfp4" else {"nvfp4_typical": NVFP4_TYPICAL}
            for preset, stats in presets.items():
                w13 = synthetic_scale_plane(w13_shape, fmt, stats, seed=SEED + 1)[:, perm].contiguous()
                w2 = synthetic_scale_plane(w2_shape, fmt, stats, seed=SEED + 3)
                row = {"geometry": geo.name, "experts": e, "preset": preset}
                if fmt == "mxfp4":
                    row["w13"] = _mxfp4_plane(w13, 2 * n)
                    row["w2"] = _mxfp4_plane(w2, None)
                else:
                    row["w13"], row["w2"] = _nvfp4_plane(w13), _nvfp4_plane(w2)
                doc[fmt].append(row)
                print(json.dumps(row), flush=True)
    doc["seconds"] = round(time.time() - started, 1)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
