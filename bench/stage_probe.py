"""Which stage of a pipeline is slow: every stage of a plan's pipeline region run alone, as a
one-stage persistent kernel on its own SMs and tile rows (inputs from DRAM, cold L2), against the
model's time of the same one-stage pipeline (a diagnostic of issue 6).

    here:    python bench/stage_probe.py --precompile PLAN.json [PLAN2.json ...]
    device:  python3 bench/stage_probe.py --out $OUT PLAN.json [...]      # -> stage_probe.json
             (a PLAN may be stage=MODEL:OP+OP@SMS/rROWS: those ops as one stage)
    here:    python bench/stage_probe.py --predict $OUT/stage_probe.json  # model beside each
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))


def stage_regions(path: str):
    """(plan path, region index, stage index, graph, one-stage region dict) of every stage."""
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.plan import load_plan
    plan = load_plan(path)
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    for i, region in enumerate(plan["regions"]):
        if region["strategy"] != "pipeline":
            continue
        for j, st in enumerate(region["stages"]):
            tile = {"rows": st["tile"]["rows"], "cols": st["tile"].get("cols", 128)}
            one = {"id": 0, "strategy": "pipeline", "ops": list(st["ops"]),
                   "stages": [{"id": 0, "ops": list(st["ops"]), "sms": st["sms"], "ctas": st["sms"],
                               "tile": tile}], "queues": []}
            yield path, i, j, graph, one


def stage_cases(specs: list[str]):
    """--stage MODEL:OP+OP+...@SMS/rROWS[/tTEAMS]: one-stage kernels of any ops of a model (a stage's
    steps cut apart), as stage_regions yields them (the plan path is 'model:MODEL')."""
    from kitsune_dse.graph import load_model
    for j, spec in enumerate(specs):
        model, _, rest = spec.rpartition(":")
        ops, _, rest = rest.partition("@")
        sms, _, rows = rest.partition("/r")
        rows, _, teams = rows.partition("/t")
        graph = load_model(model, {})
        one = {"id": 0, "strategy": "pipeline", "ops": ops.split("+"),
               "stages": [{"id": 0, "ops": ops.split("+"), "sms": int(sms), "ctas": int(sms),
                           "tile": {"rows": int(rows or 128), "cols": 128}}], "queues": []}
        if teams:       # the teams per SM the kernel runs (default: the harness's rule)
            one["pipeline"] = {"teams_per_sm": int(teams)}
        yield f"model:{model}", 0, j, graph, one


def _all_stages(paths):
    for p in paths:
        yield from (stage_cases([p[len("stage="):]]) if p.startswith("stage=") else stage_regions(p))


def variants(paths, info):
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    for path, i, j, graph, one in _all_stages(paths):
        reg = Region(graph, one)
        yield path, i, j, one, reg, PipelineVariant("plan", reg, Tensors(reg), info, one, 1.0)


def precompile(paths) -> None:
    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    for src in dict.fromkeys(v.build() for *_, v in variants(paths, info)):
        print(compile_one(src, "sm_90", out)[:200], flush=True)


def measure(paths, out: Path, runs: int) -> None:
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, env = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flusher = L2Flusher()
    rows = []
    with stream:
        for path, i, j, one, reg, v in variants(paths, info):
            row = {"plan": path, "region": i, "stage": j, "ops": one["ops"],
                   "sms": one["stages"][0]["sms"], "tile_rows": one["stages"][0]["tile"]["rows"],
                   "teams": one.get("pipeline", {}).get("teams_per_sm")}
            try:
                v.prepare()
                chk = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
                t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flusher, poison_every=False)
                row.update(time_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s, correct=chk["correct"])
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            print(f"{Path(path).stem} r{i} s{j} {'+'.join(one['ops'])} on {row['sms']} SMs: "
                  + (f"{row['time_s'] * 1e6:.1f} us" if "time_s" in row else row["error"]), flush=True)
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
    out.mkdir(parents=True, exist_ok=True)
    (out / "stage_probe.json").write_text(json.dumps(
        {"env": env, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
         "command": "python3 bench/stage_probe.py --out $OUT " + " ".join(paths), "rows": rows}, indent=1))


def predict(path: Path, spec_path: str) -> None:
    from kitsune_dse.cost.pipeline import PipelineChoice, pipeline
    from kitsune_dse.cost.region import Region
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.plan import load_plan
    spec = load_spec(spec_path)
    data = json.loads(path.read_text())
    graphs = {}
    for r in data["rows"]:
        if r["plan"] not in graphs and r["plan"].startswith("model:"):
            graphs[r["plan"]] = load_model(r["plan"][len("model:"):], {})
        elif r["plan"] not in graphs:
            plan = load_plan(r["plan"])
            graphs[r["plan"]] = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        g = graphs[r["plan"]]
        ops = tuple(r["ops"])
        pred = pipeline(Region.of(g, ops), spec, PipelineChoice((ops,), (r["sms"],), r["tile_rows"],
                                                                 teams=r.get("teams"))).latency_s
        meas = r.get("time_s")
        err = f"{(pred / meas - 1) * 100:+6.1f}%" if meas else r.get("error", "")
        print(f"{Path(r['plan']).parent.parent.name}/{Path(r['plan']).stem:24s} r{r['region']} s{r['stage']} "
              f"{'+'.join(r['ops'])[:44]:44s} {r['sms']:4d} SMs r{r['tile_rows']:<5d} t{r.get('teams') or '-'} "
              f"meas {meas * 1e6 if meas else float('nan'):9.1f} us pred {pred * 1e6:9.1f} {err}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plans", nargs="*")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--predict", default="", help="a stage_probe.json to put the model beside")
    ap.add_argument("--hw", default=str(ROOT / "hw_specs/h100-sxm.calibrated.yaml"))
    a = ap.parse_args()
    if a.predict:
        predict(Path(a.predict), a.hw)
    elif a.precompile:
        precompile(a.plans)
    else:
        measure(a.plans, Path(a.out), a.runs)


if __name__ == "__main__":
    main()
