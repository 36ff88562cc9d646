"""explore / evaluate / compare end to end: files, schema, determinism, bad input, pictures."""
from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

import jsonschema
import pytest

from kitsune_dse.cli import main
from kitsune_dse.graph import list_models, load_model
from kitsune_dse.hw import list_specs, load_spec
from kitsune_dse.report.explore import explore
from kitsune_dse.report.plan import SCHEMA_FILE, evaluate_plan
from kitsune_dse.errors import InfeasibleError

SCHEMA = json.loads(SCHEMA_FILE.read_text())
SMALL = {"tokens": 64, "tp": 8}


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


@pytest.fixture(scope="module")
def gpt3_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ex")
    res = explore("gpt3-mlp", "h100-sxm", out=out, sets=SMALL, alternatives=2)
    return res, out


def test_explore_writes_every_report(gpt3_run):
    res, out = gpt3_run
    for name in ("candidates.csv", "plan.csv", "plan.json", "strategies.csv", "pareto.png",
                 "plan.png", "strategies.png", "trace.json"):
        assert (out / name).stat().st_size > 0, name
    assert not list(out.glob(".*.tmp*")), "temporary files left behind"


def test_plan_json_matches_its_schema_and_the_model(gpt3_run):
    res, out = gpt3_run
    plan = json.loads((out / "plan.json").read_text())
    jsonschema.validate(plan, SCHEMA)
    covered = [o for r in plan["regions"] for o in r["ops"]]
    g = load_model("gpt3-mlp", SMALL)
    assert sorted(covered) == sorted(o.name for o in g.ops)          # every op exactly once
    assert plan["hw"]["sm_count"] == 132 and plan["model"]["sizes"]["tokens"] == 64
    for r in plan["regions"]:
        if r["strategy"] == "pipeline":
            assert sum(s["sms"] for s in r["stages"]) <= 132
            assert len(r["queues"]) == len(r["stages"]) - 1
    total = sum(r["predicted"]["latency_s"] for r in plan["regions"])
    assert plan["predicted"]["latency_s"] == pytest.approx(total, rel=1e-12)


def test_schema_rejects_a_broken_plan(gpt3_run):
    res, out = gpt3_run
    plan = json.loads((out / "plan.json").read_text())
    bad = copy.deepcopy(plan)
    bad["regions"][0]["strategy"] = "magic"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_alternatives_are_distinct_and_ranked(gpt3_run):
    res, out = gpt3_run
    plans = [json.loads((out / "plan.json").read_text())]
    plans += [json.loads(p.read_text()) for p in sorted(out.glob("plan-*.json"))]
    lats = [p["predicted"]["latency_s"] for p in plans]
    assert lats == sorted(lats)
    keys = {json.dumps([(r["strategy"], r["ops"], [s["sms"] for s in r["stages"]],
                         [s["tile"] for s in r["stages"]], [q["depth"] for q in r["queues"]])
                        for r in p["regions"]]) for p in plans}
    assert len(keys) == len(plans)


def test_a_rerun_with_fewer_alternatives_leaves_none_of_the_last_ones(tmp_path):
    explore("gpt3-mlp", "h100-sxm", out=tmp_path, sets=SMALL, alternatives=2, plots=False)
    assert sorted(p.name for p in tmp_path.glob("plan-*.json")) == ["plan-2.json", "plan-3.json"]
    (tmp_path / "plan-notes.json").write_text("{}")          # not ours: kept
    explore("gpt3-mlp", "h100-sxm", out=tmp_path, sets=SMALL, alternatives=0, plots=False)
    assert sorted(p.name for p in tmp_path.glob("plan-*.json")) == ["plan-notes.json"]


