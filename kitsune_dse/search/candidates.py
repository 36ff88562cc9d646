"""Candidate regions and their strategies: what the solver chooses among.

Atoms. The graph is cut into stream segments (cost.compare.stream_segments: contiguous runs of
the topological order between which tiles cannot stream) and each segment into its fused groups
(cost.strategies.fusion_groups); these groups, in a topological order of the group graph, are the
*atoms*. A contiguous window of atoms is a convex set of ops (a path leaving the window and coming
back would pass through an atom placed between two of the window's atoms), so any sequence of
windows that partitions the atom chain is a valid execution order: regions run one after another.
Chains and diamonds are both covered: a diamond's branches are consecutive atoms of one window.

Windows. Every window of 1..max_window atoms is a region; it gets the bsp, fusion, tilesync and
concurrent estimates (the cost functions on Region.of(graph, ops)) and, when it lies inside one
stream segment and spans at most MAX_PIPELINE_ATOMS atoms, pipeline candidates:
  * stage cuts between atoms: every cut into at most 4 stages for windows of up to 4 atoms;
    for longer windows at most 3 stages, and per stage count the CUTS_PER_STAGES cuts that split
    the atoms' own (one-atom window) times most evenly;
  * each cut with the default tile (128 rows) and row queues; for the REFINE_CUTS best cuts
    every tile size of cost.compare.TILE_ROWS, then split-K queues at the best tile;
  * each evaluated on its stage-time table (cost.pipeline.stage_time_table at a probe queue
    depth of 2, or 1 where 2 does not fit the usable L2; a cut whose queues do not fit even at
    depth 1 is dropped): SMs balanced as cost.compare.balance_sms does (multiples of
    sm_granularity, left-over SMs to the slowest stage), queues at their smallest adequate depth
    (adequate_depth) when those fit beside the resident weights, ranked by the solver's closed
    form at that allocation;
  * per window the KEEP_FASTEST fastest and the non-dominated (latency, DRAM bytes) ones are
    kept (at most KEEP_MAX), costed exactly (cost.pipeline.pipeline); each keeps its
    [stages, sm_count + 1] table, its queue slot bytes and the L2 left for queues beside the
    weights it keeps resident (queue_budget_bytes).
The windows of cost.compare.whole_model_pipeline (segments in chunks of MAX_ATOMS_PER_PIPELINE
fused groups) are searched exactly as compare does (cost.compare.pipeline_candidates, which may
keep queues that spill past the L2), and the whole graph is always one more window for the four
kernel strategies, so the candidate set contains a cover equal to every whole-model strategy of
`kitsune-dse compare` (CandidateSet.baselines lists them; compare_baselines=False skips the
pipeline one). These exhaustive searches are the costly part: those of windows of at least
FORK_MIN_ATOMS atoms start at once, in parts, in forked worker processes (KITSUNE_DSE_JOBS
processes in all, this one included, default the CPU count; 1 runs them all in this process)
while this process costs the other windows (the pipeline searches of the windows of one size
side by side, their stage replays together) and then prices the parts no worker has started
(and runs the short searches itself when it reaches them); the results are the same either way.

Reuse. Windows are costed once per *structural signature* (op kinds, attrs, shapes, dtypes,
which inputs are weights, graph inputs or come from inside the window, which outputs leave it,
which hand-offs stay in L2): the repeated layers of a deep model cost one window each; the
copies get the same numbers and tables (their pipeline choices name their own ops; the estimate
object is shared, and CandidateSet.own(c) gives one whose breakdown names the copy's own ops:
the solver's chosen candidates are always such). The candidate count is linear in the graph
size: at most max_window windows start at each atom, each with 4 + at most KEEP_MAX candidates.
"""
from __future__ import annotations

import gc
import heapq
import itertools
import math
import os
from dataclasses import dataclass, field, replace

import numpy as np

from kitsune_dse.cost.compare import (MAX_ATOMS_PER_PIPELINE, TILE_ROWS, pipeline_bases,
                                      priced_candidates, stream_segments)
from kitsune_dse.cost.estimate import Estimate
from kitsune_dse.cost.pipeline import (PipelineChoice, pipeline, plan_stages,
                                      prefetch_stage_schedules, stage_tables)
from kitsune_dse.cost.region import Region, entry_kernel, handed_over
from kitsune_dse.cost.strategies import (STRATEGIES, bsp, concurrent, fusion, fusion_groups,
                                         split_sms, tilesync)
from kitsune_dse.errors import InfeasibleError, KitsuneError, closest
from kitsune_dse.graph.ir import Graph
from kitsune_dse.hw.spec import HwSpec

KERNEL_STRATEGIES = ("bsp", "fusion", "tilesync", "concurrent")
_STRATEGY_FN = {"bsp": bsp, "fusion": fusion, "tilesync": tilesync, "concurrent": concurrent}
DEFAULT_TILE_ROWS = 128
MAX_STAGES_SMALL = 4          # stage cap for windows of up to 4 atoms
MAX_STAGES_LARGE = 3          # and for longer windows
REFINE_CUTS = 1               # cuts whose tile sizes and queue modes are explored
KEEP_FASTEST = 3              # pipeline candidates kept per window: the fastest ...
KEEP_MAX = 6                  # ... the best of each stage count and the non-dominated
PROBE_DEPTH = 2
QUEUE_DEPTHS = (1, 2, 4, 8)   # ring slots (row-blocks) a queue may have
CUTS_PER_STAGES = 3           # long windows: most even cuts tried per stage count
MAX_PIPELINE_ATOMS = MAX_ATOMS_PER_PIPELINE   # longest window given pipeline candidates
FORK_MIN_ATOMS = 5            # compare's search of a window this long runs in a worker process


