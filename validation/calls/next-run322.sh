#!/usr/bin/env bash
# Kept as the record of its call: the ping-pong schedule, its tests and the engine_pingpong arm it names were
# removed after run 323 (docs/moe-engine.md §4.13); run it from its own commit.
# Run 322 (wip/merge321: K splits merged into ping-pong, the slots-only gather pass and the align count programs;
# never a split ping-pong program). First GPU run of both features on one tree: the split GEMMs' partials against one
# split a K range, the ping-pong programs against the cooperative ones (bit for bit), the split layer against the
# reference at 1-8 tokens and the default layer's tests with the new gather pass and counts (every engine GEMM is
# version 7); then the split layer against the unsplit one at 1-8 tokens and ping-pong against the default at 2048
# and 8192 tokens, the peer in the same calls. Timeouts sum to about 480 s (next-run320.sh's
# ncu and 1-512 bench, DS4.1's kernel times and next-splitk.sh's served tests are left for a later call).
# Carry (64 MiB): aot_cache/carry.tgz packed as next-run320.sh's (no RAG=2 programs, no NVFP4 or gathering ping-pong
# programs) but keeping every PART program (TN=16 and 32, both formats and sources), the fc1 finishes and partial
# combines; .peers/triton_kernels, .peers/SOURCE, .ab/COMMIT.
set -uo pipefail
source validation/calls/preamble.sh run322
timeout 80 $P tests/moe/test_engine_split_gpu.py > $R/t_split.log 2>&1
log "split GEMM rc=$?: $(tail -1 $R/t_split.log)"
timeout 90 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_layer_gpu.py -k "pingpong and not nvfp4" \
  > $R/t_pingpong.log 2>&1
log "ping-pong rc=$?: $(tail -1 $R/t_pingpong.log)"
timeout 90 $P tests/moe/test_engine_split_layer_gpu.py tests/moe/test_engine_layer_gpu.py \
  -k "not pingpong and not (nvfp4 and 64) and not ragged and not (replays and nvfp4)" > $R/t_layer.log 2>&1
log "layers rc=$?: $(tail -1 $R/t_layer.log)"
timeout 70 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_inline_probe_gpu.py \
  -k "not pingpong and not (nvfp4 and 64) and not ragged and not triton" > $R/t_engine.log 2>&1
log "engine rc=$?: $(tail -1 $R/t_engine.log)"
timeout 70 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_unsplit,engine_inline,engine_inline_unsplit --tokens 1,2,4,8 --reps 8 \
  --peer-path $PWD/.peers --out $R/moe_split.json > $R/moe_split.log 2>&1
log "bench 1-8 rc=$?"
timeout 80 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_pingpong --tokens 2048,8192 --reps 6 \
  --peer-path $PWD/.peers --out $R/moe_large.json > $R/moe_large.log 2>&1
log "bench 2048-8192 rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
