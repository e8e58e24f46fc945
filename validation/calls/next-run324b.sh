#!/usr/bin/env bash
# Run 324, second call (same tree as next-run324.sh; its carry keeps moe.w4a8_gemm and may drop the inline engine
# programs instead to stay under 64 MiB). Prepared 2026-12-07, not run. What decides the next structures:
# (1) where a one-token call's time goes (issue 46 asks <= 0.50 of the peer at one token; plain launches, CSF_PDL=0):
#     csf's Triton layer, the split engine, the unsplit engine and the peer at 1 and 8 tokens;
# (2) why W4A8's FC1 runs at 37% of the FP8 peak at gpt-oss 8192 (issue 47; docs/moe-engine.md §4.7: the promotion
#     drains both consumer warpgroups each 128-K stage): its tensor pipe, issue slots and warp stall reasons;
# (3) the same counters for the W4A16 FC1 beside it (what the bound probes of next-run324.sh measure by time).
# ~300 s.
set -uo pipefail
source validation/calls/preamble.sh run324b
for m in "gpt-oss-120b --tp 1" "deepseek-v4.1-flash --tp 4" "qwen3-30b-a3b --tp 1"; do
  CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model $m --tokens 1,8 \
    --arms native,engine,engine_unsplit,triton_kernels --peer-path $PWD/.peers \
    --out $R/kernel_times_${m%% *}.json > $R/kt_${m%% *}.log 2>&1
  log "kernel times $m rc=$?"
done
MET="sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum"
MET="$MET,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_eligible.avg.per_cycle_active"
for arm in engine_w4a8 engine; do
  k=$([ $arm = engine_w4a8 ] && echo GroupedW4A8Gemm || echo GroupedFp4Gemm)
  timeout 90 ncu --clock-control none -k regex:$k -c 1 --metrics $MET --section WarpStateStats \
    python3 benchmarks/profile_kernels.py engine --arm $arm --model gpt-oss-120b --tp 1 --tokens 8192 2>&1 \
    | grep -v "^==PROF==" | tail -60 > $R/ncu_${arm}_gptoss_8192.txt
  log "ncu $arm rc=$?"
done
