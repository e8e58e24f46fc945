"""Sparse-MLA planning: the balanced split policy, scratch layout, programs, argument checks (CPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from csf_attention import MLACaps, SparseMLADecoder, plan
from csf_attention.plan import SHARED_SM_MIN_CHUNKS
from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import load_catalog
from csf_kernels.mla.heuristics import decode_config, triton_decode_config
from csf_kernels.mla.layout import VALUE_DIM
from csf_kernels.mla.specs import DecodeConfig
from tests.attention.mla_cases import mla_inputs


def test_split_policy_fills_the_machine_and_never_exceeds_one_chunk_per_split():
    p = plan(MLACaps(heads=128, max_rows=128, topk=2048))
    assert p.head_blocks == 128 // p.head_block
    for rows in (1, 2, 7, 32, 128):
        s = p.splits_for(rows)
        assert 1 <= s <= 2048 // 64
        assert rows * p.head_blocks * s <= max(p.waves * 132, rows * p.head_blocks)  # the planned waves at most
    assert p.splits_for(1) == min(32, p.waves * 132 // p.head_blocks)
    small = plan(MLACaps(heads=16, max_rows=4, topk=512))
    assert small.splits_for(1) == 512 // 64  # a lone row with one head block: every chunk its own split
    with pytest.raises(ValueError, match="rows=5"):
        small.splits_for(5)


def test_a_second_program_per_sm_only_where_splits_keep_many_chunks():
    """The 16-head program fits two per SM (waves 2); the policy plans the second only while the splits of
    one program per SM keep ``SHARED_SM_MIN_CHUNKS`` (16) chunks each: so top-k 2048 (32 chunks) at 128 rows,
    not at 32 (8 chunks each at one per SM), and never at top-k 512 (8 chunks)."""
    p = plan(MLACaps(heads=16, max_rows=128, topk=2048))
    assert p.waves == 2 and SHARED_SM_MIN_CHUNKS == 16
    assert {rows: p.splits_for(rows) for rows in (1, 16, 33, 44, 45, 64, 66, 96, 128)} == {
        1: 32,
        16: 8,
        33: 4,
        44: 3,
        45: 5,
        64: 4,
        66: 4,
        96: 2,
        128: 2,
    }  # up to 44 rows 3 or more splits (at most 11 chunks) at one per SM; from 45 on 2 or 1, so two per SM
    short = plan(MLACaps(heads=16, max_rows=128, topk=512))
    assert {rows: short.splits_for(rows) for rows in (1, 32, 128)} == {1: 8, 32: 4, 128: 1}
    one = plan(MLACaps(heads=16, max_rows=128, topk=2048, waves=1))
    assert {rows: one.splits_for(rows) for rows in (32, 48, 128)} == {32: 4, 48: 2, 128: 1}


def test_decode_programs_may_share_an_sm_only_as_their_split_count_was_planned():
    """A call planned one program per SM launches so that no SM takes two (the 16-head program would fit two);
    one planned two per SM, or with more programs than SMs, may share."""
    p = plan(MLACaps(heads=16, max_rows=256, topk=2048))
    assert {rows: p.programs_per_sm(rows) for rows in (1, 16, 32, 44, 45, 128, 256)} == {
        1: 1,
        16: 1,
        32: 1,
        44: 1,
        45: 2,
        128: 2,
        256: 2,
    }
    short = plan(MLACaps(heads=16, max_rows=256, topk=512))  # one per SM planned, but 200 programs need two
    assert (short.splits_for(200), short.programs_per_sm(200), short.programs_per_sm(32)) == (1, 2, 1)
    wide = plan(MLACaps(heads=128, max_rows=128, topk=2048))
    assert wide.programs_per_sm(128) == -(-128 * wide.head_blocks // 132)


def test_scratch_holds_the_partials_of_every_row_count():
    for dtype, esize in (("float32", 4), ("bfloat16", 2)):
        caps = MLACaps(heads=32, max_rows=128, topk=2048, partial_dtype=dtype)
        two_blocks = DecodeConfig(16, 8)  # two head blocks: 128 rows take one split, 66 take two
        p = plan(caps, two_blocks)
        # calls with one split per row finish in the decode program: only the others need partials
        slots = max(r * p.splits_for(r) for r in range(1, 129) if p.splits_for(r) > 1)
        assert p.scratch.slots == slots
        merged = plan(replace(caps, direct_single_split=False), two_blocks)
        assert merged.scratch.slots == max(r * p.splits_for(r) for r in range(1, 129)) == 128 > slots
        assert p.scratch.part_out == (0, slots * 32 * VALUE_DIM * esize)
        off, size = p.scratch.part_lse
        assert off % 256 == 0 and off >= p.scratch.part_out[1] and size == slots * 32 * 4
        assert p.scratch.nbytes >= off + size


def test_a_program_that_cannot_finish_outputs_has_every_split_merged():
    caps = MLACaps(heads=16, max_rows=300, topk=2048)  # 1 split from 265 rows on (one head block, waves 2)
    p = plan(caps)
    assert p.config.engine == "gluon" and p.splits_for(300) == 1
    assert not p.direct and caps.direct_single_split  # asked for, not offered: merged instead
    assert p.scratch.slots == max(r * p.splits_for(r) for r in range(1, 301)) == 300  # the 300-row call
    assert not any(spec.fact.get("DIRECT") for spec in p.programs)
    triton = plan(caps, triton_decode_config(16))
    assert triton.direct and triton.scratch.slots < p.scratch.slots


def test_the_wgmma_program_finishes_single_splits_itself():
    caps = MLACaps(heads=32, max_rows=200, topk=2048)  # 1 split from 133 rows on (one head block, waves 1)
    p = plan(caps)
    assert p.config.engine == "wgmma" and p.splits_for(200) == 1 and p.direct
    assert p.scratch.slots == max(r * p.splits_for(r) for r in range(1, 201) if p.splits_for(r) > 1) == 132
    direct = [spec for spec in p.programs if spec.fact.get("DIRECT")]
    assert len(direct) == 8  # two query forms x (sink, lse) options
    merged = plan(replace(caps, direct_single_split=False))
    assert not merged.direct and merged.scratch.slots == 200


@pytest.mark.parametrize(
    ("caps", "match"),
    [
        (MLACaps(heads=24, max_rows=1, topk=512), "multiple of 16 heads"),
        (MLACaps(heads=16, max_rows=1, topk=500), "topk must be"),
        (MLACaps(heads=16, max_rows=0, topk=512), "must be positive"),
        (MLACaps(heads=16, max_rows=1, topk=512, page_size=32), "page_size"),
        (MLACaps(heads=16, max_rows=1, topk=512, mode="prefill"), "mode"),
        (MLACaps(heads=16, max_rows=1, topk=512, partial_dtype="float16"), "partial_dtype"),
    ],
)
def test_unsupported_capabilities_are_refused(caps, match):
    with pytest.raises(ValueError, match=match):
        plan(caps)


@pytest.mark.parametrize("bad", [{"operand": "float8"}, {"head_block": 128}, {"num_warps": 2}])
def test_unsupported_decode_configs_are_refused(bad):
    with pytest.raises(ValueError, match="unsupported decode config"):
        DecodeConfig(**bad)


@pytest.mark.parametrize(
    "bad", [{"head_block": 64}, {"num_warps": 8}, {"operand": "bfloat16"}, {"regroup": True}, {"num_stages": 2}]
)
def test_the_wgmma_engine_refuses_what_it_was_not_built_for(bad):
    with pytest.raises(ValueError, match="wgmma decode runs 16 or 32 heads"):
        DecodeConfig(**{"head_block": 32, "num_warps": 4, "engine": "wgmma", **bad})


@pytest.mark.parametrize(
    "bad", [{"head_block": 32}, {"num_warps": 8}, {"operand": "float16"}, {"regroup": True}, {"num_stages": 2}]
)
def test_the_wide_engine_refuses_what_it_was_not_built_for(bad):
    with pytest.raises(ValueError, match="wide decode runs 64 heads"):
        DecodeConfig(**{"head_block": 64, "num_warps": 4, "operand": "bfloat16", "engine": "wide", **bad})


def test_catalog_configs_use_the_measured_operands():
    assert decode_config(128) == decode_config(64)  # 64-head blocks, heads on wgmma's M
    assert (decode_config(64).engine, decode_config(32).engine, decode_config(16).engine) == ("wide", "wgmma", "gluon")
    assert decode_config(64).operand == "bfloat16"  # the scales folded into the operands
    assert decode_config(32).operand == decode_config(16).operand == "float16"
    assert triton_decode_config(128).operand == "bfloat16"  # the Triton wgmma block: a loaded query
    assert triton_decode_config(16).regroup and not triton_decode_config(32).regroup  # 4-warp programs only


def test_every_catalog_plan_uses_only_cataloged_programs():
    cat = load_catalog()
    have = set(catalog_specs(cat, cute=False))
    for heads in cat.sparse_mla["heads"]:
        for topk in cat.sparse_mla["top_k"]:
            for dtype in ("float32", "bfloat16"):
                for quantize in (False, True):
                    caps = MLACaps(heads=heads, max_rows=128, topk=topk, partial_dtype=dtype, quantize_query=quantize)
                    assert {s.key for s in plan(caps).programs} <= have, (heads, topk, dtype, quantize)


def test_decoder_refuses_mismatched_inputs_before_launching():
    p = plan(MLACaps(heads=16, max_rows=2, topk=128))
    dec = SparseMLADecoder(p, torch.zeros(p.scratch.nbytes, dtype=torch.uint8))
    x = mla_inputs(torch.Generator().manual_seed(0), rows=2, heads=16, topk=128, pages=2, lengths=[128, 5])
    out = torch.empty(2, 16, VALUE_DIM, dtype=torch.bfloat16)
    ok = (x.q, x.kv_cache, x.indices, x.lengths, x.sm_scale, None, out, None)
    assert len(dec.launches(*ok)) == 2
    bad = {
        0: (x.q.float(), "q must be"),
        1: (x.kv_cache[..., :600].contiguous(), "kv_cache must be"),
        2: (x.indices.long(), "indices must be"),
        3: (x.lengths[:1], "lengths must be"),
        5: (torch.zeros(8), "attn_sink must be"),
        6: (out[:1], "out must be"),
    }
    for i, (value, match) in bad.items():
        args = list(ok)
        args[i] = value
        with pytest.raises(ValueError, match=match):
            dec.launches(*args)
    wide = mla_inputs(torch.Generator().manual_seed(0), rows=3, heads=16, topk=128, pages=2, lengths=[1, 1, 1])
    with pytest.raises(ValueError, match="rows=3"):
        dec.launches(wide.q, wide.kv_cache, wide.indices, wide.lengths, 1.0, None,
                     torch.empty(3, 16, VALUE_DIM, dtype=torch.bfloat16), None)  # fmt: skip
    with pytest.raises(ValueError, match="scratch must be"):
        SparseMLADecoder(p, torch.zeros(p.scratch.nbytes - 1, dtype=torch.uint8))
