#!/usr/bin/env bash
# Run 324x: the first of run 324's calls (three prepared calls regrouped into two on one carry after refused starts
# took a third of a session's device time, 2026-12-08; the rest in next-run324z.sh). This first call checks what main
# serves, then bounds the conversion: the Triton layer's GPU tests (every align program changed: route slots, fact
# INV), the engine layers' (MXFP4), W4A8's gather, row quantizer and layer (FC1's input by token), then the bound
# probes at 512-8192 tokens. ~520 s.
# Carry (one for both calls): aot_cache/carry.tgz packed with --drop for mla.merge, mla.sparse_decode_mma,
# mla.sparse_decode_wgmma, mla.sparse_decode_wide, stage.inline_decoder, "moe.engine_gemm:FMT=nvfp4",
# "moe.engine_gemm:RAG=2" (~51 MiB); .peers/triton_kernels, .peers/SOURCE, .ab/COMMIT, the codec's cp312 extension.
set -uo pipefail
source validation/calls/preamble.sh run324x
timeout 110 $P tests/moe/test_moe_gpu.py > $R/t_triton_layer.log 2>&1
log "Triton layer rc=$?: $(tail -1 $R/t_triton_layer.log)"
timeout 110 $P tests/moe/test_engine_layer_gpu.py tests/moe/test_engine_split_layer_gpu.py \
  -k "not nvfp4" > $R/t_engine_layer.log 2>&1
log "engine layers rc=$?: $(tail -1 $R/t_engine_layer.log)"
timeout 90 $P tests/moe/test_w4a8_gather_gpu.py tests/moe/test_w4a8_engine_gpu.py > $R/t_w4a8.log 2>&1
log "W4A8 tests rc=$?: $(tail -1 $R/t_w4a8.log)"
timeout 190 python3 benchmarks/bench_engine.py --skip-dense --probes --tokens 512,2048,8192 --reps 10 \
  --out $R/engine_probes.json > $R/engine_probes.log 2>&1
log "probes rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
