"""The engine GEMM's bound probes (diagnostic programs, ``csf_kernels.moe.kernels.engine_mainloop``) build for sm_90a
and are what they claim to bound: ``noconvert`` is the size's served loop without a conversion's multiply, its wgmmas
issued and retired as the served program's (slice at 256 routes a block, stage at 16); ``ss`` reads A from shared
memory (no A registers), a stage's four wgmmas a commit group, its A tiles' 32 KB taken from the ring where needed."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the engine cannot be compiled here")

from csf_kernels.aot import cute_export as export
from csf_kernels.moe.kernels.engine_gemm import GroupedFp4Gemm
from csf_kernels.moe.kernels.engine_mainloop import STEP_GROUP

from .test_engine_gemm_build import _wgmma_events, build_sass

TILE_N = 256
# (probe, routes a block): the 2048-8192-token size (slice schedule, one CTA an SM) and the decode size (stage, two)
CASES = [("noconvert", 256), ("ss", 256), ("noconvert", 16), ("ss", 16)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{p}-n{t}" for p, t in CASES])
def built(request, tmp_path_factory):
    probe, tile_n = request.param
    schedule, occ = ("slice", 1) if tile_n == 256 else ("stage", 2)
    program = export.engine_gemm_program(tile_n, schedule=schedule, ctas_per_sm=occ, probe=probe)
    meta, sass = build_sass(program, tmp_path_factory.mktemp(f"probe-{probe}-{tile_n}"))
    return probe, tile_n, meta, sass


def test_probes_build_without_spills_and_convert_nothing(built):
    probe, _, meta, sass = built
    assert meta["probe"] == probe
    assert meta["sass"]["local_bytes"] == 0 and meta["sass"]["local_memory_ops"] == 0
    assert "HMUL2" not in sass  # no scale multiply: the served program has 48 a step group (see its build test)


def test_probes_issue_the_loop_they_bound(built):
    probe, tile_n, _, sass = built
    events = _wgmma_events(sass, tile_n)
    a_operands = [re.search(rf"HGMMA\.64x{tile_n}x16\.F32\.BF16 R\d+, (\S+?),", line).group(1)
                  for line in sass.splitlines() if f"HGMMA.64x{tile_n}x16.F32.BF16" in line]  # fmt: skip
    loops = 1  # a probe converts nothing: no one-multiply twin of its loop
    if probe == "noconvert" and tile_n == 256:  # the served slice schedule: a wgmma a commit group, one in flight
        slice_ = ["F", "M", "W1"]
        group = slice_ * (4 * STEP_GROUP - 1) + ["F", "M", "W0"]
        assert events == (group + slice_ * 3 + ["F", "M", "W0"]) * loops
    else:  # the stage schedule: a stage's four wgmmas a commit group, one group in flight
        stage = ["F", "m", "m", "m", "M"]
        assert events == ([*stage, "W1"] * STEP_GROUP + ["W0", *stage, "W0"]) * loops
    # A from registers, or (ss) from shared memory by descriptor
    assert all(a.startswith("gdesc" if probe == "ss" else "R") for a in a_operands)


def test_ss_probe_gives_ring_stages_to_its_a_tiles():
    assert GroupedFp4Gemm(TILE_N, probe="ss").stages == GroupedFp4Gemm(TILE_N).stages - 1
    assert GroupedFp4Gemm(128, probe="ss").stages == GroupedFp4Gemm(128).stages  # 8 stages fit either way
    assert GroupedFp4Gemm(16, schedule="stage", ctas_per_sm=2, probe="ss").stages == 8
    with pytest.raises(ValueError, match="probe"):
        GroupedFp4Gemm(TILE_N, io="gather", probe="ss")


@pytest.mark.parametrize("tile_n", [128, 256])
def test_ss_probe_rings_as_the_transform_programs_it_stands_for(tile_n):
    """What the ss probe bounds is the transform warps' consumer side: at the sizes where the two are compared, the
    probe's ring has the transform program's stages, one CTA an SM (docs/moe-engine.md §7)."""
    probe = GroupedFp4Gemm(tile_n, probe="ss")
    transform = GroupedFp4Gemm(tile_n, schedule="transform", ragged=1)
    assert (probe.stages, probe.ctas_per_sm) == (transform.stages, transform.ctas_per_sm)
