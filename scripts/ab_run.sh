#!/usr/bin/env bash
# On the GPU machine: run one command in each A/B tree (scripts/ab_pack.sh), in the order given, on one machine, so
# that the arms alternate and share its state (compare arms side by side, never across calls). Carry the trees'
# archives (.ab/<label>.tgz) and this tree; the command runs in the tree's root with CSF_AOT_CACHE, CSF_COMMIT and
# PYTHONPATH set for that tree, AB_OUT=$OUT/<label><n>.json (n counts that tree's runs) for its JSON, and AB_ROOT
# this tree's root, where other carried paths lie (bench_moe --peer-path $AB_ROOT/.peers). The device tool returns
# at most 8 files from $OUT: keep ORDER within that.
#
#   ORDER="base new new base" bash scripts/ab_run.sh \
#       'python3 benchmarks/bench_moe.py --geometries all --tokens 2,4 --arms native,inline --out $AB_OUT | grep T='
set -uo pipefail
cd "$(dirname "$0")/.."
order=${ORDER:?set ORDER to the tree labels in run order, e.g. ORDER="base new new base"}
command=${1:?usage: ORDER="labels" ab_run.sh "command (may use \$AB_OUT)"}
trees=${AB_TREES:-/tmp/ab-trees}
out=${OUT:-$PWD/out}
root=$PWD
mkdir -p "$out"
declare -A runs
rc=0
for label in $order; do
    tree=$trees/$label
    if [ ! -d "$tree" ]; then
        mkdir -p "$tree" && tar xzf ".ab/$label.tgz" -C "$tree" || {
            rm -rf "$tree"
            echo "ab_run: no tree .ab/$label.tgz" >&2
            exit 2
        }
    fi
    n=$(( ${runs[$label]:-0} + 1 ))
    # a JSON an earlier ab_run of the same call wrote keeps its name: count past it
    while [ -e "$out/$label$n.json" ]; do n=$((n + 1)); done
    runs[$label]=$n
    (
        cd "$tree" || exit 2
        export CSF_AOT_CACHE=$tree/aot_cache CSF_COMMIT=$(cat AB_COMMIT) AB_OUT=$out/$label$n.json AB_ROOT=$root
        PYTHONPATH=$(printf '%s:' "$tree"/packages/*/src)
        export PYTHONPATH
        eval "$command"
    ) 2>&1 | sed "s/^/[$label$n] /"
    status=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] || rc=$status
done
exit "$rc"
