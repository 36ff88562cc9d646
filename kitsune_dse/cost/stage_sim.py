"""A pipeline stage of several dependent steps, worker by worker.

The persistent runtime gives a stage `workers` workers (two 256-thread teams per SM). Each worker
walks the stage's row-blocks in order and, inside a row-block, the stage's steps in order; of the
n_k items (output tiles) of step k in row-block rb it takes those whose index i satisfies
(rb * n_k + i) = its own index (mod workers), so the items of consecutive row-blocks rotate over
the workers. Before its first item of (rb, k) a worker waits for the rings step k reads: until
every item of (rb, j) is done for the step j before it whose output it reads (usually k-1; a step
that reads only the stage's input waits for that alone, as step 0 does: `StageShape.after`) and,
where step k's output ring holds `slots` row-blocks, until the last step reading that ring
(usually k+1: `StageShape.reader`; none where only the stage's outputs read it) has finished
row-block rb - slots. Its items then run back to back, `tau[k]` seconds each. A stage whose
steps are dependent therefore works on only a few row-blocks at once: a one-stage kernel of two
GEMMs of 48 and 96 column tiles per 128-row block on 132 SMs keeps far fewer than its 264
workers busy (measured: 2.9x the all-row-blocks-at-once estimate, validate/NOTES.md).

`makespan` replays that schedule for many SM counts at once (arrays over [SM counts, workers]);
beyond SIM_ROW_BLOCKS row-blocks the steady period of the second half of the simulated ones is
extrapolated, which keeps a stage-time table over every SM count a few milliseconds. The worker
rotation takes tens of row-blocks to settle: from 16 row-blocks the extrapolation made bert's
one-stage plan 4.7-6.2 ms (by SM count) where the whole replay gives 2.9-3.3 and the GPU's
trace 3.1 (it matches the trace row-block by row-block); from 128 it stays within 10%.
`stage_unit_time` times one hand-off unit through any stage (one step: its roofline; several:
that schedule) for the pipeline estimate and the search's stage tables. The search replays the
stages of many plans at once (`prefetch_schedules`, `makespans`): side by side in one set of
arrays, each the same doubles as alone, at a fraction of the cost of one by one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kitsune_dse.cost.memo import table
from kitsune_dse.cost.roofline import KernelWork, busiest_sm_tiles, kernel_time, lone_share
from kitsune_dse.hw.spec import HwSpec

SIM_ROW_BLOCKS = 128
TEAMS_PER_SM = 2


@dataclass(frozen=True)
class StageShape:
    """What the worker schedule of a multi-step stage depends on, besides the item times."""
    items: tuple[int, ...]        # per step: items (output tiles / column chunks) per row-block
    row_blocks: int               # runtime row-blocks the stage processes
    lookahead: int                # row-blocks the stage's rings let it run ahead of its oldest
    slots: tuple[int, ...]        # per step: row-blocks its output ring to the next step holds
    rb_per_unit: int = 1          # runtime row-blocks per hand-off unit of the plan
    slabs: int = 1                # hand-off units per row-block when it is handed over in slabs
    late_slot_wait: tuple[bool, ...] = ()   # per step: it waits for its output slot only before
                                  # its epilogue (a GEMM), not before it starts
    release_step: int = -1        # the last step that reads the stage's input ring: its slot of a
                                  # row-block is free once that step is done with it (-1: the
                                  # stage's last step)
    after: tuple[int, ...] = ()   # per step, the last earlier step whose row-block it reads (-1:
                                  # none, it reads only the stage's input: nerf's feature_fc
                                  # beside sigma_fc); () the step before each
    reader: tuple[int, ...] = ()  # per step, the last later step that reads its output ring (its
                                  # slot of a row-block is free once that step is done with it;
                                  # -1: none, the step writes only the stage's outputs and never
                                  # waits for a slot: nerf's sigma head); () the step after each


_CACHE: dict = {}
_CACHE_MAX = 4096


def makespan(shape: StageShape, tau: np.ndarray, workers: np.ndarray, sync_s: float,
             step_sync_s: tuple[float, ...] | None = None) -> np.ndarray:
    """Time the stage takes for all its row-blocks alone (inputs ready, outputs drained at
    once), for each worker count. tau: [steps, len(workers)] seconds per item of each step
    beside the SM's other team busy, optionally followed by the same rows for an item whose
    SM's other team is idle (default: the same time). The search asks for the same stage
    under many cuts: results are memoised. step_sync_s: per step, the wait from the step
    before it finishing a row-block to its own items starting on it (default sync_s)."""
    return makespans([(shape, tau, step_sync_s)], workers, sync_s)[0]


def makespans(jobs, workers: np.ndarray, sync_s: float) -> list[np.ndarray]:
    """makespan of each (shape, tau, step_sync_s) job on the same workers: the jobs not
    memoised yet are replayed side by side (_simulate_batch), those of the same simulated
    row-blocks and items per step in one replay. Each job's result is the double its own
    replay gives."""
    workers = np.asarray(workers, dtype=np.int64).reshape(-1)
    keys, todo, got = [], {}, {}
    for shape, tau, step_sync_s in jobs:
        tau = np.asarray(tau, dtype=float).reshape(-1, workers.size)
        key = (shape, tau.tobytes(), workers.tobytes(), float(sync_s), step_sync_s)
        keys.append(key)
        if key in _CACHE:
            got[key] = _CACHE[key]      # (taken now: storing the new ones may clear the memo)
        elif key not in todo:
            todo[key] = (shape, tau, step_sync_s)
    # one replay per number of simulated row-blocks and items per step (to the next power of
    # two, at least 4): a job padded to others' items pays for them, but a few cost less than
    # another replay (and padding a job to more steps costs more than it saves)
    groups: dict = {}
    W = int(workers.max())
    for key, (shape, _, _) in todo.items():
        rs = min(max(1, int(shape.row_blocks)), SIM_ROW_BLOCKS)
        widths = tuple(max(4, 1 << (min(n, W) - 1).bit_length()) for n in shape.items)
        groups.setdefault((rs, widths, shape.after, shape.reader), []).append(key)
    for members in groups.values():
        for key, out in zip(members, _simulate_batch([todo[k] for k in members], workers,
                                                     float(sync_s))):
            got[key] = out
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            _CACHE[key] = out
    return [got[k].copy() for k in keys]


_max_reduce = np.maximum.reduce     # (ndarray.max's Python wrapper is most of a call's cost here)


def _simulate(shape: StageShape, tau: np.ndarray, workers: np.ndarray, sync_s: float,
              step_sync_s: tuple[float, ...] | None = None) -> np.ndarray:
    """One stage's replay (not memoised): _simulate_batch of one job."""
    workers = np.asarray(workers, dtype=np.int64).reshape(-1)
    tau = np.asarray(tau, dtype=float).reshape(-1, workers.size)
    return _simulate_batch([(shape, tau, step_sync_s)], workers, float(sync_s))[0]


