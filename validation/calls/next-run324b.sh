#!/usr/bin/env bash
# Run 324, second call (same tree as next-run324.sh; its carry drops what that one drops but keeps the transform
# programs, SCHED=transform, 42 of them: native and inline). Prepared 2026-12-07, not run. What decides the next
# structures:
# (1) the transform warps (docs/moe-engine.md §4.4, §7: producer warps 1-3 convert, the consumers run SS wgmma):
#     their GPU tests (the slice schedule's bits, the layer's, native and inline), then engine_transform and
#     engine_inline_transform beside engine, engine_inline and the peer at 2048 and 8192 tokens (to read beside
#     next-run324.sh's bound probes);
# (2) the W4A16 FC1's warp stalls at gpt-oss 8192 (tensor pipe, issue slots, eligible warps). ~470 s.
set -uo pipefail
source validation/calls/preamble.sh run324b
timeout 240 $P tests/moe/test_engine_transform_gpu.py -k "not nvfp4" > $R/t_transform.log 2>&1
log "transform tests rc=$?: $(tail -1 $R/t_transform.log)"
timeout 150 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_transform,engine_inline,engine_inline_transform --tokens 2048,8192 \
  --reps 4 --peer-path $PWD/.peers --out $R/moe_transform.json > $R/moe_transform.log 2>&1
log "bench transform rc=$?"
timeout 60 ncu --clock-control none -k regex:GroupedFp4Gemm -c 1 --metrics $NCU_MET --section WarpStateStats \
  python3 benchmarks/profile_kernels.py engine --arm engine --model gpt-oss-120b --tp 1 --tokens 8192 2>&1 \
  | grep -v "^==PROF==" | tail -60 > $R/ncu_engine_gptoss_8192.txt
log "ncu engine rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
