"""Codec figures on the DeepSeek-V4.1-Flash TP4 layer planes: both forms' ratios against the targets
and the entropy bound, and CPU encode/decode throughput, written as JSON with provenance.

    python benchmarks/bench_codec.py --out benchmarks/results/codec.json [--repeats 3] [--experts 384]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance

from csf_codec import MXFP4, NVFP4, decode_compact, decode_inline, encode_compact, encode_inline
from csf_codec.stats import plane_report
from csf_codec.synthetic import (
    EXCEPTION_DENSE,
    NVFP4_TYPICAL,
    SEED_REGIME,
    measure_window_fraction,
    synthetic_scale_plane,
)

# (regime, format, stats preset, targets: minimum inline and compact ratios, or None where the issue sets none)
REGIMES = [
    ("seed_regime", MXFP4, SEED_REGIME, {"inline": 4.0, "compact": 6.0}),
    ("exception_dense", MXFP4, EXCEPTION_DENSE, {"inline": 3.0, "compact": 5.0}),
    ("nvfp4_typical", NVFP4, NVFP4_TYPICAL, None),
]


def _planes(fmt, experts: int):
    k = 2 if fmt is NVFP4 else 1  # NVFP4 has a scale per 16 weights, twice MXFP4's columns
    return [("w13", (experts, 1152, 160 * k), 576), ("w2", (experts, 5120, 18 * k), None)]


def _timed(repeats: int, fn, *args, **kwargs) -> tuple[list[float], object]:
    samples, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        samples.append(time.perf_counter() - t0)
    return samples, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--experts", type=int, default=384)
    args = ap.parse_args()

    results, layers = [], []
    for regime, fmt, stats, targets in REGIMES:
        layer = {"regime": regime, "format": fmt.name, "native_bytes": 0, "compact_bytes": 0, "inline_bytes": 0}
        for proj, shape, group in _planes(fmt, args.experts):
            plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=zlib.crc32(f"{regime}.{proj}".encode()))
            name = f"{regime}.{proj}"
            rep = plane_report(plane, fmt, name=name, row_group=group)
            n = args.repeats
            enc_c, compact = _timed(n, encode_compact, plane, fmt, name=name, verify=False)
            dec_c, back_c = _timed(n, decode_compact, compact.payload, name=name)
            enc_i, inline = _timed(n, encode_inline, plane, fmt, name=name, row_group=group, verify=False)
            dec_i, back_i = _timed(n, decode_inline, inline, name=name)
            exact = bool(torch.equal(back_c, plane) and torch.equal(back_i, plane))
            mb = plane.numel() / 1e6
            row = {
                "name": name,
                "projection": proj,
                "row_group": group,
                "window_fraction_base_base1": measure_window_fraction(plane, 1) if fmt is MXFP4 else None,
                **rep.as_dict(),
                "inline_mode_counts": inline.mode_counts(),
                "inline_tail_record_bytes": inline.tail_record_bytes,
                "bit_exact": exact,
                "timing_s": {
                    "encode_compact": enc_c,
                    "decode_compact": dec_c,
                    "encode_inline": enc_i,
                    "decode_inline": dec_i,
                },
                "throughput_native_MBps_median": {
                    k: mb / statistics.median(v)
                    for k, v in (
                        ("encode_compact", enc_c),
                        ("decode_compact", dec_c),
                        ("encode_inline", enc_i),
                        ("decode_inline", dec_i),
                    )
                },
            }
            if targets:
                row["targets"] = {f"{form}>={t}": row[f"{form}_ratio"] >= t for form, t in targets.items()}
            results.append(row)
            for key in ("native_bytes", "compact_bytes", "inline_bytes"):
                layer[key] += row[key]
            print(
                f"{name:28s} {fmt.name} {list(shape)} compact {row['compact_ratio']:.2f}x inline "
                f"{row['inline_ratio']:.2f}x bound {row['entropy_bound_ratio'] or float('inf'):.2f}x raw tiles "
                f"{row['raw_tiles']}/{row['tiles']} exact={exact} enc {statistics.median(enc_c):.2f}s",
                flush=True,
            )
        layer["compact_ratio"] = layer["native_bytes"] / layer["compact_bytes"]
        layer["inline_ratio"] = layer["native_bytes"] / layer["inline_bytes"]
        layer["native_MiB"] = layer["native_bytes"] / 2**20
        layer["inline_MiB"] = layer["inline_bytes"] / 2**20
        layer["compact_MiB"] = layer["compact_bytes"] / 2**20
        layers.append(layer)
        print(
            f"layer {regime}: native {layer['native_MiB']:.1f} MiB, compact {layer['compact_MiB']:.1f} MiB "
            f"({layer['compact_ratio']:.2f}x), inline {layer['inline_MiB']:.1f} MiB ({layer['inline_ratio']:.2f}x)"
        )

    doc = {
        "benchmark": "bench_codec",
        "provenance": provenance(),
        "geometry": "DeepSeek-V4.1-Flash TP4 MoE layer: W13 scales [E, 1152, 160], W2 [E, 5120, 18] (MXFP4)",
        "experts": args.experts,
        "repeats": args.repeats,
        "correctness": "every plane decoded bit-exactly from both forms"
        if all(r["bit_exact"] for r in results)
        else "MISMATCH",
        "planes": results,
        "layers": layers,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
