"""Execution strategies for a region: bsp, fusion, tilesync and concurrent (pipeline is in
pipeline.py). Each is a pure function (region, spec, choice) -> Estimate with a breakdown."""
from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass

import numpy as np

from kitsune_dse.cost.estimate import Estimate
from kitsune_dse.cost.memo import table
from kitsune_dse.cost.region import (Region, is_fusible_reduction_owner, kernel_variants,
                                     kernel_works, view_base)
from kitsune_dse.cost.roofline import KernelWork, busiest_sm_tiles, combine_core, kernel_time, tail_share
from kitsune_dse.graph.ir import DepPattern, OpClass
from kitsune_dse.graph.transform import BIAS_SUFFIX, unfused_bias
from kitsune_dse.hw.spec import HwSpec

STRATEGIES = ("bsp", "fusion", "tilesync", "concurrent", "pipeline")


@dataclass(frozen=True)
class LaunchChoice:
    """How kernels are launched: 'graph' (a CUDA graph: a small device gap per kernel) or
    'eager' (the host issues each kernel; short kernels wait for the host)."""
    launch: str = "graph"


def launch_timeline(times: list[float], spec: HwSpec, mode: str = "graph",
                    issue_s: list[float] | None = None) -> tuple[float, float]:
    """(makespan, launch cost) of kernels run back to back, each depending on the last;
    issue_s: launched eagerly, each kernel's host issue time (default spec.launch_overhead_s)."""
    n = len(times)
    if n == 0:
        return 0.0, 0.0
    busy = float(sum(times))
    if mode == "graph":
        # a node gap per kernel, and once the graph's launch latency (its first kernel's wait)
        over = n * spec.graph_launch_overhead_s + spec.launch_latency_cost_s
        return busy + over, over
    if mode != "eager":
        raise ValueError(f"launch mode {mode!r}")
    end = kernel_ends(times, spec, issue_s)[-1]
    return end, end - busy


def kernel_ends(times: list[float], spec: HwSpec, issue_s: list[float] | None = None) -> list[float]:
    """When each of kernels launched eagerly back to back ends: a kernel starts after the last
    one (plus the device's gap) or once the host has issued it, whichever is later. The step
    between two ends is what CUDA events recorded between the launches measure. issue_s: each
    kernel's host issue time (default spec.launch_overhead_s, the first launch
    spec.launch_first_cost_s: the host has just waited for the GPU; a GEMM library call costs
    more)."""
    out, end, issue = [], 0.0, 0.0
    for i, t in enumerate(times):
        if issue_s is not None:
            issue += issue_s[i]
        else:
            issue += spec.launch_first_cost_s if i == 0 else spec.launch_overhead_s
        end = max(end + (spec.kernel_gap_s if i else 0.0), issue) + t
        out.append(end)
    return out


def _estimate_from_kernels(works: list[KernelWork], times: list[float], latency: float, spec,
                           region: Region, **breakdown) -> Estimate:
    busy = sum(t * min(spec.sm_count, math.ceil(w.tiles / w.ctas_per_sm)) for w, t in zip(works, times))
    return Estimate(
        latency_s=latency,
        dram_read_bytes=sum(w.dram_read_bytes for w in works),
        dram_write_bytes=sum(w.dram_write_bytes for w in works),
        dram_deferred_write_bytes=sum(w.deferred_write_bytes for w in works),
        l2_bytes=max((w.l2_bytes for w in works), default=0.0),
        kernel_launches=len(works),
        sm_busy_fraction=min(1.0, busy / (latency * spec.sm_count)) if latency > 0 else 0.0,
        flops=region.flops,
        breakdown=breakdown).check()


def _kernel_rows(works, times, spec, mode: str = "graph", issue_s=None):
    """Per kernel: its work and time; launched eagerly, also the step from the previous
    kernel's end to its own (eager_step_s: the host's issue included) and what that step is when
    the host has issued ahead of the GPU (device_step_s: the kernel and the device's gap)."""
    rows = [{"kernel": w.name, "latency_s": t, "dram_read_bytes": w.dram_read_bytes,
             "dram_write_bytes": w.dram_write_bytes, "deferred_write_bytes": w.deferred_write_bytes,
             "l2_bytes": w.l2_bytes, "tiles": w.tiles,
             "waves": math.ceil(w.tiles / (spec.sm_count * w.ctas_per_sm))}
            for w, t in zip(works, times)]
    if mode == "eager":
        ends = kernel_ends(times, spec, issue_s)
        for r, e, prev in zip(rows, ends, [0.0] + ends[:-1]):
            r["eager_step_s"] = e - prev
            r["device_step_s"] = r["latency_s"] + spec.kernel_gap_s
    return rows


