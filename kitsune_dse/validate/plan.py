"""Reading a plan file (schema kitsune-dse/plan/v1) for the harness, and retargeting it.

Only the fields the harness needs are checked; an unknown or missing one is a KitsuneError naming
the file and the field. No CuPy here.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kitsune_dse.errors import KitsuneError

SCHEMA = "kitsune-dse/plan/v1"
STRATEGIES = ("pipeline", "bsp", "fusion", "tilesync", "concurrent")
QUEUE_MODES = ("row", "split_k")


def load_plan(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise KitsuneError("plan file not found", where=str(p))
    try:
        plan = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise KitsuneError(f"not valid JSON ({e.msg} at line {e.lineno})", where=str(p)) from None
    check_plan(plan, str(p))
    plan.setdefault("_source", str(p))
    return plan


def _need(d: dict, key: str, where: str, typ=None):
    if not isinstance(d, dict) or key not in d:
        raise KitsuneError(f"missing required field {key!r}", where=where)
    v = d[key]
    if typ is not None and not isinstance(v, typ):
        raise KitsuneError(f"field {key!r} must be {getattr(typ, '__name__', typ)}", where=where)
    return v


def check_plan(plan: dict, where: str = "<plan>") -> None:
    if not isinstance(plan, dict):
        raise KitsuneError("a plan must be a JSON object", where=where)
    schema = plan.get("schema")
    if schema != SCHEMA:
        raise KitsuneError(f"schema is {schema!r}, this harness reads {SCHEMA!r}", where=where)
    model = _need(plan, "model", where, dict)
    _need(model, "ref", f"{where}: model", str)
    if not isinstance(model.get("sizes", {}), dict):
        raise KitsuneError("field 'model.sizes' must be a mapping", where=where)
    hw = _need(plan, "hw", where, dict)
    _need(hw, "sm_count", f"{where}: hw", int)
    regions = _need(plan, "regions", where, list)
    if not regions:
        raise KitsuneError("field 'regions' is empty", where=where)
    for i, r in enumerate(regions):
        w = f"{where}: regions[{i}]"
        strat = _need(r, "strategy", w, str)
        if strat not in STRATEGIES:
            raise KitsuneError(f"strategy {strat!r} is not one of {', '.join(STRATEGIES)}", where=w)
        ops = _need(r, "ops", w, list)
        if not ops:
            raise KitsuneError("field 'ops' is empty", where=w)
        for g in r.get("kernels", []) or []:
            if not isinstance(g, list) or not all(isinstance(o, str) for o in g):
                raise KitsuneError("field 'kernels' must be a list of lists of op names", where=w)
            for o in g:
                if o not in ops:
                    raise KitsuneError(f"kernel group names op {o!r}, which is not in the region's ops", where=w)
        if strat == "pipeline":
            stages = _need(r, "stages", w, list)
            if not stages:
                raise KitsuneError("a pipeline region needs at least one stage", where=w)
            seen: set[str] = set()
            for j, s in enumerate(stages):
                ws = f"{w}.stages[{j}]"
                sops = _need(s, "ops", ws, list)
                sms = _need(s, "sms", ws, int)
                ctas = s.get("ctas", sms)
                if sms <= 0 or not isinstance(ctas, int) or ctas <= 0:
                    raise KitsuneError("sms and ctas must be positive integers", where=ws)
                for o in sops:
                    if o not in ops:
                        raise KitsuneError(f"op {o!r} is not in the region's ops", where=ws)
                    if o in seen:
                        raise KitsuneError(f"op {o!r} is in two stages", where=ws)
                    seen.add(o)
            missing = [o for o in ops if o not in seen]
            if missing:
                raise KitsuneError(f"ops {missing} are in no stage", where=w)
            for j, q in enumerate(r.get("queues", []) or []):
                wq = f"{w}.queues[{j}]"
                for k in ("producer", "consumer"):
                    _need(q, k, wq)
                # an empty list is valid: neighbouring stages that share no tensor (two
                # branches of the region placed side by side) still have a queue position
                if "tensors" not in q and "tensor" not in q:
                    raise KitsuneError("missing required field 'tensors'", where=wq)
                for k in ("producer", "consumer"):
                    if not isinstance(q[k], int) or not 0 <= q[k] < len(stages):
                        raise KitsuneError(f"{k} {q[k]!r} is not a stage index", where=wq)
                if q.get("mode", "row") not in QUEUE_MODES:
                    raise KitsuneError(f"mode {q.get('mode')!r} is not one of {', '.join(QUEUE_MODES)}", where=wq)
                if int(q.get("depth", 2)) < 1:
                    raise KitsuneError("depth must be >= 1", where=wq)


@dataclass(frozen=True)
class DeviceInfo:
    """What the harness needs to know of the GPU (filled from CuPy, or by tests)."""
    name: str
    arch: str            # "sm_90"
    sm_count: int
    smem_per_sm: int = 233472
    smem_per_block_optin: int = 232448
    l2_bytes: int = 50 * 2**20


def check_target(plan: dict, dev: DeviceInfo, retarget: bool = False) -> tuple[dict, list[str]]:
    """Refuse a plan made for another SM count or arch unless `retarget`, which rescales every
    pipeline stage's SM (and CTA) count proportionally, keeping the sum within the device.
    Returns (plan to run, notes)."""
    hw = plan["hw"]
    p_sms, p_arch = int(hw["sm_count"]), str(hw.get("arch", dev.arch))
    notes: list[str] = []
    mismatch = p_sms != dev.sm_count or p_arch != dev.arch
    if mismatch and not retarget:
        raise KitsuneError(
            f"the plan was made for {hw.get('name', '?')} ({p_arch}, {p_sms} SMs) but this device is "
            f"{dev.name} ({dev.arch}, {dev.sm_count} SMs); make a plan for this GPU, or pass "
            f"--retarget to rescale the SM allocation proportionally")
    out = copy.deepcopy(plan)
    if mismatch:
        notes.append(f"retargeted from {p_arch}/{p_sms} SMs to {dev.arch}/{dev.sm_count} SMs")
        for r in out["regions"]:
            if r["strategy"] != "pipeline":
                continue
            retarget_stages(r["stages"], p_sms, dev.sm_count)
    for i, r in enumerate(out["regions"]):
        if r["strategy"] == "pipeline":
            total = sum(int(s["sms"]) for s in r["stages"])
            if total > dev.sm_count:
                raise KitsuneError(f"region {r.get('id', i)}: its stages take {total} SMs, the device "
                                   f"has {dev.sm_count}")
    return out, notes


def retarget_stages(stages: list[dict], from_sms: int, to_sms: int) -> None:
    """Scale each stage's sms (and ctas, keeping its ctas/sms ratio) by to/from, at least 1 each,
    then trim the largest stages until the sum fits `to_sms` (in place)."""
    f = to_sms / from_sms
    for s in stages:
        ratio = s.get("ctas", s["sms"]) / s["sms"]
        s["sms"] = max(1, int(math.floor(s["sms"] * f)))
        s["ctas"] = max(1, int(round(s["sms"] * ratio)))
    while sum(s["sms"] for s in stages) > to_sms:
        big = max(stages, key=lambda s: s["sms"])
        if big["sms"] <= 1:
            raise KitsuneError(f"{len(stages)} stages cannot fit {to_sms} SMs")
        ratio = big["ctas"] / big["sms"]
        big["sms"] -= 1
        big["ctas"] = max(1, int(round(big["sms"] * ratio)))
