"""The engine layer (``csf_moe.engine_layer``: align, FC1 gathering its rows, FC2 scattering them to their routes, the
combine) on the GPU from the AOT cache, frozen: the float32 reference at every block size, padding routes inert,
graph replay with dependent launches equal to the eager call and to plain launches; MXFP4 on the three peer
geometries, NVFP4 (global scales in the GEMMs' epilogues) on Qwen3-30B-A3B."""

from __future__ import annotations

import os

import pytest
import torch

from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_moe.engine_layer import EngineMoE, engine_weights
from csf_moe.reference import moe_reference
from csf_moe.synthetic import synthetic_layer, synthetic_routing
from tests.cuda_graphs import captured, replay_allocating_nothing
from tests.moe.padding_routes import with_padding_routes

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("frozen_runtime")]
SEED = int.from_bytes(os.urandom(3), "little")
GEOMETRIES = [("gpt-oss-120b", 1, "mxfp4"), ("deepseek-v4.1-flash", 4, "mxfp4"), ("qwen3-30b-a3b", 1, "mxfp4"),
              ("qwen3-30b-a3b", 1, "nvfp4")]  # fmt: skip
TOKENS = (1, 7, 300, 1500, 5000)  # blocks of 64 routes up to 64 a expert, then 128 and 256
REL_TOL = 2e-2  # the layer rounds FC1's output, the activation and FC2's output to bf16 once each


@pytest.mark.parametrize("fused", [True, False], ids=["fused-act", "act-pass"])
@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES, ids=[f"{m}-tp{t}-{f}" for m, t, f in GEOMETRIES])
def test_engine_layer_matches_the_reference(model, tp, fmt, fused):
    geo = load_catalog().moe_geometry(model, tp, fmt)
    data = synthetic_layer(geo, seed=SEED % 1000, device="cuda")
    ref = data.reference()
    layer = EngineMoE(engine_weights(ref, geo.activation, fused=fused), geo.top_k)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for t in TOKENS:
        x, ids, w = synthetic_routing(geo, t, gen)
        if t >= 7:  # graph padding: ids outside [0, E) contribute nothing
            ids = with_padding_routes(ids, geo.experts)
        out = torch.full_like(x, float("nan"))
        run = layer.call(x, ids, w, out)
        names = [name for name, _ in run.launches]
        assert names.count("moe.engine_gemm") == 2
        if layer.call_splits(t) != (1, 1):  # few tokens: K splits, finished by FC1's finish and the partial combine
            assert fused and names[-3:] == ["moe.fc1_finish", "moe.engine_gemm", "moe.combine"]
        else:
            assert names[-1] == "moe.engine_combine"
            assert len(names) <= (6 if fused else 7) + ("moe.engine_gather_tokens" in names)  # align: 1-3
        run()
        want = moe_reference(x, ref, w, ids, kind=geo.activation)
        err = float((out.float() - want).norm() / want.norm())
        assert err < REL_TOL, f"seed {SEED} {geo.name} T={t}: relative error {err:.3e}"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_engine_layer_replays_new_routings_in_a_graph(fmt):
    geo = load_catalog().moe_geometry("qwen3-30b-a3b", 1, fmt)
    data = synthetic_layer(geo, seed=SEED % 1000, device="cuda")
    ref = data.reference()
    layer = EngineMoE(engine_weights(ref, geo.activation), geo.top_k)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    x, ids, w = synthetic_routing(geo, 700, gen)
    out = torch.full_like(x, float("nan"))
    run = layer.call(x, ids, w, out)
    graph = captured(run)
    x2, ids2, w2 = synthetic_routing(geo, 700, gen)
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
    assert torch.equal(plain_out, out), "dependent launches change the output"


@pytest.mark.parametrize(("model", "tp", "fmt"), GEOMETRIES, ids=[f"{m}-tp{t}-{f}" for m, t, f in GEOMETRIES])
def test_fc1_rows_from_the_gather_pass_give_the_producer_gathers_bits(model, tp, fmt):
    """FC1 reading block-order rows a gather pass wrote (``fc1_rows="pass"``, token by token through the alignment's
    route slots; TMA tiles) and FC1 gathering them in its producer warps: the same bits at every block size, padding
    routes included, and in a replayed graph."""
    geo = load_catalog().moe_geometry(model, tp, fmt)
    weights = engine_weights(synthetic_layer(geo, seed=SEED % 1000, device="cuda").reference(), geo.activation)
    # unsplit: a split call gathers FC1's rows in its producer warps whatever fc1_rows says
    layers = {rows: EngineMoE(weights, geo.top_k, fc1_rows=rows, splits=1) for rows in ("producer", "pass")}
    gen = torch.Generator(device="cuda").manual_seed(SEED + 1)
    for t in TOKENS:
        x, ids, w = synthetic_routing(geo, t, gen)
        if t >= 7:
            ids = with_padding_routes(ids, geo.experts)
        outs = {}
        for rows, layer in layers.items():
            outs[rows] = torch.full_like(x, float("nan"))
            run = layer.call(x, ids, w, outs[rows])
            names = [name for name, _ in run.launches]
            assert ("moe.engine_gather_tokens" in names) == (rows == "pass")
            run()
        assert torch.isfinite(outs["pass"].float()).all(), f"seed {SEED} {geo.name} T={t}: unwritten outputs"
        assert torch.equal(outs["pass"], outs["producer"]), f"seed {SEED} {geo.name} T={t}: FC1's rows differ"
    out = torch.full_like(x, float("nan"))
    graph = captured(layers["pass"].call(x, ids, w, out))
    x.mul_(2.0)  # new device data: the pass re-gathers it
    replay_allocating_nothing(graph)
    again = torch.full_like(x, float("nan"))
    layers["producer"].call(x, ids, w, again)()
    assert torch.equal(out, again), f"seed {SEED} {geo.name}: the replayed gather pass differs"
