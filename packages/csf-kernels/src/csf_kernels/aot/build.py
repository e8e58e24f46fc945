"""``nox -s aot_build``: compile every program the geometry catalog needs into ``aot_cache/<cache key>/``.

    python -m csf_kernels.aot.build [--out DIR] [--catalog PATH] [--jobs N]

Runs on any machine (no GPU). The directory is assembled under a temporary name and renamed into
place, so a reader or a second builder never sees a half-written cache.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from csf_kernels import env
from csf_kernels.aot.compile import compile_program
from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import CATALOG_PATH, load_catalog
from csf_kernels.runtime import config
from csf_kernels.runtime.integrity import check_entry, check_identity
from csf_kernels.runtime.manifest import EXTENSIONS, Manifest, ProgramEntry, sha256_bytes
from csf_kernels.runtime.toolchain import TARGET, TOOLCHAIN, cache_key, installed_toolchain, sources_hash

__all__ = ["build_cache", "main"]


def build_cache(out_root: Path, *, catalog_path: Path = CATALOG_PATH, jobs: int = 1, progress: bool = True) -> Path:
    """Build the whole catalog's cache; return its directory."""
    from tqdm import tqdm

    from csf_codec import CSF_FORMAT_VERSION

    have = installed_toolchain()
    for name, pinned in TOOLCHAIN.items():
        if have[name] != pinned:
            raise SystemExit(f"aot_build: installed {name} {have[name]}, the cache pins {pinned}")
    key = cache_key()
    specs = catalog_specs(load_catalog(Path(catalog_path)))
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = out_root / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    (tmp / "programs").mkdir(parents=True)
    entries: dict[str, ProgramEntry] = {}
    try:
        ordered = sorted(specs.items())
        with ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else _Inline() as pool:
            results = pool.map(compile_program, [spec for _, (spec, _) in ordered])
            bar = tqdm(
                zip(ordered, results, strict=True),
                total=len(ordered),
                desc="aot_build",
                unit="program",
                disable=not progress,
            )
            for (pkey, (spec, geos)), art in bar:
                name = f"programs/{pkey}{EXTENSIONS[art.kind]}"
                (tmp / name).write_bytes(art.data)
                entries[pkey] = entry = ProgramEntry.sealed(
                    key=pkey,
                    spec={"kernel": spec.kernel, "version": spec.version, "facts": spec.fact},
                    kind=art.kind,
                    file=name,
                    sha256=sha256_bytes(art.data),
                    nbytes=len(art.data),
                    launch=art.launch,
                    geometries=tuple(sorted(set(geos))),
                )
                # never write an entry the runtime would refuse
                check_entry(tmp, entry, spec)
                check_identity(entry, art.data, f"{name}: the binary of {spec.describe()}")
        manifest = Manifest(
            cache_key=key,
            sources_sha256=sources_hash(),
            toolchain=dict(TOOLCHAIN),
            target=dict(TARGET),
            csf_format=CSF_FORMAT_VERSION,
            catalog_sha256=hashlib.sha256(Path(catalog_path).read_bytes()).hexdigest(),
            programs=entries,
        )
        (tmp / "manifest.json").write_text(manifest.to_json())
        final = out_root / key
        stale = out_root / f".stale-{key}-{uuid.uuid4().hex[:8]}"
        if final.exists():
            os.rename(final, stale)
        os.rename(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _summary(final, entries)
    return final


class _Inline:
    """A stand-in for a process pool with one worker: compile in this process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def map(fn, items):
        return map(fn, items)


def _summary(root: Path, entries: dict[str, ProgramEntry]) -> None:
    by_kind: dict[str, list[int]] = {}
    for e in entries.values():
        by_kind.setdefault(e.kind, []).append(e.nbytes)
    total = sum(sum(v) for v in by_kind.values())
    print(f"aot_build: {root}")
    for kind, sizes in sorted(by_kind.items()):
        print(f"  {kind:14s} {len(sizes):4d} programs {sum(sizes) / 2**20:8.2f} MiB")
    print(f"  {'total':14s} {len(entries):4d} programs {total / 2**20:8.2f} MiB")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="aot_build", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="aot_cache root (default: $CSF_AOT_CACHE or ./aot_cache)")
    ap.add_argument("--catalog", type=Path, default=CATALOG_PATH)
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    env.configure_runtime()
    build_cache(a.out or config.cache_root(), catalog_path=a.catalog, jobs=a.jobs, progress=not a.no_progress)


if __name__ == "__main__":
    sys.exit(main())
