"""Plans are computed without a GPU or compiler, and every program a catalog plan runs is in the catalog."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.launch import max_blocks_for
from csf_kernels.moe.specs import ALIGN_CHUNK, ScaleRead, align_count_programs, experts_bins, k_step
from csf_moe import plan
from csf_moe.plan import FC1_RECORDS_STEPS, INLINE_TOKEN_LIMIT


def test_every_planned_program_is_built_by_the_catalog():
    built = catalog_specs(load_catalog(), cute=False)
    for geo in load_catalog().moe:
        for source in ("native", "expanded", "inline"):
            p = plan(geo, 8192, scale_source=source)
            missing = [s.describe() for s in p.specs() if s.key not in built]
            assert not missing, f"{geo.name} {source}: {missing}"


def test_fc1_reads_records_at_one_token_and_where_its_programs_run_few_steps():
    """FC1_RECORDS_TOKENS, FC1_RECORDS_STEPS: an inline plan's one-token bucket runs FC1 on W13's records (its
    program planned, one reading int32 ids), and so do its routed buckets whose FC1 programs each run at most
    FC1_RECORDS_STEPS K steps (all their calls); never for native or expanded plans, never with
    fc1_records_tokens=0, and at one token only with fc1_records_steps=0."""
    short_somewhere = False
    for geo in load_catalog().moe:
        p = plan(geo, 64)
        # FC1 reads records beside W2's expansion only where FC2 finishes FC1; FC2 does at one token on the served TP
        # geometries, while the wider ranks of an EP rank (full intermediate width) or of the TP 2 geometries the
        # multi-GPU run adds can give FC2 too many K steps a split for it
        if geo.ep == 1 and geo.tp != 2:
            assert p.bucket_for(1).fc2_finishes_fc1, geo.name
        one = 1 if p.bucket_for(1).fc2_finishes_fc1 else 0
        assert p.bucket_for(1).fc1_records_tokens == one, geo.name
        steps = -(-geo.hidden // k_step(geo.fmt))
        for b in p.buckets[1:]:
            short = b.fc2_finishes_fc1 and -(-steps // b.splits_fc1) <= FC1_RECORDS_STEPS
            assert b.fc1_records_tokens == (b.tokens if short else 0), (geo.name, b.tokens)
            short_somewhere |= short
        records_fc1 = [s for s in p.specs() if s.kernel == "moe.gemm_decode" and s.fact["SRC"] == 1]
        assert bool(records_fc1) == any(b.fc1_reads_records for b in p.buckets)
        assert all(s.fact["FIN"] == 0 and s.fact["ROUTED"] and not s.fact["IDS64"]
                                   for s in records_fc1)  # fmt: skip
        by_tokens = plan(geo, 64, fc1_records_steps=0)
        assert [b.fc1_records_tokens for b in by_tokens.buckets] == [one] + [0] * (len(by_tokens.buckets) - 1)
        for other in (plan(geo, 64, scale_source="native"), plan(geo, 64, scale_source="expanded"),
                      plan(geo, 64, fc1_records_tokens=0)):  # fmt: skip
            assert not any(b.fc1_reads_records for b in other.buckets)
    assert short_somewhere  # (Qwen3-30B MXFP4's two tokens: 8 steps a program)
    qwen = plan(load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4"), 64)
    deepseek = plan(load_catalog().moe_geometry("deepseek-v4.1-flash", 4, "mxfp4"), 64)
    assert qwen.bucket_for(2).fc1_records_tokens == 2 and deepseek.bucket_for(2).fc1_records_tokens == 0


def test_a_bucket_reads_records_in_fc1_only_where_fc2_finishes_fc1():
    p = plan(load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4"), 64)
    one = p.bucket_for(1)
    with pytest.raises(ValueError, match="only in expanding buckets whose FC2 finishes FC1"):
        dataclasses.replace(p.bucket_for(8), fc1_records_tokens=8)
    with pytest.raises(ValueError, match="must lie in"):
        dataclasses.replace(one, fc1_records_tokens=2)


def test_calls_of_one_route_chunk_align_in_one_program():
    geo = load_catalog().moe_geometry("deepseek-v4.1-flash", 4, "mxfp4")  # top 6: 170 tokens fill a chunk
    align = [(s.fact["SCATTER"], s.fact["IDS64"]) for s in plan(geo, 128).specs() if s.kernel == "moe.align_plan"]
    assert sorted(set(align)) == [(1, 0), (1, 1)]  # every bucket's calls fit one chunk: no scatter program
    assert not any(s.kernel == "moe.align_scatter" for s in plan(geo, 128).specs())
    big = plan(geo, 512).specs()  # the 512-token bucket's calls of 171 and more tokens need the scatter
    assert {s.fact["SCATTER"] for s in big if s.kernel == "moe.align_plan"} == {0, 1}
    assert any(s.kernel == "moe.align_scatter" for s in big)
    assert any(s.kernel == "moe.align_count" for s in big)  # the count programs before the plan's sum


def test_every_catalog_call_over_one_chunk_holds_its_align_counts_in_its_route_slots():
    """The count programs write their rows at the start of ``sorted_ids`` (``max_blocks_for(...) * bm`` slots):
    every catalog geometry's calls of more than one chunk, up to 64k tokens, at every block size, must hold them."""
    for geo in load_catalog().moe:
        for pairs in (ALIGN_CHUNK + 1, 4 * ALIGN_CHUNK + 1, 65536 * geo.top_k):
            for bm in (8, 16, 32, 64, 128, 256):
                slots = max_blocks_for(pairs, geo.experts, bm) * bm
                assert slots >= align_count_programs(pairs) * experts_bins(geo.experts), (geo.name, pairs, bm)


