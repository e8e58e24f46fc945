"""Expert- and tensor-parallel ranks on the CPU: the catalog's EP geometries and their AOT programs, a rank's
slice, the route-id map (allocation-free, invalid ids inert, one buffer set for every layer's map) and ranks'
reference outputs summing to the whole."""

from __future__ import annotations

import pytest
import torch

from csf_codec import scale_format
from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import MoEGeometry, load_catalog
from csf_moe import LocalRoutes, RankShard, RouteBuffers, local_expert_map, plan, shard_weights
from csf_moe.reference import moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing

from .padding_routes import with_padding_routes

# the models' usual expert-parallel sizes, as catalog.yaml lists them
EP_SIZES = {"deepseek-v3": (8,), "deepseek-v4.1-flash": (2, 4, 8), "kimi-k2": (2, 8, 16), "qwen3-30b-a3b": (4, 8)}
TINY = MoEGeometry(model="tiny", tp=1, fmt=scale_format("mxfp4"), experts=8, hidden=256, intermediate=128, top_k=3)


def test_the_catalog_holds_each_models_ep_geometries_with_local_experts_at_full_width():
    cat = load_catalog()
    for model, sizes in EP_SIZES.items():
        for fmt in ("mxfp4", "nvfp4"):
            tp_entry = next(g for g in cat.moe if (g.model, g.fmt.name, g.ep) == (model, fmt, 1))
            single = MoEGeometry(**{**tp_entry.__dict__, "tp": 1, "intermediate": tp_entry.intermediate * tp_entry.tp})
            for ep in sizes:
                geo = cat.moe_geometry(model, 1, fmt, ep=ep)
                assert geo.name == f"{model}/tp1/ep{ep}/{fmt}"
                assert (geo.experts, geo.global_experts) == (single.experts // ep, single.experts)
                assert geo == RankShard(ep=ep).geometry(single)  # full intermediate size, 1/ep of the experts
    assert sum(g.ep > 1 for g in cat.moe) == 2 * sum(len(s) for s in EP_SIZES.values())


def test_the_aot_build_lists_every_program_an_ep_geometrys_served_plan_runs():
    cat = load_catalog()
    programs = catalog_specs(cat, cute=False)  # what `nox -s aot_build` compiles, listed without compiling
    listed_for = {g for _spec, geos in programs.values() for g in geos}
    for geo in (g for g in cat.moe if g.ep > 1):
        assert geo.name in listed_for
        served = plan(geo, max(cat.token_buckets), scale_source="inline")  # as the adapters plan it
        missing = [s.describe() for s in served.specs() if s.key not in programs]
        assert not missing, f"{geo.name}: {missing[:3]}"


def test_an_ep_rank_plans_the_tiles_of_the_whole_layer():
    """Tiles follow routes per expert, which a rank shares with the whole layer: the same config per bucket (what
    makes the rank's GEMMs the whole layer's, bit for bit, on the GPU)."""
    cat = load_catalog()
    for ep in (2, 4, 8):
        local = cat.moe_geometry("deepseek-v4.1-flash", 1, "mxfp4", ep=ep)
        whole = RankShard().geometry(MoEGeometry(**{**local.__dict__, "ep": 1, "experts": local.global_experts}))
        a, b = plan(local, 8192), plan(whole, 8192)
        assert [x.config for x in a.buckets] == [x.config for x in b.buckets]
        assert [a.expands_all_experts(t) for t in (1, 64, 512)] == [b.expands_all_experts(t) for t in (1, 64, 512)]
        assert a.scratch_bytes <= b.scratch_bytes  # fewer experts: fewer partial blocks, smaller expanded planes


def test_rank_geometry_and_expert_ranges():
    shard = RankShard(tp=2, tp_rank=1, ep=4, ep_rank=3)
    geo = shard.geometry(TINY)
    assert (geo.tp, geo.ep, geo.experts, geo.intermediate, geo.global_experts) == (2, 4, 2, 64, 8)
    assert list(shard.experts(8)) == [6, 7]
    with pytest.raises(ValueError, match="no rank"):
        RankShard(ep=2, ep_rank=2)
    with pytest.raises(ValueError, match="do not split"):
        RankShard(ep=3).geometry(TINY)
    with pytest.raises(ValueError, match="single-rank"):
        RankShard().geometry(geo)


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_local_routes_map_into_one_buffer_and_keep_invalid_ids_inert(ids_dtype):
    expert_map = local_expert_map(8, RankShard(ep=2, ep_rank=1))
    assert expert_map.tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]
    routes = LocalRoutes(expert_map, max_pairs=12)
    ids = torch.tensor([[4, 0, 7], [-1, 5, 8], [2**30, -(2**30), 6]], dtype=ids_dtype)  # padding: -1, 8, far out
    got = routes(ids)
    assert got.dtype == torch.int32 and got.shape == ids.shape
    assert got.tolist() == [[0, -1, 3], [-1, 1, -1], [-1, -1, 2]]
    # every call writes the same buffer: nothing allocated, the addresses a CUDA graph captured stay valid
    again = routes(ids[:2].flip(0))
    assert again.data_ptr() == got.data_ptr() and again.tolist() == [[-1, 1, -1], [0, -1, 3]]
    with pytest.raises(ValueError, match="exceed"):
        routes(torch.zeros(5, 3, dtype=ids_dtype))
    with pytest.raises(ValueError, match="int32 or int64"):
        routes(ids.to(torch.int16))


