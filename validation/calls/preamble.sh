# Sourced by a device call (validation/calls/next-run*.sh) in the repository root on the GPU machine: unpack the
# carried AOT cache, set the import path and commit, collect every output under $R (tarred into $OUT/$1.tgz on
# exit: the device tool returns at most 8 files), record the GPU, and define `log` (a line with the seconds since
# the start) and `P` (pytest over the GPU tests).
mkdir -p aot_cache && tar xzf aot_cache/carry.tgz -C aot_cache
export PYTHONPATH=$(printf '%s:' $PWD/packages/*/src)$PWD/benchmarks PYTHONUNBUFFERED=1 CSF_COMMIT=$(cat .ab/COMMIT)
R=$OUT/r && mkdir -p $R
# the codec's C extension, built here for the device's Python (scripts/build_codec_native.sh) and carried: no compiler there
python3 -c "import csf_codec._native" 2>> $R/tests.log || echo "csf_codec._native missing: CSF encode/decode will fail" | tee -a $R/tests.log
trap "cd $OUT && tar czf $1.tgz r && rm -rf r" EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv > $R/gpu.txt 2>&1
t0=$(date +%s)
log() { echo "$1 at $(( $(date +%s) - t0 )) s" | tee -a $R/tests.log; }
P="python3 -m pytest -q -p no:cacheprovider -m gpu -rf"
# ncu's counters of a GEMM's what-bounds-it questions (tensor pipe, time, issue slots, eligible warps)
NCU_MET="sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum"
NCU_MET="$NCU_MET,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_eligible.avg.per_cycle_active"
