"""Per-program resources of a built AOT cache: registers, spills, shared memory, threads and the CTAs an SM can
hold by each limit, from the binaries themselves (no GPU).

    python scripts/kernel_resources.py aot_cache/<key> [--kernel moe.engine_gemm] [--out resources.json] [--markdown]

CuTe DSL programs carry their SASS facts in the manifest (written by the build from the embedded cubin); Triton
cubins are read with cuobjdump here. Occupancy is the theoretical one of sm_90 (65,536 registers, 2,048 threads,
32 CTAs and 233,472 bytes of shared memory a SM, 1 KB of it reserved a CTA; registers allocated per warp in
units of 256): achieved occupancy needs a profiler on the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/csf-kernels/src"))
from csf_kernels.aot.cute_export import find_cuobjdump, sass_facts

SM_REGISTERS = 65536
SM_THREADS = 2048
SM_CTAS = 32
SM_SHARED = 233472
CTA_RESERVED_SHARED = 1024
REGISTER_UNIT = 256  # registers a warp is allocated in


def ctas_per_sm(registers: int, threads: int, shared: int) -> dict:
    """How many CTAs of this program an SM holds by each limit, and the binding one."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    limits = {
        "registers": SM_REGISTERS // max(per_warp * warps, 1),
        "threads": SM_THREADS // threads,
        "shared": SM_SHARED // (shared + CTA_RESERVED_SHARED),
        "ctas": SM_CTAS,
    }
    least = min(limits.values())
    return {"limits": limits, "ctas": least, "bound_by": "+".join(k for k, v in limits.items() if v == least)}


def program_resources(cache: Path, entry: dict, cuobjdump: str | None) -> dict:
    launch = entry["launch"]
    if entry["kind"] == "cute_so":
        sass = launch["sass"]
        threads_dims, dynamic = launch["launch"]["block"], launch["launch"].get("dynamic_shared_bytes", 0)
        dynamic = dynamic or launch.get("ring_shared_bytes", 0)  # programs that size it at launch record it
    else:
        sass = sass_facts(cache / entry["file"], cuobjdump) or {}
        threads_dims, dynamic = launch["block"], launch.get("shared", 0)
    threads = threads_dims[0] * threads_dims[1] * threads_dims[2]
    shared = (sass.get("static_shared_bytes") or 0) + dynamic
    out = {
        "kernel": entry["spec"]["kernel"],
        "facts": entry["spec"]["facts"],
        "kind": entry["kind"],
        "threads": threads,
        "registers": sass.get("registers"),
        "spill_bytes": sass.get("local_bytes"),
        "local_memory_ops": sass.get("local_memory_ops"),
        "shared_bytes": shared,
    }
    if out["registers"] is not None:
        out["occupancy"] = ctas_per_sm(out["registers"], threads, shared)
    return out


def _markdown(rows: list[dict]) -> str:
    head = "| kernel | facts | threads | registers | spill bytes | shared bytes | CTAs / SM (bound by) |\n"
    head += "|---|---|---|---|---|---|---|\n"
    lines = []
    for r in rows:
        facts = " ".join(f"{k}={v}" for k, v in sorted(r["facts"].items()))
        occ = r.get("occupancy") or {}
        lines.append(f"| {r['kernel']} | {facts} | {r['threads']} | {r['registers']} | {r['spill_bytes']} | "
                     f"{r['shared_bytes']} | {occ.get('ctas')} ({occ.get('bound_by')}) |")  # fmt: skip
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache", type=Path, help="a built cache directory, aot_cache/<key>")
    ap.add_argument("--kernel", default="", help="only kernels whose name starts with this")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args()
    manifest = json.loads((args.cache / "manifest.json").read_text())
    tool = find_cuobjdump()
    rows = [
        program_resources(args.cache, entry, tool)
        for entry in manifest["programs"].values()
        if entry["spec"]["kernel"].startswith(args.kernel)
    ]
    rows.sort(key=lambda r: (r["kernel"], json.dumps(r["facts"], sort_keys=True)))
    doc = {"cache_key": manifest["cache_key"], "toolchain": manifest["toolchain"], "programs": rows}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    if args.markdown:
        print(_markdown(rows), end="")
    elif not args.out:
        print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
