"""The engine's K-split host API (CPU): split counts are whole engine records a split or refused with the counts
that are possible, partial launches pass their split's K steps and refuse what the partial programs cannot serve,
and the finishing launches check the partials' shapes."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.moe.engine import fc1_finish_launch, grouped_fp4_gemm_launch, partial_combine_launch
from csf_kernels.moe.engine_specs import (
    ENGINE_SPLIT_TILE_N,
    engine_fc1_finish_spec,
    engine_gemm_spec,
    engine_partial_combine_spec,
    engine_specs,
    engine_split_steps,
)

E, R, K, TOKENS, TOP_K = 3, 256, 576, 5, 2  # K: 9 steps


def _operands(k=K, per_step=2):
    w = torch.zeros(E, k // 64, R // 64, 256, dtype=torch.uint64)
    s = torch.zeros(E, k // 64, per_step * R, dtype=torch.uint8)
    x = torch.zeros(TOKENS, k, dtype=torch.bfloat16)
    be = torch.zeros(4, dtype=torch.int32)
    meta = torch.zeros(1, dtype=torch.int32)
    ids = torch.zeros(4 * 16, dtype=torch.int32)
    return w, s, x, be, meta, ids


@pytest.mark.parametrize(
    ("k_steps", "splits", "fmt", "steps"),
    [(9, 1, "mxfp4", 9), (9, 2, "mxfp4", 6), (9, 3, "mxfp4", 4), (9, 5, "mxfp4", 2), (45, 2, "mxfp4", 24),
     (80, 4, "mxfp4", 20), (9, 3, "nvfp4", 3), (8, 4, "nvfp4", 2), (9, 9, "nvfp4", 1), (45, 2, "nvfp4", 23)],
)  # fmt: skip
def test_split_steps_are_whole_records(k_steps, splits, fmt, steps):
    assert engine_split_steps(k_steps, splits, fmt) == steps
    # every split but the last starts and ends at whole records (one split: all of K, a tail record or not)
    assert -(-k_steps // steps) == splits and (splits == 1 or steps % (2 if fmt == "mxfp4" else 1) == 0)


def test_impossible_split_counts_are_refused_with_the_possible_ones():
    with pytest.raises(ValueError, match=r"4 K splits of 9 mxfp4 K steps .* \[1, 2, 3, 5\] are"):
        engine_split_steps(9, 4, "mxfp4")
    with pytest.raises(ValueError, match="12 K splits"):
        engine_split_steps(9, 12, "nvfp4")
    with pytest.raises(ValueError, match=r"4 K splits of 9 nvfp4"):  # 3 steps a split make 3, 2 make 5
        engine_split_steps(9, 4, "nvfp4")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            engine_split_steps(9, bad, "mxfp4")


@pytest.mark.parametrize("form", ["fc1", "rows"])
def test_a_partial_launch_passes_its_split_steps(form):
    w, s, x, be, meta, ids = _operands()
    part = torch.zeros(3 * TOKENS * TOP_K, R, dtype=torch.float32)
    launch = grouped_fp4_gemm_launch(w, s, x, part, be, meta, tile_n=16, io="gather", sorted_ids=ids, top_k=TOP_K,
                                     partial=form, splits=3)  # fmt: skip
    assert launch.spec == engine_gemm_spec(16, io="gather", partial=form) and launch.spec.fact["PART"] == form
    assert launch.args[3] is part
    # (..., ctas, top_k, pairs, split_steps, pdl): 9 steps in three splits of 4 (whole two-step records), 4 and 1
    assert launch.args[-4:-1] == (TOP_K, TOKENS * TOP_K, 4)
    assert launch.grid[0] <= 4 * 2 * 3  # never more CTAs than units: blocks x tiles x splits
    one = grouped_fp4_gemm_launch(w, s, x, part[: TOKENS * TOP_K], be, meta, tile_n=16, io="gather", sorted_ids=ids,
                                  top_k=TOP_K, partial=form)  # fmt: skip
    assert one.args[-2] == K // 64  # one split: all of K


def test_partial_launches_refuse_what_the_programs_cannot_serve():
    w, s, x, be, meta, ids = _operands()
    pairs = TOKENS * TOP_K
    part = torch.zeros(2 * pairs, R, dtype=torch.float32)
    routed = dict(tile_n=16, io="gather", sorted_ids=ids, top_k=TOP_K)
    with pytest.raises(TypeError, match="float32"):
        grouped_fp4_gemm_launch(w, s, x, part.bfloat16(), be, meta, partial="rows", splits=2, **routed)
    with pytest.raises(ValueError, match="shapes disagree"):  # rows: splits x pairs
        grouped_fp4_gemm_launch(w, s, x, part, be, meta, partial="rows", splits=3, **routed)
    with pytest.raises(ValueError, match="not possible"):
        grouped_fp4_gemm_launch(w, s, x, torch.zeros(4 * pairs, R), be, meta, partial="rows", splits=4, **routed)
    with pytest.raises(ValueError, match="need a partial program"):
        grouped_fp4_gemm_launch(w, s, x, torch.zeros(64, R, dtype=torch.bfloat16), be, meta, splits=2, **routed)
    with pytest.raises(ValueError, match="gathering"):
        grouped_fp4_gemm_launch(w, s, torch.zeros(64, K, dtype=torch.bfloat16), torch.zeros(64, R), be, meta,
                                tile_n=16, partial="rows")  # fmt: skip
    with pytest.raises(ValueError, match="one of"):
        grouped_fp4_gemm_launch(w, s, x, part, be, meta, partial="columns", splits=2, **routed)
    with pytest.raises(TypeError, match="float32 partials need partial="):
        grouped_fp4_gemm_launch(w, s, x, torch.zeros(64, R), be, meta, **routed)


def test_partial_programs_are_catalogued_at_the_split_block_sizes():
    parts = [s for s in engine_specs(("mxfp4", "nvfp4")) if "PART" in s.fact]
    got = {(s.fact["TN"], s.fact["FMT"], s.fact.get("SRC", "native"), s.fact["PART"]) for s in parts}
    assert got == {(tn, fmt, src, form) for tn in ENGINE_SPLIT_TILE_N for fmt in ("mxfp4", "nvfp4")
                   for src in ("native", "inline") for form in ("fc1", "rows")}  # fmt: skip
    assert all(s.fact["IO"] == "gather" and s.fact["ACT"] == 0 and "RAG" not in s.fact for s in parts)
    with pytest.raises(ValueError, match="built as"):
        engine_gemm_spec(64, io="gather", partial="rows")
    with pytest.raises(ValueError, match="gathering programs"):
        engine_gemm_spec(16, io="scatter", partial="rows")


def test_finishing_launches_check_the_partials():
    pairs, n, hidden = TOKENS * TOP_K, 64, 128
    ids = torch.zeros(TOKENS, TOP_K, dtype=torch.int32)
    part1 = torch.zeros(3 * pairs, 2 * n)
    a = torch.zeros(pairs, n, dtype=torch.bfloat16)
    b13 = torch.zeros(E, 2 * n)
    fin = fc1_finish_launch(part1, ids, a, splits=3, activation="swiglu_oai", bias=b13, global_scale=None,
                            num_experts=E)  # fmt: skip
    assert fin.spec == engine_fc1_finish_spec("swiglu_oai", True, "mxfp4", False)
    assert fin.args[0] is part1 and fin.args[5:] == (pairs, n, 3, E) and fin.grid[0] == pairs
    with pytest.raises(ValueError, match="partials must be float32"):
        fc1_finish_launch(part1, ids, a, splits=2, activation="silu", bias=None, global_scale=None, num_experts=E)
    with pytest.raises(ValueError, match="bias must be float32"):
        fc1_finish_launch(part1, ids, a, splits=3, activation="silu", bias=b13[:, :n], global_scale=None,
                          num_experts=E)  # fmt: skip
    part2 = torch.zeros(2 * pairs, hidden)
    out = torch.zeros(TOKENS, hidden, dtype=torch.bfloat16)
    g = torch.ones(E)
    weights = torch.zeros(TOKENS, TOP_K)
    comb = partial_combine_launch(part2, None, g, ids.long(), weights, out, splits=2, num_experts=E)
    assert comb.spec == engine_partial_combine_spec(False, "nvfp4", True, TOKENS, TOP_K)
    assert comb.spec.fact["PARTIAL"] == 1 and comb.spec.fact["HAS_GSCALE"] == 1
    assert comb.args[1] is part2 and comb.args[2] is g and comb.args[-2:] == (2, pairs)
    with pytest.raises(ValueError, match="partials must be float32"):
        partial_combine_launch(part2, None, g, ids, weights, out, splits=3, num_experts=E)
