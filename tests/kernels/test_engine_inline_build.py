"""The inline engine program's synchronization, read from its sm_90a PTX (built on the CPU): the decoder warp orders
its phases with warp barriers, hands staging slots back to the bulk copy through the async proxy, and the stage's
full barrier counts its 32 lanes beside the TMA thread with release arrivals. ptxas drops a warp barrier from the
SASS where it proves the warp converged, so the PTX is where the program's intent is checked."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed: the engine cannot be compiled here")

from csf_kernels.aot import cute_export as export
from csf_kernels.moe.kernels.engine_record_decoder import DECODER_ARRIVALS

from .test_stage_decoder_build import _toolchain_or_skip


@pytest.fixture(scope="module", params=["mxfp4", "nvfp4"])
def ptx(request, tmp_path_factory) -> str:
    _toolchain_or_skip()
    import cutlass.cute as cute

    prog = export.engine_gemm_program(16, 0, False, request.param, "inline")
    dump = tmp_path_factory.mktemp(f"inline_ptx_{request.param}")
    cute.compile(prog.factory(), *export._fake_args(prog), options=f"--gpu-arch {export.ARCH} --keep-ptx "
                 f"--dump-dir {dump}")  # fmt: skip
    (path,) = dump.rglob("*.ptx")
    return path.read_text()


def test_decoder_phases_are_warp_ordered(ptx):
    # the offset table before its reads (a cold unit's, and the next unit's behind this unit's records); after a
    # record's decode (the staging slot and the tile are free again); the words in the tile before the scatter; the
    # scatter before the words come back; and warp 0's, after a unit's facts are written and before it arrives on
    # the unit's first stage (engine_unit_facts)
    assert ptx.count("bar.warp.sync \t-1;") == 6


def test_staging_slots_return_to_the_async_proxy(ptx):
    lines = ptx.splitlines()
    copies = [i for i, line in enumerate(lines) if "cp.async.bulk.shared::cluster.global.mbarrier" in line]
    assert len(copies) == 3  # a cold unit's first records, the loop's of this unit and of the next
    for i in copies:
        before = "\n".join(lines[i - 8 : i])
        assert "fence.proxy.async.shared::cta;" in before and "mbarrier.arrive.expect_tx.shared.b64" in before


def test_full_barriers_count_the_decoder_lanes(ptx):
    first = re.search(r"mbarrier\.init\.shared\.b64\s+\[%r\d+\], (%r\d+);", ptx)
    count = re.search(rf"mov\.b32\s+{re.escape(first.group(1))}, (\d+);", ptx)
    assert int(count.group(1)) == 1 + DECODER_ARRIVALS  # the TMA thread and every decoder lane
    assert "mbarrier.arrive.relaxed" not in ptx  # arrivals release the lanes' slot stores to the consumers
