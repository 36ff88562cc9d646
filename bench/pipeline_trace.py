"""Per-unit timeline of pipeline regions: when each stage finished each row-block on the GPU,
against the queue model's departure times. A diagnostic of the pipeline model (issue 6): the
suite's stage ends say *that* a stage is late; this says from which unit on, and by how much.

    here:    python bench/pipeline_trace.py --prepare     # model departures + traced cubins
             [--plans 'bench/dram_probe/*split*.json' --targets bench/dram_probe/trace_targets.json]
    device:  python3 bench/pipeline_trace.py --run --out $OUT [--runs 10] [--targets ...]
    here:    python bench/pipeline_trace.py --report DIR  # table: measured vs model per unit

The traced kernel is the suite's persistent kernel plus one 64-bit atomicMax of %globaltimer per
(step, row-block) by each worker's thread 0 after its items of that row-block
(`layout_pipeline(trace=True)`). Times are from the kernel's first worker start.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

TARGETS = ROOT / "bench/suite/trace_targets.json"


def _targets(plans: str = "bench/suite/*/plans/*.json") -> list[tuple[str, int]]:
    """Every pipeline region of the plans (default the suite's), one per distinct (stages,
    SMs, tile, queues)."""
    out, seen = [], set()
    for p in sorted(glob.glob(str(ROOT / plans))):
        plan = json.load(open(p))
        for i, r in enumerate(plan["regions"]):
            if r["strategy"] != "pipeline":
                continue
            key = (Path(p).parts[-3], json.dumps(plan["model"].get("sizes"), sort_keys=True),
                   json.dumps([s["ops"] for s in r["stages"]]),
                   tuple(s["sms"] // 4 for s in r["stages"]), r["stages"][0]["tile"]["rows"],
                   tuple((q["depth"], q["mode"]) for q in r["queues"]))
            if key in seen:
                continue
            seen.add(key)
            out.append((str(Path(p).relative_to(ROOT)), i))
    return out


def model_departures(plan_path: str, ri: int) -> dict:
    """The queue model's view of one pipeline region (as cost.pipeline.pipeline times it)."""
    import numpy as np

    from kitsune_dse.cost.pipeline import pipe_tile, pipeline, plan_stages
    from kitsune_dse.cost.queues import simulate
    from kitsune_dse.cost.region import Region
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw.spec import load_spec
    from kitsune_dse.report.plan import choice_from_region
    from kitsune_dse.validate.harness import resolve_model_ref
    spec = load_spec(ROOT / "hw_specs/h100-sxm.calibrated.yaml")
    plan = json.load(open(ROOT / plan_path))
    plan["_source"] = str(ROOT / plan_path)
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    rd = plan["regions"][ri]
    region = Region.of(graph, [o for s in rd["stages"] for o in s["ops"]])
    choice = choice_from_region(rd)
    sp = plan_stages(region, spec, choice)
    est = pipeline(region, spec, choice)
    b = est.breakdown
    t, srv = np.array(b["stage_tile_s"]), np.array(b["stage_servers"])
    units = sp.row_blocks * sp.slabs
    depths = [d * sp.slabs for d in sp.choice.depths]
    sim = simulate(np.repeat((t * srv)[:, None], units, axis=1), depths, spec.sync_latency_s,
                   servers=srv, group=[sp.slabs] * len(depths))
    return {"plan": plan_path, "region": ri, "units": units, "slabs": sp.slabs,
            "rb_per_unit": max(1, sp.choice.tile_rows // pipe_tile(sp.choice.tile_rows)[0]),
            "sms": list(sp.choice.sms), "depths": list(sp.choice.depths), "servers": srv.tolist(),
            "unit_s": t.tolist(), "departures_s": sim.departures.tolist(),
            "predicted_latency_s": est.latency_s}


def prepare(precompile: bool = True, plans: str = "bench/suite/*/plans/*.json", targets: Path = TARGETS) -> None:
    rows = [model_departures(path, ri) for path, ri in _targets(plans)]
    targets.write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} pipeline regions -> {targets}")
    if precompile:
        _precompile(rows)


def _variant(row, info):
    """(Region, Tensors, traced PipelineVariant) of a target (no CuPy until prepared)."""
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.plan import check_target
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    plan = json.load(open(ROOT / row["plan"]))
    plan["_source"] = str(ROOT / row["plan"])
    plan, _ = check_target(plan, info, retarget=True)
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    rd = plan["regions"][row["region"]]
    reg = Region(graph, rd)
    t = Tensors(reg)
    return reg, t, PipelineVariant("plan", reg, t, info, rd, trace=True)


