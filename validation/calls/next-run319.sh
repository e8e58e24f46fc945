#!/usr/bin/env bash
# Run 319. First GPU run of three changes to the served programs: the producer publishes each unit's facts (live
# extent, one-multiply flags, NVFP4's global scale) in its first stage's slot (wip/unit-facts), FC2's scattering
# epilogue with one barrier a subtile (wip/scatter-one-barrier), and ragged level 2 (a tail block whose live routes
# lie in its first quarter runs m64n{N/4}; RAG=2, arm engine_quarter_ragged) beside level 1 (the default) and the
# peer; the ragged GPU test holds levels 0, 1 and 2 to one another's bits with tails in all three loops. The first
# two are judged against run 318 by engine / peer (the peer in each call) and kernel_times.
# Every output in one tarball (the tool returns at most 8 files). Carry (64 MiB): aot_cache/carry.tgz from
#   python scripts/pack_aot_cache.py --root aot_cache --drop mla.merge --drop mla.sparse_decode_mma \
#     --drop mla.sparse_decode_wgmma --drop mla.sparse_decode_wide --drop stage.inline_decoder \
#     --drop expand.row_blocks --drop expand.inline_rows --drop expand.compact_segments --drop expand.inline_tiles \
#     --drop moe.w4a8_gemm --drop moe.engine_gemm:FMT=nvfp4,TN=64 --drop moe.engine_gemm:FMT=nvfp4,RAG=2
# (the NVFP4 tests of those programs are deselected), .peers/triton_kernels, .peers/SOURCE, .ab/COMMIT. The
# preamble (validation/calls/preamble.sh) is tracked, so it travels with the tree.
set -uo pipefail
source validation/calls/preamble.sh run319
timeout 120 $P tests/moe/test_engine_gemm_gpu.py tests/moe/test_engine_layer_gpu.py \
  -k "not (nvfp4 and 64) and not (ragged and nvfp4)" > $R/t_engine.log 2>&1
log "engine rc=$?: $(tail -1 $R/t_engine.log)"
timeout 80 $P tests/moe/test_engine_inline_gpu.py tests/moe/test_engine_inline_probe_gpu.py -k "not (nvfp4 and 64)" \
  > $R/t_inline.log 2>&1
log "inline rc=$?: $(tail -1 $R/t_inline.log)"
timeout 90 $P tests/moe/test_engine_served_gpu.py -k "not triton" > $R/t_served.log 2>&1
log "served rc=$?: $(tail -1 $R/t_served.log)"
timeout 150 python3 benchmarks/bench_moe.py --geometries peers \
  --arms triton_kernels,engine,engine_quarter_ragged,engine_inline --tokens 1024,2048,4096,8192 --reps 6 \
  --peer-path $PWD/.peers --out $R/moe_large.json > $R/moe_large.log 2>&1
log "bench 1024-8192 rc=$?"
timeout 100 python3 benchmarks/bench_moe.py --geometries peers --arms triton_kernels,engine,engine_inline \
  --tokens 1,8,32,128,512 --reps 6 --peer-path $PWD/.peers --out $R/moe_small.json > $R/moe_small.log 2>&1
log "bench 1-512 rc=$?"
CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model gpt-oss-120b --tp 1 --tokens 8192 \
  --arms engine,engine_quarter_ragged,triton_kernels --peer-path $PWD/.peers --out $R/kernel_times.json \
  > $R/kernel_times.log 2>&1
log "kernel times rc=$?"
# short-K GEMMs: DS4.1-TP4's FC2 has 9 K steps a unit, Qwen3's 12 (gpt-oss: 45); is the per-unit start and epilogue
# what keeps them level with the peer at 8192 (docs/moe-engine.md §7)?
for m in "deepseek-v4.1-flash --tp 4" "qwen3-30b-a3b --tp 1"; do
  CSF_PDL=0 timeout 60 python3 benchmarks/kernel_times.py --model $m --tokens 2048,8192 \
    --arms engine,triton_kernels --peer-path $PWD/.peers --out $R/kernel_times_${m%% *}.json > $R/kt_${m%% *}.log 2>&1
  log "kernel times $m rc=$?"
done
MET="sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
timeout 60 ncu --clock-control none -k regex:GroupedFp4Gemm -c 2 --metrics $MET python3 benchmarks/profile_kernels.py \
  engine --arm engine --model deepseek-v4.1-flash --tp 4 --tokens 8192 2>&1 | grep -v "^==PROF==" | tail -30 \
  > $R/ncu_ds41_8192.txt
log "ncu DS4.1 rc=$?"
timeout 60 ncu --clock-control none -k regex:GroupedFp4Gemm -c 2 --metrics $MET python3 benchmarks/profile_kernels.py \
  engine --arm engine --model gpt-oss-120b --tp 1 --tokens 8192 2>&1 | grep -v "^==PROF==" | tail -30 \
  > $R/ncu_gptoss_8192.txt
log "ncu gpt-oss rc=$?"
grep -h "^FAILED\|^E  " $R/t_*.log | head -30
