#!/usr/bin/env bash
# One-stage persistent GEMM grid (issue 6 lead: a persistent GEMM streaming its A operand from
# DRAM through one column tile runs slower than the model says): M x N x K at 132 and 66 SMs,
# timed (bench/gemm_probe.py, 15 cold runs) and then under ncu for DRAM bytes and L2 hit rate.
#   here:    python bench/gemm_probe.py --precompile $(cat bench/gemm_grid_cases.txt)
#   device:  bash bench/gemm_grid_probe.sh            (carry bench/.cubin_cache; writes to $OUT)
#   here:    python bench/gemm_grid_report.py results/validation/h100/gemm_probe/grid_2026-11-23
set -x
export KDSE_CUBIN_CACHE=$PWD/bench/.cubin_cache
C=$(cat bench/gemm_grid_cases.txt)
python3 bench/gemm_probe.py --out $OUT/time --runs 15 $C > $OUT/time_stdout.txt 2>&1
tail -40 $OUT/time_stdout.txt
# ncu: the last launch of each case is its timed run after the L2 flush (check, 2 warm-ups, 1 run)
which ncu && timeout 300 ncu --cache-control none --clock-control none \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct --csv -k regex:kdse \
  python3 bench/gemm_probe.py --out $OUT/ncu --runs 1 $C > $OUT/ncu.csv 2> $OUT/ncu_err.txt
tail -3 $OUT/ncu_err.txt; wc -l $OUT/ncu.csv
