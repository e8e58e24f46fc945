#!/usr/bin/env bash
# First GPU run of the ping-pong consumers (SCHED=pingpong, docs/moe-engine.md §4.13; wip/pingpong): each consumer
# warpgroup alone on alternate half-block units of 128- and 256-route blocks, one's epilogue under the other's
# wgmmas. Correctness first (the ping-pong programs against the cooperative ones, bit for bit, and the layer against
# the default layer), then the A/B against the default (slice) at 1024-8192 tokens, the peer in the same call, then
# FC1/FC2 apart and the tensor pipe's activity at gpt-oss and DS4.1 8192. Carry (64 MiB): aot_cache/carry.tgz from
# `python -m csf_kernels.aot.build` at this commit packed as in next-run319.sh, keeping every
# moe.engine_gemm:SCHED=pingpong program (TN=128 and 256, both formats, both sources), .peers/triton_kernels,
# .peers/SOURCE, .ab/COMMIT.
set -uo pipefail
source validation/calls/preamble.sh pingpong
timeout 150 $P tests/moe/test_engine_gemm_gpu.py -k "pingpong" > $R/t_pingpong.log 2>&1
log "ping-pong GEMMs rc=$?: $(tail -1 $R/t_pingpong.log)"
timeout 150 $P tests/moe/test_engine_layer_gpu.py -k "pingpong" > $R/t_pingpong_layer.log 2>&1
log "ping-pong layer rc=$?: $(tail -1 $R/t_pingpong_layer.log)"
timeout 150 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_pingpong --tokens 1024,2048,4096,8192 --reps 6 \
  --peer-path $PWD/.peers --out $R/moe_pingpong.json > $R/moe_pingpong.log 2>&1
log "bench 1024-8192 rc=$?"
for m in "gpt-oss-120b --tp 1" "deepseek-v4.1-flash --tp 4" "qwen3-30b-a3b --tp 1"; do
  CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model $m --tokens 2048,8192 \
    --arms engine,engine_pingpong,triton_kernels --peer-path $PWD/.peers --out $R/kt_pp_${m%% *}.json \
    > $R/kt_pp_${m%% *}.log 2>&1
  log "kernel times $m rc=$?"
done
MET="sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
for m in "gpt-oss-120b --tp 1" "deepseek-v4.1-flash --tp 4"; do
  timeout 60 ncu --clock-control none -k regex:GroupedFp4Gemm -c 2 --metrics $MET python3 benchmarks/profile_kernels.py \
    engine --arm engine_pingpong --model $m --tokens 8192 2>&1 | grep -v "^==PROF==" | tail -30 \
    > $R/ncu_pp_${m%% *}_8192.txt
  log "ncu $m rc=$?"
done
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
