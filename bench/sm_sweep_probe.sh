#!/usr/bin/env bash
# The persistent GEMM's time per tile against the SMs it runs on (issue 6 lead: 4096^3 ran 10%
# slower per tile on 8-16 SMs than on 33-66). First which GPC each SM is in and which SMs a
# grid of N CTAs gets (bench/gpc_probe.py), then a one-stage GEMM sweep timed with the CTAs'
# SMs recorded (bench/gemm_probe.py), then the same under ncu for DRAM bytes and L2 hit rate.
#   here:    python bench/gemm_probe.py --precompile $(cat bench/sm_sweep_cases.txt)
#   device:  bash bench/sm_sweep_probe.sh       (carry bench/.cubin_cache; writes to $OUT)
set -x
export KDSE_CUBIN_CACHE=$PWD/bench/.cubin_cache
python3 bench/gpc_probe.py --out $OUT/gpc > $OUT/gpc_stdout.txt 2>&1
tail -30 $OUT/gpc_stdout.txt
C=$(cat bench/sm_sweep_cases.txt)
python3 bench/gemm_probe.py --out $OUT/time --runs 15 $C > $OUT/time_stdout.txt 2>&1
tail -30 $OUT/time_stdout.txt
which ncu && timeout 240 ncu --cache-control none --clock-control none \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum --csv -k regex:kdse \
  python3 bench/gemm_probe.py --out $OUT/ncu --runs 1 $C > $OUT/ncu.csv 2> $OUT/ncu_err.txt
tail -3 $OUT/ncu_err.txt; wc -l $OUT/ncu.csv
