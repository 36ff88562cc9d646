"""The SM clock inside the persistent kernel's GEMM steps by the SMs they run on: is the
persistent GEMM fit's SM-count pattern (the model slow by +5.9% at 33 SMs, +1.6% at 132 on
4096^3; gpt3 t2048's fc2 stage on 33-44 SMs +11-13% in the suite) a higher clock on fewer SMs?

Each case is a one-stage GEMM pipeline of the calibration (calibrate_device.pipe_region), and
also gpt3 t2048's hand pipelines of two stages (bench/suite plans). First it is timed cold as
the calibration times it: CUDA events, 30 runs behind the L2 flush, the median. Then it is
built traced (lower.layout_pipeline(trace=True): every worker's %globaltimer and clock64 at its
start and end) and run cold a few times. Per stage it records its end and its workers' mean
SM clock (cycles over nanoseconds).

    here:    python bench/pipe_clock_probe.py --precompile
    device:  python3 bench/pipe_clock_probe.py --out $OUT [--runs 30] [--trace-runs 5]
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

ONE_STAGE = [((4096, 4096, 4096), sms) for sms in (16, 33, 66, 99, 132)] + \
            [((2048, 12288, 6144), sms) for sms in (33, 66, 132)]
SUITE_PLANS = ["gpt3-mlp-t2048-tp8/plans/hand-p99-33-r128-d8-splitk.json",
               "gpt3-mlp-t2048-tp8/plans/hand-p88-44-r256-d4-row.json",
               "gpt3-mlp-t2048-tp8/plans/hand-p66-66-r128-d8-splitk.json"]


def cases(info):
    """(label, plain variant, traced variant) of every case (sources only until prepared)."""
    from calibrate_device import pipe_region

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.plan import load_plan
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    out = []
    for dims, sms in ONE_STAGE:
        g, region = pipe_region("matmul", dims, sms)
        reg = Region(g, region)
        t = Tensors(reg)
        out.append((f"{'x'.join(map(str, dims))}@{sms}", PipelineVariant("plan", reg, t, info, region, 1.0),
                    PipelineVariant("traced", reg, t, info, region, 1.0, trace=True)))
    for rel in SUITE_PLANS:
        plan = load_plan(ROOT / "bench/suite" / rel)
        g = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        region = plan["regions"][0]
        reg = Region(g, region)
        t = Tensors(reg)
        out.append((rel.split("/")[0] + "/" + Path(rel).stem, PipelineVariant("plan", reg, t, info, region, 1.0),
                    PipelineVariant("traced", reg, t, info, region, 1.0, trace=True)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--trace-runs", type=int, default=5)
    ap.add_argument("--precompile", action="store_true")
    a = ap.parse_args()
    if a.precompile:
        from precompile import compile_one

        from kitsune_dse.validate.plan import DeviceInfo
        info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
        cache = ROOT / "bench/.cubin_cache"
        cache.mkdir(parents=True, exist_ok=True)
        for _, pv, tv in cases(info):
            for v in (pv, tv):
                print(compile_one(v.build(), info.arch, cache), flush=True)
        return
    import cupy as cp
    import numpy as np

    from kitsune_dse.validate.measure import time_runs
    from tilesync_probe import probe_session, timing_fields, traced_cold_runs, write_rows
    info, stream, flush, stamp = probe_session(a.out, "pipe_clock_probe.py")
    rows = []
    for label, pv, tv in cases(info):
        with stream:
            pv.prepare()
            t = time_runs(pv.run, pv.pre, pv.after, stream, a.runs, 3, flush)
            tv.prepare()
            recs = traced_cold_runs(tv, stream, flush, a.trace_runs,
                                    lambda v: (v.placement["stage_end_us"], v.placement["stage_mhz"]))
        ends = np.median(np.asarray([e for e, _ in recs]), axis=0)
        mhz = np.median(np.asarray([m for _, m in recs]), axis=0)
        row = {**stamp, "case": label, "sms_per_stage": json.dumps(tv.placement["sms_per_stage"]),
               **timing_fields(t),
               "traced_stage_end_us": json.dumps([round(float(x), 1) for x in ends]),
               "stage_mhz": json.dumps([round(float(x), 1) for x in mhz])}
        rows.append(row)
        print(f"{label:52s} {row['time_us']:9.1f} us  ends {row['traced_stage_end_us']}  MHz {row['stage_mhz']}",
              flush=True)
        pv.tensors.arrays.clear()
        cp.get_default_memory_pool().free_all_blocks()
    write_rows(Path(a.out or ".") / "pipe_clock.csv", rows)


if __name__ == "__main__":
    main()
