"""validate_plan: run a plan's regions and their baselines on the GPU, check, time, report."""
from __future__ import annotations

import csv
import datetime as _dt
import functools
import json
import math
import os
import sys
from pathlib import Path

from kitsune_dse.errors import KitsuneError
from kitsune_dse.validate.plan import check_target, load_plan

CSV_FIELDS = [
    "plan", "model", "region", "strategy", "variant", "predicted_latency_s", "measured_latency_s",
    "p10_latency_s", "p90_latency_s", "host_issue_s", "warm_latency_s", "warm_p10_latency_s", "warm_p90_latency_s",
    "error_pct", "predicted_dram_read_bytes", "predicted_dram_write_bytes", "measured_dram_read_bytes",
    "measured_dram_write_bytes", "correct", "rel_err", "max_rel_err", "checks", "kernel_launches",
    "tflops", "min_dram_bytes", "runs", "placement", "kernel_times_us", "error", "notes", "gpu", "sm_clock_mhz",
    "driver", "cupy", "date", "command",
]


def writes_in_run(predicted: dict):
    """The DRAM writes a measurement of this run alone sees (ncu's range after an L2 flush): the
    predicted writes less those still dirty in L2 when it ends (dram_write_deferred_bytes)."""
    w = predicted.get("dram_write_bytes", "")
    return w - predicted.get("dram_write_deferred_bytes", 0.0) if isinstance(w, (int, float)) else w


def resolve_model_ref(plan: dict) -> str:
    ref = plan["model"]["ref"]
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".onnx") and not p.is_absolute() and plan.get("_source"):
        cand = Path(plan["_source"]).resolve().parent / p
        if cand.exists():
            return str(cand)
    return ref


def predicted_for(plan: dict, region: dict, variant: str) -> dict:
    if variant.startswith("plan"):
        return region.get("predicted") or {}
    key = {"bsp-eager": "bsp", "bsp-graph": "bsp", "fusion": "fusion", "fusion-graph": "fusion"}.get(variant)
    if key is None:
        return {}
    if isinstance(region.get("baselines"), dict) and key in region["baselines"]:
        return region["baselines"][key] or {}
    if len(plan["regions"]) == 1 and isinstance(plan.get("baselines"), dict):
        return plan["baselines"].get(key) or {}
    return {}


def _fill_inputs(reg, tensors, roles):
    from kitsune_dse.validate.reference import fill_physical, logical_shape, random_tensor
    for t in reg.inputs:
        role, scale = roles[t]
        a = tensors.get(t)
        if reg.padded(t):   # logical values, zeros in the pads
            fill_physical(reg, t, a, random_tensor(logical_shape(reg, t), role, scale, reg.dtype))
        else:
            a[...] = random_tensor(a.shape, role, scale, reg.dtype)


def check_variant(v, reg, tensors, roles, stream, checks: int = 2) -> dict:
    """`checks` runs on fresh random inputs with poisoned outputs; the worst error wins."""
    from kitsune_dse.validate.reference import compare, reference, rounding_depth, to_logical
    worst = {"rel_err": 0.0, "max_rel_err": 0.0, "correct": True, "checks": 0}
    for _ in range(checks):
        _fill_inputs(reg, tensors, roles)
        v.pre(True)
        v.run(stream)
        stream.synchronize()
        v.after()
        ref = reference(reg, {t: tensors.get(t) for t in reg.inputs})
        for t, out in v.outputs().items():
            c = compare(to_logical(reg, t, out), ref[t], reg.dtype, rounding_depth(reg, t))
            worst["rel_err"] = max(worst["rel_err"], c["rel_err"])
            worst["max_rel_err"] = max(worst["max_rel_err"], c["max_rel_err"])
            worst["correct"] = worst["correct"] and c["correct"]
        worst["checks"] += 1
    worst["_ref"] = {t: ref[t] for t in reg.outputs}
    return worst


@functools.lru_cache(maxsize=None)
def _timing_context():
    """One stream and one L2 flush buffer for every validate_plan call of the process, so that
    each plan is timed in the same state whatever was validated before it (dlrm's fusion chain
    measured 73.7 us as a process's first call and 75.0-75.7 us in later ones when each call made
    its own; bench/fusion_chain_probe.py --calls)."""
    import cupy as cp

    from kitsune_dse.validate.measure import L2Flusher
    return cp.cuda.Stream(non_blocking=True), L2Flusher()


