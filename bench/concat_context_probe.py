"""Why one persistent concat kernel times 281 us in the calibration and 429 us in the validation
path (issue 6 diagnostic, not fitted): the calibration's one-stage concat of [262144, 256] and
[262144, 64] on 66 SMs (bench/calibrate_device.py pipe case `concat`) and NeRF's skip_concat of
the same shape alone (bench/dram_probe.py lat-nerf-s1b-p1x66-x64-rays4096), whose generated
kernels differ only in the order of the two inputs, each timed both ways: outputs poisoned
before every run (the validation harness) or not (the calibration), L2 flushed either way.

    device:  python3 bench/concat_context_probe.py --out $OUT [--cols 64,320]   # -> concat_context.json
             (--cols: the same kernels with items of those column widths)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

PROBE = ROOT / "bench/dram_probe/lat-nerf-s1b-p1x66-x64-rays4096.json"


def variants(info, cols=(None,)):
    """(name, Region, variant) of the two kernels, at each column width of their items (None:
    as planned, 128; the runtime splits an elementwise row-block into items that wide)."""
    from calibrate_device import pipe_region

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref, whole_region
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors, make_variants
    plan = json.loads(PROBE.read_text())
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    out = []
    for c in cols:
        def wide(region):
            region = json.loads(json.dumps(region))
            if c:
                region["stages"][0]["tile"] = {**region["stages"][0].get("tile", {}), "cols": c}
            return region
        g, region = pipe_region("concat", (262144, 256, 64), 66, 128, 8)
        region = wide(region)
        reg = Region(g, region)
        out.append((f"calibration concat [256 | 64] items {c or 128} wide", reg,
                    PipelineVariant("plan", reg, Tensors(reg), info, region, 1.0)))
        rd = wide(next(r for r in plan["regions"] if r["strategy"] == "pipeline"))
        reg2 = Region(graph, rd, layouts=whole_region(graph))
        out.append((f"nerf skip_concat [64 | 256] items {c or 128} wide", reg2,
                    make_variants(reg2, rd, Tensors(reg2), info, 1.0, ["plan"])[0]))
    return out


def main() -> None:
    import cupy as cp

    from kitsune_dse.validate.harness import env_summary
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.runtime import gpu_info
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cols", default="", help="comma-separated item widths (columns) to try besides the plan's")
    a = ap.parse_args()
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    with stream:
        cols = (None,) + tuple(int(x) for x in a.cols.split(",") if x)
        for name, reg, v in variants(info, cols):
            v.prepare()
            for poison in ((False, True, False) if "128 wide" in name else (True,)):
                t = time_runs(v.run, v.pre, v.after, stream, a.runs, 2, flush, poison_every=poison)
                rows.append({"case": name, "poison_every": poison, "median_us": round(t.median_s * 1e6, 1),
                             "p10_us": round(t.p10_s * 1e6, 1), "p90_us": round(t.p90_s * 1e6, 1)})
                print(rows[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "concat_context.json").write_text(json.dumps({"env": env_summary(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
