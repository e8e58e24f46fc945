"""A native compressed-tensors NVFP4 checkpoint served as "csf" by each engine: parameters named as the engine's
own compressed-tensors method names them, loaded at 1 and 2 TP ranks, global scales inverted (CPU)."""

from __future__ import annotations

import pytest
import torch

from csf_serving_adapters.moe_core import COMPRESSED_TENSORS_NAMES

from .ct_checkpoints import CT_NV_CONFIG, ct_native, load_ct
from .tp_shards import merge_tp, params, same

E, H, N = 4, 512, 256


@pytest.fixture(scope="module", autouse=True)
def _registered(engine):
    engine.register()


def test_the_config_reads_the_format_from_the_config_groups(engine):
    cfg = engine.config.from_config(CT_NV_CONFIG)
    assert (cfg.scale_format, cfg.base_quant_method) == ("nvfp4", "compressed-tensors")
    layer = engine.make_experts(cfg, experts=E, hidden=H, inter=N)
    assert layer.quant_method.names is COMPRESSED_TENSORS_NAMES
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert shapes == {
        "w13_weight_packed": (E, 2 * N, H // 2),
        "w13_weight_scale": (E, 2 * N, H // 16),
        "w2_weight_packed": (E, H, N // 2),
        "w2_weight_scale": (E, H, N // 16),
        "w13_weight_global_scale": (E, 2),
        "w2_weight_global_scale": (E,),
        "w13_input_global_scale": (E, 2),
        "w2_input_global_scale": (E,),
    }


def test_two_tp_ranks_load_exactly_the_halves_of_one_and_prepare_inverts_the_global_scales(engine):
    cfg = engine.config.from_config(CT_NV_CONFIG)
    native = ct_native(E, H, N)
    whole = engine.make_experts(cfg, experts=E, hidden=H, inter=N)
    load_ct(whole, native, E, engine.weight_prefix)
    tp1 = params(whole)
    ranks = []
    for rank in range(2):
        layer = engine.make_experts(cfg, experts=E, hidden=H, inter=N, tp=2, rank=rank)
        load_ct(layer, native, E, engine.weight_prefix)
        ranks.append(params(layer))
    merged = merge_tp(ranks)
    assert merged.keys() == tp1.keys()
    for name in tp1:
        assert same(merged[name], tp1[name]), name
    assert same(tp1["w13_weight_packed"][1, :N], native["gate.weight_packed"][1])
    assert same(tp1["w13_weight_packed"][1, N:], native["up.weight_packed"][1])
    assert same(tp1["w2_weight_scale"][3], native["down.weight_scale"][3])
    _, w = whole.quant_method.prepare(whole)
    want = torch.tensor([2.0 ** -(7 + e) for e in range(E)])
    assert torch.equal(w.w13.global_scale.cpu(), want) and torch.equal(w.w2.global_scale.cpu(), want)
    entry = whole.quant_method.release_native(whole, w)
    assert entry.stored_bytes < entry.native_bytes
    assert whole.w13_weight_scale.numel() == 0 and whole.w13_weight_global_scale.numel() == 0
    assert whole.w2_weight_scale.numel() == 0
    assert whole.w13_weight_packed.data_ptr() == w.w13.values.data_ptr()
    assert whole.w2_weight_packed.data_ptr() == w.w2.values.data_ptr()