def test_layers_maps_share_one_buffer_set_sized_for_the_largest_and_keep_their_own_ids():
    buffers = RouteBuffers("cpu", max_pairs=4)
    # two layers of one device: their placements differ, the second plans more routes than the first
    first = LocalRoutes(local_expert_map(8, RankShard(ep=2, ep_rank=1)), max_pairs=6, buffers=buffers)
    second = LocalRoutes(torch.tensor([-1, 0, -1, 1, -1, 2, -1, 3], dtype=torch.int32), max_pairs=12, buffers=buffers)
    assert first.buffers is second.buffers is buffers and buffers.max_pairs == 12  # grown, while layers are built
    ids = torch.tensor([[4, 1], [7, 8], [5, -1]], dtype=torch.int64)
    a = first(ids)
    assert a.tolist() == [[0, -1], [3, -1], [1, -1]]  # the first layer consumes its map here
    b = second(torch.cat((ids, ids)).to(torch.int32))
    assert b.tolist() == [[-1, 0], [3, -1], [2, -1]] * 2
    # one buffer: the second map wrote where the first had (the first layer had read it by then)
    assert a.data_ptr() == b.data_ptr() == buffers.local.data_ptr()
    assert first(ids).tolist() == [[0, -1], [3, -1], [1, -1]]
    with pytest.raises(ValueError, match="exceed the 6"):  # each map keeps its own layer's limit
        first(torch.zeros(7, dtype=torch.int32))
    with pytest.raises(ValueError, match="route buffers on"):
        LocalRoutes(torch.zeros(8, dtype=torch.int32, device="meta"), max_pairs=2, buffers=buffers)


def test_local_routes_follow_any_placement():
    # vLLM's round-robin placement: rank 1 of 2 holds the odd experts
    routes = LocalRoutes(torch.tensor([-1, 0, -1, 1, -1, 2], dtype=torch.int32), max_pairs=6)
    assert routes(torch.arange(6).view(2, 3)).tolist() == [[-1, 0, -1], [1, -1, 2]]


def _whole(geo: MoEGeometry, seed: int = 5):
    data = synthetic_layer(geo, seed=seed)
    return data, data.weight_kwargs()


@pytest.mark.parametrize(("tp", "ep"), [(1, 2), (2, 2), (1, 4)])
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_ranks_reference_outputs_sum_to_the_whole_layers(tp, ep, fmt):
    """Each rank's slice with its mapped route ids computes only its experts; the ranks' sum (the engines'
    all-reduce) is the single-rank layer's output."""
    from dataclasses import replace

    geo = replace(TINY, fmt=scale_format(fmt))
    data, whole = _whole(geo)
    x, ids, w = synthetic_routing(geo, 9, torch.Generator().manual_seed(1))
    ids = with_padding_routes(ids, geo.experts, invalid=[-1])  # an engine's padding route: inert on every rank
    want = moe_reference(x, data.reference(), w, ids)
    total = torch.zeros_like(want)
    for t_rank in range(tp):
        for e_rank in range(ep):
            shard = RankShard(tp=tp, tp_rank=t_rank, ep=ep, ep_rank=e_rank)
            part = shard_weights(whole, shard)
            rank_geo = shard.geometry(geo)
            assert part["w13"].shape == (rank_geo.experts, 2 * rank_geo.intermediate, geo.hidden // 2)
            assert part["w2_scale"].shape == rank_geo.w2_scale_shape
            local = LocalRoutes(local_expert_map(geo.experts, shard), ids.numel())(ids)
            rank_data = replace(data, geometry=rank_geo, **part)
            total += moe_reference(x, rank_data.reference(), w, local)
    # float32 sums in another order (and, across TP ranks, dot products split in two): a rounding apart
    assert float((total - want).norm() / want.norm()) < 1e-5


def test_a_ranks_slice_is_the_whole_layers_experts_and_halves():
    data, whole = _whole(TINY)
    part = shard_weights(whole, RankShard(tp=2, tp_rank=1, ep=2, ep_rank=1))
    n = TINY.intermediate // 2
    assert torch.equal(part["w13"][:, :n], data.w13[4:, n : 2 * n])  # gate's second half
    assert torch.equal(part["w13"][:, n:], data.w13[4:, 3 * n :])  # up's second half
    assert torch.equal(part["w2"], data.w2[4:, :, n // 2 :])
    assert torch.equal(part["w2_scale"], data.w2_scale[4:, :, data.w2_scale.shape[-1] // 2 :])