# -- bsp ----------------------------------------------------------------------------------------
def bsp_groups(region: Region) -> list[tuple[str, ...]]:
    return [(o,) for o in region.ops]


def bsp(region: Region, spec: HwSpec, choice: LaunchChoice | None = None,
        issue_s: list[float] | None = None) -> Estimate:
    """One kernel per op on all SMs (issue_s: launched eagerly, each one's host issue time)."""
    choice = choice or LaunchChoice()
    works = kernel_works(region, bsp_groups(region), spec)
    times = [kernel_time(w, spec, spec.sm_count) + spec.kernel_fixed_s for w in works]
    lat, over = launch_timeline(times, spec, choice.launch, issue_s)
    return _estimate_from_kernels(works, times, lat, spec, region, strategy="bsp",
                                  launch=choice.launch, launch_s=over,
                                  kernels=_kernel_rows(works, times, spec, choice.launch, issue_s))


def library_bsp(region: Region, spec: HwSpec, choice: LaunchChoice | None = None,
                library_spec: HwSpec | None = None) -> Estimate:
    """One kernel per op with a GEMM library's plain product: a matmul's bias is added by a
    kernel of its own (what the validation harness's cublas baselines run: cuBLAS writes the
    product, an elementwise kernel reads it back with the bias). The GEMMs are priced with
    `library_spec`'s rates (the library's calibration; default `spec`), every other kernel and
    the launches with `spec` (they are this tool's kernels, launched the same way)."""
    choice = choice or LaunchChoice()
    lib = library_spec or spec
    g = unfused_bias(region.graph)
    names = {op.name for op in g.ops}
    ops = [x for o in region.ops for x in (o, o + BIAS_SUFFIX) if x in names]
    sub = Region.of(g, ops)
    groups = bsp_groups(sub)
    own, theirs = kernel_works(sub, groups, spec), kernel_works(sub, groups, lib)
    is_gemm = [any(g.op(o).info.gemm is not None for o in grp)
               for grp in groups if not all(g.op(o).info.is_view for o in grp)]
    works = [b if gm else a for a, b, gm in zip(own, theirs, is_gemm)]
    times = [kernel_time(w, lib, lib.sm_count) + lib.kernel_fixed_s if gm else
             kernel_time(w, spec, spec.sm_count) + spec.kernel_fixed_s for w, gm in zip(works, is_gemm)]
    # launched eagerly, a GEMM is a library call (library_call_s of host time), the rest this
    # tool's kernels
    issue = [(lib.library_call_first_cost_s if gm else spec.launch_first_cost_s) if i == 0 else
             (lib.library_call_cost_s if gm else spec.launch_overhead_s) for i, gm in enumerate(is_gemm)]
    lat, over = launch_timeline(times, spec, choice.launch, issue)
    return _estimate_from_kernels(works, times, lat, spec, sub, strategy="bsp", launch=choice.launch,
                                  launch_s=over, library=lib.name,
                                  kernels=_kernel_rows(works, times, spec, choice.launch, issue))


# -- fusion -------------------------------------------------------------------------------------
def _can_join(region: Region, group: list[str], op: str) -> bool:
    g = region.graph
    info = g.op(op).info
    kinds = [g.op(o).info.op_class for o in group if not g.op(o).info.is_view]
    if info.is_view:
        return True
    # the op must stream from the group: every input produced in the group row-aligned
    for t, pat in info.patterns.items():
        p = g.producer(t)
        if p in group and pat not in (DepPattern.ELEMENTWISE, DepPattern.ROW):
            return False
    c = info.op_class
    if c is OpClass.ELEMENTWISE:
        return all(k in (OpClass.GEMM, OpClass.ELEMENTWISE, OpClass.ROW_REDUCTION) for k in kinds)
    if c is OpClass.ROW_REDUCTION:
        # a row reduction stitches in when one CTA owns whole rows of the group's output
        return (all(k in (OpClass.GEMM, OpClass.ELEMENTWISE, OpClass.ROW_REDUCTION) for k in kinds)
                and is_fusible_reduction_owner(region, tuple(group)))
    if c is OpClass.GEMM:
        # prologue fusion only: elementwise producers; never across another GEMM's K dimension
        return all(k is OpClass.ELEMENTWISE for k in kinds)
    return False


