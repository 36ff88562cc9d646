"""Does a plan's persistent kernel compute the same right answer every time? Runs each pipeline
region's plan variant `--checks` times on fresh random inputs with poisoned outputs and counts
the wrong results (a race shows up as an occasional small error; issue 6 diagnostics).

    device:  python3 bench/race_probe.py PLAN.json [--checks 30]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--checks", type=int, default=30)
    a = ap.parse_args()
    import cupy as cp

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import check_variant, resolve_model_ref
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.plan import check_target, load_plan
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors, gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    for path in a.plans:
        plan, _ = check_target(load_plan(path), info, True)
        graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        for i, region in enumerate(plan["regions"]):
            if region["strategy"] != "pipeline":
                continue
            reg = Region(graph, region)
            v = PipelineVariant("plan", reg, Tensors(reg), info, region, 1.0)
            bad, worst = 0, 0.0
            with stream:
                v.prepare()
                for _ in range(a.checks):
                    c = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
                    bad += not c["correct"]
                    worst = max(worst, c["rel_err"])
            print(f"{path} r{i}: {bad}/{a.checks} wrong, worst rel err {worst:.3g}", flush=True)
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