def test_rerun_gives_byte_identical_reports(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    explore("nerf-mlp", "a100-sxm-80gb", out=a, sets={"rays": 256}, plots=False)
    explore("nerf-mlp", "a100-sxm-80gb", out=b, sets={"rays": 256}, plots=False)
    for name in ("candidates.csv", "plan.csv", "plan.json", "strategies.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_pngs_are_real_pictures_and_trace_has_one_track_per_stage(gpt3_run):
    res, out = gpt3_run
    for name in ("pareto.png", "plan.png", "strategies.png"):
        w, h = _png_size(out / name)
        assert w > 300 and h > 200 and (out / name).stat().st_size > 10_000, name
    trace = json.loads((out / "trace.json").read_text())
    ev = trace["traceEvents"]
    for e in ev:
        assert {"ph", "pid", "name"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and "ts" in e and "tid" in e
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    stages = [s for r in res.plan["regions"] for s in r["stages"]]
    assert len([n for n in names if "stage" in n]) == len(stages)
    if len(stages) > 1:
        assert any(e["ph"] == "s" for e in ev) and any(e["ph"] == "C" for e in ev)


def test_plan_is_never_slower_than_the_best_single_strategy():
    spec = load_spec("h100-sxm")
    for model in sorted(list_models()):
        res = explore(model, spec, write=False, plots=False, time_limit_s=5)
        by = {r["strategy"]: r["latency_s"] for r in res.strategies}
        best = min(v for k, v in by.items() if k != "plan")
        assert by["plan"] <= best * (1 + 1e-6), (model, by)


@pytest.mark.parametrize("spec", [s for s in list_specs() if "calibrated" not in s])
def test_explore_runs_on_every_spec(spec):
    res = explore("llama2-7b-mlp", spec, write=False, plots=False, sets={"tokens": 256},
                  time_limit_s=5)
    assert res.plan["predicted"]["latency_s"] > 0


def test_evaluate_a_hand_edited_split(gpt3_run, tmp_path):
    res, out = gpt3_run
    plan = json.loads((out / "plan.json").read_text())
    g, spec = load_model("gpt3-mlp", SMALL), load_spec("h100-sxm")
    again = evaluate_plan(plan, g, spec)
    assert again["predicted"]["latency_s"] == pytest.approx(plan["predicted"]["latency_s"], rel=1e-9)
    pipes = [r for r in plan["regions"] if r["strategy"] == "pipeline" and len(r["stages"]) == 2]
    if pipes:
        edited = copy.deepcopy(plan)
        r = next(x for x in edited["regions"] if x["id"] == pipes[0]["id"])
        r["stages"][0]["sms"], r["stages"][1]["sms"] = 88, 44      # an architect's 88/44 split
        new = evaluate_plan(edited, g, spec)
        assert [s["sms"] for s in new["regions"][r["id"]]["stages"]] == [88, 44]
        r["stages"][0]["sms"] = 100                                 # 100 + 44 > 132
        with pytest.raises(InfeasibleError, match="144 SMs"):
            evaluate_plan(edited, g, spec)
    broken = copy.deepcopy(plan)
    broken["regions"][0]["ops"] = broken["regions"][0]["ops"][1:]
    with pytest.raises(InfeasibleError, match="not covered"):
        evaluate_plan(broken, g, spec)


def test_evaluate_cli_round_trip(gpt3_run, tmp_path, capsys):
    res, out = gpt3_run
    assert main(["evaluate", str(out / "plan.json"), "--out", str(tmp_path / "ev")]) == 0
    assert (tmp_path / "ev" / "plan.json").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--objective", "fastest"], "objective"),
    (["--time-limit", "-1"], "time-limit"),
    (["--sm-granularity", "0"], "sm-granularity"),
    (["--sm-granularity", "200"], "200"),
    (["--hw-set", "l2_bytez=100MiB"], "l2_bytez"),
    (["--hw-set", "l2_bytes=100GHz"], "l2_bytes"),
])
def test_explore_bad_input_is_one_line_exit_2(args, fragment, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["explore", "gpt3-mlp", "--set", "tokens=64", "--out", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and fragment in err[0] and "Traceback" not in err[0]
    assert not out.exists() or not any(out.iterdir()), "nothing partial left behind"


def test_out_path_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("x")
    rc = main(["explore", "gpt3-mlp", "--set", "tokens=64", "--out", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is a file" in err[0]
    assert f.read_text() == "x"


def test_unwritable_out_dir(tmp_path, capsys):
    import os
    if os.geteuid() == 0:
        target = Path("/proc/kitsune-dse-cannot-write-here")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "sub"
    rc = main(["explore", "gpt3-mlp", "--set", "tokens=64", "--out", str(target)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cannot write" in err[0]


def test_whatif_spec_written_with_its_differences(tmp_path):
    res = explore("gpt3-mlp", "h100-sxm", out=tmp_path, sets=SMALL, plots=False,
                  hw_set={"l2_bytes": "100MiB", "sync_latency_s": "0.1us"})
    text = (tmp_path / "hw_spec.yaml").read_text()
    assert "l2_bytes: 52428800.0 -> 104857600.0" in text and "sync_latency_s" in text
    assert res.spec.l2_bytes == 100 * 2**20


def test_compare_cli_writes_strategies(tmp_path, capsys):
    assert main(["compare", "nerf-mlp", "--hw", "a100-sxm-80gb", "--out", str(tmp_path)]) == 0
    head = (tmp_path / "strategies.csv").read_text().splitlines()[0]
    assert head.startswith("strategy,latency_s,dram_read_bytes,dram_write_bytes")
