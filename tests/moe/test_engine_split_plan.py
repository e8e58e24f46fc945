"""The engine layer's K splits on the CPU: the heuristic splits where a call's units would leave CTA slots idle,
from the device's SM count (pinned here), never where they fill them; a split call launches FC1's partials, their
finish, FC2's partials and the partial combine, exactly the plan's programs, its buffers carved from the scratch;
``EngineMoE(splits=1)`` never splits, forced counts are checked, and the split programs are in the catalog."""

from __future__ import annotations

import pytest
import torch

from csf_kernels.aot.registry import catalog_specs
from csf_kernels.catalog import load_catalog
from csf_kernels.moe.heuristics import engine_splits
from csf_kernels.runtime.device import set_num_sms
from csf_moe import plan
from csf_moe.engine_layer import EngineMoE
from csf_moe.engine_prepare import prepare_engine_weights
from csf_moe.engine_split import call_splits, finish_bias, splits_option
from csf_moe.synthetic import synthetic_layer

PEERS = [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "mxfp4"), ("qwen3-30b-a3b", 1, "mxfp4"),
         ("deepseek-v4.1-flash", 4, "nvfp4")]  # fmt: skip


@pytest.fixture(autouse=True)
def h100_sms():
    set_num_sms(132)
    yield
    set_num_sms(None)


def test_units_that_fill_the_slots_never_split():
    for units in (264, 265, 1440):
        assert engine_splits(units, 45, "mxfp4", 2) == 1
    assert engine_splits(132, 45, "mxfp4", 1) == 1
    # few units, long K: split; at least one record (two MXFP4 steps) a split
    assert engine_splits(54, 80, "mxfp4", 2) > 1 and engine_splits(4, 3, "mxfp4", 2) == 2
    assert engine_splits(4, 2, "mxfp4", 2) == 1 and engine_splits(4, 2, "nvfp4", 2) == 1


def test_the_sm_count_decides():
    """DS4.1-TP4's FC1 at one token (6 blocks x 9 tiles = 54 units) splits on 132 SMs, not on 16 (32 slots)."""
    assert engine_splits(54, 80, "mxfp4", 2) == 4
    set_num_sms(16)
    assert engine_splits(54, 80, "mxfp4", 2) == 1


@pytest.mark.parametrize(("model", "tp", "fmt"), PEERS)
def test_peer_geometries_split_their_one_token_calls(model, tp, fmt):
    """At one token FC1 and FC2 units are 180 / 92 (gpt-oss), 54 / 240 (DS4.1-TP4), 96 / 128 (Qwen3) on 264 CTA
    slots: each splits at least one GEMM; at 8 tokens the units fill the slots and nothing splits."""
    geo = load_catalog().moe_geometry(model, tp, fmt)
    p = plan(geo, 64, gemm="engine")
    one = p.splits(1)
    assert max(one) > 1 and all(s >= 1 for s in one)
    assert p.splits(8) == (1, 1) and p.splits(64) == (1, 1)
    assert call_splits(1, geo.top_k, geo.experts, geo.hidden, geo.intermediate, fmt, 16, split_layer=False) == (1, 1)
    specs = p.call_specs(1, False)
    kinds = [(s.kernel, s.fact.get("PART")) for s in specs]
    assert kinds[-4:] == [("moe.engine_gemm", "fc1"), ("moe.fc1_finish", None), ("moe.engine_gemm", "rows"),
                          ("moe.combine", None)]  # fmt: skip
    assert specs[-1].fact["PARTIAL"] == 1 and specs[-1].fact["HAS_BIAS"] == int(geo.bias)
    assert specs[-1].fact["HAS_GSCALE"] == int(fmt == "nvfp4") == specs[-3].fact["HAS_GSCALE"]
    assert all(s.fact.get("SRC", "native") == p.scale_source for s in specs if s.kernel == "moe.engine_gemm")


def test_split_programs_of_every_served_geometry_are_in_the_catalog():
    catalog = load_catalog()
    built = set(catalog_specs(catalog, cute=True))
    for model, tp, fmt in PEERS:
        geo = catalog.moe_geometry(model, tp, fmt)
        for source in ("inline", "native"):
            p = plan(geo, 64, gemm="engine", scale_source=source)
            split = [s for t in (1, 2, 4) for ids64 in (False, True) for s in p.call_specs(t, ids64)]
            assert any("PART" in s.fact for s in split)
            missing = [s.describe() for s in split if s.key not in built]
            assert not missing, missing
            assert {s.key for s in split} <= {s.key for s in p.specs()}


