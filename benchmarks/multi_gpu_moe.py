"""Tensor- and expert-parallel MoE layers over NCCL, one process a GPU: checked against one GPU, and timed.

    torchrun --standalone --nproc-per-node 2 benchmarks/multi_gpu_moe.py --out DIR
        [--models deepseek-v4.1-flash,kimi-k2] [--formats mxfp4,nvfp4] [--modes tp,ep]
        [--tokens 1,7,64,300,512] [--bench-tokens 1,2,4,...,512] [--reps 50] [--seed S]
    torchrun --standalone --nproc-per-node 2 benchmarks/multi_gpu_moe.py --device cpu --backend gloo \\
        --models tiny --out DIR                                           # the CPU proof (reference stand-in)

For each model, format and mode (``tp``: tensor parallel over all the ranks, ``ep``: expert parallel), every rank
builds its layer as the adapters build it: the single-rank layer's tensors (``csf_moe.synthetic``, the same on every
rank from the seed) -> ``RankShard.geometry`` and ``shard_weights`` -> ``plan_rank_layer`` (the adapters' plan) ->
``prepare_weights`` -> ``bind``; under EP the model's route ids go through ``LocalRoutes`` (other ranks' experts
become -1, skipped), as an adapter's ``run_experts`` does. Each rank runs its layer on the same tokens and the ranks'
bf16 outputs are summed by ``all_reduce`` over the group, as the engines reduce a MoE layer's output with their own
FP4 methods at TP and at EP with the all-reduce backend. Rank 0 writes one JSON into ``--out`` with provenance.

Checks (``checks`` in the JSON, per token count; the run exits 1 if one fails, after writing the JSON):

* ``partial_equals_slice``: each rank's output is bit-identical (``torch.equal``) to the slice computation on one
  GPU: the layer an adapter builds for that rank's shard, built and run on rank 0's GPU in rank 0's process (for
  rank 1 its partial, computed on GPU 1, is all-gathered to GPU 0). At TP that is the whole layer's computation on
  the rank's N-slice (its N/tp gate and up rows of W13, its N/tp columns of W2: an FC2 over K = N/tp; no tp-1
  computation sums the same K-range alone, so none is bit-identical to it).
* ``partial_equals_masked_whole`` (EP only): each rank's output is bit-identical to the single-GPU layer (tp 1, ep 1,
  every expert) run with the route ids of other ranks' experts set to -1, wherever the rank's and the single
  layer's plans give that token count the same arithmetic (tiles, K splits, who finishes FC1; ``compared`` lists
  those token counts; one token always does).
* ``reduced_within_bound``: the reduced output against the single-GPU layer's output, elementwise
  ``|reduced - whole| <= tol`` (``reduction_bound``): the bf16 roundings that differ between the two computations,
  each at most u = 2^-8 of the value rounded, with the magnitudes measured per route (each route alone, weight 1,
  through the same layers: ``M = sum_j |w_j| |y_j|``):
  u |reduced| (the all-reduce rounds the two bf16 partials' exact sum once), u |whole| (the single layer's combine
  rounds its float32 sum once), u (M_0 + M_1) (each rank's combine rounds its share), (2k + 2) 2^-24 M (the float32
  combine adds the routes in another grouping); at TP also u (M_0 + M_1) + u M (each rank rounds its half of every
  route's FC2 output to bf16, the single layer rounds the whole) and an allowance of u M for FC1's and FC2's
  K-orders (tiles over other widths; exact terms are not observable from outputs); at EP where the plans differ
  (see above) 2u M (each route's output within one bf16 ulp). All times (1 + 8u). ``max_ratio`` is the largest
  |reduced - whole| / tol, ``max_ulps`` the largest difference in bf16 ulps of the single layer's value.
* ``graph``: on every rank, the layer captured in a CUDA graph replays equal to eager, allocating nothing
  (``allocation.all.allocated`` unchanged), and the layer followed by the NCCL all-reduce, captured together as an
  engine's step captures them, replays equal to the eager reduction.
* ``frozen``: the whole run is frozen (``runtime.freeze()``: programs only from the AOT cache) and
  ``runtime.compilations()`` is 0 on every rank at the end. ``coverage`` says, before anything runs, whether each
  geometry's programs are in the catalog's AOT build (``geometry_specs`` against ``catalog_specs``).
* ``scale_memory``: per rank the layer's scale bytes as stored (CSF) and as native planes, what the rank gets back;
  the ranks' native bytes must sum to the single layer's.

Benchmark (``bench``, per rank, per token count): the rank's layer alone in a CUDA graph (``replay_times``: L2
flushed before each replay), the all-reduce of its [T, H] bf16 output alone in a graph, and the two in one graph;
the collective's and the step's replays start together on every rank (barrier and device sync before each), so
they include the ranks' skew. Medians, CUDA events. One routing per token count, the same on every rank.

``--device cpu --backend gloo``: the fused layer (a GPU program) is replaced on every rank by
``csf_moe.reference.moe_reference`` over the rank's shard, rounded to bf16 (``layer.kind`` says so in the JSON):
the shards, the route-id mapping, the plan and the prepared (CSF) scales, the gloo reduction, the single-rank
comparisons and the bound are exercised; graphs and the frozen runtime are not (``null``, with the reason), and the
bench times are wall-clock of the stand-in, not figures.

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``
are set here before the process group starts): the device machines require it.
"""