def fusion_groups(region: Region) -> list[tuple[str, ...]]:
    """FusionStitching-style vertical fusion: elementwise ops and row reductions join their
    producer's kernel (epilogue), elementwise producers join a GEMM (prologue); GEMMs never fuse
    with each other; gathers, scatters and copies keep their own kernels. Groups stay convex."""
    return list(_fusion_groups(region))


@functools.lru_cache(maxsize=1 << 14)
def _fusion_groups(region: Region) -> tuple[tuple[str, ...], ...]:
    # memoised: the search asks for the groups of the same stage under many cuts and plans
    g = region.graph
    group_of: dict[str, int] = {}
    groups: list[list[str]] = []
    succ_groups: list[set[int]] = []

    def reachable(src: int, dst: int) -> bool:
        stack, seen = [src], {src}
        while stack:
            u = stack.pop()
            if u == dst:
                return True
            for v in succ_groups[u]:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return False

    for op in region.ops:
        preds = [p for p in g.preds(op) if p in region.op_set]
        pgroups = sorted({group_of[p] for p in preds}, reverse=True)
        chosen = None
        for cand in pgroups:
            others = [h for h in pgroups if h != cand]
            if _can_join(region, groups[cand], op) and not any(reachable(cand, h) for h in others):
                chosen = cand
                break
        if chosen is None:
            chosen = len(groups)
            groups.append([])
            succ_groups.append(set())
        groups[chosen].append(op)
        group_of[op] = chosen
        for h in pgroups:
            if h != chosen:
                succ_groups[h].add(chosen)
    return tuple(tuple(grp) for grp in groups)


def fusion(region: Region, spec: HwSpec, choice: LaunchChoice | None = None) -> Estimate:
    choice = choice or LaunchChoice()
    groups = fusion_groups(region)
    works = kernel_works(region, groups, spec)
    times = [kernel_time(w, spec, spec.sm_count) + spec.kernel_fixed_s for w in works]
    lat, over = launch_timeline(times, spec, choice.launch)
    return _estimate_from_kernels(works, times, lat, spec, region, strategy="fusion",
                                  launch=choice.launch, launch_s=over,
                                  groups=[list(x) for x in groups],
                                  kernels=_kernel_rows(works, times, spec, choice.launch))


# -- tilesync (cuSync) --------------------------------------------------------------------------
def _streams_from(region: Region, prod: tuple[str, ...], cons: tuple[str, ...]) -> bool:
    """Whether kernel `cons` reads `prod`'s output tile by tile (so it can start early)."""
    g = region.graph
    outs = {t for o in prod for t in g.op(o).outputs}
    pats = [g.op(o).info.patterns[t] for o in cons for t in g.op(o).inputs if t in outs]
    return bool(pats) and all(p.streamable for p in pats)


def _fluid_time(w: KernelWork, spec: HwSpec, S: int) -> float:
    """The kernel's time when the next kernel's tiles fill the SMs its last wave leaves idle:
    its tiles spread evenly over all SMs (no last-wave tail). Its ramp stays: the first
    consumer tile needs a whole row-block of this kernel's output, which its own epilogue
    writes. A one-wave kernel gains nothing: every row-block completes with its only wave
    (measured: a chain of one-wave GEMMs runs no faster under tilesync than in a graph).
    Of what spreading its tiles saves, it keeps its math's share, c / (c + its read stream):
    a stream-bound kernel's DRAM stream is as long on all SMs as on its own waves' (gpt3 t64's
    weight-streaming fc1 -> fc2 saved 27 us under tilesync against its graph, where the
    whole saving priced 54 on fc2 alone).
    Memoised: every window holding the kernel asks again."""
    memo = table(spec, "fluid_time")
    key = (w, S)
    if key not in memo:
        memo[key] = _fluid(w, spec, S)
    return memo[key]


