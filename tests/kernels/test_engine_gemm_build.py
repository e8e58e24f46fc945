"""The engine's grouped FP4 GEMM builds for sm_90a on a GPU-less machine: no spills, register budgets applied, and its
wgmmas pipelined as its schedule says (ptxas serializes wgmma when it cannot prove the A-register conversions safe;
the SASS then waits for zero wgmmas after each one), MXFP4 and NVFP4 alike; NVFP4 programs convert E4M3 factors and
multiply by the global scale, MXFP4 programs do neither. Inline-scale programs add producer warp 2's record decoder
(bulk copies, a warp ballot) within the producers' 40 registers and leave the consumers' SASS facts as they were."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the engine cannot be compiled here")

from csf_kernels.aot import cute_export as export
from csf_kernels.moe.kernels.engine_mainloop import STEP_GROUP

from .test_stage_decoder_build import _toolchain_or_skip

# (routes a block, fused activation, bias) of each format
_MXFP4 = [(16, 0, False), (32, 0, False), (64, 0, False), (128, 0, False), (256, 0, False), (16, 2, True),
          (128, 1, False), (256, 2, True)]  # fmt: skip
_NVFP4 = [(16, 0, False), (256, 0, False), (128, 1, False), (256, 2, True)]
_INLINE = [(16, 0, False, "mxfp4"), (256, 0, False, "mxfp4"), (256, 2, True, "mxfp4"), (16, 0, False, "nvfp4"),
           (128, 1, False, "nvfp4")]  # fmt: skip
# the stage schedule at the decode block sizes (where the catalog holds it), plain, fused, inline and NVFP4
_STAGE = [(16, 0, False, "mxfp4", "native"), (32, 0, False, "mxfp4", "native"), (64, 0, False, "mxfp4", "native"),
          (16, 2, True, "mxfp4", "native"), (64, 2, True, "mxfp4", "inline"), (32, 1, False, "nvfp4", "native"),
          (16, 0, False, "nvfp4", "inline")]  # fmt: skip
VARIANTS = (
    [(*v, "mxfp4", "native", "slice") for v in _MXFP4]
    + [(*v, "nvfp4", "native", "slice") for v in _NVFP4]
    + [(*v, "inline", "slice") for v in _INLINE]
    + [(*v, "stage") for v in _STAGE]
)


def _variant_id(v) -> str:
    return f"n{v[0]}-act{v[1]}{'-bias' if v[2] else ''}-{v[3]}-{v[4]}-{v[5]}"


@pytest.fixture(scope="module", params=VARIANTS, ids=_variant_id)
def built(request, tmp_path_factory):
    _toolchain_or_skip()
    tool = export.find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to read the SASS")
    tile_n, act, bias, fmt, scales, schedule = request.param
    out = tmp_path_factory.mktemp(f"engine{tile_n}")
    meta = export.build_cute_program(export.engine_gemm_program(tile_n, act, bias, fmt, scales, schedule), out)
    sass = subprocess.run([tool, "-sass", meta["paths"]["cubin"]], capture_output=True, text=True, check=True).stdout
    return tile_n, meta, sass


def test_no_spills_and_register_split(built):
    _, meta, sass = built
    facts = meta["sass"]
    assert facts["local_bytes"] == 0 and facts["local_memory_ops"] == 0
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x28" in sass  # producer: 40 registers
    assert "USETMAXREG.TRY_ALLOC.CTAPOOL" in sass and "0xe8" in sass  # consumers: 232


def _wgmma_events(sass: str, tile_n: int) -> list[str]:
    """The consumers' wgmma events in program order: ``F`` a fence (WARPGROUP.ARRIVE), ``m`` a wgmma that does not
    close its commit group, ``M`` one that does (``gsb0``), ``W<n>`` a wait for at most n groups in flight."""
    events = []
    for line in sass.splitlines():
        if "WARPGROUP.ARRIVE" in line:
            events.append("F")
        elif f"HGMMA.64x{tile_n}x16.F32.BF16" in line:
            events.append("M" if "gsb0" in line.split(";")[0] else "m")
        elif m := re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d)", line):
            events.append(f"W{m.group(1)}")
    return events


def test_wgmma_pipelined(built):
    tile_n, meta, sass = built
    events = _wgmma_events(sass, tile_n)
    # one wgmma per K slice, A from registers: a group of STEP_GROUP steps, then the one-step remainder loop
    assert events.count("m") + events.count("M") == 4 * (STEP_GROUP + 1)
    if meta["schedule"] == "slice":
        # a wgmma a commit group, one left in flight while the next slice converts, except at each loop's last
        # slice (the group loop drains at its back edge)
        slice_ = ["F", "M", "W1"]
        group = slice_ * (4 * STEP_GROUP - 1) + ["F", "M", "W0"]
        assert events == group + slice_ * 3 + ["F", "M", "W0"]
        assert meta["wgmmas_in_flight"] == 2
    else:
        # a stage's four wgmmas back to back in one commit group after one fence, one group left in flight: the
        # group loop's last stage too (its group crosses the back edge), drained once after the loop; the
        # remainder's one-stage loop drains each stage
        stage = ["F", "m", "m", "m", "M"]
        assert events == [*stage, "W1"] * STEP_GROUP + ["W0", *stage, "W0"]
        assert meta["wgmmas_in_flight"] == 8


def test_stage_schedule_alternates_register_sets(built):
    """Consecutive stages of the stage schedule's group loop read disjoint A registers, the last and the first
    across the back edge too: the conversion of one stage never writes registers a wgmma in flight reads."""
    tile_n, meta, sass = built
    if meta["schedule"] != "stage":
        pytest.skip("the slice schedule has one fragment a slice")
    a_regs = [re.search(rf"HGMMA\.64x{tile_n}x16\.F32\.BF16 R\d+, (R\d+)", line).group(1)
              for line in sass.splitlines() if f"HGMMA.64x{tile_n}x16.F32.BF16" in line]  # fmt: skip
    stages = [set(a_regs[i : i + 4]) for i in range(0, 4 * STEP_GROUP, 4)]
    assert all(len(s) == 4 for s in stages)  # four fragments a stage
    for i in range(STEP_GROUP):
        assert not stages[i] & stages[(i + 1) % STEP_GROUP], (i, stages)


def test_scale_conversion_and_global_scale_by_format(built):
    tile_n, meta, sass = built
    nv = meta["fmt"] == "nvfp4"
    # NVFP4: each step unpacks two rows' scale words (two E4M3 pairs each) and widens eight factors; the
    # epilogue multiplies every accumulator by the expert's global scale. MXFP4: none of it.
    steps = STEP_GROUP + 1
    assert sass.count("F2FP.F16.E4M3.UNPACK_B") == (4 * steps if nv else 0)
    assert sass.count("HADD2.F32") == (8 * steps if nv else 0)
    if meta["act"] == 0:  # the plain epilogue multiplies nothing else: a thread's 64 x TILE_N / 128 accumulators
        assert sass.count("FMUL") == (tile_n // 2 if nv else 0)


def _producer_registers(sass: str) -> int:
    """The highest register the producer warpgroup's code names: the instructions between its register release and
    the consumers' allocation (the producers' branches, the decoder warp's included)."""
    lines = sass.splitlines()
    start = next(i for i, line in enumerate(lines) if "USETMAXREG.DEALLOC" in line)
    end = next(i for i, line in enumerate(lines) if "USETMAXREG.TRY_ALLOC" in line)
    code = [line.split("/*")[1] if line.count("/*") > 1 else line for line in lines[start:end]]
    return max(int(r) for line in code for r in re.findall(r"\bR(\d+)\b", line)) + 1


