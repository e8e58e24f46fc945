#!/usr/bin/env bash
# Run 319 (prepared 2026-12-07): ragged level 2 (a tail block in its first quarter runs m64n{N/4}; RAG=2, the default
# at 128 and 256 routes) beside level 1 (arm engine_half_ragged) and the peer; the ragged GPU test with tails in all
# three loops. Every output in one tarball. Carry: aot_cache/carry.tgz (scripts/pack_aot_cache.py without MLA,
# stage-decoder, expander and W4A8 programs, NVFP4's 64-route and level-1 ragged engine programs: their tests are
# deselected), .peers/triton_kernels,
# .peers/SOURCE, .ab/COMMIT.
set -uo pipefail
mkdir -p aot_cache && tar xzf aot_cache/carry.tgz -C aot_cache
export PYTHONPATH=$(printf '%s:' $PWD/packages/*/src)$PWD/benchmarks PYTHONUNBUFFERED=1 CSF_COMMIT=$(cat .ab/COMMIT)
R=$OUT/r && mkdir -p $R
trap 'cd $OUT && tar czf run319.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv > $R/gpu.txt 2>&1
t0=$(date +%s)
log() { echo "$1 at $(( $(date +%s) - t0 )) s" | tee -a $R/tests.log; }
P="python3 -m pytest -q -p no:cacheprovider -m gpu -rf"
# device time is short: the tests the quarter loop touches (ragged blocks, the layer, inline at 128 and 256 routes)
timeout 90 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_layer_gpu.py \
  -k "(ragged and mxfp4) or (layer and mxfp4) or (test_matches_reference and (128 or 256))" > $R/t_engine.log 2>&1
log "engine rc=$?: $(tail -1 $R/t_engine.log)"
timeout 60 $P tests/moe/test_engine_inline_gpu.py -k "128 or 256" > $R/t_inline.log 2>&1
log "inline rc=$?: $(tail -1 $R/t_inline.log)"
timeout 150 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_half_ragged,engine_inline --tokens 2048,8192 --reps 6 \
  --peer-path $PWD/.peers --out $R/moe_large.json > $R/moe_large.log 2>&1
log "bench 2048-8192 rc=$?"
CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model gpt-oss-120b --tp 1 --tokens 8192 \
  --arms engine,engine_half_ragged,triton_kernels --peer-path $PWD/.peers --out $R/kernel_times.json \
  > $R/kernel_times.log 2>&1
log "kernel times rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
