"""The engine GEMM's K-split programs (``partial``: float32 partials for few-token calls) build for sm_90a on a
GPU-less machine as the unsplit ones do: no spills, the producers within their 40 registers, the consumers' register
budget, the stage schedule's wgmmas pipelined as the unsplit program's (a split only moves where a unit's K loop
starts and how long it runs), and an epilogue of plain float32 stores (one a value, no TMA store, no stmatrix, no global
scale: the finish applies it), beside every other fact of the
gathering program it splits."""

from __future__ import annotations

import subprocess

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the engine cannot be compiled here")

from csf_kernels.aot import cute_export as export
from csf_kernels.moe.kernels.engine_mainloop import STEP_GROUP

from .test_engine_gemm_build import _k_loops, _producer_registers, _wgmma_events
from .test_stage_decoder_build import _toolchain_or_skip

# (routes a block, format, scale source, partial form, CTAs an SM): the decode block sizes the catalog splits
VARIANTS = [
    (16, "mxfp4", "native", "fc1", 2),
    (16, "mxfp4", "inline", "fc1", 2),
    (16, "mxfp4", "native", "rows", 2),
    (16, "mxfp4", "inline", "rows", 2),
    (16, "nvfp4", "native", "rows", 2),
    (16, "nvfp4", "inline", "fc1", 2),
    (32, "mxfp4", "inline", "rows", 2),
    (64, "nvfp4", "native", "fc1", 2),
]


@pytest.fixture(scope="module", params=VARIANTS, ids=lambda v: f"n{v[0]}-{v[1]}-{v[2]}-{v[3]}-occ{v[4]}")
def built(request, tmp_path_factory):
    _toolchain_or_skip()
    tool = export.find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to read the SASS")
    tile_n, fmt, scales, partial, occ = request.param
    out = tmp_path_factory.mktemp(f"split{tile_n}")
    program = export.engine_gemm_program(tile_n, 0, False, fmt, scales=scales, io="gather", schedule="stage",
                                         ctas_per_sm=occ, partial=partial)  # fmt: skip
    meta = export.build_cute_program(program, out)
    sass = subprocess.run([tool, "-sass", meta["paths"]["cubin"]], capture_output=True, text=True, check=True).stdout
    return tile_n, meta, sass


def test_no_spills_and_register_budgets(built):
    _, meta, sass = built
    facts = meta["sass"]
    assert facts["local_bytes"] == 0 and facts["local_memory_ops"] == 0 and facts["stack_bytes"] == 0
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x28" in sass  # producers: 40
    assert facts["registers"] <= (80 if meta["ctas_per_sm"] == 2 else 168)
    assert _producer_registers(sass) <= 40


def test_wgmma_pipelined_as_the_stage_schedule(built):
    tile_n, meta, sass = built
    events = _wgmma_events(sass, tile_n)
    stage = ["F", "m", "m", "m", "M"]
    loops = _k_loops(meta)
    assert events == ([*stage, "W1"] * STEP_GROUP + ["W0", *stage, "W0"]) * loops
    assert meta["wgmmas_in_flight"] == 8 and meta["stages"] >= 4


def test_partials_are_plain_float32_stores(built):
    """Each thread stores its ``TILE_N / 2`` accumulators (two rows, ``TILE_N / 4`` routes) as 32-bit stores; no
    TMA store, no bf16 rounding or stmatrix, no global-scale multiply in the epilogue."""
    tile_n, meta, sass = built
    facts = meta["sass"]["opcodes"]
    assert facts.get("STG", 0) == tile_n // 2
    assert sass.count("STG.E.128") == 0 and sass.count("STG.E.64") == 0
    assert "UTMASTG" not in sass and "STSM" not in facts
    assert facts.get("FMUL", 0) == 0


def test_metadata_and_dependent_launch(built):
    tile_n, meta, sass = built
    assert meta["partial"] in ("fc1", "rows") and meta["io"] == "gather" and meta["tile_n"] == tile_n
    out = next(a for a in meta["args"] if a["name"] == "out")
    assert out["dtype"] == "float32"
    names = [a["name"] for a in meta["args"]]
    assert names[-6:] == ["ctas", "top_k", "pairs", "split_steps", "pdl", "stream"]
    assert sass.count("ACQBULK") == 1 and sass.count("PREEXIT") == 1
    assert sass.count("UBLKCP.S.G") == (3 if meta["scales"] == "inline" else 0)


def test_partial_programs_refuse_other_row_modes():
    from csf_kernels.moe.kernels.engine_gemm import GroupedFp4Gemm

    with pytest.raises(ValueError, match="gathering programs"):
        GroupedFp4Gemm(16, io="dense", partial="rows")
    with pytest.raises(ValueError, match="partials"):
        GroupedFp4Gemm(16, act=1, io="gather", partial="fc1")
    with pytest.raises(ValueError, match="partials"):
        GroupedFp4Gemm(16, io="gather", partial="columns")
    with pytest.raises(ValueError, match="gathering programs"):
        GroupedFp4Gemm(128, io="gather", ragged=1, partial="rows")
