"""`sweep`: explore the cross product of models and GPU specs in parallel processes (or on a
Dask cluster), one row per combination in sweep.csv plus sweep.png. A failing combination is
recorded with its error and the sweep goes on."""
from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kitsune_dse.errors import KitsuneError
from kitsune_dse.report.io import prepare_out_dir, write_csv

SWEEP_COLUMNS = ["model", "spec", "plan_latency_s", "bsp_latency_s", "fusion_latency_s",
                 "speedup_vs_bsp", "speedup_vs_fusion", "plan_dram_bytes", "bsp_dram_bytes",
                 "fusion_dram_bytes", "dram_reduction_vs_bsp", "dram_reduction_vs_fusion",
                 "plan_strategies", "solver_status", "solver_gap", "wall_s", "error"]


def sweep_job(model: str, spec: str, sets: dict, hw_set: dict, objective: str,
              time_limit_s: float, sm_granularity: int) -> dict:
    """One combination; never raises (errors become the row's `error`)."""
    from kitsune_dse.report.explore import explore
    t0 = time.perf_counter()
    row = {"model": model, "spec": spec}
    try:
        res = explore(model, spec, sets=sets, objective=objective, time_limit_s=time_limit_s,
                      sm_granularity=sm_granularity, hw_set=hw_set, write=False)
        by = {r["strategy"]: r for r in res.strategies}
        p, b, f = by["plan"], by["bsp"], by["fusion"]
        row.update({
            "plan_latency_s": p["latency_s"], "bsp_latency_s": b["latency_s"],
            "fusion_latency_s": f["latency_s"],
            "speedup_vs_bsp": b["latency_s"] / p["latency_s"],
            "speedup_vs_fusion": f["latency_s"] / p["latency_s"],
            "plan_dram_bytes": p["dram_bytes"], "bsp_dram_bytes": b["dram_bytes"],
            "fusion_dram_bytes": f["dram_bytes"],
            "dram_reduction_vs_bsp": 1 - p["dram_bytes"] / b["dram_bytes"] if b["dram_bytes"] else 0.0,
            "dram_reduction_vs_fusion": 1 - p["dram_bytes"] / f["dram_bytes"] if f["dram_bytes"] else 0.0,
            "plan_strategies": sorted({r["strategy"] for r in res.plan["regions"]}),
            "solver_status": res.plan["solver"].get("status"),
            "solver_gap": res.plan["solver"].get("gap"), "error": ""})
    except KitsuneError as e:
        row["error"] = str(e)
    except Exception as e:  # a bug in one combination must not stop the sweep
        row["error"] = f"internal error: {e.__class__.__name__}: {e}"
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def run_sweep(models: list[str], specs: list[str], *, out: Path, sets=None, hw_set=None,
              objective: str = "latency", time_limit_s: float = 10.0, sm_granularity: int = 1,
              jobs: int = 1, executor: str = "local", scheduler: str | None = None,
              progress=None) -> tuple[list[dict], float]:
    if not models or not specs:
        raise KitsuneError("--models and --hw each need at least one name")
    if jobs < 1:
        raise KitsuneError(f"--jobs {jobs}: must be >= 1")
    out = prepare_out_dir(out)
    combos = [(m, s) for m in models for s in specs]
    args = [(m, s, dict(sets or {}), dict(hw_set or {}), objective, time_limit_s, sm_granularity)
            for m, s in combos]
    t0 = time.perf_counter()
    if executor == "dask":
        rows = _run_dask(args, scheduler)
    elif executor == "local":
        if jobs == 1:
            rows = []
            for i, a in enumerate(args):
                rows.append(sweep_job(*a))
                if progress:
                    progress(i + 1, len(args), "sweep")
        else:
            with ProcessPoolExecutor(max_workers=min(jobs, os.cpu_count() or jobs)) as ex:
                futs = [ex.submit(sweep_job, *a) for a in args]
                rows = []
                for i, f in enumerate(futs):
                    rows.append(f.result())
                    if progress:
                        progress(i + 1, len(args), "sweep")
    else:
        raise KitsuneError(f"--executor {executor!r}: choose local or dask")
    wall = time.perf_counter() - t0
    stable = [{k: v for k, v in r.items()} for r in rows]
    write_csv(out / "sweep.csv", stable, SWEEP_COLUMNS)
    from kitsune_dse.report.plots import sweep_png
    if any(not r.get("error") for r in rows):
        sweep_png(out / "sweep.png", rows)
    return rows, wall


def _run_dask(args, scheduler: str | None) -> list[dict]:
    try:
        from dask.distributed import Client
    except ImportError:
        raise KitsuneError("--executor dask needs Dask: pip install 'kitsune-dse[dist]'") from None
    if not scheduler:
        raise KitsuneError("--executor dask needs --scheduler tcp://HOST:PORT")
    try:
        client = Client(scheduler, timeout="10s")
    except OSError as e:
        raise KitsuneError(f"--scheduler {scheduler}: cannot connect ({e})") from None
    try:
        futs = [client.submit(sweep_job, *a, pure=False) for a in args]
        return client.gather(futs)
    finally:
        client.close()
