#!/usr/bin/env bash
# Run 324z: what next-run324x.sh and next-run324y.sh leave out, for a session with device time left after them; same
# tree and carry as 324x. The counters that choose the next structures: the W4A16 FC1's and W4A8 FC1's warp stalls at
# gpt-oss 8192 (tensor pipe, issue slots, eligible warps: docs/moe-engine.md §4.7, §7), then where a one-token call's
# time goes (issue 46 asks <= 0.50 of the peer at one token; plain launches, CSF_PDL=0): csf's Triton layer, the split
# engine, the unsplit engine and the peer at 1 and 8 tokens. ~330 s.
set -uo pipefail
source validation/calls/preamble.sh run324z
timeout 60 ncu --clock-control none -k regex:GroupedFp4Gemm -c 1 --metrics $NCU_MET --section WarpStateStats \
  python3 benchmarks/profile_kernels.py engine --arm engine --model gpt-oss-120b --tp 1 --tokens 8192 2>&1 \
  | grep -v "^==PROF==" | tail -60 > $R/ncu_engine_gptoss_8192.txt
log "ncu engine rc=$?"
timeout 60 ncu --clock-control none -k regex:GroupedW4A8Gemm -c 1 --metrics $NCU_MET --section WarpStateStats \
  python3 benchmarks/profile_kernels.py engine --arm engine_w4a8 --model gpt-oss-120b --tp 1 --tokens 8192 2>&1 \
  | grep -v "^==PROF==" | tail -60 > $R/ncu_w4a8_gptoss_8192.txt
log "ncu W4A8 rc=$?"
for m in "gpt-oss-120b --tp 1" "deepseek-v4.1-flash --tp 4" "qwen3-30b-a3b --tp 1"; do
  CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model $m --tokens 1,8 \
    --arms native,engine,engine_unsplit,triton_kernels --peer-path $PWD/.peers \
    --out $R/kernel_times_${m%% *}.json > $R/kt_${m%% *}.log 2>&1
  log "kernel times $m rc=$?"
done
