"""Scale expansion on the GPU, from the AOT cache: exact on every catalog geometry and tail, routed
experts only, CUDA-graph capture and replay, frozen with zero compilations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from csf_codec import MXFP4, NVFP4, encode_compact, encode_inline
from csf_codec.synthetic import EXCEPTION_DENSE, SEED_REGIME, synthetic_scale_plane
from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.expand.compact_tables import compact_tables
from csf_kernels.expand.launch import ENGINES, expand_compact, expand_inline, inline_expansion_launches
from csf_kernels.expand.specs import row_block_covers, row_block_expander_spec, row_image_layout
from tests.cuda_graphs import replay_allocating_nothing

from .interpret_cases import cases

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
ROOT = Path(__file__).resolve().parents[2]
POISON = 0xAB


def _expected(plane: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    want = torch.full_like(plane, POISON)
    num = plane.shape[0] if plane.dim() == 3 else 1
    for e in ids.tolist():
        if 0 <= e < num:
            if plane.dim() == 3:
                want[e] = plane[e]
            else:
                want.copy_(plane)
    return want


@pytest.mark.parametrize("seed", [int.from_bytes(os.urandom(3), "little")])
def test_expansion_of_the_shared_cases(seed):
    for plane, fmt, group, experts, record_bytes in cases(seed):
        fmt = {"mxfp4": MXFP4, "nvfp4": NVFP4}[fmt]
        gpu = plane.cuda()
        num = plane.shape[0] if plane.dim() == 3 else 1
        ids = torch.arange(num, dtype=torch.int32) if experts is None else experts
        for form in ("inline", "inline-triton", "inline-cute", "inline-row-block", "inline-bytes", "compact"):
            if form == "inline-cute" and row_image_layout(plane.shape[-1], plane.numel()) is None:
                continue  # rows the CuTe row expander does not cover (odd column counts, chunkless planes)
            if form == "inline-row-block" and not _row_block_built(fmt, plane):
                continue  # shapes outside the catalog have no row-block program
            out = torch.full_like(gpu, POISON)
            engines = {
                "inline": "auto",
                "inline-triton": "triton",
                "inline-cute": "cute",
                "inline-row-block": "row_block",
            }
            if form in engines:  # "inline": the default engine choice
                inline = encode_inline(gpu, fmt, row_group=group, record_bytes=record_bytes)
                expand_inline(inline, out, experts=ids.to(torch.int32).cuda(), engine=engines[form])
            elif form == "inline-bytes":  # byte stores: the masked, unvectorised path
                inline = encode_inline(gpu, fmt, row_group=group, record_bytes=record_bytes)
                for launch in inline_expansion_launches(inline, out, experts=ids.cuda(), store=1):
                    launch.bind()()
            else:
                tables = compact_tables(encode_compact(gpu, fmt).payload)
                expand_compact(tables, out, experts=ids.to(torch.int32).cuda())
            assert torch.equal(out.cpu(), _expected(plane, ids)), f"seed {seed} {form} {fmt.name} {tuple(plane.shape)}"


def _row_block_built(fmt, plane: torch.Tensor) -> bool:
    """Whether the cache holds the row-block expander for this plane's shape (catalog shapes only)."""
    cols = plane.shape[-1]
    return row_block_covers(cols, plane.numel()) and runtime.is_cached(row_block_expander_spec(fmt, cols))


def _catalog_planes():
    seen = set()
    for geo in load_catalog().moe:
        for proj, (shape, group) in geo.scale_planes().items():
            key = (geo.fmt.name, shape[1:], group)
            if key in seen:
                continue
            seen.add(key)
            # the per-expert tiling is what varies between geometries; 64 experts bound the test's time
            yield pytest.param(geo.fmt, (min(shape[0], 64), *shape[1:]), group, id=f"{geo.name}-{proj}")


