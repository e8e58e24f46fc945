"""Compare two built AOT caches program by program: does a change (a refactor, a move) change any binary?

    python scripts/compare_aot_caches.py aot_cache/<key A> aot_cache/<key B>

Triton programs compare by the cubin's sha256. CuTe DSL programs are shared objects whose embedded cubin names its
kernels after the Python module and class that define them (the DSL mangles ``module.Class`` into the symbol), so a
module moved or renamed renames the kernel symbols and changes the bytes without changing a single instruction.
For those, the embedded cubins are extracted and their SASS compared with every symbol name replaced by its first
appearance's index: equal means the same instructions, registers and shared memory, renamed. Exit 0 when every
program is byte-identical or (CuTe) SASS-identical modulo names; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/csf-kernels/src"))
from csf_kernels.aot.cute_export import find_cuobjdump

EM_CUDA = 190


def embedded_cubins(blob: bytes) -> list[bytes]:
    """The CUDA ELF images (64-bit, e_machine EM_CUDA) embedded in a host shared object, in order."""
    out, at = [], blob.find(b"\x7fELF", 1)
    while at >= 0:
        head = blob[at : at + 64]
        if len(head) == 64 and head[4] == 2 and struct.unpack_from("<H", head, 18)[0] == EM_CUDA:
            phoff, shoff = struct.unpack_from("<QQ", head, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
            end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            for i in range(shnum):  # sections may lie past the header tables
                sh = at + shoff + i * shentsize
                (sh_type,) = struct.unpack_from("<I", blob, sh + 4)
                offset, size = struct.unpack_from("<QQ", blob, sh + 24)
                if sh_type != 8:  # SHT_NOBITS occupies no bytes
                    end = max(end, offset + size)
            out.append(blob[at : at + end])
        at = blob.find(b"\x7fELF", at + 1)
    return out


_SYMBOL = re.compile(r"[A-Za-z_$][\w$.]{40,}")  # mangled kernel and section names (long identifiers)


def normalised_sass(cubin: bytes, tool: str, scratch: Path) -> str:
    scratch.write_bytes(cubin)
    sass = subprocess.run([tool, "-sass", str(scratch)], capture_output=True, text=True, check=True).stdout
    names: dict[str, str] = {}
    return _SYMBOL.sub(lambda m: names.setdefault(m.group(0), f"<sym{len(names)}>"), sass)


def compare(a_dir: Path, b_dir: Path) -> dict:
    a = json.loads((a_dir / "manifest.json").read_text())["programs"]
    b = json.loads((b_dir / "manifest.json").read_text())["programs"]
    report = {"only_a": sorted(set(a) - set(b)), "only_b": sorted(set(b) - set(a)), "identical": 0,
              "renamed_only": [], "different": []}  # fmt: skip
    tool = find_cuobjdump()
    scratch = Path("/tmp") / f"compare-aot-{id(report)}.cubin"
    for key in sorted(set(a) & set(b)):
        ea, eb = a[key], b[key]
        if ea["sha256"] == eb["sha256"]:
            report["identical"] += 1
            continue
        if ea["kind"] != "cute_so" or tool is None:
            report["different"].append(key)
            continue
        ca = embedded_cubins((a_dir / ea["file"]).read_bytes())
        cb = embedded_cubins((b_dir / eb["file"]).read_bytes())
        same = len(ca) == len(cb) > 0 and all(
            normalised_sass(x, tool, scratch) == normalised_sass(y, tool, scratch) for x, y in zip(ca, cb, strict=True)
        )
        (report["renamed_only"] if same else report["different"]).append(key)
    scratch.unlink(missing_ok=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    r = compare(args.a, args.b)
    print(json.dumps({k: (v if isinstance(v, int) else len(v)) for k, v in r.items()}))
    for key in r["different"]:
        print(f"different: {key}")
    return 0 if not (r["different"] or r["only_a"] or r["only_b"]) else 1


if __name__ == "__main__":
    sys.exit(main())
