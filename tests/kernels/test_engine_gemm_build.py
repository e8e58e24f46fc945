"""The engine's grouped FP4 GEMM builds for sm_90a on a GPU-less machine: no spills, register budgets applied, and its
wgmmas pipelined as its schedule says (ptxas serializes wgmma when it cannot prove the A-register conversions safe;
the SASS then waits for zero wgmmas after each one), MXFP4 and NVFP4 alike, in every row mode and of both scale
sources; NVFP4 programs convert E4M3 factors and multiply by the global scale, MXFP4 programs do neither. Every
program waits for its predecessor and lets its successor launch once (PDL); FC1's gathering producer copies its rows
by 16-byte ``cp.async`` (no activation TMA), FC2's scattering epilogue stores them by 16-byte vector stores (no TMA
store). Inline-scale programs add producer warp 2's record decoder (bulk copies, a warp ballot) within the producers'
40 registers, their gather by the other three producer warps, and leave the consumers' SASS facts as they were."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the engine cannot be compiled here")

from csf_kernels.aot import cute_export as export
from csf_kernels.moe.engine_rows import GATHER_WARPS, OUT_CHUNKS, ROW_CHUNKS, STORE_THREADS, epi_routes
from csf_kernels.moe.kernels.engine_mainloop import STEP_GROUP
from csf_kernels.moe.kernels.engine_producer import UNROLLED_COPIES

from .test_stage_decoder_build import _toolchain_or_skip

# (routes a block, fused activation, bias, row mode) of each format and scale source
_MXFP4 = [(16, 0, False, "dense"), (32, 0, False, "dense"), (64, 0, False, "dense"), (128, 0, False, "dense"),
          (256, 0, False, "dense"), (16, 2, True, "gather"), (128, 1, False, "gather"), (256, 2, True, "gather"),
          (256, 0, False, "gather"), (16, 0, False, "scatter"), (64, 0, False, "scatter"),
          (256, 0, False, "scatter")]  # fmt: skip
_NVFP4 = [(16, 0, False, "dense"), (256, 0, False, "dense"), (128, 1, False, "gather"), (256, 2, True, "gather"),
          (32, 0, False, "scatter")]  # fmt: skip
_INLINE = [(16, 0, False, "dense", "mxfp4"), (16, 2, True, "gather", "mxfp4"), (256, 2, True, "gather", "mxfp4"),
           (256, 0, False, "scatter", "mxfp4"), (16, 0, False, "dense", "nvfp4"), (128, 1, False, "gather", "nvfp4"),
           (32, 0, False, "scatter", "nvfp4")]  # fmt: skip
# the stage schedule at the decode block sizes (where the catalog holds it): each row mode, plain, fused (FC1
# gathers), inline and NVFP4
_STAGE = [(16, 0, False, "dense", "mxfp4", "native"), (32, 0, False, "scatter", "mxfp4", "native"),
          (64, 0, False, "gather", "mxfp4", "native"), (16, 2, True, "gather", "mxfp4", "native"),
          (64, 2, True, "gather", "mxfp4", "inline"), (32, 1, False, "gather", "nvfp4", "native"),
          (16, 0, False, "dense", "nvfp4", "inline")]  # fmt: skip
VARIANTS = (
    [(*v, "mxfp4", "native", "slice") for v in _MXFP4]
    + [(*v, "nvfp4", "native", "slice") for v in _NVFP4]
    + [(*v, "inline", "slice") for v in _INLINE]
    + [(*v, "stage") for v in _STAGE]
)


def _variant_id(v) -> str:
    return f"n{v[0]}-act{v[1]}{'-bias' if v[2] else ''}-{v[3]}-{v[4]}-{v[5]}-{v[6]}"


def build_sass(program, out) -> tuple[dict, str]:
    """Build an engine program for sm_90a into ``out``: its metadata and its SASS (skips without the toolchain or
    cuobjdump); the engine's build tests share it."""
    _toolchain_or_skip()
    tool = export.find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to read the SASS")
    meta = export.build_cute_program(program, out)
    sass = subprocess.run([tool, "-sass", meta["paths"]["cubin"]], capture_output=True, text=True, check=True).stdout
    return meta, sass


