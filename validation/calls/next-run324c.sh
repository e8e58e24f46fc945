#!/usr/bin/env bash
# Run 324, third call (same tree; a carry that keeps moe.w4a8_gemm, the W4A8 gathers and row quantizers and drops
# the inline engine programs). Prepared 2026-12-07, not run. W4A8 (issue 47): FC1's quantizing gather now goes by
# token through the alignment's route slots and FC2's input has a row quantizer of its own (docs/moe-engine.md §8.2):
# their GPU tests (bytes and scales equal the torch references on every routed slot, unrouted slots untouched, the
# layer's bits independent of what padding slots hold), then the W4A8 arm beside the peer and the W4A16 engine, and
# ncu of W4A8's FC1 at gpt-oss 8192 (37% of the FP8 peak in run 316: the promotion drains both consumer
# warpgroups each 128-K stage). Then where a one-token call's time goes (issue 46 asks <= 0.50 of the peer at one
# token; plain launches, CSF_PDL=0): csf's Triton layer, the split engine, the unsplit engine and the peer at 1 and 8
# tokens. ~450 s.
set -uo pipefail
source validation/calls/preamble.sh run324c
timeout 100 $P tests/moe/test_w4a8_gather_gpu.py tests/moe/test_w4a8_engine_gpu.py > $R/t_w4a8.log 2>&1
log "W4A8 tests rc=$?: $(tail -1 $R/t_w4a8.log)"
timeout 120 python3 benchmarks/bench_moe.py --geometries peers --arms triton_kernels,engine,engine_w4a8 \
  --tokens 8,512,2048,8192 --reps 4 --peer-path $PWD/.peers --out $R/moe_w4a8.json > $R/moe_w4a8.log 2>&1
log "bench W4A8 rc=$?"
timeout 60 ncu --clock-control none -k regex:GroupedW4A8Gemm -c 1 --metrics $NCU_MET --section WarpStateStats \
  python3 benchmarks/profile_kernels.py engine --arm engine_w4a8 --model gpt-oss-120b --tp 1 --tokens 8192 2>&1 \
  | grep -v "^==PROF==" | tail -60 > $R/ncu_w4a8_gptoss_8192.txt
log "ncu W4A8 rc=$?"
for m in "gpt-oss-120b --tp 1" "deepseek-v4.1-flash --tp 4" "qwen3-30b-a3b --tp 1"; do
  CSF_PDL=0 timeout 50 python3 benchmarks/kernel_times.py --model $m --tokens 1,8 \
    --arms native,engine,engine_unsplit,triton_kernels --peer-path $PWD/.peers \
    --out $R/kernel_times_${m%% *}.json > $R/kt_${m%% *}.log 2>&1
  log "kernel times $m rc=$?"
done
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
