"""Every strategy applied to a whole model, for `kitsune-dse compare`.

bsp, fusion, tilesync and concurrent apply to the whole graph as one region. The pipeline
strategy cuts the graph where tiles cannot stream (a gather or full dependency) into segments,
and pipelines each segment with the best stage split a small exhaustive search finds (stage
cuts between fused groups, SMs balanced per stage, tile rows, row or split-K queues). The real
solver (kitsune_dse.search) searches regions and strategies jointly; this is the baseline view.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from kitsune_dse.cost.estimate import Estimate
from kitsune_dse.cost.pipeline import (PipelineChoice, pipeline, plan_stages,
                                      prefetch_stage_schedules, stage_tables)
from kitsune_dse.cost.region import Region, compose_sequential
from kitsune_dse.cost.strategies import (LaunchChoice, bsp, concurrent, fusion, fusion_groups,
                                         split_sms, tilesync)
from kitsune_dse.errors import InfeasibleError
from kitsune_dse.graph.ir import Graph
from kitsune_dse.hw.spec import HwSpec

TILE_ROWS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
MAX_STAGES = 4
MAX_ATOMS_PER_PIPELINE = 6


def stream_segments(graph: Graph, ops=None) -> list[tuple[str, ...]]:
    """Contiguous runs of ops (topological order) between which tiles cannot stream."""
    names = [o.name for o in graph.ops] if ops is None else list(ops)
    segs: list[list[str]] = []
    cur: list[str] = []
    cur_set: set[str] = set()
    for o in names:
        op = graph.op(o)
        blocked = any(graph.producer(t) in cur_set and not pat.streamable
                      for t, pat in op.info.patterns.items())
        if blocked and cur:
            segs.append(cur)
            cur, cur_set = [], set()
        cur.append(o)
        cur_set.add(o)
    if cur:
        segs.append(cur)
    return [tuple(s) for s in segs]


def _compositions(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0,) + cuts + (n,)
        yield [(b[i], b[i + 1]) for i in range(k)]


def balance_sms(region: Region, spec: HwSpec, choice: PipelineChoice, step: int = 1,
                total: int | None = None) -> PipelineChoice | None:
    r = balanced(region, spec, choice, step, total)
    return r[0] if r else None


def balanced(region: Region, spec: HwSpec, choice: PipelineChoice, step: int = 1,
             total: int | None = None) -> tuple[PipelineChoice, Estimate] | None:
    """Give each stage the SMs that minimise the slowest stage's time per tile."""
    J = len(choice.stages)
    total = spec.sm_count if total is None else total
    probe = _probe(spec, choice, step, total)
    if probe is None:
        return None
    plan = plan_stages(region, spec, probe)
    tab, srv, _ = stage_tables(region, spec, plan)
    if J == 1:
        one = PipelineChoice(choice.stages, (total,), choice.tile_rows, choice.depths, choice.modes)
        est = pipeline(region, spec, one)
        # a several-step stage's worker schedule is not monotone in its workers (a round robin
        # of uneven steps: a small MLP's three-step stage ran 24.0 us on 88 SMs, 24.2 on 89):
        # the stage may leave SMs idle where fewer give a shorter unit time
        counts = np.arange(step, total + 1, step)     # not empty: _probe checked step <= total
        fewest = int(counts[np.argmin(tab[0][counts])])
        if tab[0][fewest] < tab[0][total] * (1 - 1e-9):
            fewer = PipelineChoice(choice.stages, (fewest,), choice.tile_rows, choice.depths, choice.modes)
            e2 = pipeline(region, spec, fewer)
            if e2.latency_s < est.latency_s:
                one, est = fewer, e2
        return one, est
    _, split = split_sms([tab[j] for j in range(J)], total, step)
    if not split:
        return None
    # split_sms gives each stage the fewest SMs that meet the bottleneck time; then improve the
    # solver's closed-form makespan (candidates.closed_form_span: each stage's unit latency, its
    # servers x its unit time, once, then units - 1 periods): hand out leftover SMs and move SMs
    # between stages while that helps (the queue model re-times the result exactly)
    split = _tune_split(tab.tolist(), split, total, step, plan.row_blocks * plan.slabs,
                        (tab * srv).tolist())
    # the closed form ignores DRAM sharing and tile re-picks: check against an even split with
    # the exact model and keep the better
    tuned = PipelineChoice(choice.stages, tuple(split), choice.tile_rows, choice.depths, choice.modes)
    even = PipelineChoice(choice.stages, tuple(_even_split(total, J, step)), choice.tile_rows,
                          choice.depths, choice.modes)
    est = pipeline(region, spec, tuned)
    if even.sms != tuned.sms and all(s >= step for s in even.sms):
        e2 = pipeline(region, spec, even)
        if e2.latency_s < est.latency_s:
            tuned, est = even, e2
    # a stage's time is not monotone in its SMs where its servers change (a row-block's items
    # filling its workers 1.5 times: two row-blocks side by side, the first one's latency
    # doubled): leave a step of SMs idle while the exact model says that is faster (a 26-SM
    # spec: 2 + 24 SMs 20.57 us, 1 + 24 20.52)
    for _ in range(J):
        drops = [PipelineChoice(tuned.stages, tuple(s - step if k == j else s for k, s in enumerate(tuned.sms)),
                                tuned.tile_rows, tuned.depths, tuned.modes)
                 for j in range(J) if tuned.sms[j] - step >= step]
        best = min(((pipeline(region, spec, c), c) for c in drops), key=lambda ec: ec[0].latency_s,
                   default=None)
        if best is None or best[0].latency_s >= est.latency_s:
            break
        est, tuned = best
    return tuned, est


