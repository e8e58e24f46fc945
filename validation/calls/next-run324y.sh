#!/usr/bin/env bash
# Run 324y: the second of run 324's two calls (next-run324x.sh's tree and carry): what decides the next structures.
# The transform warps (producer warps 1-3 convert, the consumers run SS wgmma; docs/moe-engine.md §4.4) beside the
# default engine and the peer at 2048 and 8192 tokens, native and inline (bench_moe checks every arm against the
# reference and against each other); where the token-order gather pass pays (engine, engine_pass, engine_producer,
# inline too, 8-1024 tokens: PASS_FROM_TILE_N); W4A8 beside the peer and the W4A16 engine; then as many of the
# transform warps' bit-for-bit GPU tests as the call's time leaves (MXFP4). ~550 s.
set -uo pipefail
source validation/calls/preamble.sh run324y
timeout 150 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_transform,engine_inline,engine_inline_transform --tokens 2048,8192 \
  --reps 4 --peer-path $PWD/.peers --out $R/moe_transform.json > $R/moe_transform.log 2>&1
log "bench transform rc=$?"
timeout 160 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_pass,engine_producer,engine_inline,engine_inline_pass \
  --tokens 8,32,128,512,1024 --reps 4 --peer-path $PWD/.peers --out $R/moe_pass.json > $R/moe_pass.log 2>&1
log "bench 8-1024 rc=$?"
timeout 100 python3 benchmarks/bench_moe.py --geometries peers --arms triton_kernels,engine,engine_w4a8 \
  --tokens 512,2048,8192 --reps 4 --peer-path $PWD/.peers --out $R/moe_w4a8.json > $R/moe_w4a8.log 2>&1
log "bench W4A8 rc=$?"
timeout 110 $P tests/moe/test_engine_transform_gpu.py -k "not nvfp4" > $R/t_transform.log 2>&1
log "transform tests rc=$?: $(tail -1 $R/t_transform.log)"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
