"""benchmarks/multi_gpu_moe.py on the CPU: two gloo ranks with the reference stand-in for the fused layer (TP 2 and
EP 2 of a tiny layer, MXFP4 and NVFP4), its JSON read back; and its checks shown to fail on a wrong reduction and on
another rank's slice, so that passing them means something."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import torch

from csf_moe import RankShard, shard_weights
from csf_moe.synthetic import synthetic_layer
from tests.repo_scripts import ROOT, load_script

SEED = random.randrange(1 << 20)
TOKENS = (1, 5, 16)


def _script():
    return load_script("benchmarks/multi_gpu_moe.py", "multi_gpu_moe")


def test_two_gloo_ranks_shard_reduce_and_match_the_single_rank_layer(tmp_path):
    src = [str(p / "src") for p in sorted((ROOT / "packages").iterdir()) if (p / "src").is_dir()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*src, str(ROOT), *sys.path]), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "benchmarks/multi_gpu_moe.py", "--device", "cpu", "--backend", "gloo", "--models", "tiny",
           "--tokens", ",".join(map(str, TOKENS)), "--bench-tokens", "1,4", "--reps", "2", "--seed", str(SEED),
           "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"seed {SEED}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    out = json.loads((tmp_path / "multi_gpu_moe.json").read_text())

    assert out["ok"] and out["failures"] == [], f"seed {SEED}: {out['failures']}"
    assert (out["world"], out["backend"], out["seed"]) == (2, "gloo", SEED)
    assert out["layer"].startswith("reference stand-in")  # labelled: no GPU program ran
    assert out["frozen"]["frozen"] is None and out["frozen"]["why"]
    assert out["multicast_env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                    "NVSHMEM_DISABLE_NVLS": "1"}  # fmt: skip
    assert {"command", "commit", "when", "torch"} <= set(out["provenance"])
    assert {c["geometry"] for c in out["coverage"]} >= {"tiny/tp1/mxfp4", "tiny/tp2/mxfp4", "tiny/tp1/ep2/mxfp4"}

    cases = {(c["fmt"], c["mode"]): c for c in out["cases"]}
    assert set(cases) == {(f, m) for f in ("mxfp4", "nvfp4") for m in ("tp", "ep")}
    for (fmt, mode), case in cases.items():
        assert case["ok"], f"seed {SEED} {fmt} {mode}: {case['failures']}"
        ranks = case["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["kind"].startswith("reference stand-in") for r in ranks)
        assert [r["geometry"] for r in ranks] == [f"tiny/{'tp2' if mode == 'tp' else 'tp1/ep2'}/{fmt}"] * 2
        # the scale memory each rank gets back: its own planes, summing to the single layer's
        assert sum(r["scale_memory"]["native"] for r in ranks) == ranks[0]["whole_scale_memory"]["native"]
        assert all(0 < r["scale_memory"]["stored"] < r["scale_memory"]["native"] for r in ranks)
        checks = ranks[0]["checks"]
        assert set(checks) == {str(t) for t in TOKENS}
        for t, c in checks.items():
            assert c["partial_equals_slice"] == [True, True], f"seed {SEED} {fmt} {mode} T={t}"
            if mode == "ep":
                assert c["partial_equals_masked_whole"] == [True, True], f"seed {SEED} {fmt} T={t}"
            assert c["reduced_within_bound"] and c["reduction"]["max_ratio"] <= 1.0, f"seed {SEED}: {c}"
            assert c["graph"] is None  # CUDA graphs: GPU only
        for r in ranks:
            assert [b["tokens"] for b in r["bench"]] == [1, 4]
            assert all(b["layer_s"] > 0 and b["allreduce_s"] > 0 and b["reps"] == 2 for b in r["bench"])
            assert r["bench"][1]["allreduce_bytes"] == 4 * 320 * 2  # [T, H] bf16


def _tiny_ranks(mod, fmt: str, mode: str):
    whole_geo = mod.whole_geometry("tiny", fmt)
    tensors = synthetic_layer(whole_geo, seed=SEED).weight_kwargs()
    ep = mode == "ep"
    shards = [mod.rank_shard(mode, 2, r) for r in (0, 1)]
    one = [mod.Rank(mod.build(True, s.geometry(whole_geo), shard_weights(tensors, s), 16, torch.device("cpu")), s,
                    ep, whole_geo.experts, "cpu") for s in shards]  # fmt: skip
    whole = mod.Rank(mod.build(True, whole_geo, tensors, 16, torch.device("cpu")), RankShard(), False,
                     whole_geo.experts, "cpu")  # fmt: skip
    return whole_geo, one, whole


def test_the_checks_fail_on_a_missing_share_and_on_another_ranks_slice():
    mod = _script()
    for fmt, mode in (("mxfp4", "tp"), ("nvfp4", "ep")):
        geo, one, whole = _tiny_ranks(mod, fmt, mode)
        x, ids, w = mod.routing(geo, 16, SEED, torch.device("cpu"))
        partials = [r.run(x, ids, w) for r in one]
        reduced = (partials[0].float() + partials[1].float()).to(torch.bfloat16)  # what the all-reduce returns
        good = mod.compare(mode, one, whole, partials, reduced, x, ids, w, geo.top_k)
        assert good["reduced_within_bound"] and good["partial_equals_slice"] == [True, True], f"seed {SEED}"

        missing = mod.compare(mode, one, whole, partials, partials[0], x, ids, w, geo.top_k)  # rank 1 not summed
        assert not missing["reduced_within_bound"], f"seed {SEED} {mode}: {missing['reduction']}"
        swapped = mod.compare(mode, one, whole, partials[::-1], reduced, x, ids, w, geo.top_k)
        assert swapped["partial_equals_slice"] == [False, False], f"seed {SEED} {mode}"
        if mode == "ep":
            assert swapped["partial_equals_masked_whole"] == [False, False], f"seed {SEED}"


def test_the_bound_is_the_reductions_rounding():
    """With nothing but the reduction's rounding between them (exact magnitudes, EP's per-route values equal), a
    result one rounding away passes and one a few ulps away does not."""
    mod = _script()
    whole = torch.tensor([1.0, -3.0, 100.0], dtype=torch.bfloat16)
    m = whole.float().abs()
    tol = mod.reduction_bound("ep", whole, whole, [m / 2, m / 2], m, 1, True)
    assert torch.all(tol < 4 * mod.U * m * 1.1) and torch.all(tol >= 3 * mod.U * m)
    near = whole.float() * (1 + 2 * mod.U)  # one bf16 ulp away (at these values, a power of two or not)
    far = whole.float() * (1 + 16 * mod.U)
    assert torch.all((near - whole.float()).abs() <= tol)
    assert torch.all((far - whole.float()).abs() > tol)