from __future__ import annotations

import os

# before torch.distributed starts NCCL: never NVLink multicast (the lent machines' rule; see the module docstring)
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from provenance import provenance

from csf_codec import scale_format
from csf_kernels import runtime
from csf_kernels.catalog import MoEGeometry, load_catalog
from csf_moe import LocalRoutes, RankShard, bind, local_expert_map, prepare_weights, shard_weights
from csf_moe.reference import moe_reference
from csf_moe.synthetic import SyntheticLayer, synthetic_layer, synthetic_routing
from csf_serving_adapters.moe_core import plan_rank_layer

MULTICAST_OFF = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")  # set above
MODELS = ("deepseek-v4.1-flash", "kimi-k2")
FORMATS = ("mxfp4", "nvfp4")
MODES = ("tp", "ep")
CHECK_TOKENS = (1, 7, 64, 300, 512)
BENCH_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
REPS = 50
# a small layer for the CPU proof (not in the catalog): 8 experts split over ep 2, N 192 over tp 2 (96: whole blocks)
TINY = dict(experts=8, hidden=320, intermediate=192, top_k=3)
U = 2.0**-8  # bf16's unit roundoff (8 significant bits, round to nearest)
F32 = 2.0**-24  # float32's
STAND_IN = "reference stand-in: csf_moe.reference.moe_reference on the rank's shard, float32 rounded to bf16"


# ------------------------------------------------------------------------------------------------ geometries
def whole_geometry(model: str, fmt: str) -> MoEGeometry:
    """The single-rank layer (tp 1, ep 1, every expert at full width), from any catalog entry of the model."""
    if model == "tiny":
        return MoEGeometry(model="tiny", tp=1, fmt=scale_format(fmt), **TINY)
    for g in load_catalog().moe:
        if (g.model, g.fmt.name) == (model, fmt):
            return replace(g, tp=1, ep=1, experts=g.experts * g.ep, intermediate=g.intermediate * g.tp)
    raise KeyError(f"{model} {fmt} is not in the geometry catalog")


def rank_shard(mode: str, world: int, rank: int) -> RankShard:
    return RankShard(tp=world, tp_rank=rank) if mode == "tp" else RankShard(ep=world, ep_rank=rank)


_CATALOG_KEYS: list[set[str]] = []


def coverage(geo: MoEGeometry) -> dict:
    """Whether the geometry is a catalog entry, and the programs it needs that the catalog's AOT build lacks."""
    from csf_kernels.aot.registry import catalog_specs, geometry_specs

    if not _CATALOG_KEYS:
        _CATALOG_KEYS.append(set(catalog_specs(load_catalog())))
    missing = [s.describe() for s in geometry_specs(geo) if s.key not in _CATALOG_KEYS[0]]
    return {"geometry": geo.name, "in_catalog": geo in load_catalog().moe, "programs_missing": missing}


