"""The engine layer's K splits on the GPU (AOT cache, frozen): at 1, 2, 4 and 8 tokens, split by the heuristic and by
forced counts, the layer matches the float32 reference within the unsplit layer's tolerance on the three peer
geometries (MXFP4; NVFP4's global scales on DS4.1-TP4 and Qwen3), with every scratch buffer (partials, FC2's input)
poisoned with NaN before the call, padding routes inert; native and inline scale sources give the same bits; a
captured split call replays new routings allocating nothing, equal to the eager call and to plain launches."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe.engine_layer import EngineMoE, call_buffer_bytes, call_buffers, engine_weights
from csf_moe.reference import moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from tests.cuda_graphs import captured, replay_allocating_nothing
from tests.moe.padding_routes import with_padding_routes

from .test_engine_layer_gpu import REL_TOL

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")
GEOMETRIES = [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "mxfp4"), ("qwen3-30b-a3b", 1, "mxfp4"),
              ("deepseek-v4.1-flash", 4, "nvfp4"), ("qwen3-30b-a3b", 1, "nvfp4")]  # fmt: skip
TOKENS = (1, 2, 4, 8)
# None: the heuristic (splits at one token only); (2, 2): both GEMMs in two, at every count (each peer's K
# makes two whole-record splits)
SPLITS = [None, (2, 2)]


def _poisoned_scratch(layer: EngineMoE, geo, tokens: int, routing_weights: torch.Tensor) -> torch.Tensor:
    """The call's scratch, every byte 0xFF: float32 and bf16 buffers read NaN until written."""
    w = layer.weights
    shapes = call_buffers(tokens, geo.top_k, w.experts, w.hidden, w.inter, w4a8=False,
                          float_weights=routing_weights.dtype != torch.float32,
                          splits=layer.call_splits(tokens))  # fmt: skip
    return torch.full((call_buffer_bytes(shapes),), 0xFF, dtype=torch.uint8, device="cuda")


def _run(layer, geo, x, ids, w, scratch=None):
    out = torch.full_like(x, float("nan"))
    run = layer.call(x, ids, w, out, scratch=scratch)
    run()
    torch.cuda.synchronize()
    return out, run


@pytest.mark.parametrize("splits", SPLITS, ids=["heuristic", "forced-2-2"])
@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES, ids=[f"{m}-tp{t}-{f}" for m, t, f in GEOMETRIES])
def test_split_layer_matches_the_reference(model, tp, fmt, splits):
    geo = load_catalog().moe_geometry(model, tp, fmt)
    ref = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    weights = engine_weights(ref, geo.activation)
    layer = EngineMoE(weights, geo.top_k, splits=splits)
    unsplit = EngineMoE(weights, geo.top_k, splits=1)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    split_seen = False
    for t in TOKENS:
        x, ids, w = synthetic_routing(geo, t, gen)
        if t >= 2:  # graph padding: ids outside [0, E) contribute nothing
            ids = with_padding_routes(ids, geo.experts)
        out, run = _run(layer, geo, x, ids, w, _poisoned_scratch(layer, geo, t, w))
        names = [name for name, _ in run.launches]
        if layer.call_splits(t) != (1, 1):
            split_seen = True
            assert names[-4:] == ["moe.engine_gemm", "moe.fc1_finish", "moe.engine_gemm", "moe.combine"], names
        assert torch.isfinite(out.float()).all(), f"seed {SEED} {geo.name} T={t}: unwritten outputs"
        want = moe_reference(x, ref, w, ids, kind=geo.activation)
        err = float((out.float() - want).norm() / want.norm())
        assert err < REL_TOL, f"seed {SEED} {geo.name} T={t} splits {layer.call_splits(t)}: relative error {err:.3e}"
        base, _ = _run(unsplit, geo, x, ids, w)
        diff = float((out.float() - base.float()).norm() / base.float().norm())
        assert diff < REL_TOL, f"seed {SEED} {geo.name} T={t}: split and unsplit layers differ by {diff:.3e}"
    assert split_seen, f"{geo.name}: no call of {TOKENS} tokens split"


@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES, ids=[f"{m}-tp{t}-{f}" for m, t, f in GEOMETRIES])
def test_split_layer_inline_equals_native(model, tp, fmt):
    geo = load_catalog().moe_geometry(model, tp, fmt)
    ref = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    native = EngineMoE(engine_weights(ref, geo.activation), geo.top_k, splits=(2, 2))
    inline = EngineMoE(engine_weights(ref, geo.activation, scale_source="inline"), geo.top_k, splits=(2, 2))
    gen = torch.Generator(device="cuda").manual_seed(SEED + 1)
    for t in TOKENS:
        x, ids, w = synthetic_routing(geo, t, gen)
        a, _ = _run(native, geo, x, ids, w)
        b, _ = _run(inline, geo, x, ids, w)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"seed {SEED} {geo.name} T={t}: inline differs"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_split_layer_replays_new_routings_in_a_graph(fmt):
    geo = load_catalog().moe_geometry("deepseek-v4.1-flash", 4, fmt)
    ref = synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference()
    layer = EngineMoE(engine_weights(ref, geo.activation), geo.top_k)
    assert layer.call_splits(1) != (1, 1)
    gen = torch.Generator(device="cuda").manual_seed(SEED + 2)
    x, ids, w = synthetic_routing(geo, 1, gen)
    out = torch.full_like(x, float("nan"))
    run = layer.call(x, ids, w, out)
    graph = captured(run)
    x2, ids2, w2 = synthetic_routing(geo, 1, gen)
    x.copy_(x2), ids.copy_(ids2), w.copy_(w2)
    out.fill_(float("nan"))
    replay_allocating_nothing(graph)
    replayed = out.clone()
    out.fill_(float("nan"))
    run()
    assert torch.equal(replayed, out), "graph replay differs from the eager call"
    want = moe_reference(x, ref, w, ids, kind=geo.activation)
    assert float((out.float() - want).norm() / want.norm()) < REL_TOL
    runtime.set_pdl(False)  # the same layer bound to plain launches: the same bits
    try:
        plain_out = torch.full_like(x, float("nan"))
        plain = layer.call(x, ids, w, plain_out)
    finally:
        runtime.set_pdl(True)
    plain()
    assert torch.equal(plain_out, out), "dependent launches change the split layer's output"
