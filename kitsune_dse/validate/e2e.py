"""A plan end to end: its regions back to back on shared tensors, over several placements of
those tensors, alternatives of one model taking turns."""
from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

from kitsune_dse.errors import KitsuneError
from kitsune_dse.validate.harness import (_fill_inputs, _timing_context, resolve_model_ref, whole_region,
                                          writes_in_run)
from kitsune_dse.validate.plan import check_target, load_plan

ADDRESS_SET_PAD = 1 << 21     # the device's page: a pad of k pages moves every tensor behind it


def address_pad_bytes(k: int) -> int:
    """The pad allocated before address set k's tensors: 0 for the first, then sizes that step
    through 2-MiB pages in a scattered order (2 to 194 MiB), so that each set lies on other
    pages and so other DRAM channels and L2 slices than the sets before it."""
    return 0 if k == 0 else ((k * 7919 + 13) % 97 + 1) * ADDRESS_SET_PAD


def validate_plan_e2e(plan_or_path, runs: int = 30, warmup: int = 3, timeout_s: float = 1.0,
                      checks: int = 2, console=None, command: str | None = None,
                      address_sets: int = 1) -> dict:
    """The plan end to end: every region's "plan" variant back to back on shared tensors (one
    stream, eager between regions, cold L2 at the start), checked against the whole graph's fp32
    reference. Returns one row (variant "plan-e2e"); see validate_plans_e2e."""
    return validate_plans_e2e([plan_or_path], runs, warmup, timeout_s, checks, command, address_sets)[0]


def validate_plans_e2e(plans, runs: int = 30, warmup: int = 3, timeout_s: float = 1.0, checks: int = 2,
                       command: str | None = None, address_sets: int = 1) -> list[dict]:
    """Several plans end to end (alternatives of one model), one "plan-e2e" row each.

    address_sets > 1: each plan's tensors are made that many times, each behind a pad of another
    size (address_pad_bytes), and its runs shared among them; the median is over all runs. The
    plans take turns set by set, so that a drift of the device's speed over the measurement
    reaches them alike. Where a plan's tensors lie, and when it runs, move its time by up to
    1.4% (bench/cut_probe.py: NeRF's MLP as one region, 1,392-1,411 us over five pads), as much
    as the alternatives of one workload can differ."""
    import cupy as cp

    from kitsune_dse.validate.measure import Timing, time_runs
    from kitsune_dse.validate.reference import input_roles

    stream, flusher = _timing_context()
    sets = max(1, int(address_sets))
    per_set = max(5, math.ceil(runs / sets))
    jobs = [_E2eJob(p, command) for p in plans]
    with stream:
        for k in range(sets):
            for job in jobs:
                if job.failed:
                    continue
                pad = cp.empty((address_pad_bytes(k),), dtype=cp.uint8)
                vs: list = []
                store: dict = {}
                try:
                    vs, store, inputs = e2e_variants(job.plan, job.graph, job.whole, job.info, timeout_s)
                    job.notes += [n for v in vs for n in v.notes]
                    if k == 0:
                        job.worst = _e2e_checks(vs, job.whole, store, inputs, stream, checks)
                    else:
                        _fill_inputs(job.whole, inputs, input_roles(job.whole))
                    t = time_runs(lambda s: [v.run(s) for v in vs], lambda poison=True: [v.pre(poison) for v in vs],
                                  lambda: [v.after() for v in vs], stream, per_set, warmup, flusher)
                    job.samples += list(t.samples_s)
                    job.medians.append(t.median_s)
                    job.launches = sum(v.launches_per_run for v in vs)
                except KitsuneError as e:
                    job.row.update(correct=False, error=str(e))
                    job.failed = True
                store.clear()
                vs.clear()
                del pad
                cp.get_default_memory_pool().free_all_blocks()
    for job in jobs:
        if job.failed:
            continue
        row, t = job.row, Timing.of(job.samples)
        row.update(correct=job.worst["correct"], rel_err=job.worst["rel_err"], max_rel_err=job.worst["max_rel_err"],
                   checks=checks, measured_latency_s=t.median_s, p10_latency_s=t.p10_s,
                   p90_latency_s=t.p90_s, runs=t.runs, kernel_launches=job.launches,
                   tflops=job.graph.total_flops / t.median_s / 1e12)
        if isinstance(row["predicted_latency_s"], (int, float)) and row["predicted_latency_s"] > 0:
            row["error_pct"] = 100.0 * (t.median_s - row["predicted_latency_s"]) / row["predicted_latency_s"]
        if sets > 1:
            job.notes.append(f"{sets} address sets: medians {min(job.medians) * 1e6:.1f}-"
                             f"{max(job.medians) * 1e6:.1f} us")
        row["notes"] = "; ".join(dict.fromkeys(job.notes))
    return [job.row for job in jobs]


