"""`explore`: the product's main job, as a Python API the CLI wraps.

graph + spec -> candidates (cost tables) -> CP-SAT plan -> candidates.csv, plan.csv, plan.json,
strategies.csv (+ plan-2.json ... for alternatives). Folder checks happen before any work and
every file is written atomically, so a bad --out leaves nothing behind.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kitsune_dse.cost.compare import compare, compare_rows
from kitsune_dse.cost.estimate import Estimate
from kitsune_dse.errors import KitsuneError
from kitsune_dse.graph import load_model
from kitsune_dse.graph.ir import Graph
from kitsune_dse.hw.spec import HwSpec, load_spec, spec_with_overrides
from kitsune_dse.report.io import prepare_out_dir, write_csv, write_json
from kitsune_dse.report.plan import build_plan

OBJECTIVES = ("latency", "traffic", "pareto")

CANDIDATE_COLUMNS = ["candidate_id", "region_ops", "n_ops", "strategy", "stages", "sms_per_stage",
                     "tile_rows", "queue_depths", "queue_modes", "latency_s", "dram_read_bytes",
                     "dram_write_bytes", "dram_bytes", "kernel_launches", "chosen"]
PLAN_COLUMNS = ["region_id", "strategy", "region_ops", "stage_id", "stage_ops", "sms", "tile_rows",
                "queue_depth_out", "queue_mode_out", "latency_s", "dram_read_bytes",
                "dram_write_bytes", "kernel_launches"]
STRATEGY_COLUMNS = ["strategy", "latency_s", "dram_read_bytes", "dram_write_bytes", "dram_bytes",
                    "kernel_launches", "speedup_vs_bsp", "dram_change_vs_bsp", "sm_busy_fraction"]


@dataclass
class ExploreResult:
    graph: Graph
    spec: HwSpec
    plan: dict
    strategies: list[dict]
    out_dir: Path | None
    files: list[Path] = field(default_factory=list)
    solver: object = None
    alternatives: list[dict] = field(default_factory=list)


def default_out_dir(graph: Graph, spec: HwSpec) -> Path:
    return Path("results") / f"{graph.name}__{spec.name}"


def _cand_row(c, chosen_ids) -> dict:
    ch = c.choice
    return {"candidate_id": c.id, "region_ops": list(c.ops), "n_ops": len(c.ops),
            "strategy": c.strategy,
            "stages": ["+".join(s) for s in ch.stages] if ch is not None else "",
            "sms_per_stage": list(ch.sms) if ch is not None else "",
            "tile_rows": ch.tile_rows if ch is not None else "",
            "queue_depths": list(ch.depths) if ch is not None else "",
            "queue_modes": list(ch.modes) if ch is not None else "",
            "latency_s": c.estimate.latency_s, "dram_read_bytes": c.estimate.dram_read_bytes,
            "dram_write_bytes": c.estimate.dram_write_bytes, "dram_bytes": c.estimate.dram_bytes,
            "kernel_launches": c.estimate.kernel_launches, "chosen": c.id in chosen_ids}


def plan_rows(plan: dict) -> list[dict]:
    rows = []
    for r in plan["regions"]:
        p = r["predicted"]
        base = {"region_id": r["id"], "strategy": r["strategy"], "region_ops": r["ops"]}
        if r["stages"]:
            for s in r["stages"]:
                q = r["queues"][s["id"]] if s["id"] < len(r["queues"]) else None
                rows.append({**base, "stage_id": s["id"], "stage_ops": s["ops"], "sms": s["sms"],
                             "tile_rows": s["tile"]["rows"],
                             "queue_depth_out": q["depth"] if q else "",
                             "queue_mode_out": q["mode"] if q else "",
                             "latency_s": p["latency_s"], "dram_read_bytes": p["dram_read_bytes"],
                             "dram_write_bytes": p["dram_write_bytes"],
                             "kernel_launches": p["kernel_launches"]})
        else:
            rows.append({**base, "stage_id": "", "stage_ops": "", "sms": "", "tile_rows": "",
                         "queue_depth_out": "", "queue_mode_out": "", "latency_s": p["latency_s"],
                         "dram_read_bytes": p["dram_read_bytes"],
                         "dram_write_bytes": p["dram_write_bytes"],
                         "kernel_launches": p["kernel_launches"]})
    return rows


def _plan_from_result(graph, model_ref, spec, res, objective, baselines) -> dict:
    regions = [(c.ops, c.strategy, c.estimate, c.choice) for c in res.chosen]
    solver = {"status": res.status, "gap": res.gap, "wall_s": round(res.wall_s, 3),
              "objective": objective}
    return build_plan(graph, model_ref, spec, regions, objective, solver, baselines)


def explore(model: str, hw: str | HwSpec, *, out: str | Path | None = None,
            sets: dict[str, int] | None = None, objective: str = "latency",
            sm_granularity: int = 1, time_limit_s: float = 10.0, alternatives: int = 0,
            hw_set: dict[str, str] | None = None, write: bool = True, plots: bool = True,
            progress=None) -> ExploreResult:
    from kitsune_dse.search import build_candidates, solve
    if objective not in OBJECTIVES:
        raise KitsuneError(f"--objective {objective!r}: choose one of {', '.join(OBJECTIVES)}")
    if time_limit_s is None or not time_limit_s > 0:
        raise KitsuneError(f"--time-limit {time_limit_s}: must be a positive number of seconds")
    if sm_granularity is None or sm_granularity < 1:
        raise KitsuneError(f"--sm-granularity {sm_granularity}: must be a positive integer")
    if alternatives < 0:
        raise KitsuneError(f"--alternatives {alternatives}: must be >= 0")
    spec = base_spec = load_spec(hw)
    if hw_set:
        spec = spec_with_overrides(spec, hw_set)
    graph = load_model(model, sets or {})
    out_dir = None
    if write:
        out_dir = prepare_out_dir(Path(out) if out else default_out_dir(graph, spec))
    t0 = time.perf_counter()
    cands = build_candidates(graph, spec, sm_granularity=sm_granularity, progress=progress)
    res = solve(cands, objective=objective, time_limit_s=time_limit_s,
                sm_granularity=sm_granularity, alternatives=alternatives)
    whole = _whole_model_strategies(cands, graph, spec)
    baselines = {k: whole[k] for k in ("bsp", "fusion")}
    plan = _plan_from_result(graph, str(model), spec, res, objective, baselines)
    plan["solver"]["explore_wall_s"] = round(time.perf_counter() - t0, 3)
    rows = compare_rows({**whole, "plan": Estimate(
        latency_s=plan["predicted"]["latency_s"], dram_read_bytes=plan["predicted"]["dram_read_bytes"],
        dram_write_bytes=plan["predicted"]["dram_write_bytes"],
        kernel_launches=plan["predicted"]["kernel_launches"],
        sm_busy_fraction=plan["predicted"]["sm_busy_fraction"])})
    alts = [_plan_from_result(graph, str(model), spec, a, objective, baselines)
            for a in getattr(res, "alternatives", [])[:alternatives]]
    result = ExploreResult(graph, spec, plan, rows, out_dir, solver=res, alternatives=alts)
    if write:
        chosen_ids = {c.id for c in res.chosen}
        files = {
            "candidates.csv": lambda p: write_csv(p, [_cand_row(c, chosen_ids) for c in cands.candidates],
                                                  CANDIDATE_COLUMNS),
            "plan.csv": lambda p: write_csv(p, plan_rows(plan), PLAN_COLUMNS),
            "plan.json": lambda p: write_json(p, _stable(plan)),
            "strategies.csv": lambda p: write_csv(p, rows, STRATEGY_COLUMNS),
        }
        for k, alt in enumerate(alts, start=2):
            files[f"plan-{k}.json"] = (lambda a: lambda p: write_json(p, _stable(a)))(alt)
        if objective == "pareto":
            pareto = [_plan_from_result(graph, str(model), spec, r, objective, baselines)
                      for r in getattr(res, "pareto", [])]
            files["pareto.csv"] = lambda p: write_csv(p, [
                {"plan": i, "latency_s": pl["predicted"]["latency_s"],
                 "dram_bytes": pl["predicted"]["dram_bytes"],
                 "strategies": [r["strategy"] for r in pl["regions"]]} for i, pl in enumerate(pareto)],
                ["plan", "latency_s", "dram_bytes", "strategies"])
        if hw_set:
            files["hw_spec.yaml"] = lambda p: write_whatif_spec(p, base_spec, spec, hw_set)
        if plots:
            files.update(_picture_writers(plan, rows, cands, alts, spec, graph))
        for name, writer in files.items():
            writer(out_dir / name)
            result.files.append(out_dir / name)
        # a run with fewer alternatives than the last one in this folder must not leave the
        # last one's extra plan-N.json behind, read as this run's
        for old in out_dir.glob("plan-*.json"):
            if old.stem[5:].isdigit() and old.name not in files:
                old.unlink()
    return result


def _picture_writers(plan, rows, cands, alts, spec, graph) -> dict:
    from kitsune_dse.report.plots import pareto_png, plan_png, strategies_png
    from kitsune_dse.report.timeline import plan_timeline
    from kitsune_dse.report.trace import trace_events
    tl = plan_timeline(plan, spec, graph)
    title = f"{plan['model']['name']} on {plan['hw']['name']}"
    return {
        "pareto.png": lambda p: pareto_png(p, plan, rows, cands.candidates, alts),
        "plan.png": lambda p: plan_png(p, tl, f"{title}: chosen plan over time "
                                              f"({plan['predicted']['latency_s'] * 1e6:,.1f} µs)"),
        "strategies.png": lambda p: strategies_png(p, f"{title}: whole model under each strategy", rows),
        "trace.json": lambda p: write_json(p, trace_events(tl, title)),
    }


def write_whatif_spec(path: Path, base: HwSpec, spec: HwSpec, overrides: dict[str, str]) -> None:
    """The modified spec, its differences from the base listed at the top."""
    import yaml
    from kitsune_dse.report.io import atomic_write_text
    a, b = base.model_dump(mode="json"), spec.model_dump(mode="json")
    diffs = []
    for k in b:
        if isinstance(b[k], dict) and isinstance(a.get(k), dict):
            diffs += [f"{k}.{k2}: {a[k].get(k2)} -> {v2}" for k2, v2 in b[k].items() if a[k].get(k2) != v2]
        elif a.get(k) != b[k]:
            diffs.append(f"{k}: {a.get(k)} -> {b[k]}")
    head = [f"# what-if variant of {base.name} (--hw-set {' '.join(f'{k}={v}' for k, v in overrides.items())})",
            "# differences from the base spec (SI units):"] + [f"#   {d}" for d in diffs]
    atomic_write_text(path, "\n".join(head) + "\n" + yaml.safe_dump(b, sort_keys=False))


def _whole_model_strategies(cands, graph, spec) -> dict[str, Estimate]:
    """Each single strategy over the whole model: the candidate set already holds their covers
    (the same estimates compare() makes), so only bsp-eager is costed here."""
    from kitsune_dse.cost.estimate import sequential
    from kitsune_dse.cost.region import Region
    from kitsune_dse.cost.strategies import LaunchChoice, bsp
    base = getattr(cands, "baselines", None) or {}
    if not all(k in base for k in ("bsp", "fusion", "tilesync", "concurrent", "pipeline")):
        return compare(graph, spec)
    out = {"bsp": sequential([cands.candidates[i].estimate for i in base["bsp"]]),
           "bsp-eager": bsp(Region.of(graph), spec, LaunchChoice("eager"))}
    for k in ("fusion", "tilesync", "concurrent", "pipeline"):
        out[k] = sequential([cands.candidates[i].estimate for i in base[k]])
    return out


def _stable(plan: dict) -> dict:
    """Drop wall-clock fields so re-runs give byte-identical files (timings go to the terminal)."""
    p = dict(plan)
    p["solver"] = {k: v for k, v in plan.get("solver", {}).items() if not k.endswith("wall_s")}
    return p
