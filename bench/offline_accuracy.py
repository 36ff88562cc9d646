"""Re-predict the plans and baselines that the last suite run measured, with the model as it is
now (or a spec with overrides), against those measurements: the e2e MAPE, per-workload Spearman
and DRAM error a model change would give before any GPU time is spent. The picks may change with
the model; their regret needs a new run (`bench/validate_suite.py`).

    python bench/offline_accuracy.py [--set efficiency.l2_usable_fraction=0.6] [-v] [--primary-only]
        [--results DIR --plans-root ROOT]   # another run: its measurements, the plan files it ran
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from accuracy import median_over_runs, ncu_rows, repeat_runs, spearman  # noqa: E402

from kitsune_dse.cost.region import Region  # noqa: E402
from kitsune_dse.cost.strategies import LaunchChoice, bsp, fusion, library_bsp  # noqa: E402
from kitsune_dse.graph import load_model  # noqa: E402
from kitsune_dse.hw import load_spec  # noqa: E402
from kitsune_dse.hw.spec import spec_with_overrides  # noqa: E402
from kitsune_dse.report.plan import evaluate_plan  # noqa: E402

RESULTS = ROOT / "results/validation/h100/suite"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", action="append", default=[], help="spec override FIELD=VALUE")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--primary-only", action="store_true", help="validation.csv alone, not the "
                    "median over it and validation_repeat_*.csv")
    ap.add_argument("--results", type=Path, default=RESULTS, help="a suite run's folder (validation.csv, "
                    "manifest.json, ...)")
    ap.add_argument("--plans-root", type=Path, default=ROOT, help="where that run's plan files lie "
                    "(a checkout of its commit: a trial's plans are not the committed ones)")
    a = ap.parse_args()
    results = a.results
    over = dict(s.split("=", 1) for s in a.set)
    spec = spec_with_overrides(load_spec(ROOT / "hw_specs/h100-sxm.calibrated.yaml"), over)
    cspec = spec_with_overrides(load_spec(ROOT / "hw_specs/h100-sxm-cublas.calibrated.yaml"), over)
    rows = list(csv.DictReader(open(results / "validation.csv")))
    if not a.primary_only:
        # the same latencies accuracy.py reports: the median over the suite's repeated runs
        rows = median_over_runs(rows, [list(csv.DictReader(open(p))) for p in repeat_runs(results)])
    ncu = ncu_rows(results)
    manifest = json.loads((results / "manifest.json").read_text())
    lat_err, dram_err, sp = [], [], []
    for w in manifest["workloads"]:
        name = w["name"]
        graph = load_model(w["model"], w["sizes"])
        alts = []
        for p in w["plans"]:
            stem = Path(p["file"]).stem
            prs = [r for r in rows if r["plan"] == f"{name}/{stem}"]
            e2e = next((r for r in prs if r["variant"] == "plan-e2e"), None)
            if e2e is None and len(p["regions"]) == 1:
                e2e = next((r for r in prs if r["variant"] == "plan"), None)
            if e2e is None or not e2e.get("measured_latency_s"):
                continue
            plan = json.loads((a.plans_root / p["file"]).read_text())
            new = evaluate_plan(plan, graph, spec)
            pred = new["predicted"]["latency_s"]
            alts.append((stem, pred, float(e2e["measured_latency_s"])))
            for n in ncu:
                if n["plan"] == f"{name}/{stem}" and n["variant"] == "plan":
                    rd = new["regions"][int(n["region"])]["predicted"]
                    m = float(n["measured_dram_read_bytes"]) + float(n["measured_dram_write_bytes"])
                    dram_err.append((f"{name}/{stem} r{n['region']}",
                                     rd["dram_bytes"] - rd.get("dram_write_deferred_bytes", 0.0), m))
        region = Region.of(graph)
        base = {"bsp-graph": bsp(region, spec), "bsp-eager": bsp(region, spec, LaunchChoice("eager")),
                "fusion-graph": fusion(region, spec), "fusion": fusion(region, spec, LaunchChoice("eager")),
                "cublas": library_bsp(region, spec, LaunchChoice("eager"), library_spec=cspec),
                "cublas-graph": library_bsp(region, spec, LaunchChoice("graph"), library_spec=cspec)}
        for v, e in base.items():
            r = next((x for x in rows if x["plan"] == f"{name}/whole" and x["variant"] == v), None)
            if r and r.get("measured_latency_s"):
                alts.append((v, e.latency_s, float(r["measured_latency_s"])))
            n = next((x for x in ncu if x["plan"] == f"{name}/whole" and x["variant"] == v), None)
            if n:
                m = float(n["measured_dram_read_bytes"]) + float(n["measured_dram_write_bytes"])
                dram_err.append((f"{name}/whole {v}", e.dram_bytes_in_run, m))
        plans = [x for x in alts if x[0].startswith(("explorer", "hand"))]
        sp.append((name, spearman([x[1] for x in plans], [x[2] for x in plans])))
        for stem, pr, m in alts:
            lat_err.append((name, stem, pr, m))
            if a.v:
                print(f"{name:20s} {stem:28s} pred {pr * 1e6:9.1f} meas {m * 1e6:9.1f} {100 * (pr - m) / m:+6.1f}%")
    mape = sum(abs(p - m) / m for *_, p, m in lat_err) / len(lat_err) * 100
    dmape = sum(abs(p - m) / m for _, p, m in dram_err) / len(dram_err) * 100
    if a.v:
        for k, p, m in dram_err:
            print(f"DRAM {k:45s} pred {p / 1e6:9.1f} MB meas {m / 1e6:9.1f} MB {100 * (p - m) / m:+6.1f}%")
    worst = max(lat_err, key=lambda x: abs(x[2] - x[3]) / x[3])
    print(f"e2e MAPE {mape:.1f}% over {len(lat_err)} (worst {worst[0]}/{worst[1]} "
          f"{100 * (worst[2] - worst[3]) / worst[3]:+.1f}%); DRAM MAPE {dmape:.1f}% over {len(dram_err)}")
    print("Spearman (plans) per workload: " + ", ".join(f"{n} {x:.2f}" for n, x in sp)
          + f"; mean {sum(x for _, x in sp) / len(sp):.2f}")


if __name__ == "__main__":
    main()