def _fluid(w: KernelWork, spec: HwSpec, S: int) -> float:
    t, p = kernel_time(w, spec, S, parts=True)
    tiles = max(1, w.tiles)
    if float(busiest_sm_tiles(w, S)) <= 1.0:
        return t
    spread = tiles / (math.ceil(tiles / S) * S)      # its tile work, epilogues too, over all SMs
    compute = (p["compute_s"] - p["tail_s"]) * spread  # (no last round: no tail)
    f = (max(combine_core(w, spec, compute, p["dram_s"], p["read_s"]), p["l2_s"])
         + p["ramp_s"] + p["epilogue_s"] * spread)
    return t - (t - f) * tail_share(p["compute_s"], p["read_s"] or p["dram_s"])


def _tile_s(w: KernelWork, t: float, S: int) -> float:
    """A kernel's time per tile on its busiest SM (t: its time on S SMs)."""
    return t / max(1.0, float(busiest_sm_tiles(w, S)))


def _staggered_time(w: KernelWork, spec: HwSpec, S: int, stagger_s: float) -> float:
    """A kernel whose CTAs start spread over `stagger_s`: its wave tail (its time over its
    fluid time) shrinks by the share of one of its tile times the spread covers."""
    t = kernel_time(w, spec, S)
    fluid = _fluid_time(w, spec, S)
    share = min(1.0, stagger_s / max(_tile_s(w, t, S), 1e-12))
    return t - share * max(0.0, t - fluid)


def _independent(region: Region, prod: tuple[str, ...], cons: tuple[str, ...]) -> bool:
    """Whether kernel `cons` reads nothing kernel `prod` writes (views resolved): under
    tilesync its CTAs start on the SMs `prod`'s last wave leaves idle, as a streaming
    consumer's do, and wait for none of its tiles (nerf's feature head beside its density
    head: 226.5 us against 229.4 as a CUDA graph, bench/handoff_probes.txt item 3)."""
    g = region.graph
    writes = {view_base(g, t) for o in prod for t in g.op(o).outputs}
    return not any(view_base(g, t) in writes for o in cons for t in g.op(o).inputs)


def _handoffs(region: Region, groups: list[tuple[str, ...]]) -> list[tuple[bool, bool]]:
    """(waits, signals) per kernel of a tilesync/concurrent region: a kernel checks a flag before
    each tile when it reads a tensor an earlier kernel of the region writes, and counts each
    finished tile when a later kernel reads its output (views resolved to what they alias)."""
    g = region.graph
    writes = [{view_base(g, t) for o in grp for t in g.op(o).outputs} for grp in groups]
    reads = [{view_base(g, t) for o in grp for t in g.op(o).inputs} - w for grp, w in zip(groups, writes)]
    out = []
    for i in range(len(groups)):
        waits = any(reads[i] & writes[j] for j in range(i))
        signals = any(reads[j] & writes[i] for j in range(i + 1, len(groups)))
        out.append((waits, signals))
    return out


def _handoff_s(work: KernelWork, spec: HwSpec, sms, waits: bool, signals: bool):
    """Hand-off time on the kernel's busiest SM (per tile, calibrated by the harness's probes).
    A signal releases the CTA's stores, so it waits for them to drain: an SM with one CTA
    (a GEMM, a wide norm) idles meanwhile; where other CTAs share the SM, their work covers
    most of it (tile_signal_shared_s)."""
    signal = spec.tile_signal_cost_s if work.ctas_per_sm <= 1 else spec.tile_signal_shared_cost_s
    per_tile = (spec.tile_wait_cost_s if waits else 0.0) + (signal if signals else 0.0)
    return busiest_sm_tiles(work, sms) * per_tile


