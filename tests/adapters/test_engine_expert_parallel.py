"""Expert parallelism against the real engines on the CPU: two EP ranks, with and without tensor parallelism, build
their local experts, load exactly their slice of the checkpoint through the engine's own loader, plan and account
their local experts, and their outputs (route ids mapped as each engine maps them) sum to the single-rank layer's
over gloo. What csf cannot serve (EPLB, all-to-all backends) is refused, naming the engine option."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from csf_codec import MXFP4, NVFP4
from csf_serving_adapters.accounting import LEDGER
from csf_serving_adapters.moe_core import LOCAL_ROUTES_ATTR, ROUTE_BUFFERS

from .engines import engine_named, only
from .ep_ranks import CASES, EP, expected_rank_params, rank_forward, reference_bound_layer, sglang_dispatch
from .test_engine_loading import SCALES, E, H, N, _layer, _load, _native
from .tp_shards import params, same

FORMATS = [MXFP4, NVFP4]


@pytest.fixture(scope="module", autouse=True)
def _registered(engine):
    engine.register()


def _rank_layers(engine, fmt, case):
    native = _native(fmt)
    layers = []
    for kwargs, shard in CASES[engine.name][case]:
        layer = _layer(engine, fmt.name, **kwargs)
        _load(engine, layer, native, fmt)  # every expert of the checkpoint, by its global id
        layers.append((layer, shard))
    return native, layers


@pytest.mark.parametrize("case", ["without_tp", "with_tp"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_ep_ranks_hold_exactly_their_slice_of_the_checkpoint(engine, fmt, case):
    native, ranks = _rank_layers(engine, fmt, case)
    whole = _layer(engine, fmt.name)
    _load(engine, whole, native, fmt)
    single = params(whole)
    for layer, shard in ranks:
        got, want = params(layer), expected_rank_params(single, shard)
        assert got.keys() == want.keys()
        assert layer.w13_weight.shape[0] == E // EP  # the rank's local experts only
        for name in want:
            assert same(got[name], want[name]), f"{case} {shard}: {name}"
        method = layer.quant_method
        assert (method.ep_size(), method.tp_size()) == (shard.ep, shard.tp)
    # and the bytes are the checkpoint's: rank 1's first local expert is the model's expert E / EP
    layer, shard = ranks[-1]
    g, n = E // EP * shard.ep_rank, N // shard.tp
    gate = native["gate_scale"][g][shard.tp_rank * n : (shard.tp_rank + 1) * n]
    assert same(layer.w13_weight_scale.data[0, :n], gate)
    assert same(layer.w2_weight.data[0], native["down"][g][:, shard.tp_rank * n // 2 : (shard.tp_rank + 1) * n // 2])


@pytest.mark.parametrize("case", ["without_tp", "with_tp"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_ep_ranks_plan_and_account_their_local_experts(engine, fmt, case):
    _, ranks = _rank_layers(engine, fmt, case)
    layer, shard = ranks[-1]
    method = layer.quant_method
    p, w = method.prepare(layer)
    geo = p.geometry
    assert (geo.experts, geo.ep, geo.tp, geo.intermediate) == (E // EP, EP, shard.tp, N // shard.tp)
    assert geo.name.endswith(f"/tp{shard.tp}/ep{EP}/{fmt.name}")
    native_bytes = sum(getattr(layer, s).numel() for s in SCALES)
    assert native_bytes == E // EP * (2 * N * H + H * N) // shard.tp // fmt.block_size  # local experts' planes
    LEDGER.clear()
    entry = method.release_native(layer, w)
    assert entry.native_bytes == native_bytes and 0 < entry.stored_bytes < native_bytes


@only("vllm")
def test_vllm_maps_the_models_route_ids_through_its_expert_map(engine):
    _, ranks = _rank_layers(engine, MXFP4, "with_tp")
    for layer, shard in ranks:
        method = layer.quant_method
        assert method.global_expert_map(layer) is layer.expert_map
        local = [i - 2 * shard.ep_rank if 2 * shard.ep_rank <= i < 2 * shard.ep_rank + 2 else -1 for i in range(E)]
        assert layer.expert_map.tolist() == local


@only("vllm")
def test_vllm_layers_route_maps_share_the_devices_buffers_and_keep_their_own_ids(engine):
    """As process_weights_after_loading maps them: every layer's LocalRoutes writes the device's one buffer set,
    grown to the largest layer's routes, and each maps through its own layer's expert_map."""
    (a, shard_a), (b, shard_b) = _rank_layers(engine, MXFP4, "with_tp")[1]  # two layers (ranks 0 and 1's maps)
    for layer, pairs in ((a, 6), (b, 4 * E)):
        layer.quant_method.map_routes(layer, pairs, torch.device("cpu"))
    ra, rb = (getattr(layer, LOCAL_ROUTES_ATTR) for layer in (a, b))
    assert ra.buffers is rb.buffers is ROUTE_BUFFERS.get("cpu", 0) and ra.buffers.max_pairs >= 4 * E
    ids = torch.tensor([[0, 3], [2, 1], [-1, E]], dtype=torch.int32)
    for routes, shard in ((ra, shard_a), (rb, shard_b)):
        held = shard.experts(E)
        want = [[i - held.start if i in held else -1 for i in row] for row in ids.tolist()]
        got = routes(ids)
        assert got.tolist() == want and got.data_ptr() == ra.buffers.local.data_ptr()


@only("sglang")
def test_sglang_hands_csf_the_ranks_own_route_ids(engine):
    _, ranks = _rank_layers(engine, MXFP4, "without_tp")
    layer, _shard = ranks[1]
    assert layer.quant_method.global_expert_map(layer) is None  # its standard dispatcher maps them
    ids = torch.tensor([[0, 3], [2, -1]], dtype=torch.int32)
    out = sglang_dispatch(layer, torch.zeros(2, H), torch.ones(2, 2), ids)
    assert out.topk_output.topk_ids.tolist() == [[-1, 1], [0, -1]]


@only("vllm")
@pytest.mark.parametrize(
    ("options", "named"),
    [
        (dict(tp=2, ep=True, enable_eplb=True), "--enable-eplb"),
        (dict(dp=2, ep=True, all2all_backend="deepep_low_latency"), "--all2all-backend deepep_low_latency"),
        (dict(dp=2, ep=True, all2all_backend="flashinfer_nvlink_one_sided"), "--all2all-backend flashinfer"),
        (dict(tp=2, ep=True, all2all_backend="passthrough"), "--all2all-backend passthrough"),
    ],
)
def test_vllm_refuses_what_csf_cannot_serve_naming_the_option(engine, options, named):
    with pytest.raises(NotImplementedError, match=named):
        _layer(engine, "mxfp4", **options)


@only("vllm")
def test_vllm_serves_ep_over_data_parallel_ranks_with_allgather_reducescatter(engine):
    layer = _layer(engine, "mxfp4", dp=2, dp_rank=1, ep=True, all2all_backend="allgather_reducescatter")
    assert layer.quant_method.ep_size() == 2


@only("sglang")
@pytest.mark.parametrize(
    ("options", "named"),
    [
        (dict(enable_eplb=True), "--enable-eplb"),
        (dict(ep_num_redundant_experts=2), "--ep-num-redundant-experts"),
        (dict(moe_a2a_backend="deepep"), "--moe-a2a-backend deepep"),
        (dict(moe_a2a_backend="flashinfer"), "--moe-a2a-backend flashinfer"),
        (dict(elastic_ep_backend="nixl"), "--elastic-ep-backend"),
    ],
)
def test_sglang_refuses_what_csf_cannot_serve_naming_the_option(engine, options, named):
    with pytest.raises(NotImplementedError, match=named):
        _layer(engine, "mxfp4", ep=2, ep_rank=0, **options)


# ------------------------------------------------------------------------------------------------ gloo
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank: int, engine_name: str, case: str, port: int, outbox) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(CASES[engine_name][case]))
    try:
        engine = engine_named(engine_name)
        engine.register()
        kwargs, _shard = CASES[engine_name][case][rank]
        gen = torch.Generator().manual_seed(11)
        x = torch.randn(6, H, generator=gen).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=gen)[:2] for _ in range(6)]).to(torch.int32)
        ids[5, 1] = -1  # a padding route: inert on every rank
        w = torch.rand(6, 2, generator=gen)
        results = {}
        for fmt in FORMATS:
            layer = _layer(engine, fmt.name, **kwargs)
            _load(engine, layer, _native(fmt), fmt)
            reference_bound_layer(layer)
            out = rank_forward(engine_name, layer, x, w, ids).float()
            dist.all_reduce(out)  # the engines' all-reduce of the ranks' outputs (gloo here, NCCL when served)
            results[fmt.name] = out
            if rank == 0:
                single = _layer(engine, fmt.name)
                _load(engine, single, _native(fmt), fmt)
                reference_bound_layer(single)
                want = rank_forward(engine_name, single, x, w, ids).float()
                results[fmt.name] = float((out - want).norm() / want.norm())
        if rank == 0:
            outbox.put(results)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", ["without_tp", "with_tp"])
def test_ep_ranks_outputs_sum_over_gloo_to_the_single_rank_layers(engine, case):
    """Each rank's reference output over its loaded experts, with route ids as the engine hands them to csf,
    all-reduced over gloo: the single-rank layer's output (float32 sums in another order apart)."""
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    ranks = len(CASES[engine.name][case])
    port = _free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, engine.name, case, port, outbox)) for r in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    errors = outbox.get(timeout=5)
    assert set(errors) == {f.name for f in FORMATS}
    assert all(err < 1e-5 for err in errors.values()), errors