class _E2eJob:
    """One plan of validate_plans_e2e: its row so far and its runs' samples."""

    def __init__(self, plan_or_path, command):
        from kitsune_dse.graph import load_model
        from kitsune_dse.validate.runtime import gpu_info
        plan = load_plan(plan_or_path) if not isinstance(plan_or_path, dict) else plan_or_path
        self.info, extra = gpu_info()
        self.plan, tnotes = check_target(plan, self.info, False)
        self.graph = load_model(resolve_model_ref(self.plan), self.plan["model"].get("sizes") or {})
        self.whole = whole_region(self.graph)
        pred = self.plan.get("predicted") or {}
        self.row = {"plan": Path(self.plan.get("_source", "plan")).stem,
                    "model": self.plan["model"].get("name", self.graph.name), "region": "all",
                    "strategy": "+".join(r["strategy"] for r in self.plan["regions"]),
                    "variant": "plan-e2e", "gpu": self.info.name, "sm_clock_mhz": extra.get("sm_clock_mhz", ""),
                    "driver": extra.get("driver_version"), "cupy": extra.get("cupy"),
                    "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "command": command or "", "predicted_latency_s": pred.get("latency_s", ""),
                    "predicted_dram_read_bytes": pred.get("dram_read_bytes", ""),
                    "predicted_dram_write_bytes": writes_in_run(pred)}
        self.notes: list[str] = list(tnotes)
        self.samples: list[float] = []
        self.medians: list[float] = []
        self.launches = 0
        self.worst = {"rel_err": 0.0, "max_rel_err": 0.0, "correct": True}
        self.failed = self.whole is None
        if self.failed:
            self.row.update(correct=False, error="the whole graph has tensors the harness cannot hold")


def e2e_variants(plan, graph, whole, info, timeout_s: float = 1.0, plain_launches: bool = False):
    """Each region's "plan" variant, prepared, on one store of shared tensors: (variants, the
    store, the whole graph's tensors on it). plain_launches: no CUDA graphs and no programmatic
    launches (ncu's range replay refuses both; the same kernels and tiles)."""
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors, TilesyncVariant, make_variants
    store: dict = {}

    class Shared(Tensors):
        def get(self, t):
            if t not in store:
                store[t] = super().get(t)
            return store[t]
    vs = []
    for region in plan["regions"]:
        reg = Region(graph, region, layouts=whole)
        v = make_variants(reg, region, Shared(reg), info, timeout_s, ["plan"])[0]
        if plain_launches and isinstance(v, TilesyncVariant):
            v.programmatic = False
        if plain_launches and isinstance(v, StandaloneVariant):
            v.graph_mode = False
        v.prepare()
        vs.append(v)
    return vs, store, Shared(whole)


def _e2e_checks(vs, whole, store, inputs_t, stream, checks) -> dict:
    """`checks` runs on fresh inputs, each against the whole graph's fp32 reference."""
    from kitsune_dse.validate.reference import compare, input_roles, reference, rounding_depth, to_logical
    roles = input_roles(whole)
    worst = {"rel_err": 0.0, "max_rel_err": 0.0, "correct": True}
    for _ in range(checks):
        _fill_inputs(whole, inputs_t, roles)
        for v in vs:
            v.pre(True)
        for v in vs:
            v.run(stream)
        stream.synchronize()
        for v in vs:
            v.after()
        ref = reference(whole, {t: inputs_t.get(t) for t in whole.inputs})
        for t in whole.outputs:
            c = compare(to_logical(whole, t, store[t]), ref[t], whole.dtype, rounding_depth(whole, t))
            worst["rel_err"] = max(worst["rel_err"], c["rel_err"])
            worst["max_rel_err"] = max(worst["max_rel_err"], c["max_rel_err"])
            worst["correct"] = worst["correct"] and c["correct"]
    return worst
