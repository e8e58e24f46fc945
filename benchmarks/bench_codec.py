"""Codec figures on the DeepSeek-V4.1-Flash TP4 layer planes, for each synthetic regime: the compact and inline
forms' and the engine records' (csf_codec.engine_records) ratios
against the entropy bound H(delta | row base) (csf_codec.stats), CPU encode/decode throughput, and peak
memory, written as JSON with provenance.

    python benchmarks/bench_codec.py --out benchmarks/results/codec.json [--repeats 3] [--experts 384]
        [--large-experts 384]   # the memory check's large plane: [E, 5120, 160] MXFP4 (315M scales at 384)

Throughput is native scale-plane bytes over the median (and the best) wall time of ``--repeats`` calls
(encoders with ``verify=False``; CPU seconds are recorded beside, since the machine's two cores may be
shared with other work, which the median then includes). Peak memory
is measured two ways and reported as a multiple of the plane's bytes:

* ``tracemalloc_peak_x``: the peak of numpy's traced allocations during the call, in this process (torch's
  CPU allocations, which the codec makes only for per-row tables and the final payload, are not traced);
* ``rss_peak_x`` (large plane only): in a fresh child process that loads the plane (or payload) from a .npy
  file, resets the kernel's peak-RSS mark (``/proc/self/clear_refs`` 5) and runs the call once, the growth of
  the peak resident set (``VmHWM``) over the resident set after the load: everything the call allocates,
  torch included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from csf_codec import MXFP4, NVFP4, decode_compact, decode_inline, encode_compact, encode_inline, inline_from_payload
from csf_codec.engine_records import EngineRecords, decode_engine_records, encode_engine_records
from csf_codec.stats import plane_report
from csf_codec.synthetic import (
    DOWN_PROJ_DENSE,
    EXCEPTION_DENSE,
    NVFP4_TYPICAL,
    SEED_REGIME,
    measure_window_fraction,
    synthetic_scale_plane,
)

# (regime, format, stats preset, targets: minimum efficiency (ratio / bound ratio) per form, or None)
REGIMES = [
    ("seed_regime", MXFP4, SEED_REGIME, None),
    ("exception_dense", MXFP4, EXCEPTION_DENSE, None),
    ("down_proj_dense", MXFP4, DOWN_PROJ_DENSE, {"compact": 0.85, "inline": 0.65, "engine": 0.65}),
    ("nvfp4_typical", NVFP4, NVFP4_TYPICAL, None),
]
SPEED_TARGETS = {"encode": 200.0, "decode": 500.0}  # MB/s of native scale-plane bytes
OPS = ("encode_compact", "decode_compact", "encode_inline", "decode_inline", "encode_engine", "decode_engine")


def _planes(fmt, experts: int):
    k = 2 if fmt is NVFP4 else 1  # NVFP4 has a scale per 16 weights, twice MXFP4's columns
    return [("w13", (experts, 1152, 160 * k), 576), ("w2", (experts, 5120, 18 * k), None)]


def _run(op: str, plane, fmt, name, group, payloads):
    if op == "encode_compact":
        return encode_compact(plane, fmt, name=name, verify=False)
    if op == "decode_compact":
        return decode_compact(payloads["compact"], name=name)
    if op == "encode_inline":
        return encode_inline(plane, fmt, name=name, row_group=group, verify=False)
    if op == "encode_engine":
        return encode_engine_records(plane, fmt, name=name, row_group=group, verify=False)
    if op == "decode_engine":
        return decode_engine_records(payloads["engine"], name=name)
    return decode_inline(payloads["inline"], name=name)


def _measure(repeats: int, op: str, *args) -> dict:
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = _run(op, *args)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    tracemalloc.start()
    _run(op, *args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"wall_s": walls, "cpu_s": cpus, "traced_peak_bytes": peak, "out": out}


def _plane_row(regime, fmt, stats, targets, proj, shape, group, repeats) -> dict:
    plane = synthetic_scale_plane(shape, fmt, stats=stats, seed=zlib.crc32(f"{regime}.{proj}".encode()))
    name = f"{regime}.{proj}"
    rep = plane_report(plane, fmt, name=name, row_group=group)
    compact = encode_compact(plane, fmt, name=name, verify=False)
    inline = encode_inline(plane, fmt, name=name, row_group=group, verify=False)
    engine = encode_engine_records(plane, fmt, name=name, row_group=group, verify=False)
    payloads = {"compact": compact.payload, "inline": inline, "engine": engine}
    runs = {op: _measure(repeats, op, plane, fmt, name, group, payloads) for op in OPS}
    exact = bool(
        torch.equal(runs["decode_compact"]["out"], plane)
        and torch.equal(runs["decode_inline"]["out"], plane)
        and torch.equal(runs["decode_engine"]["out"], plane)
        and torch.equal(decode_inline(inline_from_payload(inline.to_payload(), name=name)), plane)
    )
    mb = plane.numel() / 1e6
    row = {
        "name": name,
        "projection": proj,
        "row_group": group,
        "window_fraction_base_base1": measure_window_fraction(plane, 1) if fmt is MXFP4 else None,
        **rep.as_dict(),
        "inline_mode_counts": inline.mode_counts(),
        "inline_tail_record_bytes": inline.tail_record_bytes,
        "engine_bytes": engine.nbytes,
        "engine_ratio": plane.numel() / engine.nbytes,
        "engine_efficiency": (plane.numel() / engine.nbytes / rep.entropy_bound_ratio)
        if rep.entropy_bound_ratio
        else None,
        "engine_mode_counts": engine.mode_counts(),
        "engine_exceptions": engine.exceptions,
        "engine_body_bytes": engine.body.numel(),
        "bit_exact": exact,
        "timing_s": {op: r["wall_s"] for op, r in runs.items()},
        "cpu_s": {op: r["cpu_s"] for op, r in runs.items()},
        "throughput_native_MBps_median": {op: mb / statistics.median(r["wall_s"]) for op, r in runs.items()},
        "throughput_native_MBps_best": {op: mb / min(r["wall_s"]) for op, r in runs.items()},
        "throughput_native_MBps_per_cpu_second": {op: mb / statistics.median(r["cpu_s"]) for op, r in runs.items()},
        "tracemalloc_peak_x": {op: r["traced_peak_bytes"] / plane.numel() for op, r in runs.items()},
    }
    if targets:
        row["targets"] = {f"{form}_efficiency>={t}": row[f"{form}_efficiency"] >= t for form, t in targets.items()}
    row["speed_targets"] = {
        f"{op}>={SPEED_TARGETS[op.split('_')[0]]}MB/s": v >= SPEED_TARGETS[op.split("_")[0]]
        for op, v in row["throughput_native_MBps_median"].items()
    }
    return row


def _memory_child(op: str, path: str, group: str) -> None:
    """Child mode: load the plane or payload from ``path``, run ``op`` once, print the RSS growth (bytes)."""
    data = _load_engine(path) if op == "decode_engine" else torch.from_numpy(np.load(path))
    fmt = MXFP4
    grp = int(group) or None
    if op.startswith("decode_inline"):
        data = inline_from_payload(data)  # validated like any load; the timed part is the decode
    base = _reset_peak_rss()
    {
        "encode_compact": lambda: encode_compact(data, fmt, verify=False),
        "decode_compact": lambda: decode_compact(data),
        "encode_inline": lambda: encode_inline(data, fmt, row_group=grp, verify=False),
        "decode_inline": lambda: decode_inline(data),
        "encode_engine": lambda: encode_engine_records(data, fmt, row_group=grp, verify=False),
        "decode_engine": lambda: decode_engine_records(data),
    }[op]()
    print(_peak_rss() - base)


_ENGINE_ARRAYS = ("base_ref", "base_delta", "block_start", "record_units", "body")


def _save_engine(path: Path, rec: EngineRecords) -> None:
    np.savez(path, shape=np.array(rec.shape), **{k: getattr(rec, k).numpy() for k in _ENGINE_ARRAYS})


def _load_engine(path: str) -> EngineRecords:
    with np.load(path) as z:
        arrays = {k: torch.from_numpy(z[k]) for k in _ENGINE_ARRAYS}
        shape = tuple(int(d) for d in z["shape"])
    return EngineRecords(fmt=MXFP4, shape=shape, row_group=shape[-2], **arrays)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> int:
    """Reset the peak resident set to the current one (Linux: clear_refs 5); return the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def _peak_rss() -> int:
    return _status_kib("VmHWM")