def validate_plan(plan_or_path, out_dir: str | Path | None = None, runs: int = 30, warmup: int = 3,
                  retarget: bool = False, ncu: bool = False, variants: list[str] | None = None,
                  timeout_s: float = 1.0, checks: int = 2, warm: bool = True, console=None,
                  command: str | None = None, csv_name: str = "validation.csv",
                  kernel_times: bool = False) -> list[dict]:
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.runtime import gpu_info

    plan = load_plan(plan_or_path) if not isinstance(plan_or_path, dict) else plan_or_path
    plan_name = Path(plan.get("_source", "plan")).stem
    info, extra = gpu_info()
    plan, tnotes = check_target(plan, info, retarget)
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    command = command or " ".join([Path(sys.argv[0]).name] + sys.argv[1:])
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    stream, flusher = _timing_context()
    rows: list[dict] = []
    ncu_bytes = {}
    if ncu:
        from kitsune_dse.validate.ncu import ncu_dram_bytes
        ncu_bytes = ncu_dram_bytes(plan, retarget=retarget, variants=variants, timeout_s=timeout_s)
    with stream:   # every fill, poison, reset and launch in one stream order
        rows += _validate_regions(plan, graph, info, extra, stream, flusher, runs, warmup, variants,
                                  timeout_s, checks, warm, console, plan_name, date, command, tnotes,
                                  ncu_bytes, kernel_times)
    if out_dir is not None:
        write_csv(rows, Path(out_dir) / csv_name)
    return rows


def whole_region(graph):
    """The whole graph as one Region (its layouts are shared by every region of a plan), or None
    when the harness cannot hold the graph's tensors (another dtype)."""
    from kitsune_dse.validate.lower import Region
    try:
        return Region(graph, {"id": "all", "strategy": "bsp", "ops": [o.name for o in graph.ops]})
    except KitsuneError:
        return None


