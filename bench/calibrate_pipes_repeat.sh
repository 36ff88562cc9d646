#!/usr/bin/env bash
# Ten runs of the calibration phases that time the harness's persistent kernels (pipes,
# epilogues, boundaries: ~4 s each), then the 4096^3 SM sweep, into $OUT/cal.tgz: the raws
# calibration_session25{a..j} after harness version 8 (calibrate.fit.merge_raw drops what that
# version changed from older runs and keeps the rest).
#   here:    python bench/calibrate_device.py --precompile
#            python bench/gemm_probe.py --precompile $(cat bench/sm_sweep_cases.txt)
#   device:  bash bench/calibrate_pipes_repeat.sh        (carry bench/.cubin_cache)
#   here:    tar xzf cal.tgz; each calN/calibration.raw.json -> results/validation/h100/suite/
export KDSE_CUBIN_CACHE=$PWD/bench/.cubin_cache
W=/tmp/calw; mkdir -p $W
for i in 1 2 3 4 5 6 7 8 9 10; do
  KDSE_CAL_PHASES=pipes,epilogues,boundaries timeout 200 python3 bench/calibrate_device.py --out $W/cal$i --runs 10 > $W/cal$i.log 2>&1
  tail -2 $W/cal$i.log | head -1
done
python3 bench/gemm_probe.py --out $W/sweep --runs 15 $(cat bench/sm_sweep_cases.txt) > $W/sweep_stdout.txt 2>&1
tail -22 $W/sweep_stdout.txt
tar czf $OUT/cal.tgz -C $W .
