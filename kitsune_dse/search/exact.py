"""Exact oracle for the solver, and the exactly-costed cover that guards its result.

`solve_exact` optimises the same integer model as `solve` (solver.py: same scaling, same allowed
SM counts, same closed form and queue rules), without CP-SAT:
  * each pipeline candidate's best allocation by enumerating every allowed allocation (NumPy);
    regions are sequential, so a candidate's best configuration is independent of the others;
  * the cover by dynamic programming over the chain of atom positions (every candidate is a
    window [lo, hi) of the atom chain), for any graph size; or, for graphs of up to 8 ops,
    by brute force over every exact cover of the ops by the candidates' op sets, which does not
    rely on the windows at all.
Objectives as in `solve`: latency then bytes, bytes then latency, or the Pareto front (a
frontier DP). The result then goes through the same exact re-timing and guard as `solve`.
"""
from __future__ import annotations

import time

from kitsune_dse.search.candidates import Candidate, CandidateSet
from kitsune_dse.search.solver import (Item, SolverResult, check_objective, guard, make_result,
                                       model_items, pareto_filter, resolve_granularity)

BRUTE_FORCE_MAX_OPS = 8


def _item_pick(it: Item):
    if it.pm is None:
        return (it.cand, None, None)
    return (it.cand, it.best[1], it.best[2])


def _dp_lexi(n: int, options: list[tuple[tuple[int, int], tuple, object]]):
    """Min-cost cover of positions 0..n by windows; options: ((lo, hi), key, payload) with
    additive tuple keys. Returns (key, payloads in order)."""
    ending: list[list] = [[] for _ in range(n + 1)]
    for span, key, payload in options:
        ending[span[1]].append((span[0], key, payload))
    best: list = [None] * (n + 1)
    best[0] = ((0,) * len(options[0][1]) if options else (), None, None)
    for p in range(1, n + 1):
        cur = None
        for lo, key, payload in ending[p]:
            if best[lo] is None:
                continue
            tot = tuple(a + b for a, b in zip(best[lo][0], key))
            if cur is None or tot < cur[0]:
                cur = (tot, lo, payload)
        best[p] = cur
    if best[n] is None:
        return None
    out, p = [], n
    while p > 0:
        tot, lo, payload = best[p]
        out.append(payload)
        p = lo
    return best[n][0], out[::-1]


def _dp_pareto(n: int, options):
    """Pareto front (lat, kib) of covers: per position the non-dominated partial covers."""
    ending: list[list] = [[] for _ in range(n + 1)]
    for span, key, payload in options:
        ending[span[1]].append((span[0], key, payload))
    fronts: list[list] = [[] for _ in range(n + 1)]
    fronts[0] = [((0, 0), ())]
    for p in range(1, n + 1):
        pts = []
        for lo, key, payload in ending[p]:
            for (a, b), path in fronts[lo]:
                pts.append(((a + key[0], b + key[1]), path + (payload,)))
        pts.sort(key=lambda x: x[0])
        front, best_b = [], None
        for k, path in pts:
            if best_b is None or k[1] < best_b:
                front.append((k, path))
                best_b = k[1]
        fronts[p] = front
    return fronts[n]


def _brute_force(cset: CandidateSet, items: list[Item], keyf):
    """Every exact cover of the ops by the items' op sets; returns all (key, picks)."""
    order = [o.name for o in cset.graph.ops]
    by_first: dict[str, list[Item]] = {}
    for it in items:
        by_first.setdefault(it.cand.ops[0], []).append(it)
    containing: dict[str, list[Item]] = {}
    for it in items:
        for o in it.cand.ops:
            containing.setdefault(o, []).append(it)
    covers = []

    def rec(covered: frozenset, chosen: list[Item]):
        first = next((o for o in order if o not in covered), None)
        if first is None:
            covers.append(list(chosen))
            return
        for it in containing.get(first, []):
            ops = set(it.cand.ops)
            if ops & covered:
                continue
            chosen.append(it)
            rec(covered | ops, chosen)
            chosen.pop()

    rec(frozenset(), [])
    out = []
    for cov in covers:
        key = tuple(sum(k) for k in zip(*(keyf(it) for it in cov)))
        out.append((key, cov))
    return out


