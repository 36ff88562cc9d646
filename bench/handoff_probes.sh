#!/bin/bash
# Run bench/handoff_probes.txt's items through bench/tilesync_probe.py (timings of the graph,
# tilesync, tilesync without PDL and eager variants, plus CTA traces with and without PDL).
#   here:    bash bench/handoff_probes.sh --precompile      (nvcc: every module into bench/.cubin_cache)
#   device:  bash bench/handoff_probes.sh OUT_DIR [FILTER]  (carry bench/.cubin_cache; FILTER: grep -E on items)
set -u
cd "$(dirname "$0")/.."
mode=${1:?OUT_DIR or --precompile}; filter=${2:-.}
if [ "$mode" != "--precompile" ]; then
  export KDSE_CUBIN_CACHE=${KDSE_CUBIN_CACHE:-$PWD/bench/.cubin_cache}
  mkdir -p "$mode"
fi
grep -v '^#' bench/handoff_probes.txt | grep -E "$filter" | while read -r plan region kernels sizes; do
  [ -z "$plan" ] && continue
  if [ "$mode" = "--precompile" ]; then
    python bench/tilesync_probe.py "$plan" "$region" --kernels "$kernels" --sizes "$sizes" \
      --precompile bench/.cubin_cache
  else
    tag=$(echo "$(basename "$plan" .json)-r$region-$kernels-$sizes" | tr '=,:' '__-')
    python3 bench/tilesync_probe.py "$plan" "$region" --kernels "$kernels" --sizes "$sizes" --runs 20 \
      --trace "$mode/trace_$tag.npz" > "$mode/probe_$tag.txt" 2>&1
    tail -n 25 "$mode/probe_$tag.txt"
  fi
done
