"""Buckets of routed few-token calls run no FC1 finish kernel: FC2's programs finish FC1 from its partials for
their own K range (``BucketPlan.fc2_finishes_fc1``). Launch order, shapes and buffers only (the GEMMs run on
GPUs: Gluon); the GPU suite checks the results against the float32 reference and the other arms."""

from __future__ import annotations

import pytest
import torch

from csf_codec import scale_format
from csf_kernels import moe_specs
from csf_kernels.catalog import MoEGeometry
from csf_kernels.kernels.moe_combine_gluon import MAX_SLOTS
from csf_kernels.kernels.moe_fc1_finish_gluon import FIN_STEPS
from csf_kernels.moe import Fc1Partials, Fc2Combine, gemm_launch
from csf_moe import plan, prepare_weights
from csf_moe.layer import MoELayer
from csf_moe.synthetic import synthetic_layer, synthetic_routing


def _layer(fmt: str, source: str, **plan_kwargs) -> tuple[MoEGeometry, MoELayer]:
    geo = MoEGeometry(model="tiny", tp=1, fmt=scale_format(fmt), experts=8, hidden=320, intermediate=192, top_k=3)
    p = plan(geo, 16, scale_source=source, **plan_kwargs)
    data = synthetic_layer(geo, seed=3, device="cpu")
    # MoELayer directly: CPU tensors need not be 256-byte aligned, as bind() requires of device scratch
    layer = MoELayer(plan=p, weights=prepare_weights(p, **data.weight_kwargs()),
                     scratch=torch.empty(p.scratch_bytes, dtype=torch.uint8))  # fmt: skip
    return geo, layer


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_routed_calls_run_fc1_then_fc2_reading_fc1_partials_and_combining(fmt, tokens):
    geo, layer = _layer(fmt, "native")
    bucket = layer.plan.bucket_for(tokens)
    assert bucket.fc2_finishes_fc1
    x, ids, w = synthetic_routing(geo, tokens, torch.Generator().manual_seed(tokens))
    out = torch.empty_like(x)
    launches = layer.launches(x, ids, w, out)
    assert [la.spec.kernel for la in launches] == ["moe.gemm_decode", "moe.gemm_decode"]
    fc1, fc2 = launches
    assert (fc1.spec.fact["ROUTED"], fc1.spec.fact["FIN"]) == (1, 0)
    assert (fc2.spec.fact["ROUTED"], fc2.spec.fact["FIN"]) == (1, 1)  # SiLU-and-mul
    part1, part2 = fc1.args[13], fc2.args[13]  # the GEMMs' float32 partials
    fin_part, fin_splits = fc2.args[-9], fc2.args[-6]
    pairs = tokens * geo.top_k
    assert fin_part.data_ptr() == part1.data_ptr() and fin_splits == bucket.splits_fc1
    fc1_region = bucket.fc1_partials(layer.plan.top_k, geo)  # the bucket's largest call's
    assert fc1_region >= fin_splits * pairs * 2 * geo.intermediate
    assert part2.data_ptr() == part1.data_ptr() + 4 * fc1_region  # FC2's partials after FC1's, not over them
    assert part2.numel() >= bucket.splits_fc2 * pairs * geo.hidden
    assert fc2.grid[2] == bucket.splits_fc2 and fc1.grid[2] == bucket.splits_fc1
    # FC1 zeroes one arrival counter per token and FC2 row tile; FC2 counts on them and writes the output
    arrivals, count, combined, weights, top_k = fc2.args[-5:]
    assert count == 0 and combined is out and weights is w and top_k == geo.top_k
    assert arrivals.dtype == torch.int32 and arrivals.numel() == tokens * fc2.grid[1]
    assert fc1.args[-5].data_ptr() == arrivals.data_ptr() and fc1.args[-4] == arrivals.numel()
    lay = layer.plan.scratch
    assert arrivals.data_ptr() == layer.scratch.data_ptr() + lay.arrivals[0]
    assert lay.arrivals[1] >= arrivals.numel() and lay.arrivals[0] + 4 * lay.arrivals[1] <= lay.nbytes
    regions = [getattr(lay, f) for f in ("partials", "fc2_out", "intermediate", "sorted_ids")]
    assert all(lay.arrivals[0] >= r[0] + r[1] or lay.arrivals[0] < r[0] for r in regions)  # a region of its own
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


def test_a_combining_fc2_refuses_what_it_cannot_write():
    geo, layer = _layer("mxfp4", "native")
    x, ids, w = synthetic_routing(geo, 2, torch.Generator().manual_seed(2))
    fc1, fc2 = layer.launches(x, ids, w, torch.empty_like(x))
    common = dict(fmt=geo.fmt, source="native", activation=geo.activation, config=layer.plan.bucket_for(2).config,
                  sorted_ids=layer.sorted_ids, block_expert=layer.block_expert, meta=layer.meta, pairs=ids.numel(),
                  routed_ids=ids, x_row_div=1, splits=fc2.grid[2], part=layer.partials)  # fmt: skip
    w13, w2 = layer.weights.w13, layer.weights.w2
    inter = layer.intermediate[: ids.numel() * geo.intermediate].view(ids.numel(), -1)
    fin = Fc1Partials(layer.partials, fc1.grid[2], w13)
    arrivals = layer.arrivals
    with pytest.raises(ValueError, match="give both finish and combine"):
        gemm_launch(fc1=False, x=inter, weights=w2, out=inter, finish=fin, **common)
    wrong_out = torch.empty(2, geo.hidden + 1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out must be contiguous bf16"):
        gemm_launch(fc1=False, x=inter, weights=w2, out=inter, finish=fin,
                    combine=Fc2Combine(wrong_out, w, arrivals), **common)  # fmt: skip
    with pytest.raises(ValueError, match="arrival counters"):
        gemm_launch(fc1=False, x=inter, weights=w2, out=inter, finish=fin,
                    combine=Fc2Combine(torch.empty_like(x), w, arrivals[:1]), **common)  # fmt: skip
    with pytest.raises(ValueError, match="topk_weights"):
        gemm_launch(fc1=False, x=inter, weights=w2, out=inter, finish=fin,
                    combine=Fc2Combine(torch.empty_like(x), w.double(), arrivals), **common)  # fmt: skip
    with pytest.raises(ValueError, match="zero_arrivals"):
        gemm_launch(fc1=False, x=inter, weights=w2, out=inter, zero_arrivals=arrivals, **common)


def test_the_combine_slot_limit_is_the_programs():
    assert moe_specs.COMBINE_MAX_SLOTS == MAX_SLOTS.value
    assert moe_specs.FIN_STEPS == FIN_STEPS.value
