"""Size estimate of variable-length inline records (the engine's scale source, ``docs/moe-engine.md`` §8) against
today's fixed-size records and the entropy bound, on the codec's synthetic regimes: a design estimate, not a format.

    python benchmarks/estimate_inline_records.py --out benchmarks/results/inline-records-estimate.json

Each tile (128 rows x 4 scale columns, the tail tile narrower) keeps today's candidate windows, row bases and base
deltas; only its record changes: ``align(header + selectors + entry_bits * n / 8)`` bytes with the window of the
fewest bytes (a raw tile costs ``align(header + native bytes)``), plus ``index_bytes`` a record for the offsets.
Today's figures come from the real encoder (``encode_inline``); the bound from ``csf_codec.stats``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from csf_codec import MXFP4, NVFP4, encode_inline
from csf_codec.inline import CANDIDATE_WINDOWS, _block_bases_np, _class_plans
from csf_codec.inline_np import TILE_ROWS, block_spans, window_stats
from csf_codec.record_layout import DELTA_BITS
from csf_codec.rowbase import row_bases
from csf_codec.stats import conditional_offset_entropy
from csf_codec.synthetic import DOWN_PROJ_DENSE, EXCEPTION_DENSE, NVFP4_TYPICAL, SEED_REGIME, synthetic_scale_plane
from csf_codec.tile_layout import InlineGeometry

REGIMES = [("seed_regime", MXFP4, SEED_REGIME), ("exception_dense", MXFP4, EXCEPTION_DENSE),
           ("down_proj_dense", MXFP4, DOWN_PROJ_DENSE), ("nvfp4_typical", NVFP4, NVFP4_TYPICAL)]  # fmt: skip
# (entry bits: position and value code; index bytes a record; alignment of a record)
VARIANTS = {"entry16_idx4_a16": (16, 4, 16), "entry12_idx1_a16": (12, 1, 16), "entry12_idx1_a8": (12, 1, 8)}
HEADER = 4


def _variable_bytes(plane: np.ndarray, fmt, row_group, entry_bits: int, index_bytes: int, align: int) -> int:
    geo = InlineGeometry.for_shape(tuple(plane.shape), row_group)
    rows = plane.reshape(-1, plane.shape[-1])
    ref, delta, br = _block_bases_np(rows, geo, fmt)
    base = ref[:, None].astype(np.int16) + delta
    valid = br >= 0
    windows = CANDIDATE_WINDOWS[fmt.name]
    total = ref.size + ref.size * TILE_ROWS * DELTA_BITS[fmt.name] // 8  # the row-base tables stay as today
    for plan in _class_plans(geo):
        if plan.count == 0:
            continue
        size = TILE_ROWS * plan.cols
        for a, b in block_spans(br.shape[0], plan.count * plan.cols):
            n, legal = window_stats(rows, br[a:b], base[a:b], valid[a:b], plan, windows)
            w = np.array([w for w, _ in windows])[:, None]
            raw = -(-(HEADER + size) // align) * align
            cost = -(-(HEADER + size * w // 8 + -(-entry_bits * n // 8)) // align) * align
            cost = np.where(legal, cost, raw).min(axis=0)
            total += int(np.minimum(cost, raw).sum()) + index_bytes * cost.size
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--experts", type=int, default=96)
    args = ap.parse_args()
    from provenance import provenance

    rows = []
    for regime, fmt, stats in REGIMES:
        k = 2 if fmt is NVFP4 else 1
        planes = (("w13", (args.experts, 1152, 160 * k), 576), ("w2", (args.experts, 5120, 18 * k), None))
        for proj, shape, group in planes:
            plane = synthetic_scale_plane(shape, fmt, stats)
            flat = plane.reshape(-1, shape[-1])
            bound_bits = conditional_offset_entropy(flat, row_bases(flat, fmt.row_base_width))
            row = {"regime": regime, "projection": proj, "shape": list(shape), "scales": plane.numel()}
            row["bound_ratio"] = 8.0 / bound_bits
            today = encode_inline(plane, fmt, name=proj, row_group=group, verify=False).nbytes
            row["today_ratio"] = plane.numel() / today
            for name, (bits, idx, align) in VARIANTS.items():
                row[f"{name}_ratio"] = plane.numel() / _variable_bytes(plane.numpy(), fmt, group, bits, idx, align)
            row.update({k.replace("_ratio", "_efficiency"): v / row["bound_ratio"] for k, v in list(row.items())
                        if k.endswith("_ratio") and k != "bound_ratio"})  # fmt: skip
            rows.append(row)
            print(regime, proj, {k: round(v, 3) for k, v in row.items() if k.endswith("efficiency")})
    doc = {"benchmark": "inline record size estimate", "provenance": provenance(), "variants": VARIANTS, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
