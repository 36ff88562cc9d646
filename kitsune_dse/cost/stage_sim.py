"""A pipeline stage of several dependent steps, worker by worker.

The persistent runtime gives a stage `workers` workers (two 256-thread teams per SM). Each worker
walks the stage's row-blocks in order and, inside a row-block, the stage's steps in order; of the
n_k items (output tiles) of step k in row-block rb it takes those whose index i satisfies
(rb * n_k + i) = its own index (mod workers), so the items of consecutive row-blocks rotate over
the workers. Before its first item of (rb, k) a worker waits until every item of (rb, k-1) is
done (a step reads its predecessor's whole row-block) and, where step k's output ring holds
`slots` row-blocks, until step k+1 has finished row-block rb - slots. Its items then run back to
back, `tau[k]` seconds each. A stage whose steps are dependent therefore works on only a few
row-blocks at once: a one-stage kernel of two GEMMs of 48 and 96 column tiles per 128-row block on
132 SMs keeps far fewer than its 264 workers busy (measured: 2.9x the all-row-blocks-at-once
estimate, validate/NOTES.md).

`makespan` replays that schedule for many SM counts at once (arrays over [SM counts, workers]);
beyond SIM_ROW_BLOCKS row-blocks the steady period of the second half of the simulated ones is
extrapolated, which keeps a stage-time table over every SM count a few milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIM_ROW_BLOCKS = 16
TEAMS_PER_SM = 2


@dataclass(frozen=True)
class StageShape:
    """What the worker schedule of a multi-step stage depends on, besides the item times."""
    items: tuple[int, ...]        # per step: items (output tiles / column chunks) per row-block
    row_blocks: int               # runtime row-blocks the stage processes
    lookahead: int                # row-blocks the stage's rings let it run ahead of its oldest
    slots: tuple[int, ...]        # per step: row-blocks its output ring to the next step holds
    rb_per_unit: int = 1          # runtime row-blocks per hand-off unit of the plan


_CACHE: dict = {}
_CACHE_MAX = 4096


def makespan(shape: StageShape, tau: np.ndarray, workers: np.ndarray, sync_s: float) -> np.ndarray:
    """Time the stage takes for all its row-blocks alone (inputs ready, outputs drained at
    once), for each worker count. tau: [steps, len(workers)] seconds per item of each step.
    The search asks for the same stage under many cuts: results are memoised."""
    workers = np.asarray(workers, dtype=np.int64).reshape(-1)
    tau = np.asarray(tau, dtype=float).reshape(len(shape.items), -1)
    key = (shape, tau.tobytes(), workers.tobytes(), float(sync_s))
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        hit = _CACHE[key] = _simulate(shape, tau, workers, sync_s)
    return hit.copy()


def _simulate(shape: StageShape, tau: np.ndarray, workers: np.ndarray, sync_s: float) -> np.ndarray:
    K, R = len(shape.items), max(1, int(shape.row_blocks))
    Rs = min(R, SIM_ROW_BLOCKS)
    n_s, W = len(workers), int(workers.max())
    c = np.arange(W)[None, :]
    Wc = workers[:, None]
    live = c < Wc
    free = np.zeros((n_s, W))
    done = np.full((Rs, K, n_s), 0.0)       # finish time of every item of (rb, k)
    look = max(1, int(shape.lookahead))
    for rb in range(Rs):
        for k, n in enumerate(shape.items):
            i0 = c - ((rb * n) % workers)[:, None]
            i0 += Wc * (i0 < 0)
            active = live & (i0 < n)
            cnt = active * ((n - 1 - i0) // Wc + 1)
            ready = np.zeros(n_s)
            if k > 0:
                ready = done[rb, k - 1] + sync_s
            elif rb >= look:
                ready = done[rb - look, K - 1] + sync_s
            slots = shape.slots[k]
            if slots and k + 1 < K and rb >= slots:
                ready = np.maximum(ready, done[rb - slots, k + 1] + sync_s)
            start = np.maximum(free, ready[:, None])
            end = start + cnt * tau[k][:, None]
            free = np.where(active, end, free)
            done[rb, k] = np.max(np.where(active, end, -np.inf), axis=1)
    # the stage ends with its last item (a later row-block may finish before an earlier one)
    ends = np.maximum.accumulate(done.max(axis=1), axis=0)
    last = ends[Rs - 1]
    if R == Rs:
        return last
    # the steady period: what the second half of the simulated row-blocks took, but never less
    # than the row-block's items spread over every worker (when fewer row-blocks are simulated
    # than the workers hold at once, the simulated ones all run side by side)
    half = Rs // 2
    work = (np.asarray(shape.items, float)[:, None] * tau).sum(axis=0) / workers
    period = np.maximum((last - ends[half - 1]) / (Rs - half), work)
    return last + (R - Rs) * period
