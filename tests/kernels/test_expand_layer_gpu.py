"""A layer's planes expanded concurrently on the H200 (two streams, fork and join): bit-exact, routed
experts with padding ids, CUDA-graph replays with changed routes that allocate nothing, and the join:
work queued after the call sees both planes."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4, encode_inline
from csf_codec.synthetic import SEED_REGIME, synthetic_scale_plane
from csf_kernels.expand.launch import expand_inline
from csf_kernels.expand.layer import bind_expand_inline_layer, expand_inline_layer, side_stream
from tests.cuda_graphs import replay_allocating_nothing

pytestmark = pytest.mark.gpu
POISON = 0xA5


@pytest.fixture(scope="module")
def layer():
    """DS4.1-TP4's W13 and W2 planes (24 experts), native and inline."""
    out = []
    for seed, (shape, group) in enumerate((((24, 1152, 160), 576), ((24, 5120, 18), None))):
        plane = synthetic_scale_plane(shape, MXFP4, stats=SEED_REGIME, seed=seed).cuda()
        out.append((plane, encode_inline(plane, MXFP4, row_group=group)))
    return out


def _expected(plane: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    want = torch.full_like(plane, POISON)
    live = ids[(ids >= 0) & (ids < plane.shape[0])].long()
    want[live] = plane[live]
    return want


def test_concurrent_planes_are_exact_and_joined(layer):
    outs = [torch.full_like(p, POISON) for p, _ in layer]
    side = side_stream(outs[0].device)
    got = expand_inline_layer([(i, o) for (_, i), o in zip(layer, outs, strict=True)])
    assert got[0] is outs[0] and got[1] is outs[1]  # the caller's order, whatever the launch order
    # queued after the call on the current stream: sees both planes (the side stream was joined back)
    copies = [o.clone() for o in outs]
    torch.cuda.synchronize()
    for (plane, _), c in zip(layer, copies, strict=True):
        assert torch.equal(c, plane)
    assert side.query()  # nothing left on the side stream


def test_concurrent_routed_experts_with_padding_ids(layer):
    ids = torch.tensor([23, -1, 0, 24, 5, 5, 11], dtype=torch.int32, device="cuda")
    outs = [torch.full_like(p, POISON) for p, _ in layer]
    expand_inline_layer([(i, o) for (_, i), o in zip(layer, outs, strict=True)], experts=ids)
    for (plane, _), o in zip(layer, outs, strict=True):
        assert torch.equal(o, _expected(plane, ids))


def test_graph_replays_with_changed_routes_equal_eager_and_allocate_nothing(layer):
    ids = torch.zeros(16, dtype=torch.int32, device="cuda")
    outs = [torch.empty_like(p) for p, _ in layer]
    bound = bind_expand_inline_layer([(i, o) for (_, i), o in zip(layer, outs, strict=True)], experts=ids)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        bound()  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        bound()
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        routes = torch.randint(-2, 27, (16,), generator=g, dtype=torch.int32)
        ids.copy_(routes)
        for o in outs:
            o.fill_(POISON)
        replay_allocating_nothing(graph)
        for (plane, inline), o in zip(layer, outs, strict=True):
            assert torch.equal(o, _expected(plane, routes.cuda()))
            eager = torch.full_like(plane, POISON)
            expand_inline(inline, eager, experts=ids)
            assert torch.equal(eager, o)
