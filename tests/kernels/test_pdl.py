"""Programmatic dependent launches: the driver structs the runtime fills and the MoE and sparse-MLA programs
built for them (CPU)."""

from __future__ import annotations

import ctypes

import pytest

from csf_kernels import runtime


def test_pdl_launch_structs_have_cuda_h_layout():
    """cuLaunchKernelEx reads these as cuda.h lays them out (CUDA 12 and 13, 64-bit)."""
    assert ctypes.sizeof(runtime.driver.LaunchAttribute) == 72 and runtime.driver.LaunchAttribute.value.offset == 8
    cfg = runtime.driver.LaunchConfig
    assert (cfg.shared.offset, cfg.stream.offset, cfg.attrs.offset, cfg.num_attrs.offset) == (24, 32, 40, 48)
    assert ctypes.sizeof(cfg) == 56
    config = runtime.driver.pdl_launch_config((3, 2, 1), (128, 1, 1), 4096)
    assert tuple(config.grid) == (3, 2, 1) and tuple(config.block) == (128, 1, 1) and config.num_attrs == 1
    attr = config.attrs[0]
    assert attr.id == runtime.driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == 6
    assert attr.value.programmatic_stream_serialization_allowed == 1


def test_every_moe_program_is_compiled_for_a_programmatic_dependent_launch():
    pytest.importorskip("triton")
    from csf_kernels.aot.compile_triton import compile_triton
    from csf_kernels.catalog import load_catalog
    from csf_kernels.moe.specs import moe_geometry_specs

    specs = moe_geometry_specs(load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4"))
    assert specs and all(s.fact["PDL"] == 1 for s in specs)
    kinds = {s.kernel: s for s in specs}  # one program of each kind: compiled with launch_pdl, waits first
    for spec in kinds.values():
        assert compile_triton(spec).launch["pdl"] is True, spec.describe()


def test_every_sparse_mla_catalog_program_is_a_dependent_launch():
    """The Gluon decode programs and the merge (the decode programs' builds are checked in
    tests/attention/test_mla_decode_build.py; the merge, a Triton program, here)."""
    pytest.importorskip("triton")
    from csf_kernels.aot.compile_triton import compile_triton
    from csf_kernels.catalog import load_catalog
    from csf_kernels.mla.heuristics import catalog_configs
    from csf_kernels.mla.specs import MLA_MERGE, merge_spec, sparse_mla_specs

    specs = sparse_mla_specs(catalog_configs(load_catalog().sparse_mla))
    assert specs and all(s.fact["PDL"] == 1 for s in specs)
    merge = merge_spec("bfloat16", sink=True, lse=True)
    assert merge.kernel == MLA_MERGE.kernel and compile_triton(merge).launch["pdl"] is True
