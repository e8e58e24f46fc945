"""The CuTe DSL row-block expander builds ahead of time on a GPU-less machine: no spills, int32 scalars after
the tensors, shared memory for four or more CTAs per SM, CTA barriers only where a CTA shares one image of whole
rows (planes split into column groups).

Needs nvidia-cutlass-dsl, gcc and a CUDA toolkit's libcudart_static.a; skipped (with the reason) without them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the row-block expander cannot be compiled")

from csf_codec import MXFP4, NVFP4
from csf_kernels.aot import cute_export as export
from csf_kernels.expand.specs import row_block_expander_spec, row_block_group_tiles, row_block_warps

from .test_stage_decoder_build import _toolchain_or_skip

TENSORS = ["base_ref", "base_delta", "records", "tail", "raw", "tail_raw", "out", "expert_ids"]


@pytest.fixture(
    scope="module",
    params=[(MXFP4, 160), (MXFP4, 18), (MXFP4, 90), (NVFP4, 448)],
    ids=["w13-160-columns", "w2-18-columns", "gpt-oss-90-columns", "kimi-nvfp4-448-columns"],
)
def built(request, tmp_path_factory):
    _toolchain_or_skip()
    fmt, cols = request.param
    f = row_block_expander_spec(fmt, cols).fact
    prog = export.row_block_expander_program(f["COLS"], f["DB"], f["MAXS"], f["MAXST"])
    return cols, export.build_cute_program(prog, tmp_path_factory.mktemp("row_block"))


def test_arguments_and_launch_in_the_metadata(built):
    cols, meta = built
    scalars = list(export.ROW_BLOCK_EXPANDER_SCALARS)
    assert meta["program"] == "row_block_expander" and meta["cols"] == cols and meta["warps"] == row_block_warps(cols)
    assert [a["name"] for a in meta["args"]] == [*TENSORS, *scalars, "stream"]
    assert meta["launch"]["grid"] == ["ctas", 1, 1] and meta["launch"]["block"] == [32 * row_block_warps(cols), 1, 1]
    # four CTAs or more fit an SM's 227 KiB of shared memory; two of the widest column-group image (448 columns)
    assert (4 if cols <= 160 else 2) * (meta["launch"]["dynamic_shared_bytes"] + 1024) <= 227 * 1024


def test_sass_stages_with_cp_async_never_spills_and_barriers_only_shared_images(built):
    cols, meta = built
    sass = meta["sass"]
    if sass is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled tools) to disassemble the cubin")
    assert sass["ldgsts"] >= 1 and all(f.endswith(".128") for f in sass["ldgsts_forms"]), sass["ldgsts_forms"]
    assert sass["local_memory_ops"] == 0 and sass["local_bytes"] == 0 and sass["stack_bytes"] == 0, sass
    if cols // 4 > row_block_group_tiles(cols):
        # a CTA images whole rows together: barriers around the shared image, each a few per block
        assert 1 <= sass["opcodes"].get("BAR", 0) <= 4
    else:
        assert sass["opcodes"].get("BAR", 0) == 0  # a warp per row block: warp barriers only
    assert sass["registers"] <= 72  # seven or more CTAs of 128 threads by registers
