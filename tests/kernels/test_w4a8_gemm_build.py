"""The engine's grouped W4A8 GEMM builds for sm_90a on a GPU-less machine: no spills, the producer / consumer register
split, FP8 wgmma with A from registers, and the folded path's wgmmas pipelined (one left in flight while the next
k32 slice converts: ptxas serializes every wgmma when it cannot prove the A-register conversions safe, and the SASS
then waits for zero after each one)."""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the engine cannot be compiled here")

from csf_kernels.aot import cute_export as export

from .test_stage_decoder_build import _toolchain_or_skip

# (routes a block, fused activation, bias)
VARIANTS = [(16, 0, False), (64, 0, False), (128, 0, False), (16, 2, True), (128, 1, False), (128, 2, True)]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: f"n{v[0]}-act{v[1]}{'-bias' if v[2] else ''}")
def built(request, tmp_path_factory):
    _toolchain_or_skip()
    tool = export.find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to read the SASS")
    tile_n, act, bias = request.param
    out = tmp_path_factory.mktemp(f"w4a8_{tile_n}")
    meta = export.build_cute_program(export.w4a8_gemm_program(tile_n, act, bias), out)
    sass = subprocess.run([tool, "-sass", meta["paths"]["cubin"]], capture_output=True, text=True, check=True).stdout
    return tile_n, meta, sass


def test_no_spills_and_register_split(built):
    _, meta, sass = built
    facts = meta["sass"]
    assert facts["local_bytes"] == 0 and facts["local_memory_ops"] == 0
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x28" in sass  # producer: 40 registers
    assert "USETMAXREG.TRY_ALLOC.CTAPOOL" in sass and "0xe8" in sass  # consumers: 232


def test_fp8_wgmma_pipelined_on_the_folded_path(built):
    tile_n, _, sass = built
    # four k32 wgmmas a stage on each path (folded, promoted), E4M3 x E4M3 into fp32, A from registers
    assert sass.count(f"QGMMA.64x{tile_n}x32.F32.E4M3.E4M3") == 8
    assert "HGMMA" not in sass
    # folded: one wgmma left in flight while the next slice converts, all drained at the stage's end (the
    # promotion); promoted: drained after each k32 wgmma (its partial is scaled at once)
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 3
    assert sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 5


def test_conversion_and_promotion(built):
    tile_n, _, sass = built
    # a prmt a register: 4 a slice, 4 slices a stage, on both paths
    assert sass.count("PRMT") >= 32
    facts = {"fadd": sass.count("FADD"), "ffma": sass.count("FFMA")}
    assert facts["fadd"] >= tile_n // 2  # the folded stage's acc += partial, tile_n / 2 values a thread
    assert facts["ffma"] >= 4 * tile_n // 2  # the promoted k32s' acc += partial * 2**d


def test_metadata(built):
    tile_n, meta, _ = built
    assert meta["program"] == "w4a8_gemm" and meta["tile_n"] == tile_n and meta["activations"] == "per_token"
    assert [a["name"] for a in meta["args"]] == [
        "w_panel", "s_panel", "bases", "flags", "x", "xscale", "out", "bias", "block_expert", "meta", "ctas", "stream",
    ]  # fmt: skip
    assert meta["ring_shared_bytes"] <= 232448 - 2048