def _large_plane(experts: int) -> dict:
    shape = (experts, 5120, 160)
    plane = synthetic_scale_plane(shape, MXFP4, stats=DOWN_PROJ_DENSE, seed=315)
    out = {"shape": list(shape), "scales": plane.numel(), "regime": "down_proj_dense", "format": "mxfp4"}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"plane": Path(tmp) / "plane.npy", "compact": Path(tmp) / "c.npy", "inline": Path(tmp) / "i.npy"}
        files["engine"] = Path(tmp) / "e.npz"
        timings = {}
        for op in OPS:
            t0 = time.perf_counter()
            if op == "encode_compact":
                compact = encode_compact(plane, MXFP4, verify=False)
            elif op == "encode_inline":
                inline = encode_inline(plane, MXFP4, verify=False)
            elif op == "decode_compact":
                ok_c = torch.equal(decode_compact(compact.payload), plane)
            elif op == "encode_engine":
                engine = encode_engine_records(plane, MXFP4, verify=False)
            elif op == "decode_engine":
                ok_e = torch.equal(decode_engine_records(engine), plane)
            else:
                ok_i = torch.equal(decode_inline(inline), plane)
            timings[op] = time.perf_counter() - t0
        out["bit_exact"] = bool(ok_c and ok_i and ok_e)
        out["wall_s"] = timings
        out["throughput_native_MBps"] = {op: plane.numel() / 1e6 / s for op, s in timings.items()}
        np.save(files["plane"], plane.numpy())
        np.save(files["compact"], compact.payload.numpy())
        np.save(files["inline"], inline.to_payload().numpy())
        _save_engine(files["engine"], engine)
        del compact, inline, engine
        sources = {"encode_compact": "plane", "encode_inline": "plane", "decode_compact": "compact"}
        sources.update(decode_inline="inline", encode_engine="plane", decode_engine="engine")
        rss = {}
        for op in OPS:
            cmd = [sys.executable, __file__, "--memory-child", op, str(files[sources[op]]), "0"]
            rss[op] = int(subprocess.check_output(cmd, text=True).strip().splitlines()[-1]) / plane.numel()
        out["rss_peak_x"] = rss
        out["memory_target_x"] = 2.0
        out["memory_ok"] = all(v <= 2.0 for v in rss.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--large-experts", type=int, default=384, help="0 skips the large-plane memory check")
    ap.add_argument("--memory-child", nargs=3, metavar=("OP", "PATH", "GROUP"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        _memory_child(*args.memory_child)
        return
    if not args.out:
        ap.error("--out is required")
    from provenance import provenance

    results, layers = [], []
    for regime, fmt, stats, targets in REGIMES:
        layer = {"regime": regime, "format": fmt.name, "native_bytes": 0, "compact_bytes": 0, "inline_bytes": 0}
        layer["engine_bytes"] = 0
        for proj, shape, group in _planes(fmt, args.experts):
            row = _plane_row(regime, fmt, stats, targets, proj, shape, group, args.repeats)
            results.append(row)
            for key in ("native_bytes", "compact_bytes", "inline_bytes", "engine_bytes"):
                layer[key] += row[key]
            mbps = row["throughput_native_MBps_median"]
            print(
                f"{row['name']:24s} {fmt.name} {list(shape)} bound {row['entropy_bound_ratio'] or float('inf'):.2f}x "
                f"compact {row['compact_ratio']:.2f}x ({row['compact_efficiency'] or 0:.0%}) inline "
                f"{row['inline_ratio']:.2f}x ({row['inline_efficiency'] or 0:.0%}) engine {row['engine_ratio']:.2f}x "
                f"({row['engine_efficiency'] or 0:.0%}) exact={row['bit_exact']} MB/s "
                + " ".join(f"{op} {v:.0f}" for op, v in mbps.items()),
                flush=True,
            )
        for form in ("compact", "inline", "engine"):
            layer[f"{form}_ratio"] = layer["native_bytes"] / layer[f"{form}_bytes"]
        layers.append(layer)

    large = _large_plane(args.large_experts) if args.large_experts else None
    if large:
        print(f"large plane {large['shape']}: MB/s {large['throughput_native_MBps']} RSS x {large['rss_peak_x']}")
    doc = {
        "benchmark": "bench_codec",
        "provenance": provenance(),
        "geometry": "DeepSeek-V4.1-Flash TP4 MoE layer: W13 scales [E, 1152, 160], W2 [E, 5120, 18] (MXFP4; NVFP4 2x)",
        "bound": "H(delta | row base): empirical conditional entropy of each scale's offset given its row base "
        "(csf_codec.stats); efficiency = bound bits / payload bits",
        "memory": "tracemalloc_peak_x: numpy's traced allocations during the call / plane bytes; rss_peak_x (large "
        "plane): peak RSS growth of a fresh process over the loaded input / plane bytes",
        "experts": args.experts,
        "repeats": args.repeats,
        "correctness": "every plane decoded bit-exactly from both forms and the engine records"
        if all(r["bit_exact"] for r in results) and (not large or large["bit_exact"])
        else "MISMATCH",
        "planes": results,
        "layers": layers,
        "large_plane": large,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
