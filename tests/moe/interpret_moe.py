"""Run a whole fused MoE layer in Triton's CPU interpreter (a subprocess entry point).

Usage: python -m tests.moe.interpret_moe SEED -> prints "ok <cases>" or exits non-zero.
Small geometries with row and column tails; every scale source; poisoned scratch and outputs;
padding route ids; outputs bit-identical across sources and close to the float32 reference.
"""

from __future__ import annotations

import sys

import torch

from csf_codec import scale_format
from csf_kernels.catalog import MoEGeometry
from csf_kernels.moe.specs import DECODE_TRITON
from csf_moe import plan, prepare_weights
from csf_moe.layer import MoELayer
from csf_moe.reference import moe_reference
from csf_moe.synthetic import synthetic_layer
from tests.interpreter import run_launch
from tests.moe.padding_routes import with_padding_routes


def geometries():
    # hidden 352: FC2's rows end in a partial 64-row block (32 rows) and every K of 352 in a narrower last
    # K-step tile (csf_kernels.moe.fp4_words), for both formats
    yield MoEGeometry(model="tiny", tp=1, fmt=scale_format("mxfp4"), experts=8, hidden=352, intermediate=192, top_k=3)
    yield MoEGeometry(model="tiny", tp=1, fmt=scale_format("nvfp4"), experts=8, hidden=352, intermediate=192, top_k=3)
    yield MoEGeometry(
        model="tiny-oss", tp=1, fmt=scale_format("mxfp4"), experts=6, hidden=192, intermediate=320, top_k=2,
        activation="swiglu_oai", bias=True,
    )  # fmt: skip


def run_layer(layer: MoELayer, x, ids, w) -> torch.Tensor:
    out = torch.full_like(x, float("nan"))
    layer.scratch.fill_(0xFF)  # poison: nothing may depend on scratch contents
    check_fork(layer, x, ids, w, out)
    for launch in layer.launches(x, ids, w, out):
        run_launch(launch)
    return out


def check_fork(layer: MoELayer, x, ids, w, out) -> None:
    """The span a GPU call forks (run() binds it as a ForkJoin) holds exactly the expansions and runs them
    beside what they need not wait for; no fork without an expansion. The routed experts' (the alignment
    lists them): W13's on the current stream beside W2's on the side stream, after the alignment. Every
    expert's (from EXPAND_ALL_ROUTES_PER_EXPERT routes per expert): from the call's start, the alignment,
    the relabelling and W2's on the current stream, W13's on the side stream."""
    calls, fork = layer._launches(x, ids, w, out)

    def writes(launch, plane) -> bool:  # an expansion launch whose output is ``plane``
        if plane is None or not launch.spec.kernel.startswith("expand."):
            return False
        return any(torch.is_tensor(a) and a.data_ptr() == plane.data_ptr() for a in launch.args)

    def reads_active(launch) -> bool:  # the alignment's list of routed experts
        return any(torch.is_tensor(a) and a.data_ptr() == layer.active_experts.data_ptr() for a in launch.args)

    w13 = [i for i, la in enumerate(calls) if writes(la, layer.w13_plane)]
    w2 = [i for i, la in enumerate(calls) if writes(la, layer.w2_plane)]
    if not w13 + w2:
        assert fork is None, fork
        return
    start, split, end = fork
    if layer.plan.expands_all_experts(x.shape[0]):
        assert start == 0 and w13 == list(range(split, end)) and all(start <= i < split for i in w2), (fork, w13, w2)
        assert not any(reads_active(calls[i]) for i in w13 + w2), "every expert's planes: nothing from the alignment"
    else:
        assert w13 == list(range(start, split)) and w2 == list(range(split, end)), (fork, w13, w2)
        assert all(reads_active(calls[i]) for i in w13 + w2), "the routed experts' planes"
        assert all(la.spec.kernel.startswith("moe.align") for la in calls[:start]), "after the alignment"


def main(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    cases = 0
    for geo in geometries():
        layer_data = synthetic_layer(geo, seed=seed)
        # 5 tokens: the routed experts' scales expanded; 8: every expert's (EXPAND_ALL_ROUTES_PER_EXPERT)
        for t in (5, 8):
            x = (torch.randn(t, geo.hidden, generator=gen)).to(torch.bfloat16)
            ids = torch.randint(0, geo.experts, (t, geo.top_k), generator=gen, dtype=torch.int32)
            ids = with_padding_routes(ids, geo.experts)  # vLLM's graph padding
            w = torch.rand(t, geo.top_k, generator=gen)
            want = moe_reference(x, layer_data.reference(), w, ids, kind=geo.activation)
            outs = {}
            # (source, tile config, ids dtype): every source on the split-K decode tiles, the inline source
            # also on the prefill tiles and with int64 ids (8 tokens: native and expanded decode tiles)
            runs = [(src, "decode", torch.int32) for src in ("native", "expanded", "inline")]
            if t == 5:
                runs += [
                    ("inline", "decode", torch.int64),
                    ("inline", "prefill", torch.int32),
                    ("native", "prefill", torch.int32),
                ]
            else:
                runs = runs[:2]
            for source, config, ids_dtype in runs:
                # the interpreter runs Triton programs: the decode tiles' Triton engine (GPU tests cover Gluon's)
                tiles = 8 if config == "decode" else 0
                p = plan(geo, 8, scale_source=source, buckets=(8,), decode_routes_per_expert=tiles,
                         decode_config=DECODE_TRITON)  # fmt: skip
                assert p.buckets[0].config.name == config
                weights = prepare_weights(p, **layer_data.weight_kwargs())
                scratch = torch.empty(p.scratch_bytes, dtype=torch.uint8)
                layer = MoELayer(plan=p, weights=weights, scratch=scratch)
                assert layer.plan.expands_all_experts(t) == (t == 8)
                outs[(source, config, ids_dtype)] = run_layer(layer, x, ids.to(ids_dtype), w)
                cases += 1
            _check(geo, t, outs, want)
    print(f"ok {cases}")


def _check(geo, t, outs, want) -> None:
    """Every run bit-identical to native on the same tiles, and close to the float32 reference."""
    for config in {key[1] for key in outs}:
        first = outs[("native", config, torch.int32)]
        for key, got in outs.items():
            if key[1] == config and not torch.equal(got, first):
                diff = (got.float() - first.float()).abs().max()
                raise SystemExit(f"{geo.name} T={t}: {key} differs from native (max difference {diff})")
        err = (first.float() - want).norm() / want.norm()
        if not err < 2e-2:
            raise SystemExit(f"{geo.name} T={t} {config}: relative error {err:.3e} against the float32 reference")
        print(f"{geo.name} T={t} {config}: rel err {err:.2e}", file=sys.stderr)


if __name__ == "__main__":
    main(int(sys.argv[1]))