@dataclass(frozen=True)
class Candidate:
    id: int
    ops: tuple[str, ...]          # topological order; a convex set (a window of the atom chain)
    strategy: str                 # "bsp" | "fusion" | "tilesync" | "concurrent" | "pipeline"
    estimate: Estimate            # the cost layer's estimate (pipelines: at `choice`)
    choice: object | None         # PipelineChoice for pipelines, else None
    stage_tables: "np.ndarray | None" = field(compare=False)  # [stages, sm_count+1] per-unit s
    units: int = 1                # pipelines: hand-off units (row_blocks * slabs)
    span: tuple[int, int] = (0, 0)        # atoms [lo, hi) of CandidateSet.atoms it covers
    slabs: int = 1                        # pipelines: split-K slabs per row-block
    slot_bytes: tuple[float, ...] = ()    # pipelines: bytes of one ring slot per queue
    queue_budget_bytes: float = 0.0       # pipelines: L2 for queue slots beside resident weights
    stage_servers: "np.ndarray | None" = field(default=None, compare=False)  # [stages, sm_count+1]
                                          # units each stage works on at once (default 1)

    @property
    def region(self) -> tuple[str, ...]:
        return self.ops


@dataclass
class CandidateSet:
    graph: Graph
    spec: HwSpec
    candidates: list[Candidate]
    atoms: list[tuple[str, ...]]
    sm_granularity: int = 1
    max_window: int = 8
    strategies: tuple[str, ...] = STRATEGIES
    # whole-model strategy -> candidate ids whose sequence is that strategy applied to the whole
    # model exactly as cost.compare.compare() computes it
    baselines: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    # windows costed as a copy of an earlier, structurally identical one: span -> {name in the
    # first copy's estimate breakdown: name here}. Their candidates share the first copy's
    # Estimate (same numbers); own() gives one whose breakdown names this window's ops
    renames: dict = field(default_factory=dict)

    def own(self, c: Candidate) -> Candidate:
        """`c` (one of self.candidates) with an estimate whose breakdown names its own ops and
        tensors; any other candidate (e.g. re-timed by the solver) is returned as it is."""
        m = self.renames.get(c.span)
        if not m or not (0 <= c.id < len(self.candidates) and self.candidates[c.id] is c):
            return c
        e = c.estimate
        est = replace(e, breakdown=_rename(e.breakdown, m))
        return replace(c, estimate=est)

    def by_span(self) -> dict[tuple[int, int], list[Candidate]]:
        out: dict[tuple[int, int], list[Candidate]] = {}
        for c in self.candidates:
            out.setdefault(c.span, []).append(c)
        return out

    def baseline_estimates(self) -> dict[str, tuple[float, float]]:
        """(latency_s, dram_bytes) of each whole-model strategy's cover."""
        return {k: (sum(self.candidates[i].estimate.latency_s for i in ids),
                    sum(self.candidates[i].estimate.dram_bytes for i in ids))
                for k, ids in self.baselines.items()}


# -- user input checks ------------------------------------------------------------------------
def check_granularity(spec: HwSpec, sm_granularity) -> int:
    if not isinstance(sm_granularity, (int, np.integer)) or isinstance(sm_granularity, bool):
        raise InfeasibleError(f"--sm-granularity must be a whole number of SMs, got "
                              f"{sm_granularity!r}")
    g = int(sm_granularity)
    if g < 1:
        raise InfeasibleError(f"--sm-granularity {g} must be at least 1 SM")
    if g > spec.sm_count:
        raise InfeasibleError(f"--sm-granularity {g} is larger than {spec.name}'s "
                              f"{spec.sm_count} SMs")
    return g


def _check_strategies(strategies) -> tuple[str, ...]:
    if isinstance(strategies, str):
        strategies = [s for s in strategies.replace(",", " ").split() if s]
    out = []
    for s in strategies:
        if s not in STRATEGIES:
            raise KitsuneError(f"unknown strategy {s!r}{closest(s, STRATEGIES)}; choose from "
                               f"{', '.join(STRATEGIES)}")
        if s not in out:
            out.append(s)
    if not out:
        raise InfeasibleError(f"no strategy allowed; choose from {', '.join(STRATEGIES)}")
    return tuple(s for s in STRATEGIES if s in out)


# -- atoms ------------------------------------------------------------------------------------
def atom_chain(graph: Graph) -> tuple[list[tuple[str, ...]], list[int]]:
    """Fused groups of every stream segment, in a topological order of the group graph (ties
    by first op), and the segment index of each."""
    groups: list[tuple[str, ...]] = []
    seg_of: list[int] = []
    for si, seg in enumerate(stream_segments(graph)):
        for grp in fusion_groups(Region.of(graph, seg)):
            groups.append(tuple(sorted(grp, key=graph.index)))
            seg_of.append(si)
    where = {o: i for i, grp in enumerate(groups) for o in grp}
    if all(where[p] <= where[o] for o in where for p in graph.preds(o)):
        return groups, seg_of
    # the creation order is not topological: Kahn's algorithm on the group graph
    succ = [set() for _ in groups]
    indeg = [0] * len(groups)
    for o, i in where.items():
        for p in graph.preds(o):
            j = where[p]
            if j != i and i not in succ[j]:
                succ[j].add(i)
                indeg[i] += 1
    heap = [(graph.index(groups[i][0]), i) for i in range(len(groups)) if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, u = heapq.heappop(heap)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (graph.index(groups[v][0]), v))
    if len(order) != len(groups):      # a cycle between fused groups: a cost-layer bug
        raise RuntimeError("fused groups are not convex: the group graph has a cycle")
    return [groups[i] for i in order], [seg_of[i] for i in order]


