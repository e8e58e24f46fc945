"""Buckets of routed few-token calls run no FC1 finish kernel: FC2's programs finish FC1 from its partials for
their own K range (``BucketPlan.fc2_finishes_fc1``). Launch order, shapes and buffers only (the GEMMs run on
GPUs: Gluon); the GPU suite checks the results against the float32 reference and the other arms."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.runtime import config as runtime_settings
from csf_moe.synthetic import synthetic_routing

from .tiny_layer import tiny_layer as _layer


def _row_block_expansions(monkeypatch) -> None:
    """Every plane on the row-block expander, as on a GPU (CPU tensors would take Triton's interpreter)."""
    import csf_kernels.expand.launch as expand
    import csf_moe.layer as layer_module

    for module in (expand, layer_module):
        monkeypatch.setattr(module, "expansion_engine", lambda inline, out: "row_block")


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_routed_calls_run_fc1_fc2_combine_with_fc2_reading_fc1_partials(fmt, tokens):
    geo, layer = _layer(fmt, "native")
    bucket = layer.plan.bucket_for(tokens)
    assert bucket.fc2_finishes_fc1
    x, ids, w = synthetic_routing(geo, tokens, torch.Generator().manual_seed(tokens))
    launches = layer.launches(x, ids, w, torch.empty_like(x))
    assert [la.spec.kernel for la in launches] == ["moe.gemm_decode", "moe.gemm_decode", "moe.combine"]
    fc1, fc2, combine = launches
    assert (fc1.spec.fact["ROUTED"], fc1.spec.fact["FIN"]) == (1, 0)
    assert (fc2.spec.fact["ROUTED"], fc2.spec.fact["FIN"]) == (1, 1)  # SiLU-and-mul
    part1, part2 = fc1.args[13], fc2.args[13]  # the GEMMs' float32 partials
    fin_part, fin_splits = fc2.args[-4], fc2.args[-1]
    pairs = tokens * geo.top_k
    assert fin_part.data_ptr() == part1.data_ptr() and fin_splits == bucket.splits_fc1
    fc1_region = bucket.fc1_partials(layer.plan.top_k, geo)  # the bucket's largest call's
    assert fc1_region >= fin_splits * pairs * 2 * geo.intermediate
    assert part2.data_ptr() == part1.data_ptr() + 4 * fc1_region  # FC2's partials after FC1's, not over them
    assert part2.numel() >= bucket.splits_fc2 * pairs * geo.hidden
    assert combine.args[1].data_ptr() == part2.data_ptr()
    assert fc2.grid[2] == bucket.splits_fc2 and fc1.grid[2] == bucket.splits_fc1
    specs = {s.key for s in layer.plan.specs()}
    assert all(la.spec.key in specs for la in launches)  # the plan lists (and a catalog would build) them all


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_expanding_routed_calls_list_the_experts_they_expand_by_their_route_ids(ids_dtype):
    """int32 route ids are the expanders' list of experts themselves (no alignment at all); int64 ones are
    listed by the one-token alignment."""
    geo, layer = _layer("mxfp4", "inline")
    x, ids, w = synthetic_routing(geo, 2, torch.Generator().manual_seed(2), ids_dtype=ids_dtype)
    launches = layer.launches(x, ids, w, torch.empty_like(x))
    kernels = [la.spec.kernel for la in launches]
    expansions = [la for la in launches if la.spec.kernel.startswith("expand.")]
    assert len(expansions) == 2 and "moe.fc1_finish" not in kernels  # W13's and W2's planes
    if ids_dtype == torch.int32:
        assert not any(k.startswith("moe.align") for k in kernels)
        assert all(la.args[7].data_ptr() == ids.data_ptr() and la.args[7].numel() == ids.numel() for la in expansions)
    else:
        assert kernels[0].startswith("moe.align")
        assert all(la.args[7].data_ptr() == layer.active_experts.data_ptr() for la in expansions)
    gemms = [la for la in launches if la.spec.kernel == "moe.gemm_decode"]
    assert [(g.spec.fact["ROUTED"], g.spec.fact["FIN"], g.spec.fact["SRC"]) for g in gemms] == [(1, 0, 0), (1, 1, 0)]


def test_a_bucket_that_also_serves_aligned_calls_keeps_its_finish_kernel():
    geo, layer = _layer("mxfp4", "native", buckets=(8, 16))  # 1-4 token calls routed in an 8-token bucket
    x, ids, w = synthetic_routing(geo, 2, torch.Generator().manual_seed(2))
    kernels = [la.spec.kernel for la in layer.launches(x, ids, w, torch.empty_like(x))]
    assert not layer.plan.bucket_for(2).fc2_finishes_fc1
    assert kernels == ["moe.gemm_decode", "moe.fc1_finish", "moe.gemm_decode", "moe.combine"]


@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("chain", [True, False])
def test_routed_expansions_chain_on_the_current_stream_where_both_planes_wait_as_dependent_launches(
    monkeypatch, pdl, chain
):
    """Both planes on the row-block expander (as every catalog plane on a GPU) and dependent launches on (the
    layer's defaults): W13's expansion waits first, W2's runs beside it, waits last and lets FC1 in only as its
    CTAs finish, and FC1 copies its first weights before it waits (EARLY); nothing forks. Otherwise (dependent
    launches off, or the layer told not to chain) W2's forks onto the side stream, FC1 waits first, and both
    (as dependent launches) let FC1 in only as their CTAs finish."""
    _row_block_expansions(monkeypatch)
    monkeypatch.setitem(runtime_settings._settings, "pdl", pdl != "0")
    geo, layer = _layer("mxfp4", "inline", fc1_records_tokens=0)  # one token expanding both planes
    assert layer.chain_expansions and layer.fc1_let_in == "end" and layer.early_fc1  # what serving runs
    layer.chain_expansions = chain
    x, ids, w = synthetic_routing(geo, 1, torch.Generator().manual_seed(1))
    launches, fork = layer._launches(x, ids, w, torch.empty_like(x))
    assert [la.spec.kernel for la in launches] == [
        "expand.row_blocks", "expand.row_blocks", "moe.gemm_decode", "moe.gemm_decode", "moe.combine"
    ]  # fmt: skip
    w13, w2 = launches[:2]
    assert w13.args[6].data_ptr() == layer.w13_plane.data_ptr() and w2.args[6].data_ptr() == layer.w2_plane.data_ptr()
    fc1, fc2 = launches[2:4]
    assert fc2.spec.fact["EARLY"] == 0
    if pdl == "1" and chain:
        # W2's waits last (beside W13's) and lets FC1 in as its CTAs finish: pdl 2 + LETS_DEPENDENT_IN_LAST
        assert fork is None and (w13.args[-1], w2.args[-1]) == (1, 6)
        assert fc1.spec.fact["EARLY"] == 1 and fc1.spec.key in {s.key for s in layer.plan.specs()}
        layer.early_fc1 = False
        assert layer._launches(x, ids, w, torch.empty_like(x))[0][2].spec.fact["EARLY"] == 0
        layer.fc1_let_in = "start"  # FC1 let in as W2's CTAs start
        assert [la.args[-1] for la in layer._launches(x, ids, w, torch.empty_like(x))[0][:2]] == [1, 2]
    else:
        assert fork == (0, 1, 2)  # forked and joined before FC1
        # W13's, right before FC1 on the current stream, and W2's, joined before FC1 (a graph's join into a
        # dependent launch is a dependent-launch edge), let it in only as their CTAs finish (pdl 1 + 4)
        assert (w13.args[-1], w2.args[-1]) == ((5, 5) if pdl == "1" else (0, 0))
        assert fc1.spec.fact["EARLY"] == 0


@pytest.mark.parametrize("hidden", [2560, 3584])
def test_routed_expansions_fork_where_w13s_rows_take_a_cta_per_block(monkeypatch, hidden):
    """W13 rows wider than a warp's image (NVFP4 at hidden 2560: 160 columns, chained; 3584: 224, as Kimi-K2
    MXFP4's) take a CTA per row block, and those calls fork their routed experts' expansions instead of chaining
    them; both let FC1 in only as their CTAs finish: the join's edge into FC1 is a dependent-launch edge under
    graph capture, and FC1 let in beside W2's forked CTAs runs longer (``docs/perf-notes.md``, "Routed experts'
    expansions are chained as dependent launches" and "An expansion lets FC1 in only as its CTAs finish")."""
    _row_block_expansions(monkeypatch)
    shape = dict(experts=4, hidden=hidden, intermediate=64, top_k=2)
    geo, layer = _layer("nvfp4", "inline", shape=shape, max_tokens=4, seed=5, fc1_records_tokens=0)
    assert layer.weights.w13.inline.geometry.cols == hidden // 16
    x, ids, w = synthetic_routing(geo, 1, torch.Generator().manual_seed(4))
    launches, fork = layer._launches(x, ids, w, torch.empty_like(x))
    w13, w2 = (la for la in launches if la.spec.kernel == "expand.row_blocks")
    if hidden // 16 <= 160:
        assert fork is None and (w13.args[-1], w2.args[-1]) == (1, 6)  # chained (as the test above)
    else:
        assert fork is not None and (w13.args[-1], w2.args[-1]) == (5, 5)


def test_bind_rejects_an_unknown_point_for_letting_fc1_in():
    from csf_moe import bind

    _, layer = _layer("mxfp4", "inline")
    with pytest.raises(ValueError, match="fc1_let_in must be one of"):
        bind(layer.plan, layer.weights, layer.scratch, fc1_let_in="middle")


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_one_token_runs_fc1_on_the_records_and_w2s_expansion_beside_it(monkeypatch, ids_dtype):
    """An inline plan's one-token calls (``BucketPlan.fc1_reads_records``): no expansion before FC1, which reads
    W13's CSF records; W2's expansion is launched after FC1 (waiting for it only before it exits, letting FC2 in
    as its CTAs start) and FC2 reads W2's expanded plane. int64 ids do not list the experts (an alignment
    would), so those calls expand both planes first. Two-token calls take the same form where FC1's programs run
    few K steps (this geometry's 3: FC1_RECORDS_STEPS), and expand both planes first with fc1_records_steps=0."""
    _row_block_expansions(monkeypatch)
    geo, layer = _layer("mxfp4", "inline")
    assert layer.plan.fc1_records_tokens == 1 and layer.plan.bucket_for(1).fc1_reads_records
    x, ids, w = synthetic_routing(geo, 1, torch.Generator().manual_seed(2), ids_dtype=ids_dtype)
    launches, fork = layer._launches(x, ids, w, torch.empty_like(x))
    kernels = [la.spec.kernel for la in launches]
    if ids_dtype == torch.int64:
        assert kernels[0].startswith("moe.align") and kernels.count("expand.row_blocks") == 2
        return
    assert fork is None
    assert kernels == ["moe.gemm_decode", "expand.row_blocks", "moe.gemm_decode", "moe.combine"]
    fc1, w2_expansion, fc2, _ = launches
    assert (fc1.spec.fact["SRC"], fc1.spec.fact["EARLY"], fc1.spec.fact["FIN"]) == (1, 0, 0)  # records
    assert fc1.prefer_shared and not fc2.prefer_shared  # the records programs' carveout
    assert (fc2.spec.fact["SRC"], fc2.spec.fact["FIN"]) == (0, 1)  # a native plane: W2's expanded one
    assert w2_expansion.args[6].data_ptr() == layer.w2_plane.data_ptr()
    assert w2_expansion.args[7].data_ptr() == ids.data_ptr()  # the route ids list the experts
    assert w2_expansion.args[-1] == 2  # waits last, lets FC2 in as its CTAs start
    assert layer.w2_plane.data_ptr() in {a.data_ptr() for a in fc2.args if isinstance(a, torch.Tensor)}
    assert {fc1.spec.key, fc2.spec.key} <= {s.key for s in layer.plan.specs()}  # (expanders: per plane)
    x, ids, w = synthetic_routing(geo, 2, torch.Generator().manual_seed(2))
    assert layer.plan.bucket_for(2).fc1_records_tokens == 2
    kernels = [la.spec.kernel for la in layer.launches(x, ids, w, torch.empty_like(x))]
    assert kernels == ["moe.gemm_decode", "expand.row_blocks", "moe.gemm_decode", "moe.combine"]
    _, by_tokens = _layer("mxfp4", "inline", fc1_records_steps=0)
    kernels = [la.spec.kernel for la in by_tokens.launches(x, ids, w, torch.empty_like(x))]
    assert kernels.count("expand.row_blocks") == 2 and kernels.index("moe.gemm_decode") == 2  # both planes first


def test_dependent_launches_off_expand_both_planes_first(monkeypatch):
    """W2's expansion beside FC1 needs it to wait as a dependent launch: without them one token expands both."""
    _row_block_expansions(monkeypatch)
    monkeypatch.setitem(runtime_settings._settings, "pdl", False)
    geo, layer = _layer("mxfp4", "inline")
    x, ids, w = synthetic_routing(geo, 1, torch.Generator().manual_seed(1))
    kernels = [la.spec.kernel for la in layer.launches(x, ids, w, torch.empty_like(x))]
    assert kernels[:2] == ["expand.row_blocks", "expand.row_blocks"]


@pytest.mark.parametrize("pdl", ["1", "0"])
def test_w2s_expansion_lets_fc1_in_only_as_its_ctas_finish_where_every_experts_scales_expand(monkeypatch, pdl):
    """From EXPAND_ALL_ROUTES_PER_EXPERT routes per expert: W13's on the side stream from the call's start; W2's on
    the current stream, FC1 right behind it. As row-block dependent launches both wait first and let FC1 in only
    as their CTAs finish (pdl 1 + LETS_DEPENDENT_IN_LAST): FC1 let in as they start is spread unevenly over the
    SMs."""
    _row_block_expansions(monkeypatch)
    monkeypatch.setitem(runtime_settings._settings, "pdl", pdl != "0")
    geo, layer = _layer("mxfp4", "inline")
    p = layer.plan
    t = 8
    assert p.expands_all_experts(t) and not p.expands_all_experts(5)
    x, ids, w = synthetic_routing(geo, t, torch.Generator().manual_seed(1))
    launches, (start, split, end) = layer._launches(x, ids, w, torch.empty_like(x))
    expansions = [i for i, la in enumerate(launches) if la.spec.kernel == "expand.row_blocks"]
    w2_at, w13_at = expansions
    assert start == 0 and w2_at == split - 1 and (split, end) == (w13_at, w13_at + 1)
    assert launches[w2_at].args[6].data_ptr() == layer.w2_plane.data_ptr()
    assert launches[end].spec.kernel.startswith("moe.gemm")  # FC1 right after the join
    # W13's, on the side stream, joins FC1 and lets it in only as its CTAs finish too
    assert (launches[w2_at].args[-1], launches[w13_at].args[-1]) == ((5, 5) if pdl == "1" else (0, 0))