def _tune_split(rows: list[list[float]], split, total: int, step: int, units: int,
                lats: list[list[float]] | None = None) -> list[int]:
    """Hand out leftover SMs and move SMs between stages while the closed-
    form makespan improves: sum(l) - min(l - t) + (units - 1) * max(t), rows[k][s] stage k's
    time per unit and lats[k][s] its unit latency on s SMs (default: the time; then it is
    sum(t) + (units - 1) * max(t)); each round takes the best move (the first of equals) of
    1, 2, 4, ... steps: growing stage j, then moving SMs from stage i to stage j, j and i in
    order."""
    J = len(split)
    w = units - 1
    lats = rows if lats is None else lats

    def cost(ts, ls):
        # as sum(ls) - min(l - t) + w * max(ts), one by one in order (sum() adds NumPy values
        # never compensated; min and max keep the first of equals)
        acc = 0 + ls[0]
        low = ls[0] - ts[0]
        top = ts[0]
        for k in range(1, J):
            acc = acc + ls[k]
            d = ls[k] - ts[k]
            if d < low:
                low = d
            if ts[k] > top:
                top = ts[k]
        return acc - low + w * top

    split = list(split)
    best = cost([rows[k][s] for k, s in enumerate(split)], [lats[k][s] for k, s in enumerate(split)])
    # moves of 1, 2, 4, ... steps: a stage's servers change at SM counts where one step alone
    # can look worse than two (a 100-SM spec: 98 + 2 SMs, one server more on the first stage,
    # priced 62.5 us, 97 + 3 worse still, 96 + 4 54.9; one-step moves stopped at 98 + 2)
    sizes = [step << e for e in range(max(1, total // step).bit_length())]
    for _ in range(4 * total // step + 8):
        bar = best * (1 - 1e-12)
        trial = None
        now_t = [rows[k][s] for k, s in enumerate(split)]
        now_l = [lats[k][s] for k, s in enumerate(split)]
        for m in sizes:
            # each stage's time and latency m SMs more and m less (a move changes one or two)
            up = [(rows[k][s + m], lats[k][s + m]) if s + m < len(rows[k]) else None
                  for k, s in enumerate(split)]
            down = [(rows[k][s - m], lats[k][s - m]) if s - m >= step else None
                    for k, s in enumerate(split)]
            if sum(split) + m <= total:
                for j in range(J):
                    if up[j] is None:
                        continue
                    ts, ls = now_t.copy(), now_l.copy()
                    ts[j], ls[j] = up[j]
                    c = cost(ts, ls)
                    if c < bar and (trial is None or c < trial[0]):
                        trial = (c, j, None, m)
            for j in range(J):
                if up[j] is None:
                    continue
                for i in range(J):
                    if i != j and down[i] is not None:
                        ts, ls = now_t.copy(), now_l.copy()
                        ts[j], ls[j] = up[j]
                        ts[i], ls[i] = down[i]
                        c = cost(ts, ls)
                        if c < bar and (trial is None or c < trial[0]):
                            trial = (c, j, i, m)
        if trial is None:
            break
        best, j, i, m = trial
        split[j] += m
        if i is not None:
            split[i] -= m
    return split


def _even_split(total: int, parts: int, step: int) -> list[int]:
    base = (total // parts) // step * step
    out = [base] * parts
    k = 0
    while sum(out) + step <= total:
        out[k % parts] += step
        k += 1
    return out


@dataclass(frozen=True)
class PipelineCandidate:
    region: Region
    choice: PipelineChoice
    estimate: Estimate


def pipeline_candidates(region: Region, spec: HwSpec, step: int = 1, max_stages: int = MAX_STAGES,
                        depths=(2,)):
    """Every stage split of a streamable region (cuts between fused groups), each with balanced
    SMs, for each tile size, queue mode and depth; infeasible ones are skipped."""
    return priced_candidates(region, spec, pipeline_bases(region, max_stages, depths), step)


def pipeline_bases(region: Region, max_stages: int = MAX_STAGES, depths=(2,)) -> list:
    """The choices pipeline_candidates balances and prices, in its order (SMs still 1 each)."""
    g = region.graph
    atoms = [a for a in fusion_groups(region)]
    rows_first = g.tensors[g.op(region.ops[0]).outputs[0]].rows
    tile_opts = sorted({min(t, max(1, rows_first)) for t in TILE_ROWS})
    bases = []
    for k in range(1, min(max_stages, len(atoms)) + 1):
        for comp in _compositions(len(atoms), k):
            stages = tuple(tuple(o for a in atoms[lo:hi] for o in a) for lo, hi in comp)
            stages = tuple(tuple(sorted(s, key=g.index)) for s in stages)
            mode_sets = [("row",) * (k - 1)]
            if k > 1:
                mode_sets.append(tuple("split_k" for _ in range(k - 1)))
            tiles = tile_opts + [max(1, rows_first)] if k == 1 else tile_opts
            for tile_rows in tiles:
                for modes in mode_sets:
                    for depth in (depths if k > 1 else (1,)):
                        bases.append(PipelineChoice(stages, (1,) * k, tile_rows,
                                                    (depth,) * (k - 1), modes))
    return bases


def priced_candidates(region: Region, spec: HwSpec, bases, step: int = 1) -> list:
    """balanced() of each of these choices, in order; infeasible ones are skipped (a slice of
    pipeline_bases gives the same slice of pipeline_candidates)."""
    prefetch_stage_schedules(spec, [(region, p) for p in _probe_plans(region, spec, bases, step)])
    out = []
    for base in bases:
        try:
            r = balanced(region, spec, base, step)
            if r is None:
                continue
            ch, est = r
        except InfeasibleError:
            continue
        out.append(PipelineCandidate(region, ch, est))
    return out


def _probe_plans(region: Region, spec: HwSpec, bases, step: int = 1) -> list:
    """The plans balanced() probes for these choices (those it gets to: feasible ones)."""
    plans = []
    for choice in bases:
        probe = _probe(spec, choice, step, spec.sm_count)
        if probe is not None:
            try:
                plans.append(plan_stages(region, spec, probe))
            except InfeasibleError:
                pass
    return plans


def _probe(spec: HwSpec, choice: PipelineChoice, step: int, total: int) -> PipelineChoice | None:
    """balanced()'s probe: the choice on an even split of `total` SMs (None: too few SMs)."""
    J = len(choice.stages)
    if J * step > total:
        return None
    return PipelineChoice(choice.stages, (max(1, total // J),) * J, choice.tile_rows,
                          choice.depths, choice.modes)


def best_pipeline(region: Region, spec: HwSpec, step: int = 1) -> PipelineCandidate | None:
    cands = pipeline_candidates(region, spec, step)
    if not cands:
        return None
    return min(cands, key=lambda c: (c.estimate.latency_s, c.estimate.dram_bytes))


def whole_model_pipeline(graph: Graph, spec: HwSpec, step: int = 1) -> tuple[Estimate, list]:
    """Pipeline every streamable segment (long ones in windows of a few fused groups)."""
    parts, chosen = [], []
    for seg in stream_segments(graph):
        region = Region.of(graph, seg)
        atoms = fusion_groups(region)
        windows = [atoms[i:i + MAX_ATOMS_PER_PIPELINE]
                   for i in range(0, len(atoms), MAX_ATOMS_PER_PIPELINE)]
        for win in windows:
            sub = Region.of(graph, [o for a in win for o in a])
            best = best_pipeline(sub, spec, step)
            if best is None:
                est = fusion(sub, spec)
                chosen.append(("fusion", sub.ops, None))
            else:
                est = best.estimate
                chosen.append(("pipeline", sub.ops, best.choice))
            parts.append(est)
    total = compose_sequential(graph, spec, [(o, e) for (_, o, _), e in zip(chosen, parts)],
                               strategy="pipeline",
                       regions=[{"strategy": s, "ops": list(o),
                                 "stages": [list(x) for x in c.stages] if c else None,
                                 "sms": list(c.sms) if c else None} for s, o, c in chosen])
    return total, chosen


def compare(graph: Graph, spec: HwSpec) -> dict[str, Estimate]:
    """Whole model under each strategy (bsp with CUDA-graph launches; bsp-eager for reference)."""
    region = Region.of(graph)
    out = {
        "bsp": bsp(region, spec),
        "bsp-eager": bsp(region, spec, LaunchChoice("eager")),
        "fusion": fusion(region, spec),
        "tilesync": tilesync(region, spec),
        "concurrent": concurrent(region, spec),
    }
    out["pipeline"] = whole_model_pipeline(graph, spec)[0]
    return out


def compare_rows(results: dict[str, Estimate]) -> list[dict]:
    base = results["bsp"]
    rows = []
    for name, e in results.items():
        rows.append({
            "strategy": name, "latency_s": e.latency_s, "dram_read_bytes": e.dram_read_bytes,
            "dram_write_bytes": e.dram_write_bytes, "dram_bytes": e.dram_bytes,
            "kernel_launches": e.kernel_launches,
            "speedup_vs_bsp": base.latency_s / e.latency_s if e.latency_s > 0 else math.inf,
            "dram_change_vs_bsp": (e.dram_bytes / base.dram_bytes - 1.0) if base.dram_bytes else 0.0,
            "sm_busy_fraction": e.sm_busy_fraction,
        })
    return rows