def tilesync(region: Region, spec: HwSpec, choice=None) -> Estimate:
    """Dependent kernels overlap at tile granularity (cuSync): a consumer's tiles start as soon
    as the producer tiles they need are done, on the SMs the producer's last wave leaves idle,
    so the producer's wave-quantization tail disappears: it costs its fluid time (its tiles
    spread evenly over all SMs) instead of whole waves; the last kernel, fed that way, starts
    staggered over one producer tile time and loses that share of one of its own tile times of
    its tail. Each consumer wave waits on one
    semaphore hand-off; kernels are launched ahead of time (one launch gap). A barrier (a full
    or gather dependency) keeps the producer's quantized time. The first consumer wave waits
    on one hand-off (later waves find their tiles ready)."""
    groups = [grp for grp in fusion_groups(region) if not all(
        region.graph.op(o).info.is_view for o in grp)]
    works = kernel_works(region, groups, spec)
    S = spec.sm_count
    fixed = spec.kernel_fixed_s
    times = [kernel_time(w, spec, S) + fixed for w in works]
    saved = []
    gap = spec.graph_launch_overhead_s
    total = gap + spec.tilesync_fixed_s + spec.launch_latency_cost_s if works else 0.0
    hand = _handoffs(region, groups)
    least_bytes = 0.0
    for i, (w, t) in enumerate(zip(works, times)):
        last = i + 1 == len(works)
        # each kernel may take whichever CTA tile / split-K suits overlapping best (a min over
        # a fixed set of monotone costs keeps the estimate monotone in the hardware); every
        # tile pays its hand-offs (a flag check before, a count after)
        variants = kernel_variants(region, groups[i], spec, w)
        least_bytes += min(v.dram_bytes for v in variants)
        if not last:
            total += spec.tilesync_handoff_s
        if not last and _independent(region, groups[i], groups[i + 1]):
            cost = min(min(_fluid_time(v, spec, S), kernel_time(v, spec, S) + gap)
                       + _handoff_s(v, spec, S, *hand[i]) for v in variants) + fixed
            saved.append(t + gap - cost)
        elif not last and _streams_from(region, groups[i], groups[i + 1]):
            cost = min(min(_fluid_time(v, spec, S) + spec.sync_latency_s,
                           kernel_time(v, spec, S) + gap) + _handoff_s(v, spec, S, *hand[i])
                       for v in variants) + fixed
            saved.append(t + gap - cost)
        elif last and i > 0 and (_streams_from(region, groups[i - 1], groups[i])
                                 or _independent(region, groups[i - 1], groups[i])):
            # fed tile by tile, the last kernel's CTAs start as its producer's last tiles end,
            # staggered over one producer tile time, and end as staggered: of its own wave tail
            # it loses that share of one of its tile times (probes on the device: llama's gate ->
            # up pair, tiles alike, saved 72 us over its CUDA graph, where the producer's tail
            # alone gave 26; a LayerNorm's short rows into a GEMM stagger nothing)
            stagger = _tile_s(works[i - 1], times[i - 1] - fixed, S)
            cost = min(_staggered_time(v, spec, S, stagger) + _handoff_s(v, spec, S, *hand[i])
                       for v in variants) + fixed
        else:
            cost = min(kernel_time(v, spec, S) + _handoff_s(v, spec, S, *hand[i])
                       for v in variants) + fixed + (0.0 if last else gap)
            if not last:
                saved.append(-gap)
        total += cost
    # overlapping kernels still share one DRAM: the traffic floor holds, for the least traffic
    # any variant of each kernel moves (the variant set does not depend on the hardware; the
    # tile picked alone does: with more bandwidth a tile that re-reads more operands could be
    # picked and raise the floor, 6% on a property test's fp32 GEMM pair)
    floor = least_bytes / spec.hbm_bandwidth_from(S)
    total = max(total, floor + (spec.graph_launch_overhead_s if works else 0.0))
    return _estimate_from_kernels(works, times, total, spec, region, strategy="tilesync",
                                  overlap_saved_s=saved, groups=[list(x) for x in groups],
                                  kernels=_kernel_rows(works, times, spec))


# -- concurrent (ACS) ---------------------------------------------------------------------------
def levels(region: Region) -> list[list[str]]:
    """Ops grouped by longest-path depth inside the region: each level's ops are independent."""
    g = region.graph
    depth: dict[str, int] = {}
    for o in region.ops:
        ps = [depth[p] for p in g.preds(o) if p in depth]
        depth[o] = (max(ps) + 1) if ps else 0
    out: dict[int, list[str]] = {}
    for o in region.ops:
        out.setdefault(depth[o], []).append(o)
    return [out[k] for k in sorted(out)]


