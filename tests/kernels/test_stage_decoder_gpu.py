"""The AOT-built CuTe inline stage decoder rebuilds every thread's wgmma scale words bit for bit (H200).

The GPU machine cannot compile: the programs come from the AOT cache (``nox -s aot_build``), frozen.
"""

from __future__ import annotations

import os

import pytest
import torch

from csf_codec import MXFP4, NVFP4, encode_inline
from csf_kernels import runtime
from csf_kernels.expand.specs import stage_decoder_spec
from csf_kernels.record.reference import expected_stage_words

from ..codec.planes_for_tests import clustered_plane, special_rows

pytestmark = pytest.mark.gpu

# record sizes across the range: the smallest MXFP4 one, a large MXFP4 one, two NVFP4 ones (8-bit deltas)
SPECS = [(MXFP4, 96), (MXFP4, 160), (MXFP4, 192), (NVFP4, 288), (NVFP4, 304)]
SEED = int.from_bytes(os.urandom(3), "little")  # fresh data every run; in the test ids


def _program(fmt, s):
    runtime.freeze()
    try:
        return runtime.program(stage_decoder_spec(fmt, s), geometry=f"stage decoder {fmt.name} S={s}")
    finally:
        runtime.unfreeze()


def _plane(seed: int, nvfp4: bool = False) -> torch.Tensor:
    """[2 experts, 320 rows (a partial last block), 34 columns (8 full tiles + a tail)], every tile mode."""
    g = torch.Generator().manual_seed(seed)
    plane = clustered_plane(
        (2, 320, 34), seed=seed, exception_rate=0.01, window=4 if nvfp4 else 1, spread=40 if nvfp4 else 3
    )
    plane = special_rows(plane, seed=seed)
    base = plane.view(-1, 34).float().median(dim=1).values.to(torch.int64).view(2, 320, 1)
    # columns 8..11: dense near exceptions (base-1 .. base+2): 2-bit selectors where the record has room
    near = (base + torch.randint(-1, 3, (2, 320, 4), generator=g)).clamp(0, 255)
    plane[:, :, 8:12] = near.to(torch.uint8)
    # columns 16..19: wide spread (base-4 .. base+11): 4-bit selectors in big records, else raw
    wide = (base + torch.randint(-4, 12, (2, 320, 4), generator=g)).clamp(0, 255)
    plane[:, :, 16:20] = wide.to(torch.uint8)
    # a few all-random tiles: raw in every record size
    for e, r0, c0 in ((0, 0, 4), (1, 128, 24), (1, 256, 28)):
        plane[e, r0 : r0 + 128, c0 : c0 + 4] = torch.randint(
            0, 256, plane[e, r0 : r0 + 128, c0 : c0 + 4].shape, generator=g
        )
    return plane


def _encode(prog, seed: int):
    """A plane in the program's delta width (4 bits: MXFP4, 8 bits: NVFP4) with the program's record size."""
    bits = int(prog.meta.get("delta_bits", 4))
    fmt = MXFP4 if bits == 4 else NVFP4
    inline = encode_inline(_plane(seed, nvfp4=bits == 8), fmt, record_bytes=int(prog.meta["record_bytes"]))
    if inline.base_delta.shape[1] != 16 * bits:
        pytest.skip(f"the codec stores {fmt.name} deltas as {tuple(inline.base_delta.shape)}, not {bits}-bit")
    return inline


@pytest.mark.parametrize(("fmt", "s"), SPECS, ids=lambda x: getattr(x, "name", x))
@pytest.mark.parametrize("seed", [SEED, SEED + 1])
def test_stage_decoder_matches_reference(fmt, s, seed):
    prog = _program(fmt, s)
    inline = _encode(prog, seed)
    s = inline.record_bytes
    modes = inline.mode_counts()
    assert modes["raw"] >= 3 and inline.exceptions > 0, modes
    expected = expected_stage_words(inline)

    dev = torch.device("cuda")
    rb, ctf = inline.records.shape[:2]
    out = torch.full((rb, ctf, 128, 4), -1, dtype=torch.int32, device=dev).view(torch.uint32)  # poison 0xFFFFFFFF
    args = [inline.base_ref, inline.base_delta, inline.records, inline.raw]
    prog(*[t.to(dev).contiguous() for t in args], out)
    torch.cuda.synchronize()
    got = out.cpu().view(torch.int32)
    want = expected.view(torch.int32)
    bad = (got != want).nonzero()
    assert torch.equal(got, want), f"S={s} modes={modes}: {bad.shape[0]} words differ, first at {bad[:4].tolist()}"


def test_stage_decoder_runs_on_the_current_stream_and_in_a_graph():
    prog = _program(MXFP4, 96)
    inline = _encode(prog, 3)
    expected = expected_stage_words(inline).view(torch.int32)
    dev = torch.device("cuda")
    args = [t.to(dev).contiguous() for t in (inline.base_ref, inline.base_delta, inline.records, inline.raw)]
    out = torch.full(tuple(expected.shape), -1, dtype=torch.int32, device=dev).view(torch.uint32)
    prog.load(dev.index)  # module load outside the capture
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        prog(*args, out)  # warm-up
        graph = torch.cuda.CUDAGraph()
        out.view(torch.int32).fill_(-1)
        with torch.cuda.graph(graph, stream=side):
            prog(*args, out)
    assert bool((out.view(torch.int32) == -1).all())  # capture does not run the kernel
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu().view(torch.int32), expected)


@pytest.mark.parametrize("shape", [(1, 256, 16), (3, 64, 2)], ids=["no_raw_tiles", "no_full_tiles"])
def test_stage_decoder_edge_shapes(shape):
    prog = _program(MXFP4, 96)
    bits = int(prog.meta.get("delta_bits", 4))
    plane = clustered_plane(shape, seed=5, exception_rate=0.0, window=4 if bits == 8 else 1)
    fmt = MXFP4 if bits == 4 else NVFP4
    inline = encode_inline(plane, fmt, record_bytes=int(prog.meta["record_bytes"]))
    if inline.base_delta.shape[1] != 16 * bits:
        pytest.skip(f"the codec stores {fmt.name} deltas as {tuple(inline.base_delta.shape)}, not {bits}-bit")
    assert inline.raw.shape[0] == 0
    expected = expected_stage_words(inline).view(torch.int32)
    dev = torch.device("cuda")
    args = [t.to(dev).contiguous() for t in (inline.base_ref, inline.base_delta, inline.records, inline.raw)]
    out = torch.full(tuple(expected.shape), -1, dtype=torch.int32, device=dev).view(torch.uint32)
    prog(*args, out)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu().view(torch.int32), expected)
