"""The CuTe DSL inline stage decoder builds ahead of time on a GPU-less machine into a self-contained .so.

Needs nvidia-cutlass-dsl, gcc and a CUDA toolkit's libcudart_static.a; skipped (with the reason) without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the stage decoder cannot be compiled here")

from csf_kernels.aot import cute_export as export

ROOT = Path(__file__).resolve().parents[2]
S = 96
ALLOWED_NEEDED = {"libc.so.6", "ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libcuda.so.1"}


def _toolchain_or_skip():
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C compiler (gcc) to link the shared object")
    try:
        export._cudart_static()
    except RuntimeError as e:
        pytest.skip(str(e))
    if shutil.which("readelf") is None or shutil.which("nm") is None:
        pytest.skip("binutils (readelf, nm) missing")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _toolchain_or_skip()
    out = tmp_path_factory.mktemp("stage_decoder_a")
    return export.build_stage_decoder(S, out), out


def _env() -> dict[str, str]:
    src = [str(ROOT / "packages" / p / "src") for p in ("csf-codec", "csf-kernels")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(src)}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_shared_object_needs_only_libc_and_the_driver(built):
    meta, out = built
    so = Path(meta["paths"]["so"])
    assert so.is_file() and so.parent == out and so.name == f"libcsf_stage_decoder_s{S}.so"
    dyn = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    needed = {line.split("[", 1)[1].split("]", 1)[0] for line in dyn.splitlines() if "(NEEDED)" in line}
    assert needed and needed <= ALLOWED_NEEDED, needed
    for bad in ("cudart", "cutlass", "cute_dsl", "python", "libstdc++", "RPATH", "RUNPATH"):
        assert bad not in dyn, f"{so.name} depends on {bad}:\n{dyn}"
    if shutil.which("ldd"):
        ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        assert "not found" not in ldd and "cudart" not in ldd and "python" not in ldd, ldd


def test_exported_symbols_match_the_header(built):
    meta, _ = built
    so, header = Path(meta["paths"]["so"]), Path(meta["paths"]["header"])
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    defined = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    for sym in meta["symbols"].values():
        if sym != meta["symbols"]["prefix"]:
            assert sym in defined, f"{sym} is not exported by {so.name}"
    assert not any(s.startswith(("cuda", "_cuda", "cu")) for s in defined), "the static runtimes leak symbols"
    text = header.read_text()
    assert meta["c_signatures"]["entry"] + ";" in text
    assert [a["name"] for a in meta["args"]] == ["base_ref", "base_delta", "records", "raw", "out", "stream"]
    assert meta["packed_args"] == ["base_ref", "base_delta", "records", "raw", "out", "&stream", "&ret"]
    records = meta["args"][2]
    assert records["c_fields"] == [
        ["data", "void *", 1],
        ["dynamic_shapes", "int32_t", 2],
        ["dynamic_strides", "int64_t", 1],
    ]
    assert meta["launch"] == {**meta["launch"], "block": [128, 1, 1], "dynamic_shared_bytes": 2 * S}


def test_sass_uses_cp_async_and_never_spills(built):
    meta, _ = built
    cubin = Path(meta["paths"]["cubin"])
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    assert hashlib.sha256(cubin.read_bytes()).hexdigest() == meta["sha256"]["cubin"]
    sass = meta["sass"]
    if sass is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled tools) to disassemble the cubin")
    assert sass["ldgsts"] >= 1 and all(f.endswith(".128") for f in sass["ldgsts_forms"]), sass["ldgsts_forms"]
    assert sass["local_memory_ops"] == 0 and sass["local_bytes"] == 0 and sass["stack_bytes"] == 0, sass
    assert sass["opcodes"].get("BAR", 0) >= 2 and sass["opcodes"].get("STG", 0) >= 1


def test_loads_with_ctypes_without_cutlass(built):
    meta, _ = built
    code = (
        "import sys; from csf_kernels.runtime.cute_so import load_cute_so; p = load_cute_so(sys.argv[1]); "
        "assert p.num_args == 7 and len(p.tensor_args) == 5; "
        "assert not {'cutlass', 'triton'} & set(sys.modules), sorted(sys.modules)"
    )
    env = _env()
    subprocess.run([sys.executable, "-c", code, meta["paths"]["so"]], check=True, env=env, timeout=120)


def test_missing_symbol_is_reported_with_the_so_and_symbol_name(built):
    from csf_kernels.runtime.cute_so import CuteSharedObject, CuteSOError

    meta, _ = built
    broken = {**meta, "symbols": {**meta["symbols"], "entry": "csf_no_such_symbol"}}
    with pytest.raises(CuteSOError, match=r"libcsf_stage_decoder_s96\.so.*csf_no_such_symbol"):
        CuteSharedObject(meta["paths"]["so"], broken)
    with pytest.raises(CuteSOError, match="does not exist"):
        CuteSharedObject(Path(meta["paths"]["so"]).with_name("libmissing.so"))


def test_build_is_deterministic_across_processes_and_directories(built, tmp_path):
    meta, out = built
    other = tmp_path / "elsewhere" / "b"
    code = "import sys; from pathlib import Path; from csf_kernels.aot.cute_export import build_stage_decoder; "
    code += f"build_stage_decoder({S}, Path(sys.argv[1]))"
    env = _env()
    subprocess.run([sys.executable, "-c", code, str(other)], check=True, env=env, timeout=300)
    for key, name in meta["files"].items():
        assert _sha(out / name) == _sha(other / name), f"{key} ({name}) differs between two builds"
    again = json.loads((other / meta["files"]["metadata"]).read_text())
    assert again["sha256"] == meta["sha256"]


def test_rejects_impossible_record_sizes(tmp_path):
    from csf_kernels.record.cute_stage_decoder import check_record_bytes

    for bad in (72, 100, 464):
        with pytest.raises(ValueError, match="multiple of 16"):
            check_record_bytes(bad)
    assert check_record_bytes(448) == 448
