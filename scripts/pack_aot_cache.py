"""Pack the AOT cache built for this tree's kernel sources into aot_cache/carry.tgz, for the GPU machine.

The tree and the unpacked cache together pass the device tool's 64 MiB (``validation/README.md``), so the
device call carries the archive and unpacks it first: ``mkdir -p aot_cache && tar xzf aot_cache/carry.tgz -C
aot_cache``. Only the current cache key's folder goes in: older keys in the root are not what this tree loads.

    nox -s aot_build            # builds, then runs this
    python scripts/pack_aot_cache.py [--root aot_cache]
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from csf_kernels import env
from csf_kernels.runtime import config
from csf_kernels.runtime.toolchain import cache_key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None, help="aot_cache root (default: $CSF_AOT_CACHE or ./aot_cache)")
    a = ap.parse_args()
    env.configure_runtime()
    root = a.root or config.cache_root()
    key = cache_key()
    if not (root / key / "manifest.json").is_file():
        sys.exit(f"pack_aot_cache: no cache built for these sources at {root / key} (run `nox -s aot_build`)")
    out = root / "carry.tgz"
    partial = out.with_suffix(".tgz.tmp")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(root / key, arcname=key)
    partial.replace(out)  # never a half-written archive under the carried name
    print(f"pack_aot_cache: {out} holds cache {key} ({out.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