def test_few_token_calls_read_their_routes_as_blocks_up_to_the_routed_token_count(monkeypatch):
    from csf_kernels.moe import heuristics as moe_heuristics
    from csf_kernels.moe import specs as moe_specs

    geo = load_catalog().moe_geometry("deepseek-v4.1-flash", 4, "mxfp4")
    monkeypatch.setattr(moe_heuristics, "ROUTED_TOKENS", 3)  # calls of 1-3 tokens run in the 1-, 2- and 4-buckets
    p = plan(geo, 64, scale_source="native")
    specs = p.specs()
    routed = [s for s in specs if s.kernel == "moe.gemm_decode" and s.fact["ROUTED"]]
    assert sorted((s.fact["FIN"], s.fact["IDS64"]) for s in routed) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for t in (1, 2, 3):
        assert moe_specs.routes_as_blocks(p.bucket_for(t).config) and p.bucket_for(t).config.bm == 8
    # buckets of routed calls only: FC2 finishes FC1 (the 4-bucket also serves 4-token calls, which align)
    assert [p.bucket_for(t).fc2_finishes_fc1 for t in (1, 2, 3)] == [True, True, False]


def test_a_plans_tiles_keep_reading_routes_as_blocks_whatever_the_module_settings_later(monkeypatch):
    """Whether a config reads routes as blocks is the config's own (``GemmConfig.routed``): a plan made on the
    catalog's one-token tiles makes the same programs after the module's tiles change (otherwise a test swapping
    them between plans would have a bound plan's routed programs refused)."""
    import dataclasses

    from csf_kernels.moe import specs as moe_specs

    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "nvfp4")
    p = plan(geo, 300, scale_source="native")
    before = p.specs()
    monkeypatch.setattr(moe_specs, "DECODE_NARROW", dataclasses.replace(moe_specs.DECODE_NARROW, word_stages=1))
    assert p.specs() == before and any(s.fact.get("ROUTED") for s in before)
    with pytest.raises(ValueError, match="8-route blocks only"):
        dataclasses.replace(moe_specs.DECODE, routed=True)


