"""The CuTe DSL row expander builds ahead of time on a GPU-less machine, with int32 scalar arguments.

Needs nvidia-cutlass-dsl, gcc and a CUDA toolkit's libcudart_static.a; skipped (with the reason) without them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the row expander cannot be compiled here")

from csf_codec import MXFP4
from csf_kernels.aot import cute_export as export
from csf_kernels.expand.specs import row_expander_spec

from .test_stage_decoder_build import _env, _toolchain_or_skip

SCALARS = list(export.ROW_EXPANDER_SCALARS)
TENSORS = ["base_ref", "base_delta", "records", "tail", "raw", "tail_raw", "out", "expert_ids"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _toolchain_or_skip()
    f = row_expander_spec(MXFP4, 8, 2).fact
    out = tmp_path_factory.mktemp("row_expander")
    return export.build_row_expander(f["GT"], f["DB"], f["MAXS"], f["MAXST"], f["STORE"], out), out


def test_scalars_follow_the_tensors_in_the_header_and_metadata(built):
    meta, _ = built
    assert meta["program"] == "narrow_row_expander" and meta["group_tiles"] == 8 and meta["delta_bits"] == 4
    assert meta["store"] == 2
    assert [a["name"] for a in meta["args"]] == [*TENSORS, *SCALARS, "stream"]
    assert [a["kind"] for a in meta["args"]] == ["tensor"] * len(TENSORS) + ["int32"] * len(SCALARS) + ["stream"]
    assert meta["packed_args"] == [*TENSORS, *(f"&{s}" for s in SCALARS), "&stream", "&ret"]
    records = meta["args"][2]
    assert records["divisible"] == {"NR": 4} and records["c_fields"] == [
        ["data", "void *", 1],
        ["dynamic_shapes", "int32_t", 1],
    ]
    assert meta["launch"]["grid"] == ["block_runs", "groups", "NE"]


def test_sass_stages_with_cp_async_writes_whole_chunks_and_never_spills(built):
    meta, _ = built
    sass = meta["sass"]
    if sass is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled tools) to disassemble the cubin")
    assert sass["ldgsts"] >= 1 and all(f.endswith(".128") for f in sass["ldgsts_forms"]), sass["ldgsts_forms"]
    assert sass["local_memory_ops"] == 0 and sass["local_bytes"] == 0 and sass["stack_bytes"] == 0, sass
    # narrow planes: one warp per row block, so no CTA barrier at all
    assert sass["opcodes"].get("BAR", 0) == 0 and sass["opcodes"].get("STG", 0) >= 2


def test_binding_checks_scalars_and_divisibility_without_a_gpu(built):
    meta, _ = built
    code = f"""
import sys
import torch
from csf_kernels.runtime.cute_so import TensorRef, load_cute_so
p = load_cute_so(sys.argv[1])
assert p.num_args == {len(TENSORS) + len(SCALARS) + 2} and len(p.scalar_args) == {len(SCALARS)}
assert p.grid({{"NE": 3}}, {{"block_runs": 10, "groups": 2}}) == [10, 2, 3]
dev = torch.device("cuda", 0)
def ref(shape, dtype):
    n = 1
    strides = []
    for s in reversed(shape):
        strides.insert(0, n)
        n *= s
    return TensorRef(1 << 20, tuple(shape), tuple(strides), dtype, dev)
u8, u32 = torch.uint8, torch.uint32
tensors = [ref((4,), u8), ref((4, 64), u8), ref((10,), u32), ref((4,), u32), ref((0, 128), u32), ref((0,), u8),
           ref((64,), u32), ref((2,), torch.int32)]
try:
    p.bind(None, *tensors, *([1] * {len(SCALARS)}))
except ValueError as e:
    assert "NR" in str(e) and "multiple of 4" in str(e), e
else:
    raise AssertionError("a record array of 10 words was accepted")
tensors[2] = ref((12,), u32)
try:
    p.bind(None, *tensors, *([1] * {len(SCALARS) - 1}))
except TypeError as e:
    assert "int32 scalars" in str(e), e
else:
    raise AssertionError("a missing scalar was accepted")
try:
    p.bind(None, *tensors, *([1] * {len(SCALARS) - 1}), 2**31)
except ValueError as e:
    assert "int32" in str(e), e
else:
    raise AssertionError("an out-of-range scalar was accepted")
assert not {{"cutlass", "triton"}} & set(sys.modules)
print("ok")
"""
    import subprocess

    r = subprocess.run([sys.executable, "-c", code, meta["paths"]["so"]], env=_env(), capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_layouts_cover_every_catalog_plane():
    from math import prod

    from csf_kernels.catalog import load_catalog
    from csf_kernels.expand.specs import row_image_layout

    for geo in load_catalog().moe:
        for proj, (shape, _group) in geo.scale_planes().items():
            lay = row_image_layout(shape[-1], prod(shape))
            assert lay is not None, (geo.name, proj, shape)
            assert lay.flat == (shape[-1] % 16 != 0) and lay.store == (4 if shape[-1] % 4 == 0 else 2)
            assert 4 * lay.group_tiles * lay.groups >= shape[-1] // 4 * 4
    assert row_image_layout(200, 1 << 20) is None  # rows wider than a group and not 16-byte multiples
    assert row_image_layout(18, 1 << 20, out_ptr=8) is None  # unaligned output: Triton
    assert row_image_layout(18, 100) is None  # the plane is not whole 16-byte chunks
    assert row_image_layout(37, 1 << 20) is None  # odd rows: byte stores, Triton


def test_metadata_lists_the_so_and_cubin(built):
    meta, out = built
    for key in ("so", "cubin", "header", "metadata"):
        assert (out / meta["files"][key]).is_file()
    assert Path(meta["paths"]["so"]).name == f"lib{export.row_expander_name(8, 4, 2)}.so"
