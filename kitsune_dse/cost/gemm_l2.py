"""DRAM reads of a standalone GEMM grid: which operand tiles each wave of CTAs finds in L2.

A standalone GEMM (the harness's tile kernel, cuBLAS alike) runs its CTAs in grouped raster
order: groups of GROUP_ROWS row-blocks, each group over every column tile (Triton's GROUP_M;
validate/codegen.py GROUP_M). `ctas` CTAs are resident at once and step through K roughly
together, so one wave reads each row-block of A and each column tile of B it touches once.
A row-block or column tile touched again by a later wave is an L2 hit when the bytes touched
from its last use to its use now fit the L2 that keeps data between uses: the waves from the
one that last used it up to this one (at each step of K a wave touches the same slice of every
tile it holds, so a tile's slice is reused one full wave of traffic later); otherwise it is
read from DRAM again. This is the residency rule of
cost.region (size plus what happens in between must fit), at the grain of a wave.

Waves do not run in lockstep (ncu on 34 GEMM grids, bench/dram_probe.py gemm-*: lockstep's
reads were off by -33..+33%, 9.8% MAPE; with the fitted drift 3.1%). Their CTAs drift apart along K, more with each wave (as a random
walk: (wave + 1)^desync_exponent), which does two things the spec's `grid_*` fields describe:
  * a tile shared by CTAs of one wave is fetched again by a CTA that reaches its slice after
    L2 has dropped it: a share of its further uses that grows with the wave's operand bytes
    over the usable L2 (long K reads more: 4096^2 x 24576 reads 1.5x the lockstep bytes), of
    at most `drift_sharers` further uses (the CTAs that fall outside one fetch's lifetime are
    few however many share it: a decode GEMM's one row-block, shared by every CTA, is read
    once);
  * the threshold for a later wave's hit is a ramp, not a step, widening with the drift to at
    most one wave's bytes (many short-K waves read less: 8192^2 x 4096 reads 0.89x).
With the defaults (center 1, half-width 0, drift 0) it is the lockstep model.
"""
from __future__ import annotations

import functools
import math

import numpy as np

GROUP_ROWS = 8
# CTAs resident at once, the grain of the wave model: the H100's 2 per SM x 132 SMs, on every
# GPU. The wave size of the GPU at hand would make a GPU with one SM more read more (a wave
# slightly past what L2 keeps between waves: a cliff), and more SMs must never slow a plan
WAVE_CTAS = 264
# (center, half-width, drift, drift exponent, desync exponent, drift sharers): lockstep waves,
# a hard threshold
LOCKSTEP = (1.0, 0.0, 0.0, 2.0, 0.5, 16.0)


def grid_reuse(spec) -> tuple[float, ...]:
    """The spec's grid_* efficiency fields, as grid_reads takes them."""
    e = spec.efficiency
    return (e.grid_reuse_center, e.grid_reuse_halfwidth, e.grid_drift_miss, e.grid_drift_exponent,
            e.grid_desync_exponent, e.grid_drift_sharers)