@pytest.fixture(scope="module", params=VARIANTS, ids=_variant_id)
def built(request, tmp_path_factory):
    tile_n, act, bias, io, fmt, scales, schedule = request.param
    program = export.engine_gemm_program(tile_n, act, bias, fmt, scales=scales, io=io, schedule=schedule)
    meta, sass = build_sass(program, tmp_path_factory.mktemp(f"engine{tile_n}"))
    return tile_n, meta, sass


def assert_register_pool_suffices(meta: dict, sass: str, ctas_per_sm: int = 1) -> None:
    """``setmaxnreg``'s split fits the registers the CTA launched with: the producer warpgroup's 128 threads at the
    lowered count and the consumers' 256 at the raised one take no more than 384 x the launch count (a consumer's
    ``TRY_ALLOC`` would otherwise wait for registers no warp gives back: a hang, not an error); and the launch count
    itself lets ``ctas_per_sm`` CTAs share an SM's 65,536."""
    producer = int(re.search(r"USETMAXREG\.DEALLOC\.CTAPOOL (0x[0-9a-f]+)", sass).group(1), 16)
    consumer = int(re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, (0x[0-9a-f]+)", sass).group(1), 16)
    launched = meta["sass"]["registers"]
    assert 128 * producer + 256 * consumer <= 384 * launched, (producer, consumer, launched)
    assert ctas_per_sm * 384 * launched <= 65536, (ctas_per_sm, launched)


def test_no_spills_and_register_split(built):
    _, meta, sass = built
    facts = meta["sass"]
    assert facts["local_bytes"] == 0 and facts["local_memory_ops"] == 0
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x28" in sass  # producer: 40 registers
    assert "USETMAXREG.TRY_ALLOC.CTAPOOL" in sass and "0xe8" in sass  # consumers: 232
    assert_register_pool_suffices(meta, sass)


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


def _k_loops(meta) -> int:
    """The K loops a program holds: MXFP4's two-multiply loop and its one-multiply twin (row blocks whose E8M0 bytes
    allow it), NVFP4's one."""
    return 1 if meta["fmt"] == "nvfp4" else 2


def test_wgmma_pipelined(built):
    tile_n, meta, sass = built
    events = _wgmma_events(sass, tile_n)
    loops = _k_loops(meta)
    # one wgmma per K slice, A from registers: a group of STEP_GROUP steps, then the one-step remainder loop; each
    # K loop the same
    assert events.count("m") + events.count("M") == 4 * (STEP_GROUP + 1) * loops
    if meta["schedule"] == "slice":
        # a wgmma a commit group, one left in flight while the next slice converts, except at each loop's last
        # slice (the group loop drains at its back edge)
        slice_ = ["F", "M", "W1"]
        group = slice_ * (4 * STEP_GROUP - 1) + ["F", "M", "W0"]
        assert events == (group + slice_ * 3 + ["F", "M", "W0"]) * loops
        assert meta["wgmmas_in_flight"] == 2
    else:
        # a stage's four wgmmas back to back in one commit group after one fence, one group left in flight: the
        # group loop's last stage too (its group crosses the back edge), drained once after the loop; the
        # remainder's one-stage loop drains each stage
        stage = ["F", "m", "m", "m", "M"]
        assert events == ([*stage, "W1"] * STEP_GROUP + ["W0", *stage, "W0"]) * loops
        assert meta["wgmmas_in_flight"] == 8


def test_one_multiply_loop_saves_a_multiply_a_pair(built):
    """MXFP4's one-multiply loop converts a step's 16 pairs with 16 HMUL2 where the two-multiply loop takes 32."""
    _, meta, sass = built
    steps = STEP_GROUP + 1
    hmul2 = sass.count("HMUL2")
    if meta["fmt"] == "nvfp4":
        assert hmul2 == 32 * steps
    else:
        assert hmul2 == 32 * steps + 16 * steps


def test_stage_schedule_alternates_register_sets(built):
    """Consecutive stages of the stage schedule's group loop read disjoint A registers, the last and the first
    across the back edge too: the conversion of one stage never writes registers a wgmma in flight reads."""
    tile_n, meta, sass = built
    if meta["schedule"] != "stage":
        pytest.skip("the slice schedule has one fragment a slice")
    a_regs = [re.search(rf"HGMMA\.64x{tile_n}x16\.F32\.BF16 R\d+, (R\d+)", line).group(1)
              for line in sass.splitlines() if f"HGMMA.64x{tile_n}x16.F32.BF16" in line]  # fmt: skip
    per_loop = 4 * (STEP_GROUP + 1)
    for first in range(0, per_loop * _k_loops(meta), per_loop):  # each K loop's group
        stages = [set(a_regs[first + i : first + i + 4]) for i in range(0, 4 * STEP_GROUP, 4)]
        assert all(len(s) == 4 for s in stages)  # four fragments a stage
        for i in range(STEP_GROUP):
            assert not stages[i] & stages[(i + 1) % STEP_GROUP], (first, i, stages)


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
    # the decoder warp: bulk copies of records (a cold unit's first, the loop's of this unit and of the next), the
    # escape ballot's warp vote
    assert sass.count("UBLKCP.S.G") == (3 if inline else 0)
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
        "sorted_ids",
        "wide",
        "ctas",
        "top_k",
        "pairs",
        "split_steps",
        "pdl",
        "stream",
    ]
    if meta["scales"] == "native":
        panel = next(a for a in meta["args"] if a["name"] == "s_panel")
        assert panel["dtype"] == ("uint32" if meta["fmt"] == "nvfp4" else "uint8")
    else:
        starts = next(a for a in meta["args"] if a["name"] == "block_start")
        assert starts["dtype"] == "int32"  # 16-byte units
    assert Path(meta["paths"]["so"]).stat().st_size > 0