# -- structural signature and renaming --------------------------------------------------------
def window_signature(region: Region, spec: HwSpec):
    """What the cost of a region depends on, without names: two windows with equal signatures
    get equal estimates (op kinds, attrs, shapes, dtypes, which inputs are weights, graph inputs
    or come from inside, which outputs leave the region, which hand-offs stay in L2, the kernel
    before it, whose dirty lines its first kernel finds). Also returns the op and tensor names
    in signature order."""
    graph, ops = region.graph, region.ops
    outputs = frozenset(region.outputs)
    local = {o: i for i, o in enumerate(ops)}
    ext: dict[str, int] = {}
    parts = []
    tnames: list[str] = []
    for o in ops:
        op = graph.op(o)
        ins = []
        for t in op.inputs:
            p = graph.producer(t)
            if p in local:
                ins.append((0, local[p], graph.op(p).outputs.index(t)))
            else:
                if t not in ext:
                    ext[t] = len(ext)
                    tnames.append(t)
                tt = graph.tensors[t]
                ins.append((1, ext[t], tt.shape, tt.dtype, t in graph.weights, p is None,
                            handed_over(region, spec, t)))
        outs = []
        for t in op.outputs:
            tt = graph.tensors[t]
            outs.append((tt.shape, tt.dtype, t in outputs, t in graph.outputs,
                         t in outputs and handed_over(region, spec, t)))
            tnames.append(t)
        attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items()))
        parts.append((op.kind, attrs, tuple(ins), tuple(outs)))
    # its first kernel finds the dirty lines of the kernel before it (cost.region.entry_kernel)
    return (tuple(parts), tuple(round(x) for x in entry_kernel(region, spec))), tuple(ops) + tuple(tnames)


def _rename(obj, m: dict):
    if not m:
        return obj
    if isinstance(obj, str):
        if obj in m:
            return m[obj]
        if "+" in obj:
            parts = obj.split("+")
            if all(p in m for p in parts):
                return "+".join(m[p] for p in parts)
        return obj
    if isinstance(obj, dict):
        return {_rename(k, m): _rename(v, m) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rename(v, m) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rename(v, m) for v in obj)
    return obj


# -- pipelines ----------------------------------------------------------------------------------
def _compositions(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0,) + cuts + (n,)
        yield tuple((b[i], b[i + 1]) for i in range(k))


@dataclass
class _PipeEval:
    choice: PipelineChoice
    estimate: Estimate | None
    order: int
    table: np.ndarray | None = None
    plan: object | None = None
    model_s: float = 0.0        # closed-form time at the balanced SMs (ranking only)
    dram: float = 0.0
    budget: float = 0.0         # L2 for queue slots beside the weights resident at the probe
    servers: np.ndarray | None = None


def _queue_budget(spec: HwSpec, plan, resident) -> float:
    """L2 bytes the queues may take without evicting a weight kept resident at the probe."""
    if plan.row_blocks <= 1:
        return float(spec.l2_usable_bytes)
    res = resident or [False] * len(plan.stage_weights)
    kept = sum(w for w, r in zip(plan.stage_weights, res) if r)
    return max(0.0, float(spec.l2_usable_bytes) - kept)


def table_and_totals(region: Region, spec: HwSpec, plan) -> tuple[np.ndarray, dict]:
    """cost.pipeline.stage_tables: the stage-time table and the DRAM totals of the same
    stage_works call, with the servers table in totals["stage_servers_table"]."""
    tab, srv, totals = stage_tables(region, spec, plan)
    return tab, {**totals, "stage_servers_table": srv}


def closed_form_span(T, L, units: int, B, sync_s: float):
    """The solver's pipeline time before the DRAM floor and the launch: every stage's unit
    latency L_j = servers_j * T_j once (the first unit's trip), U - 1 periods B, J - 1 hand-offs,
    less min_j (L_j - T_j) (a stage of c servers emits c units per latency: its own last units
    overlap; the least such overlap of any stage is taken). One stage: U * T."""
    J = len(T)
    if J == 1:
        return units * T[0]
    return (sum(L) + (units - 1) * B + (J - 1) * sync_s
            - min(l - t for l, t in zip(L, T)))


def queue_pace(depth: int, slabs: int) -> int:
    """Units of period a ring of `depth` row-blocks of `slabs` units holds a slot for: a slot is
    freed when its consumer has finished the row-block's last slab, so the producer may run
    depth * slabs - slabs + 1 units ahead of the consumer's oldest unit."""
    return depth * slabs - slabs + 1


