#!/bin/bash
# Device: where the time of a GEMM -> row-op -> GEMM tilesync chain goes (ln-residual-gemm's
# region gemm1+residual1 -> ln2 -> gemm2+residual2), whole and in slices, at several sizes, with
# CTA traces. Diagnostics for the tilesync model (issue 6), never fitted on the suite's runs.
#   bash bench/tilesync_chain_run.sh OUT_DIR [SIZES...]    (SIZES: tokens=T,hidden=H)
set -u
out=${1:?out dir}; shift
sizes=("$@")
[ ${#sizes[@]} -eq 0 ] && sizes=("tokens=4096,hidden=4096")
plan=bench/suite/ln-residual-gemm/plans/explorer-2.json
mkdir -p "$out"
for sz in "${sizes[@]}"; do
  for k in 0:3 0:2 1:3; do
    tag=$(echo "$sz-$k" | tr '=,:' '__-')
    python3 bench/tilesync_probe.py $plan 1 --kernels $k --sizes "$sz" --runs 20 \
      --trace "$out/trace_$tag.npz" 2>&1 | tee "$out/probe_$tag.txt"
  done
done
