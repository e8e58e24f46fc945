#!/usr/bin/env bash
# Kept as written (next-run322.sh, which superseded it, refers to it): the ping-pong schedule, its tests and
# the engine_pingpong arm it names were removed after run 323 (docs/moe-engine.md §4.13).
# Run 320. First GPU run of the ping-pong consumers (SCHED=pingpong, docs/moe-engine.md §4.13): each consumer
# warpgroup alone on alternate half-block units of 128- and 256-route blocks, one's epilogue under the other's wgmmas;
# and of the gather pass writing the routes' slots only, 16 slots a program (run 319: 393 us of DS4.1's 2726 at
# 8192); and of the alignment's count programs (one program counting every route took 55-58 us at 49-65k routes).
# Correctness first (ping-pong programs against the cooperative ones bit for bit, the layer against the
# default layer; the default engine's tests with the new pass), then the A/B against the default at 1024-8192 tokens
# with the peer in the same call, FC1/FC2/glue apart, the tensor pipe at gpt-oss and DS4.1 8192, and 1-512 tokens.
# Carry (64 MiB): aot_cache/carry.tgz (next-run319.sh's drops, every RAG=2 program, NVFP4 and gathering ping-pong
# programs; their tests deselected: the ragged levels' test passed in run 319), .peers/triton_kernels,
# .peers/SOURCE, .ab/COMMIT.
set -uo pipefail
source validation/calls/preamble.sh run320
timeout 150 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_layer_gpu.py -k "pingpong and not nvfp4" \
  > $R/t_pingpong.log 2>&1
log "ping-pong rc=$?: $(tail -1 $R/t_pingpong.log)"
timeout 120 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_layer_gpu.py \
  -k "not pingpong and not (nvfp4 and 64) and not ragged and not (replays and nvfp4)" \
  > $R/t_engine.log 2>&1
log "engine rc=$?: $(tail -1 $R/t_engine.log)"
timeout 150 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_pingpong,engine_inline --tokens 1024,2048,4096,8192 --reps 6 \
  --peer-path $PWD/.peers --out $R/moe_large.json > $R/moe_large.log 2>&1
log "bench 1024-8192 rc=$?"
for m in "gpt-oss-120b --tp 1" "deepseek-v4.1-flash --tp 4" "qwen3-30b-a3b --tp 1"; do
  CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model $m --tokens 2048,8192 \
    --arms engine,engine_pingpong,triton_kernels --peer-path $PWD/.peers --out $R/kt_${m%% *}.json \
    > $R/kt_${m%% *}.log 2>&1
  log "kernel times $m rc=$?"
done
MET="sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
for m in "gpt-oss-120b --tp 1" "deepseek-v4.1-flash --tp 4"; do
  timeout 60 ncu --clock-control none -k regex:GroupedFp4Gemm -c 2 --metrics $MET python3 benchmarks/profile_kernels.py \
    engine --arm engine_pingpong --model $m --tokens 8192 2>&1 | grep -v "^==PROF==" | tail -30 \
    > $R/ncu_pp_${m%% *}_8192.txt
  log "ncu $m rc=$?"
done
timeout 80 python3 benchmarks/bench_moe.py --geometries peers --arms triton_kernels,engine,engine_inline \
  --tokens 1,8,32,128,512 --reps 6 --peer-path $PWD/.peers --out $R/moe_small.json > $R/moe_small.log 2>&1
log "bench 1-512 rc=$?"
timeout 60 $P tests/moe/test_engine_inline_gpu.py -k "not (nvfp4 and 64)" > $R/t_inline.log 2>&1
log "inline rc=$?: $(tail -1 $R/t_inline.log)"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