def _per_row(values, n_s: int, dtype=None) -> np.ndarray:
    """One value per job -> one per row (each job's SM counts are n_s consecutive rows)."""
    return np.repeat(np.asarray(values, dtype=dtype), n_s)


def _simulate_batch(jobs, workers: np.ndarray, sync_s: float) -> list[np.ndarray]:
    """The replays of several stages (jobs: (shape, tau, step_sync_s), all of the same step
    count and simulated row-blocks) side by side: job b's SM counts are rows b * n_s ... of one
    set of arrays, so one NumPy operation advances every job's (row-block, step) at once (a
    replay is hundreds of operations on a few dozen numbers each: their per-call cost, not
    the arithmetic, is its time). Rows never mix: each is the same maxima and sums, in the
    same order, as that job replayed alone. Where jobs differ (items, lookahead, ring slots,
    waits) a row takes its own value; a wait that does not apply to a row is -inf there."""
    shapes = [j[0] for j in jobs]
    K = len(shapes[0].items)
    Rs = min(max(1, int(shapes[0].row_blocks)), SIM_ROW_BLOCKS)
    B, n_s, W = len(jobs), len(workers), int(workers.max())
    n = B * n_s
    taus = [tau if tau.shape[0] != K else np.vstack([tau, tau]) for _, tau, _ in jobs]
    tau_rows = np.concatenate(taus, axis=1)                       # [2K, n]: busy, then lone
    wk = np.tile(workers, B)
    # when each worker is free, row by row in one flat array; each row's last entry is
    # scratch: the padding entries of the item lists below write there
    free = np.zeros(n * (W + 1))
    base = np.arange(n) * (W + 1)
    done = np.zeros((Rs, K, n))            # finish time of every item of (rb, k)
    done_flat = done.reshape(-1)
    row_ids = np.arange(n)
    look = _per_row([max(1, int(sh.lookahead)) for sh in shapes], n_s, np.int64)
    rel = _per_row([sh.release_step if 0 <= sh.release_step < K else K - 1 for sh in shapes],
                   n_s, np.int64)
    same_look = bool((look == look[0]).all() and (rel == rel[0]).all())
    back = -look * K * n + rel * n + row_ids
    step_sync = [j[2] or (sync_s,) * K for j in jobs]
    # (one per batch: makespans groups by them)
    waits_on = shapes[0].after or tuple(range(-1, K - 1))
    freed_by = shapes[0].reader or tuple(range(1, K)) + (-1,)
    # of step k's n items in row-block rb, worker (rb * n + i) mod w takes items i, i + w, ...:
    # only the min(n, w) workers with an item are touched (a few of the stage's workers), and
    # which ones and how long they run is known before the replay
    steps = []
    for k in range(K):
        nk = _per_row([sh.items[k] for sh in shapes], n_s, np.int64)
        # (items along the first axis, rows along the last: a row-block's end is then a
        # maximum over whole rows of items, not over each row's few items, many times faster)
        cap = np.minimum(nk, wk)
        i = np.arange(int(np.minimum(nk, W).max()))[:, None]
        has = i < cap
        off = ((np.arange(Rs)[:, None] * nk[None, :]) % wk[None, :])[:, None, :]
        worker = off + i        # < 2 w (off < w, i < w): (off + i) mod w is one subtraction
        worker -= wk * (worker >= wk)
        idx = base + np.where(has, worker, W)                        # [Rs, items, n]
        # a padding entry ends at -inf: it never counts in the row-block's end (its scratch
        # slot is never read for a real item)
        m = (nk - 1 - i) // wk + 1                                   # items per worker
        busy = np.where(has, m * tau_rows[k], -np.inf)
        # worker c's SM-mate is c + w/2 (mod w): an item runs alone when the mate has no item
        # of the same (rb, k) and is free when it starts (only a worker's single item can).
        # (A job whose lone times are its busy ones, or with no lone item, gets its busy time
        # either way: lone is then busy entry for entry)
        alone = None
        half = wk // 2
        mate_here = ((i + half) % wk) < cap                          # [items, n]
        lone_item = (has & ~mate_here & (m == 1)).reshape(-1, B, n_s).any(axis=(0, 2))
        differs = [not np.array_equal(t[k], t[K + k]) for t in taus]
        if any(d and a for d, a in zip(differs, lone_item)):
            pidx = base + (((off + i) % wk + half) % wk)
            lone = np.where(has, np.where(m == 1, tau_rows[K + k], busy), -np.inf)
            alone = (pidx, mate_here, lone)
        sync_k = _per_row([s[k] for s in step_sync], n_s, float)
        if (sync_k == sync_k[0]).all():
            sync_k = float(sync_k[0])
        slot = None
        if k + 1 < K and freed_by[k] > k:
            r = freed_by[k]
            slots = _per_row([sh.slots[k] for sh in shapes], n_s, np.int64)
            late = _per_row([bool(sh.late_slot_wait[k]) if k < len(sh.late_slot_wait) else False
                             for sh in shapes], n_s, bool)
            if (slots > 0).any():
                # row-block rb's wait reads done[rb - slots, r] (flat: rb * K * n + at);
                # rows without such a wait (yet) read -inf
                same = int(slots[0]) if (slots == slots[0]).all() else None
                lo = int(slots[slots > 0].min())
                hi = int(slots.max()) if (slots > 0).all() else Rs
                at = -slots * K * n + r * n + row_ids
                mask = ((slots > 0)[None, :] & (np.arange(hi)[:, None] >= slots[None, :]))
                slot = (same, lo, hi, at, mask, late, bool(late.all()), bool((~late).all()), r)
        steps.append((idx, busy, alone, sync_k, slot))
    zero = np.zeros(n)
    for rb in range(Rs):
        row = done[rb]
        for k, (idx, busy, alone, sync_k, slot) in enumerate(steps):
            if waits_on[k] >= 0:
                ready = row[waits_on[k]] + sync_k
            elif same_look:
                ready = done[rb - look[0], rel[0]] + sync_s if rb >= look[0] else zero
            else:       # each row reads done[rb - look, rel] of its own (flat: rb * K * n + back)
                got = np.take(done_flat, rb * K * n + back, mode="wrap") + sync_s
                ready = np.where(rb >= look, got, 0.0)
            before = after = None
            if slot is not None and rb >= slot[1]:
                same, _, hi, at, mask, late, all_late, none_late, r = slot
                if same is not None:
                    wait = done[rb - same, r] + sync_s
                else:
                    wait = np.take(done_flat, rb * K * n + at, mode="wrap") + sync_s
                    if rb < hi:
                        wait = np.where(mask[rb], wait, -np.inf)
                # a GEMM step waits for its slot only before its epilogue (late), others first
                if all_late:
                    after = wait
                elif none_late:
                    before = wait
                else:
                    before = np.where(late, -np.inf, wait)
                    after = np.where(late, wait, -np.inf)
            if before is not None:
                ready = np.maximum(ready, before)
            at = idx[rb]
            end = np.maximum(free[at], ready)
            if alone is None:
                end += busy
            else:
                pidx, mate_here, lone = alone
                paired = mate_here | (free[pidx[rb]] > end)
                end += np.where(paired, busy, lone)
            if after is not None:
                end = np.maximum(end, after)
            free[at] = end
            row[k] = _max_reduce(end, axis=0)
    # the stage ends with its last item (a later row-block may finish before an earlier one)
    ends = np.maximum.accumulate(done.max(axis=1), axis=0)
    out = []
    for b, (shape, tau) in enumerate(zip(shapes, taus)):
        rows = slice(b * n_s, (b + 1) * n_s)
        last = ends[Rs - 1, rows]
        R = max(1, int(shape.row_blocks))
        if R == Rs:
            out.append(last.copy())
            continue
        # the steady period: what the second half of the simulated row-blocks took, but never
        # less than the row-block's items spread over every worker (when fewer row-blocks are
        # simulated than the workers hold at once, the simulated ones all run side by side)
        half = Rs // 2
        work = (np.asarray(shape.items, float)[:, None] * tau[:K]).sum(axis=0) / workers
        period = np.maximum((last - ends[half - 1, rows]) / (Rs - half), work)
        out.append(last + (R - Rs) * period)
    return out


