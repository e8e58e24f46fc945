#!/usr/bin/env bash
# Kept as the record of its call: the ping-pong schedule, its tests and the engine_pingpong arm it names were
# removed after run 323 (docs/moe-engine.md §4.13); run it from its own commit.
# Run 323, first call (wip/gather-scatter: main b327f65, the layer serving ping-pong again, the token-order gather
# pass). The ping-pong fix's first GPU run (the two consumer warpgroups' K loops ordered by named barriers 5/6,
# docs/moe-engine.md §4.13): the ping-pong GEMM tests (bit for bit against the cooperative programs, run 322's
# faulting gpt-oss-K shape among them) and the layer-level ping-pong bits test (every token count, 8192 served by
# ping-pong). The token-order gather pass (§4.11): the layer test of FC1's three row sources, the default layer against
# the reference (its multi-token outputs compared again since the launch-count fix). Then the engine's default,
# ping-pong, the slot-order pass and FC1's producer gather beside the peer at 1024-8192 tokens. ~540 s.
# Carry (64 MiB): aot_cache/carry.tgz (no MLA, no expanders, no W4A8, no level-2 ragged, no NVFP4 engine GEMMs:
# MXFP4 only; gathering ping-pong programs kept), .peers/triton_kernels, .peers/SOURCE, .ab/COMMIT and the codec's
# cp312 extension. Second call: next-run323-times.sh.
set -uo pipefail
source validation/calls/preamble.sh run323
timeout 100 $P tests/moe/test_engine_gemm_gpu.py -k "pingpong and not nvfp4" > $R/t_pp_gemm.log 2>&1
log "ping-pong GEMM rc=$?: $(tail -1 $R/t_pp_gemm.log)"
timeout 100 $P tests/moe/test_engine_layer_gpu.py -k "pingpong and not nvfp4" > $R/t_pp_layer.log 2>&1
log "ping-pong layer rc=$?: $(tail -1 $R/t_pp_layer.log)"
timeout 130 $P tests/moe/test_engine_layer_gpu.py -k "(gather_pass or matches_the_reference) and not nvfp4" \
  > $R/t_layer.log 2>&1
log "layer rc=$?: $(tail -1 $R/t_layer.log)"
timeout 150 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_pingpong,engine_pass_by_slot,engine_producer --tokens 1024,2048,8192 \
  --reps 6 --peer-path $PWD/.peers --out $R/moe_large.json > $R/moe_large.log 2>&1
log "bench 1024-8192 rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