def _geo():
    from csf_codec import scale_format
    from csf_kernels.catalog import MoEGeometry

    return MoEGeometry(model="tiny", tp=1, fmt=scale_format("mxfp4"), experts=8, hidden=256, intermediate=128,
                       top_k=2, activation="swiglu_oai", bias=True)  # fmt: skip


def _scratch(nbytes: int) -> torch.Tensor:
    buf = torch.zeros(nbytes + 256, dtype=torch.uint8)
    start = -buf.data_ptr() % 256
    return buf[start : start + nbytes]


def _layer(**kw):
    geo = _geo()
    p = plan(geo, 64, gemm="engine", scale_source="native")
    weights = prepare_engine_weights(p, **synthetic_layer(geo, seed=3).weight_kwargs())
    return geo, p, EngineMoE(weights, geo.top_k, activations=p.convention, **kw)


def _launches(layer, geo, tokens, scratch=None):
    x = torch.zeros(tokens, geo.hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, geo.top_k, dtype=torch.int32)
    w = torch.zeros(tokens, geo.top_k, dtype=torch.bfloat16)
    return layer.launches(x, ids, w, torch.empty_like(x), scratch=scratch)


def test_a_split_call_launches_partials_finish_and_partial_combine_from_the_scratch():
    geo, p, layer = _layer()
    splits = p.splits(1)
    assert splits != (1, 1) and layer.call_splits(1) == splits
    scratch = _scratch(p.scratch_bytes)
    launches, keep = _launches(layer, geo, 1, scratch)
    assert tuple(launch.spec for launch in launches) == p.call_specs(1, False)
    fc1, finish, fc2, combine = launches[-4:]
    part1, a, part2 = fc1.args[3], finish.args[4], fc2.args[3]
    pairs = geo.top_k
    assert part1.shape == (splits[0] * pairs, 2 * geo.intermediate) and part1.dtype == torch.float32
    assert a.shape == (pairs, geo.intermediate) and fc2.args[2] is a  # FC2 reads the finish's rows
    assert part2.shape == (splits[1] * pairs, geo.hidden) and combine.args[1] is part2
    assert fc1.args[-4] == geo.top_k and fc2.args[-4] == 1  # FC2 gathers a route's row: top_k 1
    assert finish.args[0] is part1 and finish.args[-2] == splits[0] and combine.args[-2] == splits[1]
    # the finish reads W13's bias as [gate; up]: the engine rows' bias, permuted once at construction
    assert torch.equal(finish.args[3], finish_bias(layer.weights.b13))
    start, end = scratch.data_ptr(), scratch.data_ptr() + scratch.numel()
    tensors = [b for b in keep if isinstance(b, torch.Tensor)]
    assert all(start <= b.data_ptr() < end for b in tensors) and keep[-1].dtype == torch.float32


def test_splits_1_never_splits_and_forced_counts_are_checked():
    geo, _, layer = _layer(splits=1)
    specs = tuple(launch.spec for launch in _launches(layer, geo, 1)[0])
    assert not any("PART" in s.fact for s in specs) and specs[-1].kernel == "moe.engine_combine"
    _, _, forced = _layer(splits=(2, 1))
    fc1, _, fc2, _ = _launches(forced, geo, 1)[0][-4:]
    assert fc1.args[-2] == 2 and fc2.args[-2] == geo.intermediate // 64  # FC1 in two, FC2 one split
    _, _, bad = _layer(splits=3)  # K = 256: 4 MXFP4 steps make 1 or 2 splits of whole records
    with pytest.raises(ValueError, match="3 K splits of 4 mxfp4 K steps"):
        _launches(bad, geo, 1)
    for wrong in (0, (1,), (2, 0), 1.5, (True, 1)):
        with pytest.raises(ValueError, match="splits must be"):
            splits_option(wrong)


def test_finish_bias_puts_gate_and_up_rows_at_their_columns():
    b13 = torch.arange(2 * 64, dtype=torch.float32)[None].repeat(2, 1)  # engine row j holds j
    out = finish_bias(b13)
    # engine rows 0..7: gate of outputs 0..7, rows 8..15: their up rows; rows 16..23: gate of 8..15
    assert out[0, :8].tolist() == list(range(8)) and out[0, 64:72].tolist() == list(range(8, 16))
    assert out[1, 8:16].tolist() == list(range(16, 24)) and sorted(out[0].tolist()) == b13[0].tolist()
