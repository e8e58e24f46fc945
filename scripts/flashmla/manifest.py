"""The staged FlashMLA tree's manifest (``.peers/flashmla/MANIFEST.json``): which commits it holds and a digest of
its files, written by ``scripts/stage_flashmla.sh`` and checked there (to skip a restage) and by bench_mla's
``flashmla`` arm (to refuse a tree that is not the pinned commit's, or was changed since). Standard library only.

    python3 scripts/flashmla/manifest.py write  STAGED_DIR FLASHMLA_COMMIT CUTLASS_COMMIT
    python3 scripts/flashmla/manifest.py check  STAGED_DIR [FLASHMLA_COMMIT]     # exit 0: staged and intact
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

MANIFEST = "MANIFEST.json"
TREES = ("flashmla", "cutlass")  # the staged source trees; build/ and the manifest itself are not part of it


class ManifestError(ValueError):
    """The staged tree is missing, not the pinned commit's, or differs from what was staged."""


def tree_digest(staged: Path) -> tuple[str, int, int]:
    """(sha256 over each staged file's relative path and bytes in path order, files, bytes)."""
    h = hashlib.sha256()
    files = total = 0
    for tree in TREES:
        for f in sorted(p for p in (staged / tree).rglob("*") if p.is_file()):
            data = f.read_bytes()
            h.update(str(f.relative_to(staged)).encode() + b"\0" + len(data).to_bytes(8, "little") + data)
            files += 1
            total += len(data)
    return h.hexdigest(), files, total


def write_manifest(staged: Path, flashmla_commit: str, cutlass_commit: str) -> dict:
    digest, files, total = tree_digest(staged)
    doc = {"flashmla_commit": flashmla_commit, "cutlass_commit": cutlass_commit,
           "tree_sha256": digest, "files": files, "bytes": total}  # fmt: skip
    (staged / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def check_manifest(staged: Path, flashmla_commit: str | None = None) -> dict:
    """The manifest of an intact staged tree (of ``flashmla_commit`` where given), else ManifestError."""
    path = staged / MANIFEST
    if not path.is_file():
        raise ManifestError(f"no FlashMLA staged at {staged} (no {MANIFEST}): run scripts/stage_flashmla.sh")
    try:
        doc = json.loads(path.read_text())
        keys = ("flashmla_commit", "cutlass_commit", "tree_sha256")
        missing = [k for k in keys if not isinstance(doc.get(k), str)]
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ManifestError(f"{path} is not a manifest: {exc}") from None
    if missing:
        raise ManifestError(f"{path} lacks {', '.join(missing)}")
    if flashmla_commit is not None and doc["flashmla_commit"] != flashmla_commit:
        raise ManifestError(f"{staged} holds FlashMLA {doc['flashmla_commit']}, not the pinned {flashmla_commit}")
    digest, _, _ = tree_digest(staged)
    if digest != doc["tree_sha256"]:
        raise ManifestError(f"{staged} differs from what was staged (tree sha256 {digest[:16]}, manifest "
                            f"{doc['tree_sha256'][:16]}): run scripts/stage_flashmla.sh again")  # fmt: skip
    return doc


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "write":
        print(json.dumps(write_manifest(Path(argv[1]), argv[2], argv[3])))
        return 0
    if len(argv) in (2, 3) and argv[0] == "check":
        try:
            check_manifest(Path(argv[1]), argv[2] if len(argv) == 3 else None)
        except ManifestError as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