# ------------------------------------------------------------------------------------------------ rank layers
class FusedLayer:
    """The layer an adapter serves for these tensors: plan_rank_layer -> prepare_weights -> bind."""

    kind = "fused (plan_rank_layer -> prepare_weights -> bind)"

    def __init__(self, geo: MoEGeometry, tensors: dict, max_tokens: int, device: torch.device) -> None:
        self.plan = plan_rank_layer(geo, max_tokens)
        weights = prepare_weights(self.plan, **{k: None if t is None else t.to(device) for k, t in tensors.items()})
        self.scale_bytes = weights.scale_bytes()
        self.layer = bind(self.plan, weights, torch.empty(self.plan.scratch_bytes, dtype=torch.uint8, device=device))

    def numerics(self, tokens: int):
        """What fixes a call's arithmetic (tiles, K splits, who finishes FC1)."""
        b = self.plan.bucket_for(tokens)
        return b.config, b.splits_fc1, b.splits_fc2, b.fc2_finishes_fc1

    def run(self, x, ids, w, out=None):
        return self.layer.run(x, ids, w, out=out)


class ReferenceStandIn:
    """The CPU stand-in for :class:`FusedLayer`: the same plan and prepared (CSF) weights, for the scale bytes and
    the build path, but the output is ``moe_reference`` over the rank's tensors, rounded to bf16."""

    kind = STAND_IN

    def __init__(self, geo: MoEGeometry, tensors: dict, max_tokens: int, device: torch.device) -> None:
        self.plan = plan_rank_layer(geo, max_tokens)
        self.scale_bytes = prepare_weights(self.plan, **tensors).scale_bytes()
        self.activation = geo.activation
        # the reference's view of the rank's tensors (gpt-oss's activation reads W13 interleaved)
        self.experts = SyntheticLayer(geometry=geo, **tensors).reference()

    def numerics(self, tokens: int):
        return None  # the reference's arithmetic does not depend on the plan's buckets

    def run(self, x, ids, w, out=None):
        y = moe_reference(x, self.experts, w, ids, kind=self.activation).to(torch.bfloat16)
        return y if out is None else out.copy_(y)


class Rank:
    """A layer with its route map (EP: the model's ids -> the rank's; TP: the ids as given)."""

    def __init__(self, layer, shard: RankShard, map_routes: bool, global_experts: int, device: torch.device) -> None:
        self.layer, self.shard = layer, shard
        self.routes = None
        if map_routes:
            self.routes = LocalRoutes(local_expert_map(global_experts, shard, device), layer.plan.max_pairs)

    def run(self, x, ids, w, out=None):
        return self.layer.run(x, ids if self.routes is None else self.routes(ids), w, out=out)

    def magnitude(self, x, ids, w) -> torch.Tensor:
        """float32 [T, H]: sum_j |w_j| |y_j|, each route's output computed alone (weight 1, the others 0)."""
        m = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for j in range(ids.shape[1]):
            one = torch.zeros_like(w)
            one[:, j] = 1.0
            m += w[:, j : j + 1].abs() * self.run(x, ids, one).float().abs()
        return m


def build(stand_in: bool, geo, tensors, max_tokens, device):
    return (ReferenceStandIn if stand_in else FusedLayer)(geo, tensors, max_tokens, device)


# ------------------------------------------------------------------------------------------------ checks
def routing(geo: MoEGeometry, tokens: int, seed: int, device: torch.device):
    """The same (hidden, route ids, weights) on every rank (CPU generator); the last route of token 0 is -1 (an
    engine's padding)."""
    x, ids, w = synthetic_routing(geo, tokens, torch.Generator().manual_seed(seed * 7919 + tokens))
    ids[0, -1] = -1
    return x.to(device), ids.to(device), w.to(device)