def test_dependent_launch(built):
    _, _, sass = built
    # griddepcontrol.wait once, before the first global read; launch_dependents once, right after it
    assert sass.count("ACQBULK") == 1 and sass.count("PREEXIT") == 1


def test_routed_rows(built):
    tile_n, meta, sass = built
    io, scales = meta["io"], meta["scales"]
    # weights and (native) scales by TMA; the activations as one TMA tile, or gathered: each gathering thread
    # 16-byte cp.asyncs (unrolled, once in warp 0's loop and once in the other gathering warps', where there are
    # others: not beside the inline source's decoders), then one arrival
    facts = meta["sass"]["opcodes"]
    assert sass.count("UTMALDG") == (scales == "native") + 1 + (io != "gather")
    copies = -(-tile_n // (32 * len(GATHER_WARPS[scales]) // ROW_CHUNKS))
    copies = copies if copies <= UNROLLED_COPIES else 1  # more: a loop
    loops = 1 + (len(GATHER_WARPS[scales]) > 1)
    assert facts.get("LDGSTS", 0) == (loops * copies if io == "gather" else 0)
    assert meta["sass"]["ldgsts_forms"] == (["LDGSTS.E.BYPASS.128"] if io == "gather" else [])
    if io == "scatter":  # no TMA store: 16-byte vector stores, per subtile one a pass of the consumers
        passes = -(-epi_routes(tile_n) // (STORE_THREADS // OUT_CHUNKS))
        assert sass.count("UTMASTG") == 0 and facts.get("STG", 0) == (tile_n // epi_routes(tile_n)) * passes
        assert sass.count("STG.E.128") == facts["STG"]
    if meta["act"]:  # the activated epilogue stores by plain global stores
        assert sass.count("UTMASTG") == 0


@pytest.fixture(scope="module", params=[(128, 0, False, "scatter", 1), (256, 2, True, "gather", 1),
                                        (256, 0, False, "dense", 2), (128, 1, False, "dense", 2)],
                ids=lambda v: f"n{v[0]}-{v[3]}-level{v[4]}")  # fmt: skip
def ragged(request, tmp_path_factory):
    _toolchain_or_skip()
    tool = export.find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to read the SASS")
    tile_n, act, bias, io, level = request.param
    out = tmp_path_factory.mktemp(f"ragged{tile_n}")
    program = export.engine_gemm_program(tile_n, act, bias, io=io, ragged=level)
    meta = export.build_cute_program(program, out)
    sass = subprocess.run([tool, "-sass", meta["paths"]["cubin"]], capture_output=True, text=True, check=True).stdout
    return tile_n, meta, sass


def test_ragged_programs_run_both_loops_pipelined_and_accumulating(ragged):
    """A ragged program holds the whole block's K loop and the half block's (``HGMMA.64x{N/2}``; at level 2 the
    quarter block's too, ``HGMMA.64x{N/4}``), each pipelined as the slice schedule's (one fence and one wait a
    wgmma), and every wgmma of each accumulates unconditionally: run 310's half loop carried the accumulate flag as
    a predicate (``UP0``) that was false."""
    tile_n, meta, sass = ragged
    parts = [tile_n, tile_n // 2] + ([tile_n // 4] if meta["ragged"] == 2 else [])
    loops = _k_loops(meta)  # each part's loop in its one- and two-multiply forms
    for n in parts:
        events = _wgmma_events(sass, n)
        assert events.count("M") == 4 * (STEP_GROUP + 1) * loops and events.count("m") == 0, n
    hgmma = [line.split(";")[0] for line in sass.splitlines() if "HGMMA." in line]
    assert len(hgmma) == 4 * len(parts) * (STEP_GROUP + 1) * loops
    assert not any("UP0" in line or "UPT" in line for line in hgmma)
    assert sass.count("WARPGROUP.ARRIVE") == len(hgmma) and meta["ragged"] in (1, 2)
    assert meta["sass"]["local_bytes"] == 0


@pytest.mark.parametrize(("tile_n", "act", "bias", "io", "scales"),
                         [(16, 2, True, "gather", "native"), (32, 0, False, "scatter", "native"),
                          (16, 1, False, "gather", "inline")])  # fmt: skip
def test_paired_programs_fit_two_ctas_an_sm(tmp_path, tile_n, act, bias, io, scales):
    """Two CTAs an SM: 80 registers a thread at launch (2 x 384 threads), the consumers raised to 96 and the
    producers lowered to 40 (128 x 40 + 256 x 96 <= 384 x 80), no spills, the stage schedule's wgmmas pipelined as
    in the one-CTA program."""
    _toolchain_or_skip()
    tool = export.find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to read the SASS")
    program = export.engine_gemm_program(tile_n, act, bias, scales=scales, io=io, schedule="stage", ctas_per_sm=2)
    meta = export.build_cute_program(program, tmp_path)
    sass = subprocess.run([tool, "-sass", meta["paths"]["cubin"]], capture_output=True, text=True, check=True).stdout
    facts = meta["sass"]
    assert facts["registers"] <= 80 and facts["local_bytes"] == 0 and facts["local_memory_ops"] == 0
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x28" in sass and re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL .*0x60", sass)
    assert_register_pool_suffices(meta, sass, ctas_per_sm=2)
    assert meta["ctas_per_sm"] == 2 and 2 * meta["ring_shared_bytes"] <= 227 * 1024
    events = _wgmma_events(sass, tile_n)
    loops = _k_loops(meta)
    assert events.count("W0") == 2 * loops and events.count("M") == (STEP_GROUP + 1) * loops  # as one CTA's


def test_the_program_refuses_the_removed_pingpong_schedule():
    """The ping-pong consumers are gone (``docs/moe-engine.md`` §4.13): the program refuses the schedule, naming
    those it has."""
    from csf_kernels.moe.kernels.engine_gemm import SCHEDULES, GroupedFp4Gemm

    assert "pingpong" not in SCHEDULES and {"slice", "stage"} <= set(SCHEDULES)
    with pytest.raises(ValueError, match=re.escape(f"schedules {SCHEDULES}; got 'pingpong'")):
        GroupedFp4Gemm(256, schedule="pingpong")
