"""Where a tilesync region's time goes: the same kernels as one CUDA graph, under tilesync with
programmatic dependent launches, and under tilesync in plain stream order (flag waits only),
each timed on cold L2 (a diagnostic of the tilesync model, issue 6).

    device:  python3 bench/tilesync_probe.py PLAN.json [REGION] [--kernels A:B] [--runs 30]

--kernels A:B keeps the region's kernels A to B-1 (which hand-off of a chain costs what);
--splits I=S runs kernel I of the slice with S ranges of K (does splitting K cost the hand-off?).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("region", nargs="?", type=int, default=0)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--kernels", default="", help="A:B, a slice of the region's kernels")
    ap.add_argument("--splits", action="append", default=[],
                    help="I=S: run kernel I (of the slice) with S ranges of K (a GEMM's split-K)")
    a = ap.parse_args()
    import cupy as cp

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import check_variant, resolve_model_ref
    from kitsune_dse.validate.lower import Region, fusion_groups
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.plan import load_plan
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors, TilesyncVariant, gpu_info
    plan = load_plan(a.plan)
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    region = plan["regions"][a.region]
    if a.kernels:
        lo, hi = (int(x) if x else None for x in a.kernels.split(":"))
        kernels = region["kernels"][lo:hi]
        region = dict(region, kernels=kernels, ops=[o for k in kernels for o in k])
    info, _ = gpu_info()
    reg = Region(graph, region)
    tensors = Tensors(reg)
    groups = fusion_groups(reg)
    for spec in a.splits:
        i, n = (int(x) for x in spec.split("="))
        groups[i].tile = dict(groups[i].tile or {}, splits=n)
    pdl = TilesyncVariant("tilesync", reg, tensors, info, groups, region["strategy"])
    plain = TilesyncVariant("tilesync-no-pdl", reg, tensors, info, groups, region["strategy"])
    plain.programmatic = False
    graph_v = StandaloneVariant("graph", reg, tensors, info, groups, graph=True, prefix="fus")
    eager = StandaloneVariant("eager", reg, tensors, info, groups, prefix="fus")
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    with stream:
        for v in (graph_v, pdl, plain, eager):
            v.prepare()
            chk = check_variant(v, reg, tensors, input_roles(reg), stream, 1)
            chk.pop("_ref", None)
            t = time_runs(v.run, v.pre, v.after, stream, a.runs, 3, flush)
            rows.append((v.name, t.median_s * 1e6, t.p10_s * 1e6, t.p90_s * 1e6, chk["correct"]))
    print(f"{a.plan} region {a.region} {a.kernels} {' '.join(a.splits)} "
          f"({region['strategy']}, {len(groups)} kernels)")
    for name, med, p10, p90, ok in rows:
        print(f"  {name:16s} {med:9.1f} us  (p10 {p10:.1f}, p90 {p90:.1f}) {'ok' if ok else 'WRONG'}")
    print(json.dumps({n: round(m, 2) for n, m, *_ in rows}))


if __name__ == "__main__":
    main()