def reduction_bound(mode: str, reduced, whole, m_ranks, m_whole, k: int, same_routes: bool) -> torch.Tensor:
    """Elementwise tolerance of |reduced - whole| (module docstring, ``reduced_within_bound``)."""
    m = sum(m_ranks)
    tol = U * (reduced.float().abs() + whole.float().abs()) + U * m + (2 * k + 2) * F32 * m_whole
    if mode == "tp":
        tol = tol + U * m + U * m_whole + U * m_whole
    elif not same_routes:
        tol = tol + 2 * U * m_whole
    return tol * (1 + 8 * U)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    a = x.float().abs().clamp(min=2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


def graph_check(rank: Rank, x, ids, w, eager, reduced) -> dict:
    """The layer alone, and the layer then the all-reduce, captured and replayed (every rank together)."""
    from timing import capture

    out = torch.empty_like(x)
    g = capture(lambda: rank.run(x, ids, w, out=out))  # an eager warm-up binds outside capture, as engines do
    out.zero_()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    g.replay()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    layer_equal = torch.equal(out, eager)

    step_out = torch.empty_like(x)
    rank.run(x, ids, w, out=step_out)
    dist.all_reduce(step_out)
    torch.cuda.synchronize()
    step = torch.cuda.CUDAGraph()
    with torch.cuda.graph(step):
        rank.run(x, ids, w, out=step_out)
        dist.all_reduce(step_out)
    step_out.zero_()
    torch.cuda.synchronize()
    step.replay()
    torch.cuda.synchronize()
    return {"replay_equals_eager": layer_equal, "replay_allocated": allocated,
            "step_replay_equals_eager_reduction": torch.equal(step_out, reduced)}  # fmt: skip


def compare(mode, ranks_on_one, whole, partials, reduced, x, ids, w, k) -> dict:
    """Rank 0: the ranks' partials and their reduction against the computations on this one device."""
    out: dict = {}
    slices = [r.run(x, ids, w) for r in ranks_on_one]
    out["partial_equals_slice"] = [torch.equal(p, s) for p, s in zip(partials, slices, strict=True)]
    want = whole.run(x, ids, w)
    same_routes = True
    if mode == "ep":
        masked = []
        for r, p in zip(ranks_on_one, partials, strict=True):
            held = r.shard.experts(whole.layer.plan.geometry.experts)
            if r.layer.numerics(x.shape[0]) != whole.layer.numerics(x.shape[0]):
                masked.append(None)  # other K splits: equal within rounding only
                same_routes = False
                continue
            mine = (ids >= held.start) & (ids < held.stop)
            masked.append(torch.equal(p, whole.run(x, torch.where(mine, ids, -1), w)))
        out["partial_equals_masked_whole"] = masked
    m_ranks = [r.magnitude(x, ids, w) for r in ranks_on_one]
    m_whole = whole.magnitude(x, ids, w)
    tol = reduction_bound(mode, reduced, want, m_ranks, m_whole, k, same_routes)
    diff = (reduced.float() - want.float()).abs()
    out["reduced_within_bound"] = bool((diff <= tol).all())
    out["reduction"] = {
        "max_abs_diff": diff.max().item(),
        "max_ratio": (diff / tol.clamp(min=torch.finfo(torch.float32).tiny)).max().item(),
        "max_ulps": (diff / bf16_ulp(want)).max().item(),
        "elements_differing": int((diff > 0).sum()),
        "elements": diff.numel(),
        "bit_identical": bool(torch.equal(reduced, want)),
    }
    return out


# ------------------------------------------------------------------------------------------------ benchmark
def _lockstep(fn, reps: int, flush, cuda: bool) -> list[float]:
    """Seconds per call of ``fn`` started together on every rank (barrier, device sync), CUDA events on GPUs."""
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.add_(1)
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def bench(rank: Rank, geo, tokens: int, seed: int, reps: int, device) -> dict:
    x, ids, w = routing(geo, tokens, seed, device)
    out, buf = torch.empty_like(x), torch.empty_like(x)
    buf.copy_(rank.run(x, ids, w))
    cuda = device.type == "cuda"
    if not cuda:  # the stand-in, wall-clock: exercises the harness, measures nothing of the GPU layer
        layer = _lockstep(lambda: rank.run(x, ids, w, out=out), reps, None, False)
        coll = _lockstep(lambda: dist.all_reduce(buf), reps, None, False)
        step = _lockstep(lambda: (rank.run(x, ids, w, out=out), dist.all_reduce(out)), reps, None, False)
    else:
        from timing import capture, l2_flush_buffer, replay_times

        flush = l2_flush_buffer()
        g_layer = capture(lambda: rank.run(x, ids, w, out=out))
        g_coll = capture(lambda: dist.all_reduce(buf))
        g_step = capture(lambda: (rank.run(x, ids, w, out=out), dist.all_reduce(out)))
        dist.barrier()
        layer = replay_times(g_layer, reps, flush)
        coll = _lockstep(g_coll.replay, reps, flush, True)
        step = _lockstep(g_step.replay, reps, flush, True)
    med = statistics.median
    return {"tokens": tokens, "layer_s": med(layer), "allreduce_s": med(coll), "layer_then_allreduce_s": med(step),
            "allreduce_bytes": buf.numel() * buf.element_size(), "reps": reps}  # fmt: skip


# ------------------------------------------------------------------------------------------------ one case
def run_case(args, model: str, fmt: str, mode: str, device: torch.device) -> dict:
    world, me = dist.get_world_size(), dist.get_rank()
    stand_in = args.device == "cpu"
    whole_geo = whole_geometry(model, fmt)
    shards = [rank_shard(mode, world, r) for r in range(world)]
    geo = shards[me].geometry(whole_geo)
    max_tokens = max((*args.tokens, *args.bench_tokens))
    data = synthetic_layer(whole_geo, seed=args.seed)  # on the CPU, the same on every rank
    tensors = data.weight_kwargs()
    ep = mode == "ep"
    rank = Rank(build(stand_in, geo, shard_weights(tensors, shards[me]), max_tokens, device), shards[me], ep,
                whole_geo.experts, device)  # fmt: skip
    mine: dict = {"rank": me, "geometry": geo.name, "scale_memory": rank.layer.scale_bytes, "checks": {}}
    if device.type == "cuda":
        mine["device"] = torch.cuda.get_device_name(device)

    # every rank: its partial, the reduction, graphs; then rank 0 compares with its own device's computations
    one = [Rank(build(stand_in, s.geometry(whole_geo), shard_weights(tensors, s), max_tokens, device), s, ep,
                whole_geo.experts, device) for s in shards] if me == 0 else []  # fmt: skip
    whole = Rank(build(stand_in, whole_geo, tensors, max_tokens, device), RankShard(), False, whole_geo.experts,
                 device) if me == 0 else None  # fmt: skip
    for t in args.tokens:
        x, ids, w = routing(whole_geo, t, args.seed, device)
        partial = rank.run(x, ids, w)
        reduced = partial.clone()
        dist.all_reduce(reduced)
        gathered = [torch.empty_like(partial) for _ in range(world)]
        dist.all_gather(gathered, partial)
        c: dict = {}
        if device.type == "cuda":
            c["graph"] = graph_check(rank, x, ids, w, partial, reduced)
        if me == 0:
            c.update(compare(mode, one, whole, gathered, reduced, x, ids, w, whole_geo.top_k))
        mine["checks"][str(t)] = c
    if me == 0:
        mine["whole_scale_memory"] = whole.layer.scale_bytes
        del one, whole
    del data, tensors
    if device.type == "cuda":
        torch.cuda.empty_cache()
    mine["bench"] = [bench(rank, whole_geo, t, args.seed, args.reps, device) for t in args.bench_tokens]
    mine["kind"] = rank.layer.kind
    return mine


def verdict(case: dict, world: int, cuda: bool) -> list[str]:
    """What failed in a case (empty: all passed)."""
    bad = []
    r0 = case["ranks"][0]
    for t, c in r0["checks"].items():
        if not all(c["partial_equals_slice"]):
            bad.append(f"T={t}: a rank's partial differs from its slice on one device")
        masked = c.get("partial_equals_masked_whole")
        if masked is not None and False in masked:
            bad.append(f"T={t}: a rank's partial differs from the masked single layer")
        if not c["reduced_within_bound"]:
            bad.append(f"T={t}: the reduction is outside the bound ({c['reduction']})")
    if case["mode"] == "ep" and "1" in r0["checks"]:
        if None in r0["checks"]["1"].get("partial_equals_masked_whole", []):
            bad.append("T=1: a one-token call plans other arithmetic than the single layer")
    for r in case["ranks"]:
        for t, c in r["checks"].items():
            g = c.get("graph")
            if cuda and (g is None or not (g["replay_equals_eager"] and g["replay_allocated"] == 0
                                           and g["step_replay_equals_eager_reduction"])):  # fmt: skip
                bad.append(f"rank {r['rank']} T={t}: graph check {g}")
    native = sum(r["scale_memory"]["native"] for r in case["ranks"])
    if native != r0["whole_scale_memory"]["native"]:
        bad.append(f"the ranks' native scale bytes {native} != the single layer's {r0['whole_scale_memory']}")
    return bad


# ------------------------------------------------------------------------------------------------ main
def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in s.split(",") if v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder; rank 0 writes multi_gpu_moe.json there")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--models", default=",".join(MODELS), help="catalog models, or 'tiny' (the CPU proof's)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--tokens", type=_ints, default=CHECK_TOKENS, help="token counts checked")
    ap.add_argument("--bench-tokens", type=_ints, default=BENCH_TOKENS, help="token counts timed ('' for none)")
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--seed", type=int, default=None, help="default: fresh, in the JSON")
    args = ap.parse_args(argv)
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    if "LOCAL_RANK" not in os.environ:
        ap.error("start it with torchrun (one process a device): torchrun --nproc-per-node 2 " + sys.argv[0])
    local = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group(backend, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend)
    world, me = dist.get_world_size(), dist.get_rank()
    seed = [args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "little")]
    dist.broadcast_object_list(seed, src=0)
    args.seed = seed[0]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))

    cuda = args.device == "cuda"
    if cuda:
        runtime.freeze()  # serving conditions: programs only from the AOT cache
    models, formats, modes = (s.split(",") for s in (args.models, args.formats, args.modes))
    result: dict = {
        "provenance": provenance(),
        "seed": args.seed,
        "world": world,
        "backend": backend,
        "device": args.device,
        "layer": STAND_IN if not cuda else FusedLayer.kind,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "multicast_env": {k: os.environ[k] for k in MULTICAST_OFF},
        "bound": "|reduced - whole| <= tol elementwise: benchmarks/multi_gpu_moe.py, reduction_bound",
        "coverage": [],
        "cases": [],
    }
    failures: list[str] = []
    for model in models:
        for fmt in formats:
            whole_geo = whole_geometry(model, fmt)
            for mode in modes:
                geos = [whole_geo, *(rank_shard(mode, world, r).geometry(whole_geo) for r in range(world))]
                covered = [coverage(g) for g in geos]  # every rank: the same answer, so every rank skips alike
                result["coverage"] += [c for c in covered if c not in result["coverage"]]
                missing = sorted({c["geometry"] for c in covered if c["programs_missing"]})
                if cuda and missing:  # frozen, the run would stop at the first uncached program: say so, go on
                    why = f"programs missing from the catalog's AOT build for {missing} (coverage)"
                    result["cases"].append({"model": model, "fmt": fmt, "mode": mode, "ok": False, "not_run": why})
                    failures.append(f"{model} {fmt} {mode}: not run: {why}")
                    if me == 0:
                        print(f"{model} {fmt} {mode}{world}: not run: {why}", flush=True)
                    continue
                t0 = time.perf_counter()
                mine = run_case(args, model, fmt, mode, device)
                ranks: list = [None] * world
                dist.all_gather_object(ranks, mine)
                case = {"model": model, "fmt": fmt, "mode": mode, f"{mode}": world, "whole": whole_geo.name,
                        "seconds": time.perf_counter() - t0, "ranks": ranks}  # fmt: skip
                if me == 0:
                    bad = verdict(case, world, cuda)
                    case["ok"] = not bad
                    case["failures"] = bad
                    failures += [f"{model} {fmt} {mode}: {b}" for b in bad]
                    print(f"{model} {fmt} {mode}{world}: {'ok' if not bad else bad} ({case['seconds']:.1f} s)",
                          flush=True)  # fmt: skip
                result["cases"].append(case)
    compiled = [0] * world
    dist.all_gather_object(compiled, runtime.compilations())
    result["frozen"] = (
        {"frozen": True, "compilations_per_rank": compiled, "ok": not any(compiled)}
        if cuda
        else {"frozen": None, "why": "no GPU programs run on the CPU (the reference stand-in)"}
    )
    if cuda and any(compiled):
        failures.append(f"compilations per rank: {compiled}")
    if not cuda:
        for case in result["cases"]:
            for r in case.get("ranks", ()):
                for c in r["checks"].values():
                    c["graph"] = None  # CUDA graphs: GPU only
    result["ok"] = not failures
    result["failures"] = failures
    if me == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "multi_gpu_moe.json"
        path.write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
        print(f"wrote {path}: {'ok' if not failures else f'{len(failures)} failures'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if not failures else 1


def _json_default(o):
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
