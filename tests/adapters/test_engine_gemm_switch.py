"""Which GEMM each engine's MoE layer runs on (``CSF_MOE_ENGINE``, ``CSF_MOE_W4A8``): read once as the engine creates
the layer, and what follows from the choice on the CPU: the plan, the weights prepared in place, the ledger's form and
figures, and the binding path (a frozen runtime over an empty AOT cache names the first program of that path)."""

from __future__ import annotations

import pytest
import torch

from csf_codec import MXFP4, NVFP4
from csf_kernels import runtime
from csf_moe import EnginePlan, MoEPlan
from csf_moe.engine_layer import EngineWeights
from csf_serving_adapters.accounting import LEDGER
from csf_serving_adapters.gemm_choice import ENGINE, TRITON, W4A8

from .test_engine_loading import SCALES, _layer, _load, _native


@pytest.fixture(scope="module", autouse=True)
def _registered(engine):
    engine.register()


def test_the_layer_reads_the_switches_once_when_created(engine, switches):
    switches(MOE_ENGINE="1")
    layer = _layer(engine, "mxfp4")
    assert layer.quant_method.gemm == ENGINE
    switches(MOE_ENGINE="0")  # later changes reach new layers only
    assert layer.quant_method.gemm == ENGINE and _layer(engine, "mxfp4").quant_method.gemm == TRITON
    switches(MOE_ENGINE="1", MOE_W4A8="1")
    with pytest.raises(ValueError, match="stays W4A16"):  # an NVFP4 layer asked for W4A8: refused as it is created
        _layer(engine, "nvfp4")


CASES = [("mxfp4", "MOE_ENGINE", ENGINE, "engine-inline"), ("nvfp4", "MOE_ENGINE", ENGINE, "engine-inline"),
         ("mxfp4", "MOE_W4A8", W4A8, "engine-w4a8-native"), ("mxfp4", None, TRITON, "triton-inline")]  # fmt: skip


@pytest.mark.parametrize("fmt, switch, choice, form", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_the_switch_plans_prepares_and_accounts_the_layer_on_its_gemm(engine, switches, fmt, switch, choice, form):
    """Everything process_weights_after_loading does before binding, on the chosen GEMM: the plan, the weights built
    in the parameters' own storage, the native scales released and the ledger's form and figures."""
    if switch:
        switches(**{switch: "1"})
    layer = _layer(engine, fmt)
    _load(engine, layer, _native(MXFP4 if fmt == "mxfp4" else NVFP4), MXFP4 if fmt == "mxfp4" else NVFP4)
    method = layer.quant_method
    assert method.gemm == choice
    values = method.values(layer, "w13").data_ptr(), method.values(layer, "w2").data_ptr()
    native_bytes = sum(getattr(layer, s).numel() for s in SCALES)
    p, w = method.prepare(layer)
    if choice.engine:
        assert isinstance(p, EnginePlan) and isinstance(w, EngineWeights)
        assert (p.activations, p.scale_source) == (choice.activations, "native" if w.w4a8 else "inline")
        assert p.geometry == method.geometry(layer) and w.w4a8 == (choice == W4A8)
        assert (w.w13.data_ptr(), w.w2.data_ptr()) == values  # the panels took the packed values' place
    else:
        assert isinstance(p, MoEPlan) and p.scale_source == "inline"
    LEDGER.clear()
    entry = method.release_native(layer, w)
    assert (entry.form, entry.native_bytes) == (form, native_bytes)
    if form == "engine-w4a8-native":  # panels keep every byte, plus a base a row and a flag a 128-row tile
        extra = sum(t.numel() for t in (w.base13, w.base2, w.flags13, w.flags2))
        assert entry.stored_bytes == native_bytes + extra and entry.returned_bytes < 0
    else:
        assert 0 < entry.stored_bytes < native_bytes
    assert LEDGER.report()["layers"][0]["form"] == form and LEDGER.report()["total"]["form"] == form
    assert all(getattr(layer, s).numel() == 0 for s in SCALES)
    assert method.values(layer, "w13").data_ptr() == values[0]  # no second copy of the weights


def test_graph_sizes_become_buckets_of_the_engine_plan_too(engine, switches):
    switches(MOE_ENGINE="1")
    layer = _layer(engine, "mxfp4")
    method = layer.quant_method
    method.capture_sizes = (1, 3, 24, 96)  # as each engine's CUDA-graph config would set them
    _load(engine, layer, _native(MXFP4), MXFP4)
    p, _ = method.prepare(layer)
    assert isinstance(p, EnginePlan) and {1, 3, 24, 96} <= {b.tokens for b in p.buckets}
    assert p.bucket_for(3).tokens == 3 and p.max_tokens == method.max_tokens()


@pytest.mark.parametrize("switch, first", [(None, "moe."), ("MOE_ENGINE", "moe.align"), ("MOE_W4A8", "moe.align")])
def test_binding_takes_the_chosen_path_and_names_a_missing_program(engine, switches, tmp_path, switch, first):
    """On the CPU nothing can load, but binding resolves the plan's programs first: a frozen runtime over an empty
    cache fails naming the first program of the chosen plan (the engine plan's: its alignment; the Triton plan's
    are other programs), never later, mid-forward."""
    if switch:
        switches(**{switch: "1"})
    layer = _layer(engine, "mxfp4")
    _load(engine, layer, _native(MXFP4), MXFP4)
    method = layer.quant_method
    p, w = method.prepare(layer)
    buf = torch.zeros(p.scratch_bytes + 256, dtype=torch.uint8)
    scratch = buf[-buf.data_ptr() % 256 :][: p.scratch_bytes]
    was = runtime.is_frozen()
    runtime.set_cache_root(tmp_path)
    runtime.freeze()
    try:
        with pytest.raises(runtime.UncachedProgramError, match=f"program {first}") as err:
            method.gemm.bind(p, w, scratch)
    finally:
        runtime.set_cache_root(None)
        if not was:
            runtime.unfreeze()
    assert err.value.spec.key in {s.key for s in p.specs()}