def stage_unit_time(works: list[KernelWork], spec: HwSpec, sms, shape: StageShape | None = None):
    """One hand-off unit through a stage (scalar or array of SM counts). One step: its work on
    the units its rings admit at once. Several steps (`shape`): the worker-by-worker schedule of
    all the stage's row-blocks (makespan), per unit. Memoised: the search meets the same stage
    (equal works) under many cuts and SM splits."""
    if np.ndim(sms):
        a = np.asarray(sms)
        key = (tuple(works), shape, a.dtype.str, a.shape, a.tobytes())
    else:
        key = (tuple(works), shape, float(sms))
    memo = table(spec, "stage_unit_time")
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _stage_unit_time(works, spec, sms, shape)
    return hit.copy() if isinstance(hit, np.ndarray) else hit


def _stage_unit_time(works: list[KernelWork], spec: HwSpec, sms, shape: StageShape | None):
    if shape is None or len(works) == 1:
        return (sum(kernel_time(w, spec, sms) / w.inflight for w in works)
                + sum(step_wait_s(w, spec) for w in works[1:]))
    s = np.maximum(np.atleast_1d(np.asarray(sms, dtype=float)), 1.0)
    top, log_grid, log_span, units, U, whole, _ = _schedule(works, spec, shape)
    span = np.exp(np.interp(np.log(np.minimum(s, top)), log_grid, log_span))
    bound = sum(kernel_time(w, spec, s) for w in whole) / U
    out = np.maximum(span / max(units, 1e-9), bound)
    return out if np.ndim(sms) else float(out[0])