def _validate_regions(plan, graph, info, extra, stream, flusher, runs, warmup, variants, timeout_s,
                      checks, warm, console, plan_name, date, command, tnotes, ncu_bytes, kernel_times=False):
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.measure import time_runs
    from kitsune_dse.validate.reference import compare, input_roles, rounding_depth, to_logical
    from kitsune_dse.validate.runtime import Tensors, make_variants
    rows: list[dict] = []
    whole = whole_region(graph) if len(plan["regions"]) > 1 else None
    for ri, region in enumerate(plan["regions"]):
        reg = Region(graph, region, layouts=whole)
        tensors = Tensors(reg)
        roles = input_roles(reg)
        flops = sum(graph.op(o).info.flops for o in reg.ops)
        min_bytes = sum(tensors.get(t).nbytes for t in reg.inputs) + sum(tensors.get(t).nbytes for t in reg.outputs)
        for v in make_variants(reg, region, tensors, info, timeout_s, variants):
            row = {"plan": plan_name, "model": plan["model"].get("name", graph.name), "region": region.get("id", ri),
                   "strategy": region["strategy"], "variant": v.name, "gpu": info.name,
                   "sm_clock_mhz": extra.get("sm_clock_mhz", ""), "driver": extra.get("driver_version", extra.get("driver")),
                   "cupy": extra.get("cupy"), "date": date, "command": command, "min_dram_bytes": min_bytes}
            pred = predicted_for(plan, region, v.name)
            row["predicted_latency_s"] = pred.get("latency_s", "")
            row["predicted_dram_read_bytes"] = pred.get("dram_read_bytes", "")
            row["predicted_dram_write_bytes"] = writes_in_run(pred)
            try:
                v.prepare()
                chk = check_variant(v, reg, tensors, roles, stream, checks)
                ref = chk.pop("_ref")
                # eager launches are timed from an idle GPU: their model is the host's issue
                host = getattr(v, "host_issued", False)
                t_cold = time_runs(v.run, v.pre, v.after, stream, runs, warmup, flusher, host_start=host)
                cold_placement = dict(getattr(v, "placement", None) or {})
                if v.name == "bsp-eager" and kernel_times:
                    row["kernel_times_us"] = json.dumps([[n, round(t * 1e6, 2)] for n, t in
                                                         v.kernel_times(stream, flusher)])
                t_warm = time_runs(v.run, v.pre, v.after, stream, runs, 1, None, host_start=host) if warm else None
                # the last timed run, on the last check's inputs, must be right too
                for t, out in v.outputs().items():
                    c = compare(to_logical(reg, t, out), ref[t], reg.dtype, rounding_depth(reg, t))
                    chk["rel_err"] = max(chk["rel_err"], c["rel_err"])
                    chk["max_rel_err"] = max(chk["max_rel_err"], c["max_rel_err"])
                    chk["correct"] = chk["correct"] and c["correct"]
                row.update(correct=chk["correct"], rel_err=chk["rel_err"], max_rel_err=chk["max_rel_err"],
                           checks=chk["checks"] + 1, measured_latency_s=t_cold.median_s,
                           p10_latency_s=t_cold.p10_s, p90_latency_s=t_cold.p90_s, runs=t_cold.runs,
                           host_issue_s=t_cold.host_s,
                           kernel_launches=v.launches_per_run, tflops=flops / t_cold.median_s / 1e12)
                if t_warm:
                    row.update(warm_latency_s=t_warm.median_s, warm_p10_latency_s=t_warm.p10_s,
                               warm_p90_latency_s=t_warm.p90_s)
                if isinstance(row["predicted_latency_s"], (int, float)) and row["predicted_latency_s"] > 0:
                    row["error_pct"] = 100.0 * (t_cold.median_s - row["predicted_latency_s"]) / row["predicted_latency_s"]
                if cold_placement:
                    row["placement"] = json.dumps(cold_placement)
            except KitsuneError as e:
                row.update(correct=False, error=str(e))
            except Exception as e:   # noqa: BLE001  a library's refusal fails this variant, not the others
                row.update(correct=False, error=f"{type(e).__name__}: {e}")
            nb = ncu_bytes.get((row["region"], v.name))
            if nb:
                row["measured_dram_read_bytes"], row["measured_dram_write_bytes"] = nb
            row["notes"] = "; ".join(tnotes + v.notes)
            rows.append(row)
            if console is not None:
                console.print(f"  {plan_name} region {row['region']} {v.name}: "
                              + (f"{row.get('measured_latency_s', math.nan) * 1e6:.1f} us, correct={row['correct']}"
                                 if "measured_latency_s" in row else f"ERROR {row.get('error')}"))
        tensors.arrays.clear()
    return rows


def write_csv(rows: list[dict], path: Path, append: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not (append and path.exists())
    with open(path, "a" if append else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k, "")) for k in CSV_FIELDS})


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def table(rows: list[dict], title: str = "validation"):
    from rich.table import Table
    t = Table(title=title)
    for c in ("plan", "reg", "variant", "pred us", "meas us", "p10-p90", "warm us", "err %", "TFLOP/s",
              "ncu MB r/w", "ok", "rel err"):
        t.add_column(c, justify="left" if c in ("plan", "variant") else "right")
    for r in rows:
        def us(k):
            v = r.get(k)
            return f"{v * 1e6:.1f}" if isinstance(v, (int, float)) and v != "" else "-"
        ncu = "-"
        if r.get("measured_dram_read_bytes") not in (None, ""):
            ncu = f"{r['measured_dram_read_bytes'] / 1e6:.0f}/{r['measured_dram_write_bytes'] / 1e6:.0f}"
        spread = f"{us('p10_latency_s')}-{us('p90_latency_s')}"
        t.add_row(str(r["plan"]), str(r["region"]), r["variant"], us("predicted_latency_s"),
                  us("measured_latency_s"), spread, us("warm_latency_s"),
                  f"{r['error_pct']:+.0f}" if isinstance(r.get("error_pct"), float) else "-",
                  f"{r['tflops']:.0f}" if isinstance(r.get("tflops"), float) else "-", ncu,
                  "yes" if r.get("correct") else ("ERR" if r.get("error") else "NO"),
                  f"{r['rel_err']:.1e}" if isinstance(r.get("rel_err"), float) else "-")
    return t


def env_summary() -> dict:
    from kitsune_dse.validate.runtime import gpu_info
    _, extra = gpu_info()
    extra["date"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    extra["host"] = os.uname().nodename
    return extra
