"""SGLang 0.5.23: a native compressed-tensors NVFP4 checkpoint served as "csf": parameters named as SGLang's
own compressed-tensors method names them, loaded at 1 and 2 TP ranks, global scales inverted (CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")

from csf_serving_adapters.moe_core import COMPRESSED_TENSORS_NAMES
from csf_serving_adapters.sglang import register
from csf_serving_adapters.sglang.config import CsfConfig

from .ct_checkpoints import CT_NV_CONFIG, ct_native, load_ct
from .sglang_layers import make_experts
from .tp_shards import merge_tp, params, same

E, H, N = 4, 512, 256


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register()


def test_sglang_compressed_tensors_parameters_load_at_two_ranks_and_prepare_inverts_the_global_scales():
    cfg = CsfConfig.from_config(CT_NV_CONFIG)
    assert (cfg.scale_format, cfg.base_quant_method) == ("nvfp4", "compressed-tensors")
    native = ct_native(E, H, N)
    whole = make_experts(cfg, experts=E, hidden=H, inter=N)
    assert whole.quant_method.names is COMPRESSED_TENSORS_NAMES
    assert {n for n, _ in whole.named_parameters()} == {
        f"{stem}_{s}" for stem in ("w13", "w2")
        for s in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
    }  # fmt: skip
    load_ct(whole, native, E, "experts")
    tp1 = params(whole)
    ranks = []
    for rank in range(2):
        layer = make_experts(cfg, experts=E, hidden=H, inter=N, tp=2, rank=rank)
        load_ct(layer, native, E, "experts")
        ranks.append(params(layer))
    merged = merge_tp(ranks)
    for name in tp1:
        assert same(merged[name], tp1[name]), name
    assert same(tp1["w13_weight_packed"][1, N:], native["up.weight_packed"][1])
    _, w = whole.quant_method.prepare(whole)
    want = torch.tensor([2.0 ** -(7 + e) for e in range(E)])
    assert torch.equal(w.w13.global_scale.cpu(), want) and torch.equal(w.w2.global_scale.cpu(), want)
    whole.quant_method.release_native(whole, w)
    assert whole.w2_weight_scale.numel() == 0 and whole.w2_weight_packed.data_ptr() == w.w2.values.data_ptr()