@pytest.mark.parametrize(("fmt", "shape", "group"), list(_catalog_planes()))
def test_expansion_is_exact_on_every_catalog_geometry(fmt, shape, group):
    plane = synthetic_scale_plane(shape, fmt, stats=EXCEPTION_DENSE if fmt is MXFP4 else None, seed=hash(shape) % 999)
    gpu = plane.cuda()
    inline = encode_inline(gpu, fmt, row_group=group)
    compact = compact_tables(encode_compact(gpu, fmt).payload)
    assert row_image_layout(shape[-1], gpu.numel()) is not None, "every catalog plane has a CuTe row expander"
    covered = row_block_covers(shape[-1], gpu.numel())
    assert _row_block_built(fmt, gpu) == covered, "the catalog builds the row-block expander of every plane it covers"
    engines = [e for e in ENGINES if e != "row_block" or covered]
    for engine in engines:
        out = torch.full_like(gpu, POISON)
        expand_inline(inline, out, engine=engine)
        assert torch.equal(out, gpu), f"expand_inline {engine} {fmt.name} {shape}"
    out = torch.full_like(gpu, POISON)
    expand_compact(compact, out)
    assert torch.equal(out, gpu), f"expand_compact {fmt.name} {shape}"
    # routed experts only, with vLLM's padding ids and an expert listed twice (its programs run concurrently)
    ids = torch.tensor([shape[0] - 1, -1, 0, shape[0], 3 % shape[0], 0], dtype=torch.int32, device="cuda")
    for engine in engines:
        out = torch.full_like(gpu, POISON)
        expand_inline(inline, out, experts=ids, engine=engine)
        assert torch.equal(out.cpu(), _expected(plane, ids.cpu())), engine
    out = torch.full_like(gpu, POISON)
    expand_compact(compact, out, experts=ids)
    assert torch.equal(out.cpu(), _expected(plane, ids.cpu())), f"routed expand_compact {fmt.name} {shape}"


