"""Expert-parallel ranks on the GPU, from the AOT cache (frozen): a rank's layer at a catalog EP geometry, its
route ids mapped by LocalRoutes, bit-identical to the single-rank layer computing only that rank's experts; the
mapping and the layer captured in one CUDA graph that replays allocating nothing."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels.catalog import load_catalog
from csf_moe import LocalRoutes, RankShard, bind, local_expert_map, plan, prepare_weights, shard_weights
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from tests.cuda_graphs import replay_allocating_nothing
from tests.moe.padding_routes import with_padding_routes

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")  # fresh data every run; in every failure message
MAX_TOKENS = 512
TOKENS = (1, 3, 7, 64, 300)
GEOMETRIES = [("qwen3-30b-a3b", 4, "mxfp4"), ("qwen3-30b-a3b", 8, "nvfp4")]  # single-rank geometry: tp 1


def _bucket_numerics(p, tokens):
    """What fixes a call's arithmetic (tiles, K splits, who finishes FC1); the scale source does not."""
    b = p.bucket_for(tokens)
    return b.config, b.splits_fc1, b.splits_fc2, b.fc2_finishes_fc1


def _bound(geo, weights):
    p = plan(geo, MAX_TOKENS, scale_source="inline")  # as the adapters plan a served layer
    return bind(p, prepare_weights(p, **weights), torch.empty(p.scratch_bytes, dtype=torch.uint8, device="cuda"))


@pytest.mark.parametrize(("model", "ep", "fmt"), GEOMETRIES)
def test_a_ranks_layer_is_bit_identical_to_its_slice_of_the_whole_layer(model, ep, fmt):
    cat = load_catalog()
    whole_geo = cat.moe_geometry(model, 1, fmt)
    data = synthetic_layer(whole_geo, seed=SEED, device="cuda")
    whole = _bound(whole_geo, data.weight_kwargs())
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for rank in (0, ep - 1):
        shard = RankShard(ep=ep, ep_rank=rank)
        geo = shard.geometry(whole_geo)
        assert geo == cat.moe_geometry(model, 1, fmt, ep=ep)  # a catalog geometry: every program in the AOT cache
        local = _bound(geo, shard_weights(data.weight_kwargs(), shard))
        routes = LocalRoutes(local_expert_map(whole_geo.experts, shard, device="cuda"), local.plan.max_pairs)
        held = shard.experts(whole_geo.experts)
        compared = []
        for t in TOKENS:
            if _bucket_numerics(local.plan, t) != _bucket_numerics(whole.plan, t):
                continue  # other K splits sum in another order: equal within rounding only
            x, ids, w = synthetic_routing(whole_geo, t, gen)
            ids = with_padding_routes(ids, whole_geo.experts, invalid=[-1])  # an engine's padding route
            mine = (ids >= held.start) & (ids < held.stop)
            want = whole.run(x, torch.where(mine, ids, -1), w)  # the whole layer, this rank's experts only
            got = local.run(x, routes(ids), w)
            assert torch.equal(got, want), f"seed {SEED} {geo.name} rank {rank} T={t}"
            compared.append(t)
        # one token's routes all fit the rank's experts: its blocks, and so its splits, are the whole layer's
        assert 1 in compared, f"{geo.name}: a one-token call plans other arithmetic than the whole layer"


def test_the_route_map_and_the_layer_replay_in_a_cuda_graph_allocating_nothing():
    cat = load_catalog()
    whole_geo = cat.moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
    data = synthetic_layer(whole_geo, seed=SEED, device="cuda")
    shard = RankShard(ep=4, ep_rank=2)
    layer = _bound(shard.geometry(whole_geo), shard_weights(data.weight_kwargs(), shard))
    routes = LocalRoutes(local_expert_map(whole_geo.experts, shard, device="cuda"), layer.plan.max_pairs)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    x, ids, w = synthetic_routing(whole_geo, 7, gen)
    out = torch.empty_like(x)
    eager = layer.run(x, routes(ids), w).clone()
    layer.run(x, routes(ids), w, out=out)  # bind outside capture (eager warm-up, as engines do)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.run(x, routes(ids), w, out=out)
    out.zero_()
    replay_allocating_nothing(graph)
    assert torch.equal(out, eager), f"seed {SEED}"
    _x2, ids2, _w2 = synthetic_routing(whole_geo, 7, gen)
    ids.copy_(ids2)  # new routes in the captured input: the replay maps them afresh
    replay_allocating_nothing(graph)
    assert torch.equal(out, layer.run(x, routes(ids), w)), f"seed {SEED}"
