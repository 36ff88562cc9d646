"""Queue-occupancy model of a spatial pipeline: a tandem of stages with bounded buffers.

Stage j finishes (departs) tile n at
    D[j][n] = max( max(D[j-1][n] + sync, D[j][n-1]) + t[j][n],   D[j+1][n - b[j]] + sync )
i.e. it starts when the tile has arrived (one flag hand-off later) and it is free, and it cannot
publish until the ring slot it writes is released by the consumer (b[j] slots, counting the one
the consumer works on; blocking after service). For one stage, D[n] = max(D[n-1] + t[n], E[n])
with E[n] = max(A[n] + t[n], B[n]) is a max-plus linear recurrence solved in closed form with
cumulative sums and a running maximum: D = C + maximum.accumulate(E - C), C = cumsum(t). The
blocking terms couple neighbouring stages; Gauss-Seidel sweeps over the stages repeat until the
departure times stop changing (they only grow, and settle within a few sweeps).

Two generalisations follow the persistent runtime. A stage of c servers works on c units at
once, each for its service time (the unit's latency; c units per service time is the stage's
throughput): D[n] = max(max(arrive[n], D[n-c]) + t[n], block[n]), c interleaved single-server
chains. A queue whose slots are released in groups of g units (a split_k ring: the consumer
frees a row-block's slot once it has summed all g of its column slabs) blocks unit u of its
producer on the consumer's unit (u // g - b / g) * g + g - 1 instead of u - b.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QueueResult:
    departures: np.ndarray          # [stages, tiles] finish times
    starts: np.ndarray              # [stages, tiles] service start times
    makespan_s: float
    fill_s: float                   # first tile out of the last stage
    drain_s: float                  # from the first stage's last tile to the end
    period_s: float                 # steady-state time between tiles at the last stage
    bottleneck_stage: int
    stall_s: np.ndarray             # per stage: idle or blocked time between first start and last finish
    mean_occupancy: np.ndarray      # per queue (stages - 1): tiles held, time-averaged (Little)
    max_occupancy: np.ndarray       # per queue
    stage_end_s: np.ndarray | None = None   # per stage: its last unit's departure (None: the
                                            # departures' last column)

    @property
    def stage_ends_s(self) -> np.ndarray:
        return self.departures[:, -1] if self.stage_end_s is None else self.stage_end_s


def _stage_pass(t, arrive, block, c=None):
    """D[n] = max(max(arrive[n], D[n-1]) + t[n], block[n]) in closed form (c: cumsum(t))."""
    c = np.cumsum(t) if c is None else c
    e = np.maximum(arrive + t, block)
    return c + np.maximum.accumulate(e - c)


def simulate(t, depth, sync_s: float = 0.0, release=None, max_sweeps: int = 8,
             servers=None, group=None) -> QueueResult:
    """t: [stages, tiles] service times (a unit's latency on one server); depth: [stages - 1]
    ring slots per queue (>= 1, in units); sync_s: one-way hand-off latency; release: when
    each tile enters the first stage; servers: [stages] units a stage works on at once
    (default 1); group: [stages - 1] units whose slots a queue frees together (default 1; a
    depth is then a multiple of it)."""
    t = np.atleast_2d(np.asarray(t, dtype=float))
    J, N = t.shape
    b = np.asarray(depth, dtype=int).reshape(-1)
    if b.size != J - 1:
        raise ValueError(f"{J} stages need {J - 1} queue depths, got {b.size}")
    if (b < 1).any():
        raise ValueError("queue depths must be >= 1")
    arrive0 = np.zeros(N) if release is None else np.asarray(release, dtype=float)
    c = np.ones(J, dtype=int) if servers is None else np.asarray(servers, dtype=int).reshape(-1)
    g = np.ones(J - 1, dtype=int) if group is None else np.asarray(group, dtype=int).reshape(-1)
    if c.size != J or (c < 1).any():
        raise ValueError(f"{J} stages need {J} server counts >= 1, got {list(c)}")
    if g.size != J - 1 or (g < 1).any() or (b % g).any():
        raise ValueError(f"release groups {list(g)} must be >= 1 and divide the depths {list(b)}")
    if (c > 1).any() or (g > 1).any():
        D = _general(t, b, c, g, float(sync_s), arrive0, max_sweeps)
        return _result(t, D, arrive0, c, sync_s)
    neg = np.full(N, -np.inf)
    C = [np.cumsum(t[j]) for j in range(J)]
    D = np.zeros((J, N))
    # first pass: no blocking
    for j in range(J):
        arr = arrive0 if j == 0 else D[j - 1] + sync_s
        D[j] = _stage_pass(t[j], arr, neg, C[j])
    # a pass over stage j depends only on its neighbours' departures: with finite inputs it
    # gives the same D[j] again when neither changed since its last pass, so it is skipped
    # (NaN never equals itself: without that guarantee every stage is passed every sweep)
    finite = bool(np.isfinite(t).all() and np.isfinite(arrive0).all() and np.isfinite(sync_s))
    version = [0] * J
    used = [(0, -1) if j < J - 1 else (0, 0) for j in range(J)]
    converged = False
    for _ in range(max_sweeps):
        changed = False
        for j in range(J):
            dep = (version[j - 1] if j > 0 else 0, version[j + 1] if j < J - 1 else 0)
            if finite and dep == used[j]:
                continue
            used[j] = dep
            arr = arrive0 if j == 0 else D[j - 1] + sync_s
            if j < J - 1:
                blk = neg.copy()
                bj = b[j]
                if bj < N:
                    blk[bj:] = D[j + 1][: N - bj] + sync_s
            else:
                blk = neg
            new = _stage_pass(t[j], arr, blk, C[j])
            if not np.array_equal(new, D[j]):
                changed = True
                D[j] = new
                version[j] += 1
        if not changed:
            converged = True
            break
    if not converged:
        D = _chunked(t, b, sync_s, arrive0)
    return _result(t, D, arrive0, np.ones(J, dtype=int), sync_s)


def _blocker(N: int, b: int, g: int) -> np.ndarray:
    """Per producer unit, the consumer unit whose departure frees its slot (-1: none)."""
    u = np.arange(N)
    return np.where(u >= b, (u // g) * g - b + g - 1, -1)


def _servers_pass(t, arrive, block, c: int) -> np.ndarray:
    """_stage_pass of a stage of c servers: unit n follows unit n - c on its server,
    D[n] = max(max(arrive[n], D[n - c]) + t[n], block[n]). Few servers: one closed-form pass
    per server's chain; many (a several-step stage holds dozens of units): round by round,
    all servers at once (the recurrence itself, where the chains use its closed form)."""
    N = t.size
    if c <= 1:
        return _stage_pass(t, arrive, block)
    if c * c <= N:
        # the c chains side by side: unit n is row n // c, column n % c of a [rows, c] array
        # whose columns are the chains; cumsum and the running maximum along axis 0 add and
        # compare each column in the same order as a pass over that chain alone (bit for bit
        # the per-chain result), in one call instead of c. Padding units at the end (t = 0,
        # arrive = block = -inf) come after every real unit of their column: they change none
        rows = -(-N // c)
        pad = rows * c - N
        if pad:
            t = np.concatenate((t, np.zeros(pad)))
            arrive = np.concatenate((arrive, np.full(pad, -np.inf)))
            block = np.concatenate((block, np.full(pad, -np.inf)))
        tt = t.reshape(rows, c)
        acc = np.cumsum(tt, axis=0)
        e = np.maximum(arrive.reshape(rows, c) + tt, block.reshape(rows, c))
        return (acc + np.maximum.accumulate(e - acc, axis=0)).reshape(-1)[:N]
    D = np.empty(N)
    prev = np.full(c, -np.inf)
    for k in range(0, N, c):
        m = min(c, N - k)
        d = np.maximum(np.maximum(arrive[k:k + m], prev[:m]) + t[k:k + m], block[k:k + m])
        D[k:k + m] = d
        prev = d
    return D


class _StagePass:
    """_servers_pass of one stage with its blocking term, for the sweeps of _general: what no
    sweep changes (the service times' running sums, by server chain; where each unit's slot
    is freed) is set up once, the same operations in the same order each sweep."""

    def __init__(self, t, c: int, b: int, blocker):
        N = t.size
        self.t, self.c, self.N, self.b = t, c, N, b
        self.src = None if blocker is None else blocker[b:]    # (None: unit u - b frees it)
        self.rows = -(-N // c) if 1 < c and c * c <= N else 0
        size = self.rows * c if self.rows else N
        # blocking times; units < b wait for no slot (-inf), as do the chains' padding units
        self.block = np.full(size, -np.inf)
        if c <= 1:
            self.acc = np.cumsum(t)
        elif self.rows:
            tt = np.zeros(size)
            tt[:N] = t
            self.tt = tt.reshape(self.rows, c)
            self.acc = np.cumsum(self.tt, axis=0)
            self.arrive = np.full(size, -np.inf)

    def run(self, arrive, down, sync_s: float) -> np.ndarray:
        """The stage's departures for these arrivals and the departures of the stage it
        blocks on (down; None for the last stage)."""
        N, b = self.N, self.b
        if down is not None and b < N:
            if self.src is None:
                np.add(down[:N - b], sync_s, out=self.block[b:N])
            else:
                np.add(down[self.src], sync_s, out=self.block[b:N])
        if self.c <= 1:
            e = np.maximum(arrive + self.t, self.block)
            return self.acc + np.maximum.accumulate(e - self.acc)
        if self.rows:
            self.arrive[:N] = arrive
            shape = (self.rows, self.c)
            e = np.maximum(self.arrive.reshape(shape) + self.tt, self.block.reshape(shape))
            return (self.acc + np.maximum.accumulate(e - self.acc, axis=0)).reshape(-1)[:N]
        return _servers_pass(self.t, arrive, self.block, self.c)


def _general(t, b, c, g, sync_s: float, arrive0, max_sweeps: int) -> np.ndarray:
    """Departures with multi-server stages and grouped releases: Gauss-Seidel sweeps of
    closed-form passes over each stage's interleaved chains; if they have not settled, the
    exact unit-by-unit evaluation (every term refers to an earlier unit or an earlier stage)."""
    J, N = t.shape
    blockers = [_blocker(N, int(b[j]), int(g[j])) for j in range(J - 1)]
    passes = [_StagePass(t[j], int(c[j]), int(b[j]) if j < J - 1 else N,
                         blockers[j] if j < J - 1 and g[j] > 1 else None) for j in range(J)]
    D = np.full((J, N), -np.inf)
    for _ in range(max(1, max_sweeps)):
        old = D.copy()
        for j, stage in enumerate(passes):
            D[j] = stage.run(arrive0 if j == 0 else D[j - 1] + sync_s,
                             D[j + 1] if j < J - 1 else None, sync_s)
        if np.array_equal(old, D):
            return D
    m = min([int(x) for x in c if x > 1] + [int(bj - gj + 1) for bj, gj in zip(b, g)] + [N])
    if m >= 4:
        return _chunked(t, b, sync_s, arrive0, servers=c, blockers=blockers, m=m)
    return _unit_by_unit(t, c, b, blockers, sync_s, arrive0)


def _unit_by_unit(t, c, b, blockers, sync_s: float, arrive0) -> np.ndarray:
    """_general's exact evaluation in plain floats (NumPy's per-element access would cost more
    than the arithmetic), unit by unit, stage by stage: the same comparisons and sums in the
    same order as the recurrence. Once every stage has a unit on each server behind it and
    every queue a slot to wait on (unit n >= every c_j and b_j), no test is needed for either."""
    J, N = t.shape
    tl, a0 = t.tolist(), arrive0.tolist()
    rows = [[0.0] * N for _ in range(J)]
    # per stage: its row, servers, service times, blockers and the row of the stage it blocks on
    stages = [(rows[j], int(c[j]), tl[j], blockers[j].tolist() if j < J - 1 else None,
               rows[j + 1] if j < J - 1 else None) for j in range(J)]
    steady = min(N, max([int(x) for x in c] + [int(x) for x in b[:J - 1]]))
    for n in range(steady):
        start = a0[n]
        for Dj, cj, tj, bj, down in stages:
            if n >= cj and Dj[n - cj] > start:
                start = Dj[n - cj]
            d = start + tj[n]
            if bj is not None:
                k = bj[n]
                if k >= 0:
                    blk = down[k] + sync_s
                    if blk > d:
                        d = blk
            Dj[n] = d
            start = d + sync_s      # the next stage's arrival
    inner, (last, cl, tlast, _, _) = stages[:-1], stages[-1]
    for n in range(steady, N):
        start = a0[n]
        for Dj, cj, tj, bj, down in inner:
            prev = Dj[n - cj]
            if prev > start:
                start = prev
            d = start + tj[n]
            blk = down[bj[n]] + sync_s
            if blk > d:
                d = blk
            Dj[n] = d
            start = d + sync_s
        prev = last[n - cl]
        if prev > start:
            start = prev
        last[n] = start + tlast[n]
    return np.array(rows, dtype=float)


def _result(t, D, arrive0, c, sync_s) -> QueueResult:
    J, N = t.shape
    # service start: the later of arrival and the departure of the server's previous unit
    S = np.empty_like(D)
    for j in range(J):
        arr = arrive0 if j == 0 else D[j - 1] + sync_s
        cj = int(c[j])
        prev = np.concatenate((np.full(min(cj, N), -np.inf), D[j][:-cj] if cj < N else []))
        S[j] = np.maximum(arr, prev)
    makespan = float(D[-1, -1])
    fill = float(D[-1, 0])
    drain = float(D[-1, -1] - D[0, -1])
    period = float((D[-1, -1] - D[-1, 0]) / (N - 1)) if N > 1 else float(t[:, 0].max())
    busy = t.sum(axis=1) / c
    stall = (D[:, -1] - S[:, 0]) - busy
    mean_occ = np.empty(J - 1)
    max_occ = np.empty(J - 1)
    for j in range(J - 1):
        enter, leave = D[j], D[j + 1]          # a tile holds its slot until its consumer is done
        mean_occ[j] = float((leave - enter).sum() / makespan) if makespan > 0 else 0.0
        # tiles held when tile n enters: those before it not yet released (a release at the
        # same instant frees the slot first); departures are non-decreasing per stage
        tol = 1e-12 * max(abs(makespan), 1e-30)   # closed-form sums round by an ulp or so
        released = np.minimum(np.searchsorted(leave, enter + tol, side="right"), np.arange(N))
        max_occ[j] = float(np.max(np.arange(N) - released + 1)) if N else 0.0
    return QueueResult(D, S, makespan, fill, drain, period, int(np.argmax(busy)),
                       np.maximum(stall, 0.0), mean_occ, max_occ)


SCALAR_CHUNK_MAX = 8     # chunks this short are evaluated tile by tile in plain floats


def _chunked(t, b, sync_s, arrive0, servers=None, blockers=None, m: int | None = None):
    """Exact evaluation in chunks of m tiles (default min(b)): inside a chunk the blocking terms
    refer only to earlier chunks, so each stage is one closed-form pass over the chunk. With
    `servers` and `blockers` (_general's: m no more than any multi-server stage's servers nor
    any queue's units between a slot's use and its release) a unit's server waits on an earlier
    chunk too: a stage of c > 1 servers is one vectorised step per chunk."""
    J, N = t.shape
    if m is None:
        m = int(b.min()) if b.size else N
    if (servers is None and blockers is None and m <= SCALAR_CHUNK_MAX and np.isfinite(t).all()
            and np.isfinite(arrive0).all() and np.isfinite(sync_s)):
        return _chunked_scalar(t, b, sync_s, arrive0, m)
    D = np.empty((J, N))
    for n0 in range(0, N, m):
        n1 = min(N, n0 + m)
        for j in range(J):
            tt = t[j, n0:n1]
            arr = arrive0[n0:n1] if j == 0 else D[j - 1, n0:n1] + sync_s
            blk = None
            if j < J - 1:
                blk = np.full(n1 - n0, -np.inf)
                if blockers is None:
                    lo, hi = n0 - b[j], n1 - b[j]
                    if hi > 0:
                        k0 = max(lo, 0)
                        blk[k0 - lo:] = D[j + 1, k0:hi] + sync_s
                else:
                    k = blockers[j][n0:n1]
                    ok = k >= 0
                    blk[ok] = D[j + 1][k[ok]] + sync_s
            cj = 1 if servers is None else int(servers[j])
            if cj > 1:
                prev = np.full(n1 - n0, -np.inf)
                idx = np.arange(n0, n1) - cj
                ok = idx >= 0
                prev[ok] = D[j][idx[ok]]
                e = np.maximum(arr, prev) + tt
                D[j, n0:n1] = e if blk is None else np.maximum(e, blk)
                continue
            e = arr + tt
            if blk is not None:
                e = np.maximum(e, blk)
            if n0 > 0:
                e[0] = max(e[0], D[j, n0 - 1] + tt[0])
            c = np.cumsum(tt)
            D[j, n0:n1] = c + np.maximum.accumulate(e - c)
    return D


def _chunked_scalar(t, b, sync_s, arrive0, m: int):
    """_chunked for short chunks: the same operations in the same order on plain floats (IEEE
    doubles either way, so bit for bit the same departures), without NumPy's per-call cost,
    which dominates on chunks of a tile or two (depth-1 queues over thousands of tiles)."""
    J, N = t.shape
    tl, a0, bl = t.tolist(), arrive0.tolist(), b.tolist()
    sync_s = float(sync_s)
    D = [[0.0] * N for _ in range(J)]
    for n0 in range(0, N, m):
        n1 = min(N, n0 + m)
        for j in range(J):
            tj, Dj = tl[j], D[j]
            up = D[j - 1] if j else None
            down, bj = (D[j + 1], bl[j]) if j < J - 1 else (None, 0)
            c = run = 0.0
            for n in range(n0, n1):
                tt = tj[n]
                e = (a0[n] if up is None else up[n] + sync_s) + tt
                if down is not None and n >= bj:
                    e = max(e, down[n - bj] + sync_s)
                if n == n0:
                    if n0 > 0:
                        e = max(e, Dj[n0 - 1] + tt)
                    c = tt                      # cumsum restarts with the chunk
                    run = e - c                 # and so does the running maximum
                else:
                    c = c + tt
                    run = max(run, e - c)
                Dj[n] = c + run
    return np.array(D, dtype=float)


def simulate_reference(t, depth, sync_s: float = 0.0, servers=None, group=None):
    """Plain-loop evaluation of the same recurrence (for tests)."""
    t = np.atleast_2d(np.asarray(t, dtype=float))
    J, N = t.shape
    c = [1] * J if servers is None else [int(x) for x in servers]
    g = [1] * (J - 1) if group is None else [int(x) for x in group]
    D = np.full((J, N), -np.inf)
    # iterate to a fixed point because of the backward blocking term
    for _ in range(10 * (J + N)):
        old = D.copy()
        for n in range(N):
            for j in range(J):
                arr = 0.0 if j == 0 else D[j - 1][n] + sync_s
                prev = D[j][n - c[j]] if n >= c[j] else -np.inf
                blk = -np.inf
                if j < J - 1 and n - depth[j] >= 0:
                    blk = D[j + 1][(n // g[j]) * g[j] - depth[j] + g[j] - 1] + sync_s
                D[j][n] = max(max(arr, prev) + t[j][n], blk)
        if np.array_equal(old, D):
            break
    return D
