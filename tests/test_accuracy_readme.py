"""README.md's accuracy tables match results/accuracy/h100.csv, and that CSV matches the suite's
measurements (bench/accuracy.py recomputed from results/validation/h100/suite/). No GPU needed."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "results/accuracy/h100.csv"
SUITE = ROOT / "results/validation/h100/suite"


def _accuracy():
    spec = importlib.util.spec_from_file_location("kdse_bench_accuracy", ROOT / "bench/accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_accuracy_tables_match_the_csv():
    acc = _accuracy()
    rows = acc.read_csv_rows(CSV)
    workloads, overall = acc.readme_lines(rows)
    assert len(workloads) >= 2 + 8 and len(overall) >= 2 + 10
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Prediction accuracy on an H100" in text, \
        "README.md lacks the accuracy section: paste results/accuracy/README_SECTION.md into it"
    missing = [ln for ln in workloads + overall if ln not in text]
    assert not missing, "README.md's accuracy tables differ from results/accuracy/h100.csv " \
                        "(rerun python bench/accuracy.py and paste README_SECTION.md):\n" + "\n".join(missing)


def test_accuracy_csv_is_up_to_date_with_the_suite():
    acc = _accuracy()
    fresh = {(r["kind"], r["workload"], r["alternative"], r.get("item")): r for r in acc.build(SUITE)}
    stored = acc.read_csv_rows(CSV)
    assert len(stored) == len(fresh)
    for r in stored:
        f = fresh[(r["kind"], r["workload"], r["alternative"], r["item"])]
        for k in ("predicted", "measured", "error_pct", "mape_pct", "worst_pct", "spearman", "spearman_runs",
                  "spearman_halves", "regret"):
            a, b = r.get(k), f.get(k)
            if a is None or b is None:
                assert a is None and (b is None or (isinstance(b, float) and not math.isfinite(b))), (r, k)
                continue
            assert a == pytest.approx(b, rel=1e-5, abs=1e-12), (r["kind"], r["workload"], r["alternative"], k)


def test_accuracy_definitions():
    acc = _accuracy()
    assert acc.err(110.0, 100.0) == pytest.approx(10.0)        # optimistic model: negative
    assert acc.err(50.0, 100.0) == pytest.approx(-50.0)
    assert acc.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert acc.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert acc.spearman([1, 1, 1], [1, 2, 3]) is None           # ties only: undefined
    w = acc.workload_summary("x", [
        {"alternative": "explorer-1", "variant": "plan", "predicted": 1.0, "measured": 2.0, "error_pct": -50.0},
        {"alternative": "explorer-2", "variant": "plan", "predicted": 2.0, "measured": 1.5, "error_pct": 33.3},
        {"alternative": "bsp-graph", "variant": "bsp-graph", "predicted": 3.0, "measured": 1.0, "error_pct": 200.0},
        {"alternative": "cublas", "variant": "cublas", "predicted": 3.0, "measured": 0.5, "error_pct": 500.0},
        {"alternative": "cublas-graph", "variant": "cublas-graph", "predicted": 0.5, "measured": 0.4,
         "error_pct": 25.0}])
    assert w["regret"] == pytest.approx(1.0)          # 2.0 over the best non-cuBLAS alternative 1.0
    assert w["regret_alt"] == pytest.approx(2.0 / 1.5 - 1)
    assert w["worst_pct"] == pytest.approx(500.0) and w["n"] == 5


def test_latency_is_the_median_over_the_repeated_runs():
    """A row's measured latency is the median over the runs that measured it correctly; a
    failed repeat does not count, and a row only one run has keeps its value."""
    acc = _accuracy()
    row = {"plan": "w/explorer-1", "region": "0", "variant": "plan", "correct": "True",
           "measured_latency_s": "1.0", "host_issue_s": "", "placement": "{}"}
    lone = dict(row, plan="w/explorer-2", measured_latency_s="5.0")
    reps = [[dict(row, measured_latency_s="3.0")], [dict(row, measured_latency_s="2.0")],
            [dict(row, measured_latency_s="100.0", correct="False")]]
    out = acc.median_over_runs([row, lone], reps)
    assert float(out[0]["measured_latency_s"]) == 2.0 and out[0]["runs_merged"] == 3
    assert out[0]["placement"] == "{}"                     # the primary run's
    assert float(out[1]["measured_latency_s"]) == 5.0 and "runs_merged" not in out[1]
    assert row["measured_latency_s"] == "1.0"               # the input is not changed


def test_spearman_between_runs(tmp_path):
    """Each pair of runs ranks the plans by its own measured times; the report gives the mean
    over pairs: three plans, run A 1 < 2 < 3, run B the same order, run C the last two swapped
    (0.5 against A and B), a plan of two regions by its plan-e2e row, a failed row left out."""
    acc = _accuracy()
    fields = ["plan", "region", "variant", "correct", "measured_latency_s"]

    def run(path, t1, t2, t3):
        with open(path, "w", newline="") as f:
            w = acc.csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerow({"plan": "w/p1", "region": "0", "variant": "plan", "correct": "True", "measured_latency_s": t1})
            w.writerow({"plan": "w/p2", "region": "0", "variant": "plan", "correct": "True", "measured_latency_s": t2})
            w.writerow({"plan": "w/p3", "region": "0", "variant": "plan", "correct": "True", "measured_latency_s": 9.0})
            w.writerow({"plan": "w/p3", "region": "", "variant": "plan-e2e", "correct": "True", "measured_latency_s": t3})
            w.writerow({"plan": "w/p4", "region": "0", "variant": "plan", "correct": "False", "measured_latency_s": 0.1})
    run(tmp_path / "validation.csv", 1.0, 2.0, 3.0)
    run(tmp_path / "validation_repeat_1.csv", 1.5, 2.5, 3.5)
    run(tmp_path / "validation_repeat_2.csv", 1.0, 3.0, 2.0)
    workload = {"name": "w", "plans": [{"file": "x/p1.json", "regions": [0]}, {"file": "x/p2.json", "regions": [0]},
                                       {"file": "x/p3.json", "regions": [0, 1]}, {"file": "x/p4.json", "regions": [0]}]}
    assert acc.spearman_between_runs(tmp_path, workload) == pytest.approx((1.0 + 0.5 + 0.5) / 3)
    assert acc.spearman_halves(tmp_path, workload) is None           # three runs: no two halves
    # a fourth run in B's order: halves (A, B) and (C, D), their medians per plan p1..p3:
    # (1.25, 2.25, 3.25) against (1.25, 2.5, 2.5): p2 and p3 tie in the second half
    run(tmp_path / "validation_repeat_3.csv", 1.5, 2.0, 3.0)
    from scipy.stats import spearmanr
    assert acc.spearman_halves(tmp_path, workload) == pytest.approx(
        spearmanr([1.25, 2.25, 3.25], [1.25, 2.5, 2.5])[0])
    (tmp_path / "validation_repeat_3.csv").unlink()
    (tmp_path / "validation_repeat_1.csv").unlink()
    (tmp_path / "validation_repeat_2.csv").unlink()
    assert acc.spearman_between_runs(tmp_path, workload) is None      # one run: nothing to compare


def test_add_runs_numbers_the_next_repeats_and_refuses_other_plans(tmp_path):
    """bench/validate_suite.py --add-runs: a second call's run and ncu passes join the collected
    ones as the next repeats; a run of other plans is refused."""
    spec = importlib.util.spec_from_file_location("kdse_bench_validate_suite", ROOT / "bench/validate_suite.py")
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    head = "plan,region,variant,measured_latency_s\n"
    res, run, ncu, other = (tmp_path / x for x in ("results", "run", "ncu", "other"))
    for d in (res, run, ncu, other):
        d.mkdir()
    (res / "validation.csv").write_text(head + "w/p1,0,plan,1.0\n")
    (res / "validation_repeat_1.csv").write_text(head + "w/p1,0,plan,1.1\n")
    (res / "validation_ncu.csv").write_text(head + "w/p1,0,plan,\n")
    (run / "validation.csv").write_text(head + "w/p1,0,plan,1.2\n")
    (ncu / "validation_ncu.csv").write_text(head + "w/p1,0,plan,\n")
    (ncu / "validation_ncu_repeat_1.csv").write_text(head + "w/p1,0,plan,\n")
    (other / "validation.csv").write_text(head + "w/p2,0,plan,1.0\n")
    vs.RESULTS = res
    vs.add_runs([run, ncu])
    assert (res / "validation_repeat_2.csv").read_text().endswith("1.2\n")
    assert {p.name for p in res.glob("validation_ncu_repeat_*.csv")} == {"validation_ncu_repeat_1.csv",
                                                                       "validation_ncu_repeat_2.csv"}
    with pytest.raises(SystemExit, match="not the plans"):
        vs.add_runs([other])
