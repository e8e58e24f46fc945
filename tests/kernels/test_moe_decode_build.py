"""The Gluon decode GEMM builds ahead of time for sm_90a on a GPU-less machine, as its design needs it.

Its register layouts are checked while it compiles (``convert_layout(..., assert_trivial=True)`` refuses any
relabelling that would move data between threads); here: every catalog variant builds, its shared memory
is exactly its operand stages (weights and activations of ``word_stages`` K steps), and the form without
stages needs none (both MMA operands straight into registers)."""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile

import pytest

pytest.importorskip("triton")

from csf_codec import MXFP4, NVFP4
from csf_kernels.aot.compile_triton import compile_triton
from csf_kernels.aot.cute_export import find_cuobjdump
from csf_kernels.moe.specs import (
    DECODE,
    DECODE_MMA_SYNC,
    DECODE_NARROW,
    DECODE_WIDE,
    DECODE_WIDEST,
    MOE_GEMM_DECODE,
    ScaleRead,
    gemm_spec,
)


@pytest.mark.parametrize("config", [DECODE_MMA_SYNC, DECODE_NARROW], ids=["16-routes", "8-routes"])
@pytest.mark.parametrize("source", list(ScaleRead), ids=["plane", "records"])
@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=["mxfp4", "nvfp4"])
def test_builds_with_operands_in_registers(fmt, source, config):
    spec = gemm_spec(fmt, source, fc1=True, activation="silu", bias=False, config=config)
    assert spec.kernel == MOE_GEMM_DECODE.kernel
    # FC1 and FC2 run one program: split-K partials tile gate and up rows like any other rows
    assert gemm_spec(fmt, source, fc1=False, activation="swiglu_oai", bias=True, config=config) == spec
    art = compile_triton(spec)
    assert art.kind == "triton_cubin" and art.launch["entry"] == "moe_gemm_decode"
    assert art.launch["block"] == [128, 1, 1]
    k_step = 128 if fmt is MXFP4 else 64  # weights per row and step
    stage = 64 * k_step // 2 + config.bm * k_step * 2  # FP4 bytes of 64 rows + bf16 activations of bm routes
    assert config.word_stages == 3 and art.launch["shared"] == config.word_stages * stage
    unstaged = dataclasses.replace(config, word_stages=1, ahead=False)
    art = compile_triton(gemm_spec(fmt, source, fc1=True, activation="silu", bias=False, config=unstaged))
    assert art.launch["shared"] == 0


def _sass(cubin: bytes) -> str:
    """The cubin's SASS (skips without a cuobjdump: the CUDA toolkit's or Triton's bundled one)."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled tools) to disassemble the cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("source", list(ScaleRead), ids=["plane", "records"])
@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=["mxfp4", "nvfp4"])
def test_wgmma_blocks_build_with_activations_in_shared_memory(fmt, source):
    """wgmma blocks: the weights' A fragments are mma.sync's (the relabelling is proven trivial against the
    wgmma layout too), the activations are two operand buffers of the block, stored relabelled by the program
    (a sweep variant: the catalog's blocks read activations stored relabelled); the weight words stay staged."""
    config = dataclasses.replace(DECODE_WIDE, relabelled=False)
    assert config.mma == "wgmma" and config.bm == 32
    art = compile_triton(gemm_spec(fmt, source, fc1=True, activation="silu", bias=False, config=config))
    assert art.kind == "triton_cubin" and art.launch["block"] == [128, 1, 1]
    k_step = 128 if fmt is MXFP4 else 64
    words, operand = 64 * k_step // 2, config.bm * k_step * 2
    assert art.launch["shared"] == config.word_stages * words + 2 * operand
    sass = _sass(art.data)
    assert "HGMMA.64x32x16.F32.BF16" in sass and "HMMA" not in sass  # wgmma m64n32k16, no mma.sync left
    with pytest.raises(ValueError, match="16, 32, 64 routes"):
        dataclasses.replace(config, bm=8)


@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=["mxfp4", "nvfp4"])
def test_wgmma_blocks_of_128_rows_share_one_activation_operand(fmt):
    """The sweep's 128-row wgmma variant (two warpgroups, 8 warps): twice the staged weight words, the same
    activation operand buffers; native scales only (a program's records must lie in one 128-row block)."""
    config = dataclasses.replace(DECODE_WIDE, bn=128, num_warps=8, relabelled=False)
    art = compile_triton(gemm_spec(fmt, ScaleRead.PLANE, fc1=True, activation="silu", bias=False, config=config))
    assert art.launch["block"] == [256, 1, 1]
    k_step = 128 if fmt is MXFP4 else 64
    assert art.launch["shared"] == config.word_stages * 128 * k_step // 2 + 2 * config.bm * k_step * 2
    assert "HGMMA.64x32x16.F32.BF16" in _sass(art.data)
    with pytest.raises(Exception, match="native scales"):
        compile_triton(gemm_spec(fmt, ScaleRead.RECORDS, fc1=True, activation="silu", bias=False, config=config))
    with pytest.raises(ValueError, match="64 rows on 4 warps"):
        dataclasses.replace(DECODE_WIDE, bn=128, num_warps=4)


@pytest.mark.parametrize("source", list(ScaleRead), ids=["plane", "records"])
@pytest.mark.parametrize("fmt", [MXFP4, NVFP4], ids=["mxfp4", "nvfp4"])
@pytest.mark.parametrize("config", [DECODE, DECODE_WIDE, DECODE_WIDEST], ids=["16-routes", "32-routes", "64-routes"])
def test_catalog_wgmma_blocks_copy_relabelled_activations_into_their_operand(config, fmt, source):
    """The catalog's wgmma blocks read activations stored relabelled: each stage is the weight words and the
    block's activations, both copied by cp.async; no register ever goes to shared memory (no STS)."""
    assert config.mma == "wgmma" and config.relabelled
    art = compile_triton(gemm_spec(fmt, source, fc1=True, activation="silu", bias=False, config=config))
    k_step = 128 if fmt is MXFP4 else 64
    assert art.launch["shared"] == config.word_stages * (64 * k_step // 2 + config.bm * k_step * 2)
    sass = _sass(art.data)
    assert f"HGMMA.64x{config.bm}x16.F32.BF16" in sass and "HMMA" not in sass
    assert "LDGSTS" in sass and not any(line.split()[1:2] == ["STS"] or " STS." in line for line in sass.splitlines())


@pytest.mark.parametrize("ids64", [False, True], ids=["int32-ids", "int64-ids"])
def test_one_token_programs_read_routes_as_blocks(ids64):
    """The one-token tiles' programs that read a token's route ids as blocks (no alignment) build like the
    aligned ones: same operands, same shared memory; only the block's expert and routes come from elsewhere."""
    plain = gemm_spec(MXFP4, ScaleRead.PLANE, fc1=True, activation="silu", bias=False, config=DECODE_NARROW)
    spec = gemm_spec(MXFP4, ScaleRead.PLANE, fc1=True, activation="silu", bias=False, config=DECODE_NARROW, routed=True,
                     ids64=ids64)  # fmt: skip
    assert spec.fact["ROUTED"] == 1 and spec.fact["IDS64"] == int(ids64) and spec.key != plain.key
    aligned, art = compile_triton(plain), compile_triton(spec)
    assert art.launch["shared"] == aligned.launch["shared"] and art.launch["block"] == [128, 1, 1]