def _precompile(rows) -> None:
    import concurrent.futures as cf
    sys.path.insert(0, str(ROOT / "bench"))
    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", sm_count=132, arch="sm_90")
    srcs = [_variant(r, info)[2].build() for r in rows]
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    with cf.ThreadPoolExecutor(8) as ex:
        for msg in ex.map(lambda s: compile_one(s, "sm_90", out), srcs):
            print(msg.splitlines()[0])


def run(out: Path, runs: int, targets: Path = TARGETS) -> None:
    import cupy as cp

    from kitsune_dse.validate.harness import _fill_inputs
    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    res = []
    for row in json.loads(targets.read_text()):
        try:
            reg, tensors, v = _variant(row, info)
            with stream:
                v.prepare()
                _fill_inputs(reg, tensors, input_roles(reg))
                traces, ends, walls = [], [], []
                for k in range(runs + 2):
                    v.pre(poison=False)
                    flush(stream)
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(stream)
                    v.run(stream)
                    e1.record(stream)
                    e1.synchronize()
                    v.after()
                    if k >= 2:      # two warm-up runs
                        traces.append(v.placement["step_rb_done_us"])
                        ends.append(v.placement["stage_end_us"])
                        walls.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
            med = [[statistics.median(tr[s][b] for tr in traces) for b in range(len(traces[0][s]))]
                   for s in range(len(traces[0]))]
            res.append({**row, "step_stage": v.placement["step_stage"], "step_rb_done_us": med,
                        "stage_end_us": [statistics.median(e[j] for e in ends) for j in range(len(ends[0]))],
                        "wall_us": statistics.median(walls), "bm": v.layout.bm})
            print(f"{row['plan']} r{row['region']}: {statistics.median(walls):.1f} us "
                  f"(predicted {row['predicted_latency_s'] * 1e6:.1f})", flush=True)
        except Exception as e:  # noqa: BLE001 - one broken target must not lose the others
            print(f"{row['plan']} r{row['region']}: ERROR {e}", flush=True)
        finally:
            cp.get_default_memory_pool().free_all_blocks()
    out.mkdir(parents=True, exist_ok=True)
    (out / "pipeline_trace.json").write_text(json.dumps(res, indent=1))


def report(path: Path) -> None:
    """Measured unit completions against the model as it is now (re-timed here)."""
    res = json.loads((path / "pipeline_trace.json").read_text() if path.is_dir() else path.read_text())
    errs = []
    for r in res:
        plan = json.load(open(ROOT / r["plan"]))
        if r["region"] >= len(plan["regions"]) or plan["regions"][r["region"]]["strategy"] != "pipeline":
            print(f"\n{r['plan']} region {r['region']}: no longer a pipeline region (plans re-made)")
            continue
        r = {**r, **model_departures(r["plan"], r["region"])}
        errs.append(abs(r["predicted_latency_s"] * 1e6 - r["wall_us"]) / r["wall_us"])
        print(f"\n{r['plan']} region {r['region']}: sms {r['sms']} depths {r['depths']} units {r['units']} "
              f"(slabs {r['slabs']}), wall {r['wall_us']:.1f} us, predicted {r['predicted_latency_s'] * 1e6:.1f}")
        dep = r["departures_s"]
        rpu, slabs, units = r["rb_per_unit"], r["slabs"], r["units"]
        last = {}
        for s, st in enumerate(r["step_stage"]):
            last[st] = s                     # the stage's last step ends its units
        for j, s in sorted(last.items()):
            done = r["step_rb_done_us"][s]
            n_units = units // slabs
            # a unit of tile_rows rows is done when its last runtime row-block is
            meas = [max(done[u * rpu:(u + 1) * rpu]) for u in range(n_units)]
            pred = [dep[j][u * slabs + slabs - 1] * 1e6 for u in range(n_units)]
            pick = sorted(set([0, 1, n_units // 2, n_units - 1]) & set(range(n_units)))
            cells = "  ".join(f"u{u}: {meas[u]:7.1f}/{pred[u]:7.1f}" for u in pick)
            print(f"  stage {j} on {r['sms'][j]:3d} SMs x{r['servers'][j]}, unit {r['unit_s'][j] * 1e6:6.2f} us model; "
                  f"done measured/model: {cells}; end {r['stage_end_us'][j]:.1f}")
    print(f"\nregion latency, model against the traced runs: MAPE {100 * sum(errs) / len(errs):.1f}% "
          f"over {len(errs)} regions")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--report", type=Path)
    ap.add_argument("--plans", default="bench/suite/*/plans/*.json", help="plan files to trace (--prepare)")
    ap.add_argument("--targets", type=Path, default=TARGETS, help="the targets file --prepare writes, --run reads")
    a = ap.parse_args()
    if a.prepare:
        prepare(not a.no_precompile, a.plans, a.targets)
    if a.run:
        run(a.out or Path("."), a.runs, a.targets)
    if a.report:
        report(a.report)


if __name__ == "__main__":
    main()