def stage_unit_latency(works: list[KernelWork], spec: HwSpec, sms, shape: StageShape):
    """How long a several-step stage takes for its first hand-off unit alone (scalar or array
    of SM counts): the unit's trip through every step, a hand-off between steps, against the
    per-unit time its overlapping row-blocks give (stage_unit_time). The queue model runs such
    a stage as that many units side by side (cost.pipeline._stage_ratio)."""
    s = np.maximum(np.atleast_1d(np.asarray(sms, dtype=float)), 1.0)
    top, log_grid, _, _, _, _, log_first = _schedule(works, spec, shape)
    out = np.exp(np.interp(np.log(np.minimum(s, top)), log_grid, log_first))
    return out if np.ndim(sms) else float(out[0])


def step_wait_s(work: KernelWork, spec: HwSpec) -> float:
    """From the step before finishing a row-block to this step's items starting on it: a GEMM
    step waits a calibrated hand-off (the flag, then the first operand slabs of a just-written
    ring); a row or elementwise step, the flag alone."""
    return spec.step_handoff_cost_s if work.tile_shape else spec.sync_latency_s


def _schedule(works: list[KernelWork], spec: HwSpec, shape: StageShape):
    """What a several-step stage's unit time needs besides its SM counts, memoised (a plan is
    re-timed at many SM splits): the log of the worker schedule's span on the simulation grid,
    the units, and the works of all units at once (the bandwidth bound)."""
    key = (tuple(works), shape)
    memo = table(spec, "stage_schedule")
    hit = memo.get(key)
    if hit is None:
        setup = _schedule_setup(works, spec, shape)
        hit = memo[key] = _schedule_finish(setup, makespans(setup[0], *setup[1:3]))
    return hit