@pytest.mark.parametrize("stats", [EXCEPTION_DENSE, SEED_REGIME], ids=["dense", "seed"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("shape", "group"), [((64, 1152, 160), 576), ((64, 1280, 18), None)], ids=["w13", "w2"])
def test_graph_capture_and_replay_with_changed_routes(engine, shape, group, stats):
    plane = synthetic_scale_plane(shape, MXFP4, stats=stats, seed=5)
    gpu = plane.cuda()
    inline = encode_inline(gpu, MXFP4, row_group=group)
    # the row-block expander stages two items' records when they fit half its staging (the seed regime's
    # 96-byte records), else one (the dense regime's 128): both forms are replayed
    half = row_block_expander_spec(MXFP4, shape[-1]).fact["MAXS"] // 2
    assert (inline.record_bytes <= half) == (stats is SEED_REGIME)
    tables = compact_tables(encode_compact(gpu, MXFP4).payload)
    ids = torch.zeros(48, dtype=torch.int32, device="cuda")
    out_i = torch.empty_like(gpu)
    out_c = torch.empty_like(gpu)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up (loads the programs) outside capture
        expand_inline(inline, out_i, experts=ids, engine=engine)
        expand_compact(tables, out_c, experts=ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        expand_inline(inline, out_i, experts=ids, engine=engine)
        expand_compact(tables, out_c, experts=ids)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        routes = torch.randint(-2, 70, (48,), generator=g, dtype=torch.int32)  # some padding ids
        ids.copy_(routes)
        out_i.fill_(POISON)
        out_c.fill_(POISON)
        replay_allocating_nothing(graph)
        want = _expected(plane, routes)
        assert torch.equal(out_i.cpu(), want)
        assert torch.equal(out_c.cpu(), want)
        eager = torch.full_like(gpu, POISON)
        expand_inline(inline, eager, experts=ids, engine=engine)
        assert torch.equal(eager, out_i)


def test_frozen_production_install_needs_no_compiler():
    """A fresh process with triton and cutlass unimportable expands scales from the cache."""
    code = """
import sys
sys.modules['triton'] = None  # what an install without them looks like: import fails, find_spec is None
sys.modules['cutlass'] = None
import os
os.environ['CSF_FROZEN'] = '1'
import torch
from csf_codec import MXFP4, encode_inline, encode_compact
from csf_codec.synthetic import synthetic_scale_plane
from csf_kernels import runtime
from csf_kernels.expand.compact_tables import compact_tables
from csf_kernels.expand.launch import expand_compact, expand_inline
plane = synthetic_scale_plane((8, 5120, 18), MXFP4, seed=3).cuda()
assert torch.equal(expand_inline(encode_inline(plane, MXFP4)), plane)
assert torch.equal(expand_compact(compact_tables(encode_compact(plane, MXFP4).payload)), plane)
assert runtime.compilations() == 0
assert sys.modules['triton'] is None and sys.modules['cutlass'] is None
assert not [m for m in sys.modules if m.split('.')[0] in ('triton', 'cutlass') and '.' in m]
print('ok')
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-4000:]


def test_frozen_runtime_refuses_an_uncached_program():
    from csf_kernels.expand.specs import inline_class_spec

    spec = inline_class_spec(MXFP4, 1008)  # a record size no plane can choose: never built
    with pytest.raises(runtime.UncachedProgramError, match="nox -s aot_build"):
        runtime.program(spec, geometry="nowhere")


def test_row_expander_never_writes_outside_its_plane_on_tampered_records():
    """Random bytes in every record (headers, selectors, exception entries) decode to garbage, but the CuTe
    expanders write only inside the plane: the guard bytes around it keep their poison."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(3), "little"))
    for shape, fmt in (((4, 100, 18), MXFP4), ((2, 256, 160), MXFP4), ((2, 100, 38), NVFP4)):
        plane = synthetic_scale_plane(shape, fmt, seed=11).cuda()
        inline = encode_inline(plane, fmt)
        for arr in (inline.records, inline.tail):
            arr.copy_(torch.randint(0, 256, arr.shape, generator=g, dtype=torch.uint8))
        n = plane.numel()
        buf = torch.full((n + 4096,), POISON, dtype=torch.uint8, device="cuda")
        out = buf[2048 : 2048 + n].view(shape)  # 16-byte aligned, guard bytes either side
        for engine in ("cute", "row_block"):
            if engine == "row_block" and not _row_block_built(fmt, plane):
                continue
            buf.fill_(POISON)
            expand_inline(inline, out, engine=engine)
            torch.cuda.synchronize()
            assert torch.all(buf[:2048] == POISON) and torch.all(buf[2048 + n :] == POISON), (engine, shape)


@pytest.mark.parametrize("stats", [EXCEPTION_DENSE, SEED_REGIME], ids=["one-staging", "two-stagings"])
@pytest.mark.parametrize(
    ("shape", "group"),
    [((6, 1152, 160), 576), ((6, 1280, 18), None), ((6, 1152, 90), 576)],
    ids=["w13", "w2", "gpt-oss-90"],
)
@pytest.mark.parametrize("ctas", [1, 3])
def test_row_block_items_in_turn_through_both_stagings(shape, group, stats, ctas):
    """A grid of one or three CTAs walks many items per warp (or CTA), so the staging of the next item
    (during the copy-out with one staging region, a whole item ahead with two) is used again and again:
    exact, routed experts with padding ids included; tampered records still write only inside the plane."""
    from csf_kernels.expand.launch import _row_block_launch

    plane = synthetic_scale_plane(shape, MXFP4, stats=stats, seed=ctas).cuda()
    inline = encode_inline(plane, MXFP4, row_group=group)
    if not _row_block_built(MXFP4, plane):
        pytest.skip("the cache holds no row-block program for this shape")
    assert (inline.record_bytes <= row_block_expander_spec(MXFP4, shape[-1]).fact["MAXS"] // 2) == (
        stats is SEED_REGIME
    ), "the seed regime's records fit two stagings, the dense regime's one"
    ids = torch.tensor([5, -1, 0, 2, 6, 2, 4, 1, 3], dtype=torch.int32, device="cuda")
    out = torch.full_like(plane, POISON)
    _row_block_launch(inline, out, ids, ctas=ctas).bind()()
    assert torch.equal(out.cpu(), _expected(plane.cpu(), ids.cpu()))
    g = torch.Generator().manual_seed(ctas)
    for arr in (inline.records, inline.tail):
        arr.copy_(torch.randint(0, 256, arr.shape, generator=g, dtype=torch.uint8))
    n = plane.numel()
    buf = torch.full((n + 4096,), POISON, dtype=torch.uint8, device="cuda")
    guarded = buf[2048 : 2048 + n].view(shape)
    _row_block_launch(inline, guarded, ids, ctas=ctas).bind()()
    torch.cuda.synchronize()
    assert torch.all(buf[:2048] == POISON) and torch.all(buf[2048 + n :] == POISON)