def adequate_depth(slabs: int, period_s: float, consumer_s: float, sync_s: float):
    """Smallest ring depth (row-blocks) with which a queue does not slow the pipeline below its
    period B (the bottleneck stage's unit time): queue_pace(depth, slabs) * B >= L_consumer + 2
    * sync, L the consumer's unit latency (a slot is freed one hand-off after its consumer
    finishes the row-block and refilled one hand-off later); None if no depth of QUEUE_DEPTHS
    is. The solver applies the same rule in integer ns."""
    for d in QUEUE_DEPTHS:
        if queue_pace(d, slabs) * period_s >= consumer_s + 2 * sync_s:
            return d
    return None


class _PipelineEnumerator:
    def __init__(self, graph: Graph, spec: HwSpec, step: int):
        self.graph, self.spec, self.step = graph, spec, step
        self.l2_dropped = 0
        self.min_queue_bytes = math.inf
        self.evaluated = 0
        self.exact_calls = 0

    def probe_plan(self, region: Region, stages, tile_rows: int, modes):
        """The plan evaluate() probes: SMs split evenly, queues PROBE_DEPTH deep, or 1 deep
        where that does not fit the usable L2. (plan, None), or (None, bytes one slot per queue
        needs) when even one does not fit, or (None, None) when infeasible or too few SMs."""
        spec, S = self.spec, self.spec.sm_count
        J = len(stages)
        if J * self.step > S:
            return None, None
        probe = PipelineChoice(stages, (max(1, S // J),) * J, tile_rows,
                               (PROBE_DEPTH,) * (J - 1), modes)
        try:
            plan = plan_stages(region, spec, probe)
            if J > 1:
                need = sum(plan.slot_bytes)
                if PROBE_DEPTH * need > spec.l2_usable_bytes:
                    if need > spec.l2_usable_bytes:
                        return None, need
                    probe = PipelineChoice(stages, probe.sms, tile_rows, (1,) * (J - 1), modes)
                    plan = plan_stages(region, spec, probe)
        except InfeasibleError:
            return None, None
        return plan, None

    def prefetch(self, region: Region, probes) -> None:
        """Replay the stages of the plans evaluate() will probe for these (stages, tile_rows,
        modes) side by side (cost.pipeline.prefetch_stage_schedules)."""
        plans = [self.probe_plan(region, *p)[0] for p in probes]
        prefetch_stage_schedules(self.spec, [(region, p) for p in plans if p is not None])

    def evaluate(self, region: Region, stages, tile_rows: int, modes, order: int):
        """Probe plan, stage-time table, SMs balanced over it, the model's closed-form time."""
        spec, S, g = self.spec, self.spec.sm_count, self.step
        J = len(stages)
        plan, need = self.probe_plan(region, stages, tile_rows, modes)
        if plan is None:
            if need is not None:
                self.l2_dropped += 1
                self.min_queue_bytes = min(self.min_queue_bytes, need)
            return None
        probe = plan.choice
        try:
            tab, totals = table_and_totals(region, spec, plan)
        except InfeasibleError:
            return None
        if J == 1:
            sms = (S,)          # one stage partitions nothing: the whole GPU
        else:
            _, split = split_sms([tab[j] for j in range(J)], S, g)
            if not split:
                return None
            # as cost.compare.balance_sms: SMs left over go to the slowest stage, step by step
            split = [int(s) for s in split]
            rows = tab.tolist()
            used = sum(split)
            while used + g <= S:
                j, slowest = 0, rows[0][split[0]]       # the first of the slowest
                for k in range(1, J):
                    if rows[k][split[k]] > slowest:
                        j, slowest = k, rows[k][split[k]]
                split[j] += g
                used += g
            sms = tuple(split)
        self.evaluated += 1
        units = plan.row_blocks * plan.slabs
        srv = totals["stage_servers_table"]
        T = [float(tab[j][s]) for j, s in enumerate(sms)]
        L = [float(tab[j][s] * srv[j][s]) for j, s in enumerate(sms)]
        B = max(T)
        dram = totals["dram_timed_bytes"]
        model = max(closed_form_span(T, L, units, B, spec.ring_handoff_cost_s),
                    dram / spec.hbm_bandwidth_from(S)) + spec.persistent_launch_cost_s
        # queue depths: the smallest adequate ones if they fit beside the resident weights
        depths = probe.depths
        budget = _queue_budget(spec, plan, totals.get("weights_resident"))
        if J > 1:
            ad = [adequate_depth(plan.slabs, B, L[q + 1], spec.ring_handoff_cost_s) or QUEUE_DEPTHS[-1]
                  for q in range(J - 1)]
            if sum(d * b for d, b in zip(ad, plan.slot_bytes)) <= budget:
                depths = tuple(ad)
        choice = PipelineChoice(stages, sms, tile_rows, depths, modes)
        return _PipeEval(choice, None, order, tab, plan, model, dram, budget, srv)

    def cut_options(self, atoms, work: list[float], k: int):
        """Stage cuts of a window of k atoms: every cut for up to MAX_STAGES_SMALL stages when
        k <= 4, else up to MAX_STAGES_LARGE stages and per stage count the CUTS_PER_STAGES
        cuts with the most even split of the atoms' fused-kernel times."""
        if k <= 4:
            return [c for J in range(1, min(MAX_STAGES_SMALL, k) + 1) for c in _compositions(k, J)]
        out = []
        for J in range(1, MAX_STAGES_LARGE + 1):
            comps = list(_compositions(k, J))
            if len(comps) > CUTS_PER_STAGES:
                comps.sort(key=lambda c: max(sum(work[lo:hi]) for lo, hi in c))
                comps = comps[:CUTS_PER_STAGES]
            out.extend(comps)
        return out

    def limited(self, region: Region, atoms: list[tuple[str, ...]], work: list[float]):
        return self.together({0: self.limited_steps(region, atoms, work)})[0]

    def together(self, searches: dict) -> dict:
        """Run limited_steps generators side by side: each yields the plans it is about to
        price, ("probe", region, [(stages, tile_rows, modes)]) for evaluate() or ("exact",
        region, [choices]) for pipeline(), and is resumed once the stages of every search's
        plans have been replayed together (prefetch_stage_schedules); key -> its result. The
        searches are pure: the same results as one after another, in a fraction of the time."""
        results, waiting = {}, dict(searches)
        while waiting:
            asks, ready = [], {}
            for key, gen in waiting.items():
                try:
                    asks.append(next(gen))
                    ready[key] = gen
                except StopIteration as stop:
                    results[key] = stop.value
            plans = []
            for kind, region, items in asks:
                if kind == "probe":
                    plans += [(region, p) for p in (self.probe_plan(region, *i)[0] for i in items)
                              if p is not None]
                else:
                    for choice in items:
                        try:
                            plans.append((region, plan_stages(region, self.spec, choice)))
                        except InfeasibleError:
                            pass
            prefetch_stage_schedules(self.spec, plans)
            waiting = ready
        return results

    def limited_steps(self, region: Region, atoms: list[tuple[str, ...]], work: list[float]):
        """The pipeline candidates of a window of atoms (a generator: see together())."""
        g = self.graph
        k = len(atoms)
        rows_first = max(1, g.tensors[g.op(region.ops[0]).outputs[0]].rows)
        tile_opts = sorted({min(t, rows_first) for t in TILE_ROWS})
        default_tile = min(DEFAULT_TILE_ROWS, rows_first)
        out: list[_PipeEval] = []
        seen = set()
        order = 0
        cuts = []
        for comp in self.cut_options(atoms, work, k):
            J = len(comp)
            stages = tuple(tuple(sorted((o for a in atoms[lo:hi] for o in a), key=g.index))
                           for lo, hi in comp)
            cuts.append((stages, default_tile if J > 1 else rows_first, ("row",) * (J - 1)))
        yield ("probe", region, cuts)
        for stages, tile, modes in cuts:
            seen.add((stages, tile, modes))
            ev = self.evaluate(region, stages, tile, modes, order)
            order += 1
            if ev is not None:
                out.append(ev)
        multi = sorted((e for e in out if len(e.choice.stages) > 1),
                       key=lambda e: (e.model_s, e.dram, e.order))
        for base in multi[:REFINE_CUTS]:
            # the best cuts: every tile size with row queues, then split-K at the best tile
            stages = base.choice.stages
            J = len(stages)
            row = ("row",) * (J - 1)
            tried = [base]
            yield ("probe", region, [(stages, tile, row) for tile in tile_opts
                                     if (stages, tile, row) not in seen])
            for tile in tile_opts:
                if (stages, tile, row) in seen:
                    continue
                seen.add((stages, tile, row))
                ev = self.evaluate(region, stages, tile, row, order)
                order += 1
                if ev is not None:
                    out.append(ev)
                    tried.append(ev)
            best = min(tried, key=lambda e: (e.model_s, e.dram, e.order))
            sk = ("split_k",) * (J - 1)
            if (stages, best.choice.tile_rows, sk) not in seen:
                seen.add((stages, best.choice.tile_rows, sk))
                ev = self.evaluate(region, stages, best.choice.tile_rows, sk, order)
                order += 1
                if ev is not None:
                    out.append(ev)
        kept = _keep(out, lambda e: (e.model_s, e.dram, e.order))
        yield ("exact", region, [e.choice for e in kept])
        for e in kept:
            try:
                e.estimate = pipeline(region, self.spec, e.choice)
            except InfeasibleError:
                e.estimate = None
            self.exact_calls += 1
        return [e for e in kept if e.estimate is not None]

    def full(self, region: Region, res: list) -> list[_PipeEval]:
        """The results of cost.compare.pipeline_candidates on the window ([(choice, estimate)],
        exactly the search of whole_model_pipeline); the kept ones get their tables."""
        self.evaluated += len(res)
        self.exact_calls += len(res)
        evals = [_PipeEval(ch, est, i, model_s=est.latency_s, dram=est.dram_bytes)
                 for i, (ch, est) in enumerate(res)]
        kept = _keep(evals, lambda e: (e.model_s, e.dram, e.order))
        self.prefetch(region, [(e.choice.stages, e.choice.tile_rows, e.choice.modes) for e in kept])
        for e in kept:
            # the solver's table: at a queue depth that fits the L2 (as evaluate probes it), not
            # at compare's depth, whose queues may spill and slow every stage down
            e.plan = plan_stages(region, self.spec, e.choice)
            probe = self.evaluate(region, e.choice.stages, e.choice.tile_rows, e.choice.modes,
                                  e.order)
            if probe is not None:
                e.table, e.budget, e.servers = probe.table, probe.budget, probe.servers
            else:
                e.table, e.servers, _ = stage_tables(region, self.spec, e.plan)
                e.budget = _queue_budget(self.spec, e.plan,
                                         e.estimate.breakdown.get("weights_resident"))
        return kept


_FORKED: dict = {}


def _pipeline_search(ops: tuple[str, ...]) -> list:
    """compare.pipeline_candidates on a window, as [(choice, estimate)]."""
    graph, spec, step = _FORKED["args"]
    region = Region.of(graph, ops)
    return [(pc.choice, pc.estimate)
            for pc in priced_candidates(region, spec, pipeline_bases(region), step)]


def _pipeline_search_part(ops: tuple[str, ...], tile_rows: int) -> list:
    """The part of _pipeline_search(ops) at one tile size (its choices share most of their
    stages' work), as [(index among the window's pipeline_bases, choice, estimate)]."""
    graph, spec, step = _FORKED["args"]
    region = Region.of(graph, ops)
    bases = pipeline_bases(region)
    part = [i for i, b in enumerate(bases) if b.tile_rows == tile_rows]
    # a priced choice is its base with other SMs (balanced() changes nothing else); the same
    # base may come twice (a one-stage cut's tile at the stream's rows): in order, then
    where: dict = {}
    for i in part:
        b = bases[i]
        where.setdefault((b.stages, b.tile_rows, b.depths, b.modes), []).append(i)
    out = []
    for pc in priced_candidates(region, spec, [bases[i] for i in part], step):
        c = pc.choice
        out.append((where[(c.stages, c.tile_rows, c.depths, c.modes)].pop(0), c, pc.estimate))
    return out


def jobs() -> int:
    """Processes for compare's exhaustive pipeline searches, this one included:
    KITSUNE_DSE_JOBS, else the CPU count (1: all in this process)."""
    try:
        return max(1, int(os.environ.get("KITSUNE_DSE_JOBS", "") or (os.cpu_count() or 1)))
    except ValueError:
        return 1


class _PipelineSearches:
    """cost.compare.pipeline_candidates on some windows (op tuples), the costly part of the
    candidate search: independent pure computations. The `remote` ones (long windows) are cut
    into parts, one per tile size (its choices share most of their stages' work), which
    jobs() - 1 forked worker processes price one at a time, in the order this process will
    need them, while this process costs the other windows; when it needs a remote window, it
    prices the parts no worker has taken yet itself, so that neither side waits long for the
    other (a worker is handed its next part only when it is done with one). The others (short
    windows: a few cuts, quick) and, without fork, all of them run here when first asked for.
    Same results either way: a window's parts, merged in its choices' order, are its search."""

    def __init__(self, graph: Graph, spec: HwSpec, step: int, tasks: dict, remote=None):
        import threading
        self.args = (graph, spec, step)
        self.tasks = tasks              # key -> ops, in the order this process needs them
        self.done: dict = {}
        self.parts: dict = {}           # key -> its parts' tile sizes, in order
        self.pending: list = []         # (key, tile_rows) no worker has taken, in order
        self.futures: dict = {}         # (key, tile_rows) -> future of a part a worker took
        self.lock = threading.Lock()    # (workers' completions hand out parts from another thread)
        self.pool = None
        remote = [k for k in tasks if remote is None or k in remote]
        if jobs() > 1 and remote:
            try:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor
                if not mp.current_process().daemon and "fork" in mp.get_all_start_methods():
                    _FORKED["args"] = self.args
                    for key in remote:
                        bases = pipeline_bases(Region.of(graph, tasks[key]))
                        self.parts[key] = list(dict.fromkeys(b.tile_rows for b in bases))
                        self.pending += [(key, t) for t in self.parts[key]]
                    self.pool = ProcessPoolExecutor(max_workers=jobs() - 1,
                                                    mp_context=mp.get_context("fork"))
                    for _ in range(jobs() - 1):
                        self._hand_out()
            except Exception:       # no fork here (sandbox, daemon worker...): run them here
                self.close()
                self.parts, self.pending, self.futures = {}, [], {}

    def _hand_out(self, _done=None) -> None:
        """Give a worker the next part no one has taken (called again as each one finishes)."""
        with self.lock:
            if self.pool is None or not self.pending:
                return
            key, t = self.pending.pop(0)
            fut = self.futures[(key, t)] = self.pool.submit(_pipeline_search_part,
                                                            self.tasks[key], t)
        fut.add_done_callback(self._hand_out)

    def result(self, key) -> list:
        if key not in self.done:
            _FORKED["args"] = self.args
            if key not in self.parts:
                self.done[key] = _pipeline_search(self.tasks[key])
                return self.done[key]
            here = {}
            while True:     # the window's next part no worker has taken, while there is one
                with self.lock:
                    mine = [i for i, (k, _) in enumerate(self.pending) if k == key]
                    if not mine:
                        break
                    _, t = self.pending.pop(mine[0])
                here[t] = _pipeline_search_part(self.tasks[key], t)
            merged = []
            for t in self.parts[key]:
                if t not in here:
                    try:
                        here[t] = self.futures[(key, t)].result()
                    except Exception:
                        here[t] = _pipeline_search_part(self.tasks[key], t)
                merged += here[t]
            self.done[key] = [(c, est) for _, c, est in sorted(merged, key=lambda x: x[0])]
        return self.done[key]

    def close(self):
        with self.lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        _FORKED.clear()


def _keep(evals, key) -> list:
    """The KEEP_FASTEST first by `key`, the first of every stage count not yet among them, then
    the non-dominated by DRAM bytes; KEEP_MAX in all."""
    if not evals:
        return []
    by = sorted(evals, key=key)
    kept = by[:KEEP_FASTEST]
    for e in by:
        if len(kept) >= KEEP_MAX:
            break
        if all(len(k.choice.stages) != len(e.choice.stages) for k in kept):
            kept.append(e)
    best = math.inf
    for e in sorted(evals, key=lambda e: (e.dram, key(e))):
        if e.model_s < best:
            best = e.model_s
            if len(kept) < KEEP_MAX and all(e is not k for k in kept):
                kept.append(e)
    kept.sort(key=key)
    return kept


# -- the builder ----------------------------------------------------------------------------------
@dataclass
class _Entry:
    """One costed candidate of a window, with names as in the window it was costed for."""
    strategy: str
    estimate: Estimate
    choice: PipelineChoice | None = None
    table: np.ndarray | None = None
    units: int = 1
    slabs: int = 1
    slot_bytes: tuple[float, ...] = ()
    queue_budget: float = 0.0
    servers: np.ndarray | None = None


def build_candidates(graph: Graph, spec: HwSpec, *, max_window: int = 8, sm_granularity: int = 1,
                     strategies=STRATEGIES, progress=None,
                     compare_baselines: bool = True) -> CandidateSet:
    """Every window of up to `max_window` atoms with each allowed strategy (see the module doc).
    `progress(done, total)` is called as windows are costed. compare_baselines=False skips the
    exhaustive pipeline search on whole_model_pipeline's windows (faster; CandidateSet.baselines
    then has no "pipeline" entry and the plan is guaranteed against the other strategies only)."""
    step = check_granularity(spec, sm_granularity)
    strategies = _check_strategies(strategies)
    if not isinstance(max_window, int) or max_window < 1:
        raise InfeasibleError(f"max_window must be at least 1 fused group, got {max_window!r}")
    atoms, seg_of = atom_chain(graph)
    n = len(atoms)
    kernel_strats = [s for s in KERNEL_STRATEGIES if s in strategies]
    want_pipe = "pipeline" in strategies

    # the windows whole_model_pipeline uses: chunks of each segment's fused groups
    pipe_windows: list[tuple[int, int]] = []
    if want_pipe and compare_baselines:
        lo = 0
        while lo < n:
            hi = lo
            while hi < n and seg_of[hi] == seg_of[lo]:
                hi += 1
            for a in range(lo, hi, MAX_ATOMS_PER_PIPELINE):
                pipe_windows.append((a, min(hi, a + MAX_ATOMS_PER_PIPELINE)))
            lo = hi
    full_pipe = set(pipe_windows)
    windows = [(lo, hi) for lo in range(n) for hi in range(lo + 1, min(n, lo + max_window) + 1)]
    extra = sorted({w for w in pipe_windows if w[1] - w[0] > max_window})
    if n > max_window:
        extra.append((0, n))
    # by size first: the one-atom windows give the atom times that rank long windows' cuts
    windows = sorted(set(windows) | set(extra), key=lambda w: (w[1] - w[0], w[0]))

    enum = _PipelineEnumerator(graph, spec, step)
    # compare's exhaustive searches first (the costly part), once per distinct window, in
    # parallel where possible
    tasks: dict = {}
    remote = set()
    for w in sorted(full_pipe, key=lambda w: (w[1] - w[0], w[0])):     # as _build needs them
        ops = tuple(sorted((o for a in atoms[w[0]:w[1]] for o in a), key=graph.index))
        if seg_of[w[0]] == seg_of[w[1] - 1]:
            key = window_signature(Region.of(graph, ops), spec)[0]
            tasks.setdefault(key, ops)
            if w[1] - w[0] >= FORK_MIN_ATOMS:
                remote.add(key)
    # no cyclic garbage collection while building (nor in the workers forked here): the build
    # makes hundreds of thousands of short-lived objects, nearly all freed by their reference
    # counts, and the collector's passes over them were ~5% of its time (peak memory the same;
    # the first collection after it scans what it kept: chain-5000's build 1.8 s faster, the
    # solve after it 0.5 s slower)
    collecting = gc.isenabled()
    gc.disable()
    try:
        searches = _PipelineSearches(graph, spec, step, tasks, remote)
        try:
            return _build(graph, spec, atoms, seg_of, n, windows, full_pipe, pipe_windows, step,
                          strategies, kernel_strats, want_pipe, compare_baselines, max_window,
                          progress, enum, searches)
        finally:
            searches.close()
    finally:
        if collecting:
            gc.enable()


def _build(graph, spec, atoms, seg_of, n, windows, full_pipe, pipe_windows, step, strategies,
           kernel_strats, want_pipe, compare_baselines, max_window, progress, enum, searches):
    cache: dict = {}
    renames: dict = {}
    hits = 0
    work = [0.0] * n
    cands: list[Candidate] = []
    span_ids: dict[tuple[int, int], dict[str, list[int]]] = {}
    seen_windows: dict = {}      # (lo, hi) -> ops, region, signature names, full, do_pipe, key
    limited: dict = {}           # key -> the pipeline search of its first window (evals)

    def window(lo, hi):
        if (lo, hi) not in seen_windows:
            ops = tuple(sorted((o for a in atoms[lo:hi] for o in a), key=graph.index))
            region = Region.of(graph, ops)
            sig, names = window_signature(region, spec)
            full = (lo, hi) in full_pipe
            do_pipe = (want_pipe and seg_of[lo] == seg_of[hi - 1]
                       and (full or hi - lo <= min(max_window, MAX_PIPELINE_ATOMS)))
            seen_windows[(lo, hi)] = (ops, region, sig, names, full, do_pipe,
                                      (sig, do_pipe, full))
        return seen_windows[(lo, hi)]

    for wi, (lo, hi) in enumerate(windows):
        if wi == 0 or hi - lo != windows[wi - 1][1] - windows[wi - 1][0]:
            # the pipeline searches of every new window of this size, side by side (their
            # stage replays together); the one-atom windows before give the atom times
            steps = {}
            for w in windows[wi:]:
                if w[1] - w[0] != hi - lo:
                    break
                _, region, _, _, full, do_pipe, key = window(*w)
                if do_pipe and not full and key not in cache and key not in steps:
                    steps[key] = enum.limited_steps(region, [tuple(a) for a in atoms[w[0]:w[1]]],
                                                       work[w[0]:w[1]])
            limited = enum.together(steps)
        ops, region, sig, names, full, do_pipe, key = seen_windows.pop((lo, hi), None) or window(lo, hi)
        if key in cache:
            hits += 1
            src_names, entries = cache[key]
            mapping = {a: b for a, b in zip(src_names, names) if a != b}
        else:
            entries = [_Entry(s, _STRATEGY_FN[s](region, spec)) for s in kernel_strats]
            if do_pipe:
                if full:
                    res, src_ops = searches.result(sig), searches.tasks[sig]
                    m = dict(zip(window_signature(Region.of(graph, src_ops), spec)[1], names))
                    res = [(PipelineChoice(_rename(ch.stages, m), ch.sms, ch.tile_rows,
                                           ch.depths, ch.modes), est) for ch, est in res]
                    evals = enum.full(region, res)
                else:
                    evals = limited.pop(key)
                for e in evals:
                    p = e.plan
                    entries.append(_Entry(
                        "pipeline", e.estimate, e.choice, e.table, p.row_blocks * p.slabs,
                        p.slabs, tuple(p.slot_bytes), e.budget, e.servers))
            cache[key] = (names, entries)
            mapping = {}
        if hi - lo == 1 and entries:
            work[lo] = min(e.estimate.latency_s for e in entries)
        ids = span_ids.setdefault((lo, hi), {})
        if mapping:
            renames[(lo, hi)] = mapping
        for e in entries:
            est = e.estimate
            choice = e.choice
            if mapping:
                if choice is not None:
                    choice = PipelineChoice(_rename(choice.stages, mapping), choice.sms,
                                            choice.tile_rows, choice.depths, choice.modes)
            c = Candidate(len(cands), ops, e.strategy, est, choice, e.table, e.units, (lo, hi),
                          e.slabs, e.slot_bytes, e.queue_budget, e.servers)
            ids.setdefault(e.strategy, []).append(c.id)
            cands.append(c)
        if progress is not None:
            progress(wi + 1, len(windows))

    # every atom must be coverable
    covered = [False] * n
    for c in cands:
        for i in range(*c.span):
            covered[i] = True
    if not all(covered):
        i = covered.index(False)
        why = ""
        if strategies == ("pipeline",) and enum.l2_dropped:
            why = (f"; {spec.name}'s usable L2 ({spec.l2_usable_bytes / 2**20:.1f} MiB) is too "
                   f"small for one slot per queue of any pipeline over it")
        raise InfeasibleError(f"no allowed strategy ({', '.join(strategies)}) can run op "
                              f"{atoms[i][0]!r}{why}")

    multi = [c for c in cands if c.strategy == "pipeline" and len(c.choice.stages) > 1]
    if (strategies == ("pipeline",) and (enum.l2_dropped or multi)
            and not any(sum(c.slot_bytes) <= spec.l2_usable_bytes for c in multi)):
        need = min([enum.min_queue_bytes] + [sum(c.slot_bytes) for c in multi])
        raise InfeasibleError(
            f"{spec.name}'s usable L2 ({spec.l2_usable_bytes / 2**20:.2f} MiB) is too small for "
            f"one slot per queue of any pipeline (the smallest needs {need / 2**20:.2f} MiB); "
            f"allow other strategies or a larger L2")

    baselines: dict[str, list[int]] = {}
    for s in kernel_strats:
        baselines[s] = list(span_ids[(0, n)][s][:1])
    if want_pipe and compare_baselines:
        ids = []
        for w in pipe_windows:
            d = span_ids[w]
            if d.get("pipeline"):
                best = min(d["pipeline"], key=lambda i: (cands[i].estimate.latency_s,
                                                         cands[i].estimate.dram_bytes, i))
                ids.append(best)
            elif d.get("fusion"):
                ids.append(d["fusion"][0])
            else:
                ids = None
                break
        if ids is not None:
            baselines["pipeline"] = ids
    stats = {"atoms": n, "windows": len(windows), "candidates": len(cands),
             "pipeline_candidates": sum(c.strategy == "pipeline" for c in cands),
             "pipelines_evaluated": enum.evaluated, "pipelines_exact": enum.exact_calls,
             "pipelines_dropped_for_l2": enum.l2_dropped,
             "window_cache_hits": hits}
    return CandidateSet(graph, spec, cands, list(atoms), step, max_window, strategies, baselines,
                        stats, renames)
