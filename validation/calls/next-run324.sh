#!/usr/bin/env bash
# Run 324 (main: the token-order gather pass alone, the slot-order pass removed; the codec's C step two). Prepared
# 2026-12-07, not run: refused starts spent that session's device time. Build the codec's cp312 extension first
# (scripts/build_codec_native.sh: its sources changed).
# Every align program changed (route slots, fact INV), so the Triton layer's GPU tests run beside the engine's: the
# Triton layer's sources bit for bit and against the reference, padding routes and graph replay; the engine layer
# against the reference, FC1's rows from the pass against the producer gather, the split layer at 1-8 tokens. Then
# where the pass pays: engine (the pass from 64 routes a block with native scales, 32 with inline), engine_pass (the
# pass at every size) and engine_producer beside the peer at 8-1024 tokens, inline arms too. Last, the grouped GEMMs'
# bound probes at 128-8192 tokens (docs/moe-engine.md §7: the loop without the conversion, and with A from shared
# memory, beside the same GEMMs whole-block): whether a transform warpgroup can pay. ~530 s.
# Carry (64 MiB): aot_cache/carry.tgz without MLA, stage-decoder, W4A8, RAG=2, SCHED=transform or NVFP4 engine
# programs (--drop "moe.engine_gemm:SCHED=transform" beside the others; the Triton layer's NVFP4 programs, the
# expanders and the bound probes travel);
# .peers/triton_kernels, .peers/SOURCE, .ab/COMMIT and the codec's cp312 extension.
set -uo pipefail
source validation/calls/preamble.sh run324
timeout 120 $P tests/moe/test_moe_gpu.py > $R/t_triton_layer.log 2>&1
log "Triton layer rc=$?: $(tail -1 $R/t_triton_layer.log)"
timeout 120 $P tests/moe/test_engine_layer_gpu.py tests/moe/test_engine_split_layer_gpu.py \
  -k "not nvfp4" > $R/t_engine_layer.log 2>&1
log "engine layers rc=$?: $(tail -1 $R/t_engine_layer.log)"
timeout 170 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_pass,engine_producer,engine_inline,engine_inline_pass \
  --tokens 8,32,128,512,1024 --reps 4 --peer-path $PWD/.peers --out $R/moe_pass.json > $R/moe_pass.log 2>&1
log "bench 8-1024 rc=$?"
timeout 200 python3 benchmarks/bench_engine.py --skip-dense --probes --tokens 128,512,2048,8192 --reps 10 \
  --out $R/engine_probes.json > $R/engine_probes.log 2>&1
log "probes rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
