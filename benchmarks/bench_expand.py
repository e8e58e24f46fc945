"""Scale-expansion figures on the H200, from the AOT cache (frozen): JSON with provenance.

* expansion throughput on the DeepSeek-V4.1-Flash TP4 layer (W13 + W2, MXFP4), inline and compact
  forms, whole layer (its planes concurrently, and in sequence) and routed experts, as a fraction of the
  device copy bandwidth measured in the same run (bytes read + written: CSF bytes read, native bytes
  written);
* the time to load every program of one model's geometry set from the cache;
* the host cost of one launch through the runtime against Triton's own JIT launch of the same kernel.

    python3 benchmarks/bench_expand.py --out $OUT/bench_expand.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance
from timing import capture, copy_bandwidth, l2_flush_buffer, replay_times

from csf_codec import MXFP4, encode_compact, encode_inline
from csf_codec.synthetic import SEED_REGIME, synthetic_scale_plane
from csf_kernels import env, runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.expand.compact_tables import compact_tables
from csf_kernels.expand.launch import expand_compact, expand_inline, inline_expansion_launches
from csf_kernels.expand.layer import expand_inline_layer


def layer_planes(model: str = "deepseek-v4.1-flash", tp: int = 4):
    """A catalog MXFP4 layer's scale planes (seed-regime statistics; default DeepSeek-V4.1-Flash TP4) on the
    GPU, with their inline forms: (geometry, {projection: (plane, inline)})."""
    geo = load_catalog().moe_geometry(model, tp, "mxfp4")
    planes = {}
    for proj, (shape, group) in geo.scale_planes().items():
        plane = synthetic_scale_plane(shape, MXFP4, stats=SEED_REGIME, seed=7).cuda()
        planes[proj] = (plane, encode_inline(plane, MXFP4, row_group=group))
    return geo, planes


def expansion(reps: int, flush: torch.Tensor, copy_gbps: float, model: str, tp: int) -> list[dict]:
    geo, inline_planes = layer_planes(model, tp)
    planes = {
        proj: (plane, inline, compact_tables(encode_compact(plane, MXFP4).payload))
        for proj, (plane, inline) in inline_planes.items()
    }
    outs = {p: torch.empty_like(v[0]) for p, v in planes.items()}
    results = []
    g = torch.Generator().manual_seed(0)
    n_routed = min(8 * geo.top_k, geo.experts)  # the experts 8 tokens route to, at most
    routed = torch.randperm(geo.experts, generator=g)[:n_routed].to(torch.int32).cuda()
    # a layer's planes expand concurrently (csf_kernels.expand.layer: two streams, one plane's tail filled by
    # the other's work); "layer_sequential": one after the other, as two plain expand_inline calls
    both = tuple(planes)
    scopes = [("layer", None, both, True), ("layer_sequential", None, both, False)]
    scopes += [
        (f"routed_{n_routed}_experts", routed, both, True),
        (f"routed_{n_routed}_sequential", routed, both, False),
    ]
    scopes += [(f"{p}_only", None, (p,), False) for p in planes]
    # the inline form by the default choice and every engine side by side (the per-shape row-block expander,
    # the CuTe row images, Triton tiles), then the compact form
    arms = (("inline", "auto"), ("inline", "row_block"), ("inline", "cute"), ("inline", "triton"), ("compact", None))
    for form, engine in arms:
        for scope, ids, projs, concurrent in scopes:
            if concurrent and form != "inline":
                continue  # the compact form has no concurrent layer expansion
            if form == "inline" and not _covers(engine, [(planes[p][1], outs[p]) for p in projs]):
                print(f"expand {form:8s} {engine:9s} {scope:18s} not covered (a plane outside the engine)", flush=True)
                continue

            def run(form=form, engine=engine, ids=ids, projs=projs, concurrent=concurrent):
                if concurrent:
                    expand_inline_layer([(planes[p][1], outs[p]) for p in projs], experts=ids, engine=engine)
                    return
                for _proj in projs:
                    _, inline, tables = planes[_proj]
                    if form == "inline":
                        expand_inline(inline, outs[_proj], experts=ids, engine=engine)
                    else:
                        expand_compact(tables, outs[_proj], experts=ids)

            for o in outs.values():
                o.fill_(0xAB)
            graph = capture(run)
            graph.replay()
            torch.cuda.synchronize()
            exact = all(
                torch.equal(outs[p], planes[p][0])
                if ids is None
                else torch.equal(outs[p][ids.long()], planes[p][0][ids.long()])
                for p in projs
            )
            frac = 1.0 if ids is None else ids.numel() / geo.experts
            read = sum(
                (
                    v[1].nbytes
                    if form == "inline"
                    else int(
                        v[2].selectors.numel()
                        + v[2].exceptions.numel()
                        + v[2].codes.numel()
                        + v[2].escapes.numel()
                        + v[2].counts.numel()
                    )
                )
                for v in (planes[p] for p in projs)
            )
            written = sum(planes[p][0].numel() for p in projs)
            moved = (read + written) * frac
            t = replay_times(graph, reps, flush)
            med = statistics.median(t)
            results.append(
                {
                    "form": form,
                    "engine": engine,
                    "scope": scope,
                    "planes_concurrent": concurrent,
                    "bit_exact": bool(exact),
                    "bytes_read": read * frac,
                    "bytes_written": written * frac,
                    "samples_s": t,
                    "median_us": med * 1e6,
                    "GBps": moved / med / 1e9,
                    "fraction_of_copy_bandwidth": moved / med / 1e9 / copy_gbps,
                }
            )
            print(
                f"expand {form:8s} {engine or '':9s} {scope:18s} {med * 1e6:8.1f} us  {moved / med / 1e9:7.0f} GB/s  "
                f"{moved / med / 1e9 / copy_gbps:5.1%} of copy  exact={exact}",
                flush=True,
            )
    return results


def _covers(engine: str, pairs) -> bool:
    """Whether ``engine`` expands every plane of ``pairs`` (the CuTe engines refuse planes they do not cover)."""
    try:
        for inline, out in pairs:
            inline_expansion_launches(inline, out, engine=engine)
    except ValueError:
        return False
    return True


LOAD_SNIPPET = """
import time, json
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.zeros(1, device='cuda')
t1 = time.perf_counter()
from csf_kernels import runtime
from csf_kernels.catalog import load_catalog
from csf_kernels.aot.registry import geometry_specs
runtime.freeze()
geo = load_catalog().moe_geometry('deepseek-v4.1-flash', 4, 'mxfp4')
specs = geometry_specs(geo)
t2 = time.perf_counter()
for s in specs:
    runtime.program(s, geometry=geo.name)
