#!/usr/bin/env bash
# Kept as the record of its call: the ping-pong schedule, its tests and the engine_pingpong arm it names were
# removed after run 323 (docs/moe-engine.md §4.13); run it from its own commit.
# Run 323, second call (same tree and carry as next-run323.sh): per-kernel times at 8192 tokens (plain launches,
# CSF_PDL=0) of the default engine (token-order pass), the slot-order pass, ping-pong and the peer, on the three
# peer geometries: what the glue (alignment, pass, combine) and each GEMM cost. ~200 s.
set -uo pipefail
source validation/calls/preamble.sh run323t
timeout 60 $P tests/moe/test_engine_layer_gpu.py -k "matches_the_reference and not nvfp4" > $R/t_ref.log 2>&1
log "layer reference rc=$?: $(tail -1 $R/t_ref.log)"
for m in "deepseek-v4.1-flash --tp 4" "qwen3-30b-a3b --tp 1" "gpt-oss-120b --tp 1"; do
  CSF_PDL=0 timeout 65 python3 benchmarks/kernel_times.py --model $m --tokens 8192 \
    --arms engine,engine_pass_by_slot,engine_pingpong,triton_kernels --peer-path $PWD/.peers \
    --out $R/kernel_times_${m%% *}.json > $R/kt_${m%% *}.log 2>&1
  log "kernel times $m rc=$?"
done