@pytest.mark.parametrize("model,tp,fmt", [("gpt-oss-120b", 1, "mxfp4"), ("kimi-k2", 16, "nvfp4")])
def test_fc2_finishing_fc1_splits_within_its_activation_buffer_and_keeps_both_partials(model, tp, fmt):
    from csf_kernels.moe import heuristics as moe_heuristics
    from csf_kernels.moe import specs as moe_specs
    from csf_kernels.moe.relabel import k_step

    geo = load_catalog().moe_geometry(model, tp, fmt)
    p = plan(geo, 64, scale_source="native")
    steps = -(-geo.intermediate // k_step(geo.fmt))
    for b in p.buckets:
        fits = -(-steps // b.splits_fc2) <= moe_specs.FIN_STEPS  # a split's K steps fit the activation buffer
        assert b.fc2_finishes_fc1 == (b.tokens <= moe_heuristics.ROUTED_TOKENS and fits)
        if b.fc2_finishes_fc1:
            pairs = b.tokens * p.top_k
            both = pairs * (b.splits_fc1 * 2 * geo.intermediate + b.splits_fc2 * geo.hidden)
            assert b.partials(p.top_k, geo) == both <= p.scratch.partials[1]
    # gpt-oss (23 FC2 steps): one token's 3 splits fit, 4 tokens' one split does not (no splits added for it)
    assert model != "gpt-oss-120b" or [b.fc2_finishes_fc1 for b in p.buckets[:3]] == [True, False, False]


def test_one_token_calls_read_their_routes_as_blocks_and_align_only_to_expand():
    """The first bucket (one-token calls) plans the routed GEMMs whatever its scales, and the one-token alignment
    (each route a block) for the calls that expand the routed experts' scales (it lists them)."""
    geo = load_catalog().moe_geometry("gpt-oss-120b", 1, "mxfp4")

    def routed(p):
        return {s.fact["IDS64"] for s in p.specs() if s.kernel == "moe.gemm_decode" and s.fact["ROUTED"]}

    def route_aligned(p):
        return {s.fact["IDS64"] for s in p.specs() if s.kernel == "moe.align_routes"}

    native = plan(geo, 64, scale_source="native")
    assert routed(native) == {0, 1} and route_aligned(native) == {0, 1}
    records = plan(geo, 64, scale_source="inline", inline_token_limit=64)
    assert routed(records) == {0, 1}
    expanding = plan(geo, 64, scale_source="inline")
    assert expanding.buckets[0].expand and routed(expanding) == {0, 1} and route_aligned(expanding) == {0, 1}
    assert routed(plan(geo, 64, scale_source="native", buckets=(2, 64))) == {0, 1}  # T = 1 runs in the 2-bucket
    from csf_kernels.moe.specs import DECODE, gemm_spec

    with pytest.raises(ValueError, match="does not read routes as blocks"):
        gemm_spec(geo.fmt, ScaleRead.PLANE, fc1=True, activation="silu", bias=False, config=DECODE, routed=True)


def test_buckets_pick_tiles_and_expansion_by_token_count():
    geo = load_catalog().moe_geometry("deepseek-v4.1-flash", 4, "mxfp4")
    p = plan(geo, 8192, scale_source="inline")
    assert [b.tokens for b in p.buckets] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    for b in p.buckets:
        assert b.expand == (b.tokens > INLINE_TOKEN_LIMIT or b.config.name == "prefill")
        assert b.scale_read == (ScaleRead.PLANE if b.expand else ScaleRead.RECORDS)
    assert p.bucket_for(1).expand and p.bucket_for(64).expand  # the routed experts' scales expanded first
    records = plan(geo, 4096, scale_source="inline", inline_token_limit=512)  # records read in the GEMM
    assert not records.bucket_for(64).expand and records.bucket_for(64).scale_read is ScaleRead.RECORDS
    # decode tiles: 8-route mma.sync blocks up to 4 routes per expert (DS4.1: 384 experts, top 6), then wgmma
    # blocks reading relabelled activations: 16 routes up to 8 per expert, 32 up to 64, 64 above; the prefill
    # tiles above 1024 routes per expert
    blocks = [(p.bucket_for(t).config.bm, p.bucket_for(t).config.mma) for t in (1, 256, 512, 1024, 4096, 8192)]
    assert blocks == [(8, "mma_sync")] * 2 + [(16, "wgmma"), (32, "wgmma"), (32, "wgmma"), (64, "wgmma")]
    assert all(b.config.relabelled == (b.config.mma == "wgmma") for b in p.buckets)
    assert {b.config.name for b in p.buckets} == {"decode"}
    prefill = plan(geo, 1 << 17, buckets=(65536, 1 << 17))
    assert [b.config.name for b in prefill.buckets] == ["decode", "prefill"]
    assert p.bucket_for(3).tokens == 4
    with pytest.raises(ValueError, match="max_tokens"):
        p.bucket_for(8193)
    native = plan(geo, 4096, scale_source="native")
    assert not any(b.expand for b in native.buckets)
    assert native.scratch_bytes < p.scratch_bytes  # no expansion planes


def test_scratch_regions_are_aligned_and_disjoint():
    geo = load_catalog().moe_geometry("kimi-k2", 16, "nvfp4")
    lay = plan(geo, 300, scale_source="expanded").scratch
    regions = sorted(
        (off, off + n * size)
        for (off, n), size in (
            (lay.cursor, 4), (lay.meta, 4), (lay.block_expert, 4), (lay.active_experts, 4), (lay.sorted_ids, 4),
            (lay.intermediate, 2), (lay.fc2_out, 2), (lay.w13_scales, 1), (lay.w2_scales, 1),
            (lay.relabelled_input, 2),
        )
    )  # fmt: skip
    for (a0, a1), (b0, _) in itertools.pairwise(regions):
        assert a0 % 256 == 0 and a1 <= b0
    assert regions[-1][1] <= lay.nbytes


def test_plan_rejects_what_it_cannot_serve():
    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
    with pytest.raises(ValueError, match="quant_mode"):
        plan(geo, 8, quant_mode="nvfp4")
    with pytest.raises(ValueError, match="scale_source"):
        plan(geo, 8, scale_source="compact")
    with pytest.raises(ValueError, match="top_k"):
        plan(geo, 8, top_k=0)
    with pytest.raises(ValueError, match="max_tokens"):
        plan(geo, 0)


def test_every_experts_scales_expand_from_the_planned_routes_per_expert():
    """EXPAND_ALL_ROUTES_PER_EXPERT by default; a plan argument moves the threshold (Qwen3-30B: 128 experts,
    top-8, so 2 routes per expert at 32 tokens, 3 at 48); it must be positive."""
    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")
    default, later = plan(geo, 64), plan(geo, 64, expand_all_routes_per_expert=3)
    assert next(t for t in range(1, 65) if default.expands_all_experts(t)) == 32
    assert next(t for t in range(1, 65) if later.expands_all_experts(t)) == 48
    with pytest.raises(ValueError, match="expand_all_routes_per_expert must be positive"):
        plan(geo, 64, expand_all_routes_per_expert=0)


def test_the_plan_names_each_calls_expansion_schedule():
    """One decision, in the plan: what a call expands and how, from its bucket, its token count, its route ids
    and what the device makes of the planes' expansions (the layer only executes it)."""
    from csf_moe.plan import ExpansionSchedule as S
    from csf_moe.plan import PlaneExpansion

    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, "mxfp4")  # 128 experts, top-8: all experts from 32 tokens
    p = plan(geo, 64, scale_source="inline")
    chained = PlaneExpansion(w13_dependent=True, w2_dependent=True, w13_whole_rows=True)
    ok = dict(ids_list_experts=True)
    assert p.expansion_schedule(1, chained, **ok) is S.FC1_ON_RECORDS  # FC1_RECORDS_TOKENS
    assert p.expansion_schedule(1, chained, ids_list_experts=False) is S.ROUTED_CHAINED  # int64 ids list no experts
    assert p.expansion_schedule(1, dataclasses.replace(chained, w2_dependent=False), **ok) is S.ROUTED_FORKED
    for forked in (dataclasses.replace(chained, chain=False), dataclasses.replace(chained, w13_whole_rows=False),
                   dataclasses.replace(chained, w13_dependent=False)):  # fmt: skip
        assert p.expansion_schedule(16, forked, **ok) is S.ROUTED_FORKED
    assert p.expansion_schedule(16, chained, **ok) is S.ROUTED_CHAINED
    assert p.expansion_schedule(32, chained, **ok) is S.ALL_EXPERTS
    assert p.expansion_schedule(16, chained, planes_given=True, **ok) is S.GIVEN_PLANES
    assert plan(geo, 64, scale_source="native").expansion_schedule(16, chained, **ok) is S.NONE
    records = plan(geo, 64, scale_source="inline", inline_token_limit=64)  # the GEMMs read the records themselves
    assert records.expansion_schedule(16, chained, **ok) is S.NONE
