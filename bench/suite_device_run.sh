#!/usr/bin/env bash
# The validation suite on the device in one call (the README's "Exact commands"): the main run
# (30 cold runs a plan), three more --run repeats, five ncu passes and the GPU tests, into $OUT
# (carry bench/.cubin_cache; here first: python bench/validate_suite.py --prepare --precompile).
# a cache carried as one archive (bench/.cubin_cache.tgz: the tree and the cache past the
# 64 MiB carry limit) is unpacked first
[ -f bench/.cubin_cache.tgz ] && tar xzf bench/.cubin_cache.tgz -C bench
export KDSE_CUBIN_CACHE=$PWD/bench/.cubin_cache
mkdir -p /tmp/reps /tmp/ncu
python3 bench/validate_suite.py --run --runs 30 --out $OUT > $OUT/run_stdout.txt 2>&1
for i in 1 2 3; do python3 bench/validate_suite.py --run --out /tmp/reps/r$i > /tmp/reps/r$i.log 2>&1; done
python3 bench/validate_suite.py --ncu --ncu-passes 5 --ncu-budget-s 200 --out /tmp/ncu > /tmp/ncu/ncu_stdout.txt 2>&1
python3 -m pytest -q tests/test_validate_gpu.py > /tmp/ncu/pytest_gpu_log.txt 2>&1
tar czf $OUT/extras.tgz -C /tmp reps ncu
tail -5 $OUT/run_stdout.txt; tail -3 /tmp/ncu/ncu_stdout.txt; tail -2 /tmp/ncu/pytest_gpu_log.txt
