"""The Gluon sparse-MLA decode builds ahead of time for sm_90a on a GPU-less machine, as its design needs it.

Its register relabellings are checked while it compiles (``convert_layout(..., assert_trivial=True)``
refuses any that would move data between threads); here: every catalog program builds, for every query
form, and the 16-head programs leave room for two per SM (their shared memory: two chunk stages)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from csf_kernels.aot.compile_triton import compile_triton
from csf_kernels.mla_specs import MLA_DECODE_MMA, PARTIAL_DTYPES, QUERY_MODES, decode_config, decode_spec

H200_SHARED_PER_SM = 228 * 1024  # sm_90: shared memory per SM, 1 KiB of it reserved per resident block


@pytest.mark.parametrize("heads", [16, 32])
@pytest.mark.parametrize("query", list(QUERY_MODES))
def test_catalog_programs_build(heads, query):
    config = decode_config(heads)
    assert config.engine == "gluon"
    for dtype in PARTIAL_DTYPES:
        spec = decode_spec(config, dtype, query)
        assert spec.kernel == MLA_DECODE_MMA.kernel
        art = compile_triton(spec)
        assert art.kind == "triton_cubin" and art.launch["entry"] == "mla_decode_mma"
        assert art.launch["block"] == [32 * config.num_warps, 1, 1]
        if heads == 16:  # two programs per SM, as the split policy plans (waves = 2)
            assert config.waves == 2 and 2 * (art.launch["shared"] + 1024) <= H200_SHARED_PER_SM


def test_gluon_programs_do_not_finish_outputs_directly():
    config = decode_config(16)
    assert not config.finishes_directly
    with pytest.raises(ValueError, match="does not finish outputs directly"):
        decode_spec(config, "float32", "bf16", direct=True)