def split_sms(tables: list[np.ndarray], total: int, step: int = 1) -> tuple[float, list[int]]:
    """Share `total` SMs among independent kernels to minimise the slowest one. tables[i][s] is
    kernel i's latency on s SMs (index 0 unused); the latency is non-increasing in s, so the
    answer is the smallest T for which the SMs each needs to finish within T fit in `total`."""
    k = len(tables)
    allowed = np.arange(step, total + 1, step)
    if k * step > total:
        return math.inf, []
    cands = np.unique(np.concatenate([tab[allowed] for tab in tables]))

    def need(T):
        out = []
        for tab in tables:
            ok = np.nonzero(tab[allowed] <= T * (1 + 1e-12))[0]
            if ok.size == 0:
                return None
            out.append(int(allowed[ok[0]]))
        return out if sum(out) <= total else None

    lo = bisect.bisect_left(range(len(cands)), True, key=lambda i: need(cands[i]) is not None)
    T = float(cands[lo])
    return T, need(T)


def concurrent(region: Region, spec: HwSpec, choice=None) -> Estimate:
    """Independent kernels of each dependency level launched back to back (ACS's window of
    independent kernels; the harness's programmatic dependent launches), dependent levels one
    after another. The hardware gives every CTA slot a kernel frees to the next kernel launched,
    so a level's kernels share the SMs only as their grids let them: kernels whose CTAs all fit
    the chip at once run side by side, each on a share of the SMs in proportion to its CTAs;
    larger ones overlap only where an earlier kernel's last wave leaves SMs idle (it costs its
    fluid time, as a tilesync producer). Measured on the H100 (nerf's sigma and feature heads,
    2,048 and 4,096 CTAs): 240 us, against 230 for the two kernels one after another; an SM
    split (38 / 94) the grids never take had priced it 217."""
    groups = [tuple(lv) for lv in levels(region)]
    works = kernel_works(region, [(o,) for lv in groups for o in lv], spec)
    by_op = {w.name: w for w in works}
    variants = {w.name: kernel_variants(region, (w.name,), spec, w) for w in works}
    S = spec.sm_count
    order = [(w.name,) for w in works]
    hand = dict(zip([w.name for w in works], _handoffs(region, order)))
    total, times, shares = (spec.tilesync_fixed_s + spec.launch_latency_cost_s if works else 0.0), [], []

    def best(w):
        """(time on all SMs, variant): the variant best with its hand-offs (a min over a fixed
        set of monotone costs keeps the estimate monotone)."""
        costs = [kernel_time(v, spec, S) + _handoff_s(v, spec, S, *hand[w.name]) for v in variants[w.name]]
        i = int(np.argmin(costs))
        return costs[i], variants[w.name][i]

    for lv in groups:
        ws = [by_op[o] for o in lv if o in by_op]
        if not ws:
            continue
        if len(ws) == 1:
            t = best(ws[0])[0]
            split = [S]
        else:
            alone, picks = zip(*(best(w) for w in ws))
            # launched in order, each kernel but the last loses its wave tail to the next
            fill = sum(min(_fluid_time(v, spec, S), kernel_time(v, spec, S)) + _handoff_s(v, spec, S, *hand[w.name])
                       for w, v in zip(ws[:-1], picks[:-1])) + alone[-1]
            t, split = fill, [S] * len(ws)
            footprint = [v.tiles / max(1, v.ctas_per_sm) for v in picks]     # SMs its grid fills
            if sum(footprint) <= S:
                side = [max(1, int(S * f / sum(footprint))) for f in footprint]
                t_side = max(kernel_time(v, spec, s) + _handoff_s(v, spec, s, *hand[w.name])
                             for w, v, s in zip(ws, picks, side))
                if t_side < t:
                    t, split = t_side, side
            # the kernels share one DRAM: at least their bytes at the chip's bandwidth
            dram = sum(w.dram_bytes - w.grid_reread_bytes for w in ws)
            t = max(t, dram / spec.hbm_bandwidth_from(S))
            serial = (sum(alone)
                      + (len(ws) - 1) * (spec.graph_launch_overhead_s + spec.kernel_fixed_s))
            if serial <= t:     # as good back to back
                t, split = serial, [S] * len(ws)
        t += spec.kernel_fixed_s        # the kernels of a level ramp up and drain together
        total += t + spec.graph_launch_overhead_s
        times.extend([t] * len(ws))
        shares.append({w.name: s for w, s in zip(ws, split)})
    ordered = [w for lv in groups for w in (by_op[o] for o in lv if o in by_op)]
    return _estimate_from_kernels(ordered, times, total, spec, region, strategy="concurrent",
                                  sm_shares=shares)
