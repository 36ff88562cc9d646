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

Measured (ncu, the suite's whole-model baselines): gpt3 t2048 tp8's two GEMMs read 922 MB where
their operands are 453 MB; llama2-7b's MLP 790 MB for 542 MB.
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


def raster(m_blocks: int, n_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-block and column tile of every CTA in launch order (grouped rasterization)."""
    c = np.arange(m_blocks * n_tiles)
    per_group = GROUP_ROWS * n_tiles
    grp0 = (c // per_group) * GROUP_ROWS
    gsize = np.minimum(m_blocks - grp0, GROUP_ROWS)
    j = c % per_group
    return grp0 + j % gsize, j // gsize


@functools.lru_cache(maxsize=1 << 12)
def grid_reads(m: int, n: int, k: int, tile_m: int, tile_n: int, elem_bytes: int, ctas: int,
               budget: float, out_elem_bytes: int = 2) -> tuple[float, float]:
    """(A bytes, B bytes) the grid reads from DRAM, A [m, k] and B [k, n] both starting cold."""
    mb, nt = math.ceil(m / tile_m), math.ceil(n / tile_n)
    a_blk, b_blk = tile_m * k * elem_bytes, k * tile_n * elem_bytes
    rb, ct = raster(mb, nt)
    ctas = max(1, int(ctas))
    waves = math.ceil(rb.size / ctas)
    last_a = np.full(mb, -1)
    last_b = np.full(nt, -1)
    touched = np.zeros(waves + 1)          # touched[w + 1]: cumulative bytes through wave w
    a_bytes = b_bytes = 0.0
    for w in range(waves):
        rows = np.unique(rb[w * ctas:(w + 1) * ctas])
        cols = np.unique(ct[w * ctas:(w + 1) * ctas])
        n_cta = min(ctas, rb.size - w * ctas)
        mine = rows.size * a_blk + cols.size * b_blk + n_cta * tile_m * tile_n * out_elem_bytes
        # bytes touched from a tile's last use (that wave's, at the same step of K) to now
        since_a = touched[w] - touched[np.maximum(last_a[rows], 0)]
        since_b = touched[w] - touched[np.maximum(last_b[cols], 0)]
        a_bytes += a_blk * np.count_nonzero((last_a[rows] < 0) | (since_a > budget))
        b_bytes += b_blk * np.count_nonzero((last_b[cols] < 0) | (since_b > budget))
        last_a[rows] = w
        last_b[cols] = w
        touched[w + 1] = touched[w] + mine
    # a partial last tile reads only the rows / columns that exist
    return a_bytes * min(1.0, m / (mb * tile_m)), b_bytes * min(1.0, n / (nt * tile_n))