def raster(m_blocks: int, n_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-block and column tile of every CTA in launch order (grouped rasterization)."""
    c = np.arange(m_blocks * n_tiles)
    per_group = GROUP_ROWS * n_tiles
    grp0 = (c // per_group) * GROUP_ROWS
    gsize = np.minimum(m_blocks - grp0, GROUP_ROWS)
    j = c % per_group
    return grp0 + j % gsize, j // gsize


def operand_reads(spec, m: int, n: int, k: int, tile: tuple[int, int], elem_bytes: int) -> tuple[float, float]:
    """(A bytes, B bytes) a one-pass standalone GEMM grid with this CTA tile reads from DRAM on
    `spec` (its gemm_read_grids where it has them: a library whose kernels are not the tile
    priced; the first grid whose row bound holds m, else the last)."""
    tm, tn, ctas = tile[0], tile[1], WAVE_CTAS
    if spec.gemm_read_grids:
        _, tm, tn, ctas = next((g for g in spec.gemm_read_grids if m <= g[0]), spec.gemm_read_grids[-1])
    return grid_reads(m, n, k, tm, tn, elem_bytes, ctas, spec.l2_usable_bytes, reuse=grid_reuse(spec))


@functools.lru_cache(maxsize=1 << 12)
def grid_waves(m: int, n: int, k: int, tile_m: int, tile_n: int, elem_bytes: int, ctas: int,
               out_elem_bytes: int = 2) -> tuple:
    """What each wave of the grid touches, whatever the L2 keeps: (A tile bytes, B tile bytes,
    [(operand bytes, A's (bytes since last use, users), B's alike)] per wave; bytes since last use
    inf for a tile not used before), A [m, k] and B [k, n]."""
    mb, nt = math.ceil(m / tile_m), math.ceil(n / tile_n)
    a_blk, b_blk = tile_m * k * elem_bytes, k * tile_n * elem_bytes
    rb, ct = raster(mb, nt)
    ctas = max(1, int(ctas))
    waves = math.ceil(rb.size / ctas)
    last_a = np.full(mb, -1)
    last_b = np.full(nt, -1)
    touched = np.zeros(waves + 1)          # touched[w + 1]: cumulative bytes through wave w
    out = []
    for w in range(waves):
        rows, row_users = np.unique(rb[w * ctas:(w + 1) * ctas], return_counts=True)
        cols, col_users = np.unique(ct[w * ctas:(w + 1) * ctas], return_counts=True)
        n_cta = min(ctas, rb.size - w * ctas)
        operands = rows.size * a_blk + cols.size * b_blk
        # bytes touched from a tile's last use (that wave's, at the same step of K) to now
        since_a = np.where(last_a[rows] < 0, np.inf, touched[w] - touched[np.maximum(last_a[rows], 0)])
        since_b = np.where(last_b[cols] < 0, np.inf, touched[w] - touched[np.maximum(last_b[cols], 0)])
        out.append((float(operands), since_a, row_users, since_b, col_users))
        last_a[rows] = w
        last_b[cols] = w
        touched[w + 1] = touched[w] + operands + n_cta * tile_m * tile_n * out_elem_bytes
    return a_blk, b_blk, out


@functools.lru_cache(maxsize=1 << 12)
def grid_reads(m: int, n: int, k: int, tile_m: int, tile_n: int, elem_bytes: int, ctas: int,
               budget: float, out_elem_bytes: int = 2,
               reuse: tuple[float, ...] = LOCKSTEP) -> tuple[float, float]:
    """(A bytes, B bytes) the grid reads from DRAM, A [m, k] and B [k, n] both starting cold.
    reuse: grid_reuse(spec)."""
    center, halfwidth, drift, drift_exp, desync_exp, sharers = reuse
    a_blk, b_blk, waves = grid_waves(m, n, k, tile_m, tile_n, elem_bytes, ctas, out_elem_bytes)
    a_bytes = b_bytes = 0.0
    for w, (operands, since_a, row_users, since_b, col_users) in enumerate(waves):
        desync = (w + 1.0) ** desync_exp
        half = min(halfwidth * desync * budget, operands)
        a_bytes += a_blk * _misses(since_a, center * budget, half)
        b_bytes += b_blk * _misses(since_b, center * budget, half)
        if drift > 0.0:
            # further uses of a tile inside the wave that find it gone (the CTAs drift apart)
            q = min(1.0, drift * (operands / budget) ** drift_exp * desync)
            a_bytes += q * float(np.minimum(row_users - 1, sharers).sum()) * a_blk
            b_bytes += q * float(np.minimum(col_users - 1, sharers).sum()) * b_blk
    # a partial last tile reads only the rows / columns that exist
    mb, nt = math.ceil(m / tile_m), math.ceil(n / tile_n)
    return a_bytes * min(1.0, m / (mb * tile_m)), b_bytes * min(1.0, n / (nt * tile_n))


def _misses(since: np.ndarray, threshold: float, half: float) -> float:
    """How many of these tiles miss L2: every one not used before (since inf); one used before
    with probability 0 below threshold - half, 1 above threshold + half, linear between (half 0:
    a step at threshold)."""
    if half <= 0.0:
        return float(np.count_nonzero(since > threshold))
    with np.errstate(over="ignore"):    # a ramp narrower than a float's range is a step: inf clips to 1
        return float(np.sum(np.clip(0.5 + (since - threshold) / (2.0 * half), 0.0, 1.0)))
