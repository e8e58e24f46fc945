"""Transform warps (schedule ``transform``, ``csf_kernels.moe.kernels.engine_transform``) build for sm_90a without a
GPU: no spills under the producer warpgroup's 56 registers and the consumers' 224; the consumers convert nothing and
issue the stage schedule's wgmmas with A from shared memory (descriptors, no A registers); the conversions (and
their multiplies) happen once a stage in the transform warps (three, or two beside an inline decoder warp), which
``stmatrix`` each MMA warp's four K slices."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the engine cannot be compiled here")

from csf_kernels.aot import cute_export as export
from csf_kernels.moe.kernels.engine_gemm import GroupedFp4Gemm
from csf_kernels.moe.kernels.engine_mainloop import STEP_GROUP
from csf_kernels.moe.kernels.engine_transform import transform_warps

from .test_engine_gemm_build import assert_register_pool_suffices, build_sass

# (routes a block, activation, bias, format, rows, ragged, scales): the plain GEMM, FC2 scattering, gpt-oss's fused
# FC1, natively and from inline records
CASES = [(256, 0, False, "mxfp4", "dense", 1, "native"), (128, 0, False, "nvfp4", "scatter", 1, "native"),
         (256, 2, True, "mxfp4", "dense", 1, "native"), (256, 0, False, "mxfp4", "dense", 1, "inline"),
         (128, 0, False, "nvfp4", "scatter", 1, "inline"), (256, 2, True, "mxfp4", "dense", 1, "inline"),
         (64, 1, False, "mxfp4", "dense", 0, "inline")]  # fmt: skip


def _shares(scales: str) -> int:
    """MMA warps' fragments a transform warp converts a stage (8 dealt to its warps: the unrolled loop's shares)."""
    return -(-8 // len(transform_warps(scales == "inline")))


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"n{c[0]}-act{c[1]}-{c[3]}-{c[4]}-{c[6]}")
def built(request, tmp_path_factory):
    tile_n, act, bias, fmt, io, ragged, scales = request.param
    program = export.engine_gemm_program(tile_n, act, bias, fmt, scales, io, schedule="transform", ragged=ragged)
    meta, sass = build_sass(program, tmp_path_factory.mktemp(f"transform{tile_n}"))
    return request.param, meta, sass


def test_no_spills_and_the_register_split(built):
    _, meta, sass = built
    assert meta["sass"]["local_bytes"] == 0 and meta["sass"]["local_memory_ops"] == 0
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x38" in sass  # producers and transform warps: 56
    assert re.search(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, 0xe0", sass)  # consumers: 224
    assert_register_pool_suffices(meta, sass)


def _events(sass: str) -> tuple[list[str], list[int]]:
    """The consumers' wgmma events in program order (``F`` a fence, ``m`` / ``M`` a wgmma that does not / does close
    its commit group, ``W<n>`` a wait for at most n groups) and the wgmma widths in the order their loops come."""
    events, widths = [], []
    for line in sass.splitlines():
        if "WARPGROUP.ARRIVE" in line:
            events.append("F")
        elif m := re.search(r"HGMMA\.64x(\d+)x16\.F32\.BF16", line):
            if not widths or widths[-1] != int(m.group(1)):
                widths.append(int(m.group(1)))
            events.append("M" if "gsb0" in line.split(";")[0] else "m")
        elif m := re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d)", line):
            events.append(f"W{m.group(1)}")
    return events, widths


def test_consumers_read_a_from_shared_memory_a_stage_a_commit_group(built):
    (tile_n, _, _, _, _, ragged, _), _, sass = built
    hgmma = [line for line in sass.splitlines() if "HGMMA.64x" in line]
    assert hgmma and all(re.search(r"HGMMA\.\S+ R\d+, gdesc\[", line) for line in hgmma)  # A by descriptor
    stage = ["F", "m", "m", "m", "M"]
    loop = [*stage, "W1"] * STEP_GROUP + ["W0", *stage, "W0"]  # a stage a commit group, one group in flight
    events, widths = _events(sass)
    assert widths == ([tile_n // 2, tile_n] if ragged else [tile_n])  # ragged level 1: the half loop, then the whole
    assert events == loop * len(widths)


def test_transform_warps_convert_and_store_each_fragment_once(built):
    """Each of a transform warp's shares: four K slices converted (MXFP4 in a two- and a one-multiply branch: 48
    multiplies, NVFP4 32) and stored by four ``stmatrix.x4`` (the epilogue's subtiles go by the transposed form)."""
    (_, _, _, fmt, _, _, scales), _, sass = built
    per_share = 48 if fmt == "mxfp4" else 32
    assert sass.count("HMUL2") == _shares(scales) * per_share
    assert sass.count("STSM.16.M88.4") == _shares(scales) * 4


def test_transform_is_built_where_the_producer_warps_are_free():
    assert GroupedFp4Gemm(256, schedule="transform").stages == 4  # two 16 KB A tiles cost the ring one stage
    inline = GroupedFp4Gemm(256, scales="inline", schedule="transform")
    assert inline.decoders == (1,) and inline.transform_warps == (2, 3)  # one decoder beside two transform warps
    for bad in (dict(io="gather"), dict(tile_n=32), dict(ctas_per_sm=2, tile_n=64)):
        options = {"tile_n": 256, **bad}
        with pytest.raises(ValueError, match="transform"):
            GroupedFp4Gemm(options.pop("tile_n"), schedule="transform", **options)
