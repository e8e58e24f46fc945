#!/usr/bin/env bash
# K splits (wip/splitk): first GPU run. Split units' partials against one split a K range and native against inline
# (bit for bit), the split layer against the reference at 1-8 tokens, the existing engine tests (every engine GEMM is
# version 7: the AOT cache must be rebuilt for all of them), then the split layer against the unsplit one and the peer
# at 1, 2, 4, 8 tokens in one call. Carry: aot_cache/carry.tgz (python scripts/pack_aot_cache.py --root aot_cache, as
# next-run319.sh drops what these calls do not launch), .peers/triton_kernels, .peers/SOURCE, .ab/COMMIT.
set -uo pipefail
source validation/calls/preamble.sh splitk
timeout 150 $P tests/moe/test_engine_split_gpu.py > $R/t_split.log 2>&1
log "split GEMM rc=$?: $(tail -1 $R/t_split.log)"
timeout 120 $P tests/moe/test_engine_split_layer_gpu.py tests/moe/test_engine_layer_gpu.py > $R/t_layer.log 2>&1
log "layers rc=$?: $(tail -1 $R/t_layer.log)"
timeout 150 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_inline_gpu.py tests/moe/test_engine_served_gpu.py \
  tests/moe/test_engine_inline_probe_gpu.py -k "not triton" > $R/t_engine.log 2>&1
log "engine rc=$?: $(tail -1 $R/t_engine.log)"
timeout 120 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_unsplit,engine_inline,engine_inline_unsplit --tokens 1,2,4,8 --reps 10 \
  --peer-path $PWD/.peers --out $R/moe_split.json > $R/moe_split.log 2>&1
log "bench 1-8 rc=$?"
CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model deepseek-v4.1-flash --tp 4 --tokens 1,2,4 \
  --arms engine,engine_unsplit,triton_kernels --peer-path $PWD/.peers --out $R/kernel_times_ds41.json \
  > $R/kt_ds41.log 2>&1
log "kernel times DS4.1 rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
