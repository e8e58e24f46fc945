"""Pack the AOT cache built for this tree's kernel sources into aot_cache/carry.tgz, for the GPU machine.

The tree and the unpacked cache together pass the device tool's 64 MiB (``validation/README.md``), so the
device call carries the archive and unpacks it first: ``mkdir -p aot_cache && tar xzf aot_cache/carry.tgz -C
aot_cache``. Only the current cache key's folder goes in: older keys in the root are not what this tree loads.

    nox -s aot_build            # builds, then runs this
    python scripts/pack_aot_cache.py [--root aot_cache] [--drop moe.engine_gemm:FMT=nvfp4 ...]

``--drop KERNEL[:FACT=VALUE,...]`` leaves out the programs of ``KERNEL`` whose spec facts hold every pair (``FACT=-``:
the spec has no such fact, e.g. ``moe.engine_gemm:FMT=mxfp4,SRC=-`` for the native-scale programs), for a
call whose tree and cache would not fit otherwise: the archive's manifest lists only the programs it carries
(entries are sealed one by one, so a subset is a valid cache), and the frozen runtime refuses a dropped program
by name (``UncachedProgramError``).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

from csf_kernels import env
from csf_kernels.runtime import config
from csf_kernels.runtime.toolchain import cache_key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None, help="aot_cache root (default: $CSF_AOT_CACHE or ./aot_cache)")
    ap.add_argument("--drop", action="append", default=[], metavar="KERNEL[:FACT=VALUE,...]",
                    help="leave out these programs (repeatable)")  # fmt: skip
    a = ap.parse_args()
    drops = [_drop_rule(d) for d in a.drop]
    env.configure_runtime()
    root = a.root or config.cache_root()
    key = cache_key()
    if not (root / key / "manifest.json").is_file():
        sys.exit(f"pack_aot_cache: no cache built for these sources at {root / key} (run `nox -s aot_build`)")
    out = root / "carry.tgz"
    partial = out.with_suffix(".tgz.tmp")
    with tarfile.open(partial, "w:gz") as tar:
        if drops:
            kept = _add_subset(tar, root / key, key, drops)
        else:
            tar.add(root / key, arcname=key)
            kept = None
    partial.replace(out)  # never a half-written archive under the carried name
    subset = "" if kept is None else f", {kept[0]} of {kept[1]} programs"
    print(f"pack_aot_cache: {out} holds cache {key}{subset} ({out.stat().st_size / 2**20:.1f} MiB)")


def _drop_rule(text: str) -> tuple[str, dict[str, str]]:
    kernel, _, facts = text.partition(":")
    pairs = [f.split("=", 1) for f in facts.split(",") if f]
    if not kernel or any(len(p) != 2 for p in pairs):
        sys.exit(f"pack_aot_cache: --drop {text!r} is not KERNEL[:FACT=VALUE,...]")
    return kernel, dict(pairs)


def _dropped(spec: dict, drops) -> bool:
    facts = {k: str(v) for k, v in spec.get("facts", {}).items()}
    return any(
        spec.get("kernel") == kernel and all(facts.get(k, "-") == v for k, v in want.items()) for kernel, want in drops
    )


def _add_subset(tar: tarfile.TarFile, folder: Path, key: str, drops) -> tuple[int, int]:
    """The cache folder without the dropped programs: a manifest listing the rest, and their binaries."""
    doc = json.loads((folder / "manifest.json").read_bytes())
    programs = doc["programs"]
    doc["programs"] = {k: e for k, e in programs.items() if not _dropped(e["spec"], drops)}
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    info = tarfile.TarInfo(f"{key}/manifest.json")
    info.size = len(data)
    tar.add(folder, arcname=key, recursive=False)
    tar.addfile(info, io.BytesIO(data))
    tar.add(folder / "programs", arcname=f"{key}/programs", recursive=False)
    for entry in doc["programs"].values():
        tar.add(folder / entry["file"], arcname=f"{key}/{entry['file']}")
    return len(doc["programs"]), len(programs)


if __name__ == "__main__":
    main()
