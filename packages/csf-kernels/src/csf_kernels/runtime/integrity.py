"""What the runtime checks before it trusts an AOT cache, one of its entries and one of its binaries.

Anyone who can write the cache directory can edit the manifest, swap, truncate or link files, or put a directory
where a file belongs; each of these is refused with :class:`CacheIntegrityError` naming the file and the program,
before any byte reaches the driver or the dynamic loader. In order:

1. the manifest (``check_built_for``): built for these sources, this toolchain, target and CSF format;
2. the entry (``check_entry``): its recorded spec hashes to its key and is the asked spec, whole; its binary lies
   at ``programs/<key>.<ext>`` exactly; its seal covers every other field;
3. the binary (``read_binary``): a regular file (no link, directory or device) of the recorded size and sha256,
   which names the entry points its launch facts call.

The bytes checked are the bytes loaded: a cubin goes to the driver from memory, a shared object is loaded from a
private copy (``cute_so``).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from csf_kernels.runtime.manifest import (
    BUILD_COMMAND,
    EXTENSIONS,
    CacheIntegrityError,
    Manifest,
    ProgramEntry,
    read_regular_file,
    sha256_bytes,
)
from csf_kernels.runtime.programs import ProgramSpec, program_key
from csf_kernels.runtime.toolchain import TARGET, TOOLCHAIN, sources_hash

__all__ = ["check_built_for", "check_entry", "check_identity", "read_binary"]

_EM_CUDA = 190  # ELF e_machine of a cubin
_ET_DYN = 3  # ELF e_type of a shared object
_SPEC_FIELDS = {"kernel", "version", "facts"}
# launch facts a Triton entry must carry, with their types (``LoadedProgram.from_cubin`` reads them)
_TRITON_LAUNCH = {
    "entry": str,
    "block": list,
    "shared": int,
    "global_scratch": list,
    "profile_scratch": list,
    "params": list,
    "triton": str,
}
_CUTE_SYMBOLS = ("entry", "init", "load_to_device")


def check_built_for(m: Manifest, cache_dir: Path, key: str) -> None:
    """Refuse a manifest built for other sources, another toolchain, target or CSF format."""
    from csf_codec import CSF_FORMAT_VERSION

    where = cache_dir / "manifest.json"
    rebuild = f"rebuild the cache with `{BUILD_COMMAND}`"
    if m.cache_key != key or m.sources_sha256 != sources_hash():
        raise CacheIntegrityError(
            f"{where}: the cache was built for other sources (manifest key {m.cache_key}, expected {key}); {rebuild}"
        )
    if m.toolchain != TOOLCHAIN:
        raise CacheIntegrityError(f"{where}: built with {m.toolchain}, this runtime loads {TOOLCHAIN}; {rebuild}")
    if m.target != TARGET:
        raise CacheIntegrityError(f"{where}: built for target {m.target}, this runtime needs {TARGET}; {rebuild}")
    if m.csf_format != CSF_FORMAT_VERSION:
        raise CacheIntegrityError(
            f"{where}: built for CSF format {m.csf_format}, this runtime reads {CSF_FORMAT_VERSION}; {rebuild}"
        )


def _label(spec: ProgramSpec) -> str:
    return f"program {spec.describe()} [key {spec.key}]"


def check_entry(cache_dir: Path, entry: ProgramEntry, spec: ProgramSpec) -> None:
    """Refuse an entry that does not describe exactly ``spec`` or was edited after the build."""
    where = f"{cache_dir / 'manifest.json'}: the entry of {_label(spec)}"
    recorded = entry.spec
    if set(recorded) != _SPEC_FIELDS or not isinstance(recorded.get("facts"), dict):
        raise CacheIntegrityError(f"{where} records a malformed spec {recorded!r}")
    canonical = json.dumps(recorded, sort_keys=True)
    if program_key(canonical) != entry.key or entry.key != spec.key:
        raise CacheIntegrityError(
            f"{where} is filed under key {entry.key}, but its recorded spec hashes to {program_key(canonical)}"
        )
    if canonical != spec.canonical():
        raise CacheIntegrityError(f"{where} records the spec {canonical}, not {spec.canonical()}")
    ext = EXTENSIONS.get(entry.kind)
    if ext is None:
        raise CacheIntegrityError(f"{where} has the unknown kind {entry.kind!r}")
    if entry.file != f"programs/{entry.key}{ext}":
        raise CacheIntegrityError(f"{where} names the binary {entry.file!r}, not programs/{entry.key}{ext}")
    if entry.entry_sha256 != entry.seal():
        raise CacheIntegrityError(f"{where} was altered after the build (entry_sha256 does not match its fields)")
    _check_launch_facts(entry, where)


def _check_launch_facts(entry: ProgramEntry, where: str) -> None:
    launch = entry.launch
    if entry.kind == "triton_cubin":
        bad = [k for k, t in _TRITON_LAUNCH.items() if not isinstance(launch.get(k), t)]
        if bad:
            raise CacheIntegrityError(f"{where} lacks well-formed launch facts {bad}")
        if launch["triton"] != TOOLCHAIN["triton"]:
            raise CacheIntegrityError(
                f"{where} was compiled by triton {launch['triton']}, this runtime loads triton "
                f"{TOOLCHAIN['triton']}; rebuild the cache with `{BUILD_COMMAND}`"
            )
    else:
        symbols = launch.get("symbols")
        if not isinstance(symbols, dict) or not all(isinstance(symbols.get(s), str) for s in _CUTE_SYMBOLS):
            raise CacheIntegrityError(f"{where} names no entry, init and load_to_device symbols")
        if not isinstance(launch.get("args"), list) or not isinstance(launch.get("num_args"), int):
            raise CacheIntegrityError(f"{where} lacks well-formed launch facts (args, num_args)")


def read_binary(cache_dir: Path, entry: ProgramEntry, spec: ProgramSpec) -> bytes:
    """The checked bytes of the entry's binary (``check_entry`` has passed)."""
    programs = cache_dir / "programs"
    try:
        mode = os.lstat(programs).st_mode
    except OSError as e:
        raise CacheIntegrityError(
            f"{programs}: unreadable, so is the binary of {_label(spec)} ({e.strerror})"
        ) from None
    if not stat.S_ISDIR(mode):
        raise CacheIntegrityError(
            f"{programs}: the programs folder, holding the binary of {_label(spec)}, is not a directory (a link?)"
        )
    path = cache_dir / entry.file
    data = read_regular_file(path, f"the binary of {_label(spec)}")
    if len(data) != entry.nbytes:
        raise CacheIntegrityError(
            f"{path}: the binary of {_label(spec)} is {len(data)} bytes, the manifest says {entry.nbytes} "
            "(truncated or replaced)"
        )
    if sha256_bytes(data) != entry.sha256:
        raise CacheIntegrityError(f"{path}: the sha256 of the binary of {_label(spec)} does not match the manifest")
    check_identity(entry, data, f"{path}: the binary of {_label(spec)}")
    return data


