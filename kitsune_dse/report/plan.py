"""plan.json (schema kitsune-dse/plan/v1): writing, reading, checking and re-predicting plans.

A plan names the model (zoo name or path, sizes, content hash) and the GPU spec (name, SM count,
arch, content hash) it was made for, the regions in execution order with their strategy, their
kernels (fused groups), for a pipeline its stages (ops, SMs, CTAs, tile) and queues (producer,
consumer, tensors, slot bytes, depth, mode), and the predicted Estimate per region and in total.
The validation harness reads nothing else. `evaluate_plan` re-predicts a plan written or edited
by hand and names the region, stage or queue and the resource of any violation.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kitsune_dse.cost.estimate import Estimate
from kitsune_dse.cost.pipeline import PipelineChoice, pipeline, plan_stages, ring_bytes
from kitsune_dse.cost.region import Region, compose_sequential
from kitsune_dse.cost.strategies import (bsp, concurrent, fusion, fusion_groups, levels, tilesync)
from kitsune_dse.errors import InfeasibleError, KitsuneError
from kitsune_dse.graph.ir import Graph
from kitsune_dse.hw.spec import HwSpec

SCHEMA_ID = "kitsune-dse/plan/v1"
SCHEMA_FILE = Path(__file__).with_name("plan.schema.json")
STRATEGY_FUNCS = {"bsp": bsp, "fusion": fusion, "tilesync": tilesync, "concurrent": concurrent}


def graph_hash(graph: Graph) -> str:
    h = hashlib.sha256()
    for op in graph.ops:
        h.update(json.dumps([op.name, op.kind, list(op.inputs), list(op.outputs),
                             sorted((k, str(v)) for k, v in op.attrs.items())]).encode())
    for name in sorted(graph.tensors):
        t = graph.tensors[name]
        h.update(f"{name}:{t.shape}:{t.dtype}".encode())
    return h.hexdigest()[:16]


def estimate_dict(e: Estimate) -> dict:
    return {"latency_s": e.latency_s, "dram_read_bytes": e.dram_read_bytes,
            "dram_write_bytes": e.dram_write_bytes, "dram_bytes": e.dram_bytes,
            "dram_write_deferred_bytes": e.dram_deferred_write_bytes,
            "l2_bytes": e.l2_bytes, "kernel_launches": e.kernel_launches,
            "sm_busy_fraction": e.sm_busy_fraction}


def region_kernels(region: Region, strategy: str, choice=None) -> list[list[str]]:
    if strategy == "bsp":
        return [[o] for o in region.ops if not region.graph.op(o).info.is_view]
    if strategy == "concurrent":
        return [list(lv) for lv in levels(region)]
    if strategy == "pipeline" and choice is not None:
        return [list(s) for s in choice.stages]
    return [list(grp) for grp in fusion_groups(region)]


def region_dict(idx: int, region: Region, strategy: str, est: Estimate, choice, spec: HwSpec) -> dict:
    d = {"id": idx, "strategy": strategy, "ops": list(region.ops),
         "kernels": region_kernels(region, strategy, choice), "stages": [], "queues": [],
         "predicted": estimate_dict(est)}
    if strategy == "pipeline":
        plan = plan_stages(region, spec, choice)
        c = plan.choice
        b = est.breakdown
        for j, st in enumerate(c.stages):
            d["stages"].append({"id": j, "ops": list(st), "sms": c.sms[j], "ctas": c.sms[j],
                                "tile": {"rows": c.tile_rows, "slabs": plan.slabs},
                                "predicted_unit_latency_s": b["stage_tile_s"][j],
                                "servers": int(b["stage_servers"][j]),
                                "stall_s": b["stall_s"][j],
                                "predicted_end_s": b["stage_end_s"][j]})
        for q in range(len(c.stages) - 1):
            d["queues"].append({"producer": q, "consumer": q + 1,
                                "tensors": list(plan.queue_tensors[q]),
                                "slot_bytes": plan.slot_bytes[q] / plan.slabs,
                                "depth": c.depths[q] * plan.slabs, "mode": c.modes[q],
                                "mean_occupancy": b["queue_mean_occupancy"][q],
                                "max_occupancy": b["queue_max_occupancy"][q]})
        d["pipeline"] = {"row_blocks": plan.row_blocks, "slabs": plan.slabs,
                         # 256-thread teams per CTA the harness runs (cost.pipeline.solo_team_fits)
                         "teams_per_sm": b["teams_per_sm"],
                         "fill_s": b["fill_s"], "drain_s": b["drain_s"], "period_s": b["period_s"],
                         "bottleneck_stage": b["bottleneck_stage"],
                         "queue_bytes": b["queue_bytes"], "queue_spill_bytes": b["queue_spill_bytes"],
                         "queue_write_back_bytes": b["queue_write_back_bytes"],
                         "weight_reread_bytes": b["weight_reread_bytes"],
                         # what L2 holds over one ring cycle (the write-back grows with it), of
                         # which the kernel's spilled stack frames
                         "l2_footprint_bytes": b["l2_footprint_bytes"],
                         "l2_frame_bytes": b["l2_frame_bytes"]}
    return d


def build_plan(graph: Graph, model_ref: str, spec: HwSpec, regions: list[tuple], objective: str,
               solver: dict | None = None, baselines: dict[str, Estimate] | None = None) -> dict:
    """regions: [(ops, strategy, Estimate, PipelineChoice | None)] in execution order."""
    rdicts, ests = [], []
    for i, (ops, strat, est, choice) in enumerate(regions):
        rdicts.append(region_dict(i, Region.of(graph, ops), strat, est, choice, spec))
        ests.append((tuple(ops), est))
    total = compose_sequential(graph, spec, ests)
    return {
        "schema": SCHEMA_ID,
        "model": {"name": graph.name, "ref": model_ref, "sizes": dict(graph.meta.get("sizes", {})),
                  "hash": graph_hash(graph), "ops": len(graph.ops)},
        "hw": {"name": spec.name, "full_name": spec.full_name, "arch": spec.arch,
               "sm_count": spec.sm_count, "hash": spec.content_hash()},
        "objective": objective,
        "regions": rdicts,
        "predicted": estimate_dict(total),
        "baselines": {k: estimate_dict(v) for k, v in (baselines or {}).items()},
        "solver": solver or {},
    }


def read_plan(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KitsuneError("plan file not found", where=str(path)) from None
    except json.JSONDecodeError as e:
        raise KitsuneError(f"line {e.lineno}: not valid JSON: {e.msg}", where=str(path)) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_ID:
        raise KitsuneError(f"not a {SCHEMA_ID} plan (field 'schema' is "
                           f"{data.get('schema') if isinstance(data, dict) else None!r})",
                           where=str(path))
    for field in ("model", "hw", "regions"):
        if field not in data:
            raise KitsuneError(f"missing required field {field!r}", where=str(path))
    return data


def choice_from_region(rd: dict) -> PipelineChoice:
    stages = tuple(tuple(s["ops"]) for s in rd["stages"])
    sms = tuple(int(s["sms"]) for s in rd["stages"])
    tile = rd["stages"][0].get("tile", {}) if rd["stages"] else {}
    slabs = int(tile.get("slabs", 1)) or 1
    depths = tuple(max(1, int(q["depth"]) // slabs) for q in rd.get("queues", []))
    modes = tuple(q.get("mode", "row") for q in rd.get("queues", []))
    teams = (rd.get("pipeline") or {}).get("teams_per_sm")     # what the harness will run
    return PipelineChoice(stages, sms, int(tile.get("rows", 128)), depths, modes,
                          None if teams is None else int(teams))


def evaluate_plan(plan: dict, graph: Graph, spec: HwSpec, where: str = "plan") -> dict:
    """Check a (possibly hand-edited) plan against the graph and spec and predict it again.
    Returns a new plan dict with fresh predictions; violations raise InfeasibleError."""
    seen: dict[str, int] = {}
    regions = []
    for i, rd in enumerate(plan["regions"]):
        ops = rd.get("ops") or []
        strat = rd.get("strategy")
        label = f"{where}: region {i}"
        if strat not in (*STRATEGY_FUNCS, "pipeline"):
            raise InfeasibleError(f"{label}: unknown strategy {strat!r}")
        for o in ops:
            try:
                graph.op(o)
            except KitsuneError:
                raise InfeasibleError(f"{label}: op {o!r} is not in model {graph.name}") from None
            if o in seen:
                raise InfeasibleError(f"{label}: op {o!r} is already covered by region {seen[o]}")
            seen[o] = i
        regions.append((tuple(ops), strat, rd))
    missing = [o.name for o in graph.ops if o.name not in seen]
    if missing:
        raise InfeasibleError(f"{where}: ops not covered by any region: {', '.join(missing[:8])}"
                              + (" ..." if len(missing) > 8 else ""))
    for o in graph.ops:
        for p in graph.preds(o.name):
            if seen[p] > seen[o.name]:
                raise InfeasibleError(f"{where}: region {seen[o.name]} runs op {o.name!r} before "
                                      f"region {seen[p]} produces its input (from {p!r})")
    out = []
    for i, (ops, strat, rd) in enumerate(regions):
        region = Region.of(graph, ops)
        if strat == "pipeline":
            choice = choice_from_region(rd)
            try:
                sp = plan_stages(region, spec, choice)
            except InfeasibleError as e:
                raise InfeasibleError(f"{where}: region {i}: {e.what}") from None
            qb = ring_bytes(sp)
            if qb > spec.l2_usable_bytes:
                parts = ", ".join(f"queue {q} (stage {q} -> {q + 1}): {d} x {sb / 1e6:.3g} MB"
                                  for q, (d, sb) in enumerate(zip(sp.choice.depths, sp.slot_bytes)))
                raise InfeasibleError(f"{where}: region {i}: ring queues need {qb / 1e6:.4g} MB of "
                                      f"L2 ({parts}) but usable L2 of {spec.name} is "
                                      f"{spec.l2_usable_bytes / 1e6:.4g} MB")
            est = pipeline(region, spec, choice)
            out.append((ops, strat, est, sp.choice))
        else:
            out.append((ops, strat, STRATEGY_FUNCS[strat](region, spec), None))
    return build_plan(graph, plan["model"].get("ref", graph.name), spec, out,
                      plan.get("objective", "evaluate"), plan.get("solver"), None)