def prefetch_schedules(stages, spec: HwSpec) -> None:
    """_schedule of every (works, shape) in `stages` not memoised yet, their worker schedules
    replayed side by side (makespans): the search asks for hundreds of stages at once, each
    replay alone being mostly NumPy's per-call cost. The same numbers as one by one."""
    memo = table(spec, "stage_schedule")
    setups = {}
    for works, shape in stages:
        key = (tuple(works), shape)
        if key not in memo and key not in setups:
            setups[key] = _schedule_setup(works, spec, shape)
    if not setups:
        return
    jobs = [job for setup in setups.values() for job in setup[0]]
    first = next(iter(setups.values()))
    spans = makespans(jobs, first[1], first[2])
    for i, (key, setup) in enumerate(setups.items()):
        memo[key] = _schedule_finish(setup, spans[2 * i:2 * i + 2])


def _schedule_setup(works: list[KernelWork], spec: HwSpec, shape: StageShape):
    """_schedule's two replays (makespans jobs: the stage's row-blocks, then its first unit's
    alone), their workers and hand-off, and what the rest of _schedule needs."""
    # the schedule is replayed at a fixed grid of SM counts (every SM_GRID_STEP and the chip's
    # total) and interpolated log-log in between, so a table and a single SM count agree
    grid = sim_grid(spec.sm_count)
    tau, lone = [], []
    for w, n in zip(works, shape.items):
        # one runtime row-block of the step on the stage's SMs: rounds of one item per SM; a
        # worker (one of TEAMS_PER_SM teams) runs its items at its share of the SM, or alone
        # on it at lone_share of its rate
        rb = w.scaled(shape.slabs / shape.rb_per_unit, tiles=n)
        a = lone_share(rb, spec)
        t = TEAMS_PER_SM * kernel_time(rb, spec, grid) / busiest_sm_tiles(rb, grid, a)
        tau.append(t)
        lone.append(t / (TEAMS_PER_SM * a))
    # a step waiting for its slot in the ring to the next step (or the stage for a slot of its
    # input ring) waits a ring hand-off: the consumer's release, then the producer's poll, as
    # between stages (ring_handoff_s, 2.4 us; it had been the idle flag ping-pong, 0.53 us:
    # attention's qk + scale + softmax stage, whose scores ring holds two row-blocks, ran a row-
    # block every 3.1 us where that gave 1.8; NeRF's three-layer stages alone -17% -> -3%)
    taus = np.vstack(tau + lone)
    waits = tuple(step_wait_s(w, spec) for w in works)
    # the first unit alone: the same schedule over the unit's own row-blocks
    one = StageShape(shape.items, max(1, shape.rb_per_unit), shape.lookahead, shape.slots,
                     shape.rb_per_unit, shape.slabs, shape.late_slot_wait, shape.release_step)
    jobs = [(shape, taus, waits), (one, taus, waits)]
    return (jobs, TEAMS_PER_SM * grid.astype(np.int64), spec.ring_handoff_cost_s, grid, works,
            shape)


def _schedule_finish(setup, replays):
    _, _, _, grid, works, shape = setup
    span, first = replays
    units = shape.row_blocks * shape.slabs / shape.rb_per_unit     # hand-off units (slabs)
    # never faster than every unit's work at once on the stage's SMs (the shared DRAM and L2
    # bandwidth of all the row-blocks in flight)
    U = max(1, round(units))
    whole = [w.scaled(U, tiles=w.tiles * U) for w in works]
    return (grid[-1], np.log(grid), np.log(span), units, U, whole, np.log(first))


SM_GRID_STEP = 8


def sim_grid(sm_count: int) -> np.ndarray:
    """Fixed points (1, 2, 4, every SM_GRID_STEP) up to the first at or past the chip's SM
    count: a given SM count interpolates between the same points on any chip, so a chip with
    more SMs never re-prices a stage it could already run."""
    top = -(-sm_count // SM_GRID_STEP) * SM_GRID_STEP
    pts = {1, 2, 4} | set(range(SM_GRID_STEP, top + 1, SM_GRID_STEP))
    return np.array(sorted(p for p in pts if p <= max(top, 4)), dtype=float)