t3 = time.perf_counter()
print(json.dumps({'programs': len(specs), 'torch_cuda_init_s': t1 - t0, 'imports_s': t2 - t1, 'load_all_s': t3 - t2}))
"""


def load_time() -> dict:
    runs = []
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", LOAD_SNIPPET], capture_output=True, text=True, check=True)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {"runs": runs, "median_load_all_s": statistics.median(x["load_all_s"] for x in runs)}


def launch_overhead(calls: int) -> dict:
    """Host time per launch of the same tiny expansion: AOT runtime vs Triton's JIT launcher."""
    plane = synthetic_scale_plane((1, 128, 4), MXFP4, seed=1).cuda()
    inline = encode_inline(plane, MXFP4)
    out = torch.empty_like(plane)
    ids = torch.zeros(1, dtype=torch.int32, device="cuda")
    expand_inline(inline, out, experts=ids)
    torch.cuda.synchronize()
    res = {}
    t0 = time.perf_counter()
    for _ in range(calls):
        expand_inline(inline, out, experts=ids)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    res["csf_expand_inline_bind_and_launch_us"] = (t1 - t0) / calls * 1e6
    from csf_kernels.expand.launch import bind_expand_inline, inline_expansion_launches

    for engine in ("cute", "triton"):
        bound = bind_expand_inline(inline, out, experts=ids, engine=engine)
        bound()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            bound()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res[f"csf_bound_launch_{engine}_us"] = (t1 - t0) / calls * 1e6
    (launch,) = inline_expansion_launches(inline, out, experts=ids, engine="triton")
    try:
        runtime.unfreeze()  # Triton's own launcher JIT-compiles; measured for comparison only
        from csf_kernels.expand.kernels.triton_inline import SIGNATURE, expand_inline_tiles

        f = launch.spec.fact
        kw = {k: f[k] for k, t in SIGNATURE.items() if t == "constexpr"}
        kw["num_warps"] = f["num_warps"]
        # Triton's launcher takes no empty tensors (a plane without raw tiles or tail)
        jargs = tuple(
            torch.zeros(1, dtype=a.dtype, device="cuda") if torch.is_tensor(a) and a.numel() == 0 else a
            for a in launch.args
        )
        grid = launch.grid
        expand_inline_tiles[grid](*jargs, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            expand_inline_tiles[grid](*jargs, **kw)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res["triton_jit_launch_us"] = (t1 - t0) / calls * 1e6
    finally:
        runtime.freeze()
    res["calls"] = calls
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--model", default="deepseek-v4.1-flash", help="a catalog MXFP4 geometry")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--expansion-only", action="store_true", help="skip program-load and launch timings")
    a = ap.parse_args()
    env.configure_runtime()  # CSF_FROZEN, CSF_AOT_CACHE, CSF_PDL: read here, at the edge
    runtime.freeze()
    flush = l2_flush_buffer()
    copy = copy_bandwidth(a.reps, flush)
    print(f"copy bandwidth {copy['median_GBps']:.0f} GB/s (read + write)", flush=True)
    doc = {
        "benchmark": "bench_expand",
        "provenance": provenance(),
        "copy_bandwidth": copy,
        "geometry": {"model": a.model, "tp": a.tp, "fmt": "mxfp4"},
        "expansion": expansion(a.reps, flush, copy["median_GBps"], a.model, a.tp),
    }
    if not a.expansion_only:
        doc["program_load"] = load_time()
        doc["launch_overhead"] = launch_overhead(2000)
        print(json.dumps({k: doc[k] for k in ("program_load", "launch_overhead")}, indent=1))
    doc["compilations_while_frozen"] = runtime.compilations()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
