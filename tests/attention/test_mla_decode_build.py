"""The Gluon sparse-MLA decode programs build ahead of time for sm_90a on a GPU-less machine, as their design
needs it.

Their register relabellings are checked while they compile (``convert_layout(..., assert_trivial=True)``
refuses any that would move data between threads); here: every catalog program builds, for every query
form; the 16-head programs leave room for two per SM (their shared memory: two chunk stages); the 32-head
program runs two warpgroups (a warp-specialized worker beside the program's 4 warps) and the 64-head program
three (two workers) in one SM's shared memory."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("triton")

from csf_kernels.aot.compile_triton import compile_triton
from csf_kernels.aot.cute_export import find_cuobjdump
from csf_kernels.mla.heuristics import decode_config
from csf_kernels.mla.specs import (
    MLA_DECODE_MMA,
    MLA_DECODE_WGMMA,
    MLA_DECODE_WIDE,
    PARTIAL_DTYPES,
    QUERY_MODES,
    DecodeConfig,
    decode_spec,
)

H200_SHARED_PER_SM = 228 * 1024  # sm_90: shared memory per SM, 1 KiB of it reserved per resident block
FAMILY = {"gluon": MLA_DECODE_MMA, "wgmma": MLA_DECODE_WGMMA, "wide": MLA_DECODE_WIDE}
WARPGROUPS = {"gluon": 1, "wgmma": 2, "wide": 3}  # the program's own warps, then its warp-specialized workers


@pytest.mark.parametrize("heads", [16, 32, 64])
@pytest.mark.parametrize("query", list(QUERY_MODES))
def test_catalog_programs_build(heads, query):
    config = decode_config(heads)
    family = FAMILY[config.engine]
    for dtype in PARTIAL_DTYPES:
        spec = decode_spec(config, dtype, query)
        assert spec.kernel == family.kernel
        art = compile_triton(spec)
        assert art.kind == "triton_cubin" and art.launch["entry"] == family.function
        assert art.launch["block"] == [32 * config.num_warps * WARPGROUPS[config.engine], 1, 1]
        assert spec.fact["PDL"] == 1 and art.launch["pdl"] is True  # a dependent launch: waits first
        assert config.waves * (art.launch["shared"] + 1024) <= H200_SHARED_PER_SM
        if heads == 16:  # two programs per SM, as the split policy may plan (waves = 2)
            assert config.waves == 2


def test_the_wgmma_program_builds_for_16_heads():
    """Not in the catalog (the mma.sync program wins at 16 heads and batch 128), but swept on the GPU."""
    art = compile_triton(decode_spec(DecodeConfig(16, 4, 1, 1, engine="wgmma"), "float32", "bf16"))
    assert art.launch["block"] == [256, 1, 1] and art.launch["shared"] + 1024 <= H200_SHARED_PER_SM


def test_the_mma_sync_program_does_not_finish_outputs_directly():
    config = decode_config(16)
    assert config.engine == "gluon" and not config.finishes_directly
    with pytest.raises(ValueError, match="does not finish outputs directly"):
        decode_spec(config, "float32", "bf16", direct=True)


def test_the_wgmma_program_finishes_single_splits_with_every_option():
    config = decode_config(32)
    assert config.engine == "wgmma" and config.finishes_directly
    split = decode_spec(config, "bfloat16", "bf16")
    facts = {k: split.fact[k] for k in ("DIRECT", "PARTIAL_BF16", "HAS_SINK", "WRITE_LSE")}
    assert facts == {"DIRECT": 0, "PARTIAL_BF16": 1, "HAS_SINK": 0, "WRITE_LSE": 0}
    for sink in (False, True):
        for lse in (False, True):
            direct = decode_spec(config, "bfloat16", "packed", direct=True, sink=sink, lse=lse)
            assert direct.fact["DIRECT"] == 1 and direct.fact["PARTIAL_BF16"] == 0  # no partials to type
            assert (direct.fact["HAS_SINK"], direct.fact["WRITE_LSE"]) == (int(sink), int(lse))
    art = compile_triton(decode_spec(config, "float32", "bf16", direct=True, sink=True, lse=True))
    assert art.launch["block"] == [256, 1, 1] and art.launch["shared"] + 1024 <= H200_SHARED_PER_SM


def test_the_wide_program_puts_64_heads_on_wgmma_m_with_every_operand_converted_once():
    """The 64-head program: one converter and two consumer warpgroups in one SM's shared memory; each
    consumer's half of the scores as 64 x 32 and the values as 64 x 128 wgmma tiles on bf16 operands (heads
    along M), registers reallocated between the partitions (setmaxnreg)."""
    config = decode_config(64)
    assert config.engine == "wide" and config.finishes_directly
    art = compile_triton(decode_spec(config, "float32", "bf16", direct=True, sink=True, lse=True))
    assert art.launch["block"] == [384, 1, 1] and art.launch["shared"] + 1024 <= H200_SHARED_PER_SM
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled tools) to disassemble the cubin")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "wide.cubin"
        cubin.write_bytes(art.data)
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert "HGMMA.64x32x16.F32.BF16" in sass and "HGMMA.64x128x16.F32.BF16" in sass  # half the candidates each
    assert "USETMAXREG" in sass
