#!/usr/bin/env bash
# Run 318 (prepared 2026-12-07): clusters of two CTAs multicasting a block's activation tile (CL=2 programs, 128
# and 256 routes), beside the lone programs and the peer; the FC2 epilogue's route ids loaded together; the align
# plan's four chunks an iteration; inline FC1 from the gather pass at 32 routes. Every output goes into one tarball
# (the tool returns at most 8 files). Carry: aot_cache/carry.tgz (scripts/pack_aot_cache.py without MLA,
# stage-decoder, expander and W4A8 programs and NVFP4's 64-route engine programs: 64 MiB), .peers/triton_kernels,
# .peers/SOURCE, .ab/COMMIT.
set -uo pipefail
mkdir -p aot_cache && tar xzf aot_cache/carry.tgz -C aot_cache
export PYTHONPATH=$(printf '%s:' $PWD/packages/*/src)$PWD/benchmarks PYTHONUNBUFFERED=1 CSF_COMMIT=$(cat .ab/COMMIT)
R=$OUT/r && mkdir -p $R
trap 'cd $OUT && tar czf run318.tgz r && rm -rf r' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv > $R/gpu.txt 2>&1
t0=$(date +%s)
log() { echo "$1 at $(( $(date +%s) - t0 )) s" | tee -a $R/tests.log; }
P="python3 -m pytest -q -p no:cacheprovider -m gpu -rf"
timeout 90 $P tests/moe/test_engine_gemm_gpu.py -k clusters > $R/t_cluster.log 2>&1
log "cluster rc=$?: $(tail -1 $R/t_cluster.log)"
timeout 80 $P tests/moe/test_engine_inline_gpu.py tests/moe/test_engine_inline_probe_gpu.py > $R/t_inline.log 2>&1
log "inline rc=$?: $(tail -1 $R/t_inline.log)"
timeout 90 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_layer_gpu.py -k "not clusters and not (nvfp4 and 64)" \
  > $R/t_engine.log 2>&1
log "engine rc=$?: $(tail -1 $R/t_engine.log)"
timeout 130 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_cluster,engine_inline,engine_inline_cluster --tokens 2048,8192 --reps 6 \
  --peer-path $PWD/.peers --out $R/moe_large.json > $R/moe_large.log 2>&1
log "bench 2048-8192 rc=$?"
timeout 110 python3 benchmarks/bench_moe.py --geometries peers --arms triton_kernels,engine,engine_inline \
  --tokens 1,8,32,128,512 --reps 6 --peer-path $PWD/.peers --out $R/moe_small.json > $R/moe_small.log 2>&1
log "bench 1-512 rc=$?"
CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model gpt-oss-120b --tp 1 --tokens 8192 \
  --arms engine,engine_cluster,triton_kernels --peer-path $PWD/.peers --out $R/kernel_times.json > $R/kernel_times.log 2>&1
log "kernel times rc=$?"
MET="sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,gpu__time_duration.sum,dram__bytes_read.sum"
timeout 60 ncu --clock-control none -k regex:GroupedFp4Gemm -c 2 --metrics $MET \
  python3 benchmarks/profile_kernels.py engine --arm engine_cluster --tokens 8192 2>&1 | grep -v "^==PROF==" | tail -40 > $R/ncu8192.txt
log "ncu rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