def check_identity(entry: ProgramEntry, data: bytes, where: str) -> None:
    """Refuse a binary that is not of the entry's kind or does not define the entry points its launch facts name
    (the build runs this too, so it never writes an entry the runtime would refuse)."""
    if data[:4] != b"\x7fELF":
        raise CacheIntegrityError(f"{where} is not an ELF file")
    if entry.kind == "triton_cubin":
        if int.from_bytes(data[18:20], "little") != _EM_CUDA:
            raise CacheIntegrityError(f"{where} is not a cubin (ELF machine {int.from_bytes(data[18:20], 'little')})")
        name = entry.launch["entry"]
        if b".text." + name.encode() + b"\0" not in data:
            raise CacheIntegrityError(f"{where} defines no kernel {name}, the entry point its launch facts name")
        return
    if int.from_bytes(data[16:18], "little") != _ET_DYN:
        raise CacheIntegrityError(f"{where} is not a shared object")
    for what in _CUTE_SYMBOLS:
        name = entry.launch["symbols"][what]
        if b"\0" + name.encode() + b"\0" not in data:
            raise CacheIntegrityError(f"{where} does not export {name}, the {what} symbol its metadata names")
    recorded = entry.launch.get("sha256")
    if not isinstance(recorded, dict) or recorded.get("so") != entry.sha256:
        raise CacheIntegrityError(f"{where}: the export metadata records another shared object ({recorded!r})")
