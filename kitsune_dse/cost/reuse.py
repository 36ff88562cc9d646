"""When a kernel touches each part of a tensor, and what a later kernel finds of it in L2.

A kernel that reads a tensor another kernel of the region touched before finds a part of it in
L2 when the bytes touched between the two uses fit the usable L2: the rest of the earlier kernel
after its last touch of the part, the kernels in between, and the start of the later one up to
its first touch. Where in its run a kernel touches a part follows its grid:
  * a GEMM runs its CTAs in grouped raster order (cost.gemm_l2.raster), WAVE_CTAS at a time: an
    output tile, and an input read in the epilogue, is touched during its CTA's wave; a row-block
    of A from the first to the last wave of the CTAs of that row-block, a column tile of B alike;
  * an element-wise kernel runs the harness's grid-stride loop (with the spec's
    elementwise_grid_ctas_per_sm, the harness's 32): 256-thread CTAs, a vector of 8 elements a
    thread per step; the CTAs resident at once (8 per SM) sweep the whole tensor, a step every
    grid's width of vectors, before the next ones start, so a tensor larger than one sweep
    (17 MB of fp16 on 132 SMs) has its end touched early (bench/dram_probe.py gg-*: an add after
    its GEMM finds the GEMM's last wave, the last 31% of the rows, which memory order reaches
    after 52 MB of the add's own traffic);
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
from kitsune_dse.graph.ir import Graph, OpClass

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


EW_THREADS = 256            # the harness's element-wise kernel: threads a CTA ...
EW_VECTOR = 8               # ... elements a thread per step (its grid's CTAs per SM: the spec's)
SAMPLE_ROWS = 16            # rows of a part whose vectors place it in a grid-stride run


def _grid_stride(rows: int, cols: int, pr: int, pc: int, part_r: int, part_c: int,
                 sms: int, grid_per_sm: int, resident_per_sm: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) of each part in the harness's grid-stride element-wise kernel over a
    [rows, cols] iteration space: CTA c steps through vectors c x 256 + k x (grid x 256); the
    CTAs resident at once (a batch, in block order) run their steps together and the next
    batch starts when they end, so step k of batch b spans [b + k / steps, b + (k + 1) / steps]
    of the run's batches."""
    nv = max(1, math.ceil(cols / EW_VECTOR))
    total = rows * nv
    grid = max(1, min(math.ceil(total / EW_THREADS), sms * grid_per_sm))
    width = grid * EW_THREADS
    steps = math.ceil(total / width)
    batch = max(1, sms * resident_per_sm)
    batches = math.ceil(grid / batch)
    # each part: SAMPLE_ROWS of its rows, the first and last vector of its columns in each
    r = np.minimum(np.arange(pr)[:, None] * part_r
                   + np.linspace(0, part_r - 1, min(part_r, SAMPLE_ROWS)).astype(int)[None, :], rows - 1)
    c0 = np.arange(pc) * part_c // EW_VECTOR
    c1 = np.minimum((np.arange(pc) + 1) * part_c, cols) // EW_VECTOR - 1
    v = r[:, None, :, None] * nv + np.stack([c0, np.maximum(c0, c1)], axis=1)[None, :, None, :]
    b, k = (v % width) // EW_THREADS // batch, v // width
    first = ((b + k / steps) / batches).reshape(pr * pc, -1).min(axis=1)
    last = ((b + (k + 1) / steps) / batches).reshape(pr * pc, -1).max(axis=1)
    return first, last


@functools.lru_cache(maxsize=1 << 14)
def touch_positions(graph: Graph, group: tuple[str, ...], tensor: str, names: frozenset[str],
                    sms: int = 0, grid_per_sm: int = 0, resident_per_sm: int = 8) -> tuple:
    """(first, last): arrays over the tensor's parts (row-major) of the fraction of the kernel's
    run at which it first and last touches each part. `names`: the tensor and the views of it
    the kernel's ops name (the same memory). `grid_per_sm` > 0: an element-wise kernel's
    grid-stride order, that many CTAs per SM in its grid on `sms` SMs, `resident_per_sm` of
    them at once on each; 0: memory order."""
    rows, cols, pr, pc, part_r, part_c = part_grid(graph.tensors[tensor].shape)
    gemm = next((graph.op(o) for o in group if graph.op(o).info.gemm is not None
                 and graph.op(o).info.gemm.batch == 1), None)
    if gemm is None:
        if sms and grid_per_sm and _grid_strided(graph, group, (rows, cols)):
            return _grid_stride(rows, cols, pr, pc, part_r, part_c, sms, grid_per_sm, resident_per_sm)
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


def _grid_strided(graph: Graph, group: tuple[str, ...], matrix: tuple[int, int]) -> bool:
    """Whether the harness runs the group as its grid-stride element-wise kernel over a tensor
    of this [rows, cols] (its iteration space: the group's output's shape)."""
    ops = [graph.op(o) for o in group if not graph.op(o).info.is_view]
    if not ops or any(op.info.op_class is not OpClass.ELEMENTWISE for op in ops):
        return False
    out = graph.tensors[ops[-1].outputs[0]].shape
    cols = int(out[-1]) if out else 1
    return (int(math.prod(out[:-1])) if len(out) > 1 else 1, cols) == matrix


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