def solve_exact(cands: CandidateSet, objective="latency", sm_granularity: int = 1, *,
                method: str = "auto") -> SolverResult:
    """The optimum of solve()'s integer model without CP-SAT. method: "auto" (brute force for
    graphs of up to 8 ops, else DP), "dp" or "brute-force"."""
    t0 = time.perf_counter()
    objective = check_objective(objective)
    step = resolve_granularity(cands, sm_granularity)
    items = model_items(cands, step)
    n_ops = len(cands.graph.ops)
    if method == "auto":
        method = "brute-force" if n_ops <= BRUTE_FORCE_MAX_OPS else "dp"
    if method not in ("dp", "brute-force"):
        raise ValueError(f"method {method!r}")
    n = len(cands.atoms)

    def keyf(it: Item):
        return (it.kib, it.lat) if objective == "traffic" else (it.lat, it.kib)

    def result(picks_items, source):
        lat = sum(it.lat for it in picks_items)
        kib = sum(it.kib for it in picks_items)
        return make_result(cands, [_item_pick(it) for it in picks_items], objective, "OPTIMAL",
                           0.0, t0, lat, kib, source)

    if objective == "pareto":
        if method == "dp":
            front = [(k, list(path)) for k, path in
                     _dp_pareto(n, [(it.cand.span, (it.lat, it.kib), it) for it in items])]
        else:
            allc = sorted(_brute_force(cands, items, lambda it: (it.lat, it.kib)),
                          key=lambda x: x[0])
            front, best_b = [], None
            for k, cov in allc:
                if best_b is None or k[1] < best_b:
                    front.append((k, cov))
                    best_b = k[1]
        pts = [result(cov, method) for _, cov in front]
        main = pts[0]
        pts.append(guard(cands, main, "latency", step))
        pts.append(guard(cands, pts[-2], "traffic", step))
        fr = pareto_filter(pts)
        return SolverResult(fr[0].status, 0.0, objective, fr[0].chosen, fr[0].latency_s,
                            fr[0].dram_bytes, time.perf_counter() - t0, pareto=fr,
                            model_latency_s=main.model_latency_s,
                            model_dram_bytes=main.model_dram_bytes, source=fr[0].source)
    if method == "dp":
        sol = _dp_lexi(n, [(it.cand.span, keyf(it), it) for it in items])
        if sol is None:
            raise RuntimeError("no cover of the atom chain")
        picks = sol[1]
    else:
        allc = _brute_force(cands, items, keyf)
        picks = min(allc, key=lambda x: x[0])[1]
        picks.sort(key=lambda it: it.cand.span)
    res = result(picks, method)
    out = guard(cands, res, objective, step)
    from dataclasses import replace
    return replace(out, wall_s=time.perf_counter() - t0)


def exact_cover(cset: CandidateSet, objective: str, extra: list[Candidate] = (),
                allowed=None) -> list[Candidate]:
    """The best cover when every candidate (and every one of `extra`, e.g. re-timed pipelines)
    costs its own exact estimate; bytes add up per region. objective: latency or traffic;
    `allowed(candidate)` filters the set's own candidates."""
    n = len(cset.atoms)

    def key(c: Candidate):
        e = c.estimate
        return ((e.dram_bytes, e.latency_s) if objective == "traffic"
                else (e.latency_s, e.dram_bytes))

    opts = [(c.span, key(c), c) for c in cset.candidates if allowed is None or allowed(c)]
    opts += [(c.span, key(c), c) for c in extra]
    sol = _dp_lexi(n, opts)
    return list(sol[1])
