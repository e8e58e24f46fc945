"""Build the CuTe DSL inline stage decoder ahead of time (no GPU needed) and print its launch metadata.

    python packages/csf-kernels/tools/build_stage_decoder_demo.py OUT_DIR [--sizes 96 160 288] [--delta-bits 8]

Writes ``libcsf_stage_decoder_s<S>.so`` (needs only libc and the CUDA driver), ``csf_stage_decoder_s<S>.h``,
``.cubin`` and ``.json`` per record size into OUT_DIR. Needs nvidia-cutlass-dsl, gcc and a CUDA toolkit's
``libcudart_static.a`` (``$CUDA_HOME`` or /usr/local/cuda).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "src"
if str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))

from csf_kernels.aot.cute_export import build_stage_decoder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--sizes", type=int, nargs="+", default=[96], help="record bytes S (multiples of 16, 80..448)")
    ap.add_argument("--delta-bits", type=int, default=4, choices=(4, 8), help="base-delta bits per slot (default 4)")
    ap.add_argument("--full", action="store_true", help="print the whole metadata (default: a summary)")
    args = ap.parse_args(argv)
    for s in args.sizes:
        meta = build_stage_decoder(s, args.out_dir, delta_bits=args.delta_bits)
        if args.full:
            print(json.dumps(meta, indent=1, sort_keys=True))
            continue
        sass = meta["sass"] or {}
        summary = {
            "so": meta["paths"]["so"],
            "entry": meta["symbols"]["entry"],
            "entry_c_signature": meta["c_signatures"]["entry"],
            "packed_args": meta["packed_args"],
            "structs": {a["name"]: a["c_fields"] for a in meta["args"] if a["kind"] == "tensor"},
            "launch": meta["launch"],
            "sha256": meta["sha256"],
            "sass": {
                k: sass.get(k) for k in ("registers", "local_bytes", "instructions", "ldgsts", "local_memory_ops")
            },
            "toolchain": meta["toolchain"],
        }
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