def test_producers_fit_their_registers(built):
    _, meta, sass = built
    assert _producer_registers(sass) <= 40
    inline = meta["scales"] == "inline"
    # the decoder warp: bulk copies of records (the prologue's and the loop's), the escape ballot's warp vote
    assert sass.count("UBLKCP.S.G") == (2 if inline else 0)
    assert ("VOTE.ANY" in sass) == inline


def test_metadata(built):
    tile_n, meta, _ = built
    assert meta["program"] == "engine_gemm" and meta["tile_n"] == tile_n
    scales = (
        ["base_ref", "base_delta", "block_start", "record_units", "body"] if meta["scales"] == "inline" else ["s_panel"]
    )
    assert [a["name"] for a in meta["args"]] == [
        "w_panel",
        *scales,
        "x",
        "out",
        "bias",
        "gscale",
        "block_expert",
        "meta",
        "ctas",
        "stream",
    ]
    if meta["scales"] == "native":
        panel = next(a for a in meta["args"] if a["name"] == "s_panel")
        assert panel["dtype"] == ("uint32" if meta["fmt"] == "nvfp4" else "uint8")
    else:
        starts = next(a for a in meta["args"] if a["name"] == "block_start")
        assert starts["dtype"] == "int32"  # 16-byte units
    assert Path(meta["paths"]["so"]).stat().st_size > 0
