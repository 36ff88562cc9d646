"""When a kernel touches each part of a tensor, and what a later kernel finds of it in L2.

A kernel that reads a tensor another kernel of the region touched before finds a part of it in
L2 when the bytes touched between the two uses fit the usable L2: the rest of the earlier kernel
after its last touch of the part, the kernels in between, and the start of the later one up to
its first touch. Where in its run a kernel touches a part follows its grid:
  * a GEMM runs its CTAs in grouped raster order (cost.gemm_l2.raster), WAVE_CTAS at a time: an
    output tile, and an input read in the epilogue, is touched during its CTA's wave; a row-block
    of A from the first to the last wave of the CTAs of that row-block, a column tile of B alike;
  * any other kernel streams through its tensors in memory order.
A kernel's bytes are spread evenly over its run. Parts are tiles of 128 x 128 elements of the
tensor seen as a matrix (leading dimensions folded into rows; larger where a tensor would have
more than MAX_PARTS of them).

ncu on an MLP cut into one, two and four kernels (bench/dram_probe.py seq-*, none a suite size)
showed why position matters: a GELU after a 2.9-wave GEMM found the 40% of its input written
by the GEMM's last wave in L2 and read the rest from DRAM (1024 x 12288 x 6144: 31%, its last
of 1.45 waves), and a fused fc2 + residual re-read its 25 MB input from DRAM, 100 MB of fc1's
output having passed since fc1 read it. Whole-kernel rules (hit when the tensor fits with the
kernels strictly between) said 100% and 100%.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from kitsune_dse.cost.gemm_l2 import WAVE_CTAS, raster
from kitsune_dse.graph.ir import Graph

PART = 128            # rows and columns of a part ...
MAX_PARTS = 1 << 14   # ... doubled along the longer side where a tensor would have more parts


def part_grid(shape: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
    """(rows, cols, parts down, parts across, rows of a part, columns of a part) of a tensor
    seen as a matrix."""
    cols = int(shape[-1]) if shape else 1
    rows = int(math.prod(shape[:-1])) if len(shape) > 1 else 1
    part_r = part_c = PART
    while math.ceil(rows / part_r) * math.ceil(cols / part_c) > MAX_PARTS:
        if math.ceil(rows / part_r) >= math.ceil(cols / part_c):
            part_r *= 2
        else:
            part_c *= 2
    return rows, cols, math.ceil(rows / part_r), math.ceil(cols / part_c), part_r, part_c


def _streamed(pr: int, pc: int) -> tuple[np.ndarray, np.ndarray]:
    n = pr * pc
    p = np.arange(n, dtype=float)
    return p / n, (p + 1) / n


@functools.lru_cache(maxsize=1 << 14)
def touch_positions(graph: Graph, group: tuple[str, ...], tensor: str, names: frozenset[str]) -> tuple:
    """(first, last): arrays over the tensor's parts (row-major) of the fraction of the kernel's
    run at which it first and last touches each part. `names`: the tensor and the views of it
    the kernel's ops name (the same memory)."""
    rows, cols, pr, pc, part_r, part_c = part_grid(graph.tensors[tensor].shape)
    gemm = next((graph.op(o) for o in group if graph.op(o).info.gemm is not None
                 and graph.op(o).info.gemm.batch == 1), None)
    if gemm is None:
        return _streamed(pr, pc)
    gd = gemm.info.gemm
    tm, tn = (64 if gd.m <= 64 else 128), 128
    mb, nt = math.ceil(gd.m / tm), math.ceil(gd.n / tn)
    rb, ct = raster(mb, nt)
    # each CTA's wave, and each wave's span of the kernel's run (the last wave may be partial)
    n = rb.size
    wave = np.arange(n) // WAVE_CTAS
    w0 = np.arange(wave[-1] + 1) * WAVE_CTAS
    start, length = w0 / n, (np.minimum(w0 + WAVE_CTAS, n) - w0) / n
    r_part = np.minimum(np.arange(pr) * part_r // tm, mb - 1)
    if gemm.inputs[1] in names:             # B: a column tile's slices, swept along K every wave
        b_rows = (rows, cols) == (gd.k, gd.n)
        if not b_rows and (rows, cols) != (gd.n, gd.k):
            return np.zeros(pr * pc), np.ones(pr * pc)
        lo, hi = _span(ct, nt, wave, start, length)
        c = np.minimum(np.arange(pc if b_rows else pr) * (part_c if b_rows else part_r) // tn, nt - 1)
        k = (np.arange(pr if b_rows else pc) + 0.5) / (pr if b_rows else pc)     # K position
        first = lo[0][c][None, :] + k[:, None] * lo[1][c][None, :]
        last = hi[0][c][None, :] + k[:, None] * hi[1][c][None, :]
        if not b_rows:
            first, last = first.T, last.T
        return first.ravel(), last.ravel()
    if gemm.inputs[0] in names and (rows, cols) == (gd.m, gd.k):   # A: a row-block's slices
        lo, hi = _span(rb, mb, wave, start, length)
        k = (np.arange(pc) + 0.5) / pc
        first = lo[0][r_part][:, None] + k[None, :] * lo[1][r_part][:, None]
        last = hi[0][r_part][:, None] + k[None, :] * hi[1][r_part][:, None]
        return first.ravel(), last.ravel()
    if (rows, cols) == (gd.m, gd.n):        # the output, or an input of its epilogue: its CTA's end
        at = np.empty((mb, nt))
        at[rb, ct] = (start + length)[wave]
        c = np.minimum(np.arange(pc) * part_c // tn, nt - 1)
        w = at[np.ix_(r_part, c)].ravel()
        return w, w
    return _streamed(pr, pc)


def _span(tile_of_cta: np.ndarray, tiles: int, wave: np.ndarray, start: np.ndarray,
          length: np.ndarray):
    """((start, length) of the first wave, (start, length) of the last wave) each operand tile is
    used in, per tile (`wave`: each CTA's; `start`, `length`: each wave's)."""
    first = np.full(tiles, wave[-1])
    last = np.zeros(tiles, dtype=wave.dtype)
    np.minimum.at(first, tile_of_cta, wave)
    np.maximum.at(last, tile_of_cta, wave)
    return (start[first], length[first]), (start[last], length[last])


def hit_fraction(last: np.ndarray, first: np.ndarray, last_bytes: float, between_bytes: float,
                 now_bytes: float, budget: float) -> float:
    """Share of a tensor's parts found in L2: those whose distance (the rest of the earlier
    kernel after its last touch, the kernels between, this kernel up to its first touch) fits."""
    room = budget - between_bytes
    if room <= 0.0:
        return 0.0
    d = (1.0 - last) * last_bytes + first * now_bytes
    return float(np.count_nonzero(d <= room)) / d.size


def dirty_residue(alloc_bytes: list[float], write_bytes: list[float], spec, kept_dirty: float = 0.0) -> list[float]:
    """Bytes of each kernel's DRAM writes still dirty in L2 when the region ends: written to DRAM
    only after it (by whatever evicts them next; ncu's range, and a run timed from a flushed L2,
    never see them). L2 holds the last efficiency.l2_recent_fraction x l2_bytes of what the
    kernels brought into it (`alloc_bytes`: DRAM reads and every byte written), the last
    kernel's first; of that, each kernel's written share is dirty, up to
    efficiency.l2_dirty_fraction x l2_bytes of dirty lines in all (less the region's
    intermediates `kept_dirty` that never leave it).

    ncu on bench/dram_probe.py seq-* (none a suite size): a region ending in an element-wise
    kernel left 16-19 MB unwritten whatever its size, one ending in a GEMM 2-6 MB (its writes
    are a small share of its traffic)."""
    e = spec.efficiency
    window = e.l2_recent_fraction * spec.l2_bytes
    room = max(0.0, e.l2_dirty_fraction * spec.l2_bytes - kept_dirty)
    out = [0.0] * len(alloc_bytes)
    for k in range(len(alloc_bytes) - 1, -1, -1):
        if window <= 0.0 or room <= 0.0:
            break
        if alloc_bytes[k] <= 0.0:
            continue
        take = min(alloc_bytes[k], window)
        out[k] = min(write_bytes[k] * take / alloc_bytes[k], room)
        room -= out[k]
        window -= take
    return out
