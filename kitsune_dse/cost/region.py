"""Regions of a graph and the kernels they launch.

A Region is a convex set of ops run by one strategy. `kernel_works` turns a sequence of kernels
(groups of ops launched one after another) into KernelWork records, deciding for every tensor a
kernel touches whether it crosses DRAM:
  * graph inputs are read from DRAM (cold caches: the harness flushes L2 between runs);
  * a tensor a later kernel reads again (a weight, an intermediate) is found in L2 part by part:
    a part whose distance (the rest of the kernel that last touched it, the kernels in between,
    the later kernel up to it) fits the usable L2 (cost.reuse: where in its run each kernel
    touches each part), else re-read from DRAM;
  * every tensor a kernel writes reaches DRAM: L2 writes its dirty lines back even when the next
    kernel reads them from L2 (ncu on the suite's one-kernel-per-op and fused baselines: DRAM
    writes = the bytes their kernels write, within 8%), unless the distinct bytes of the
    region's kernels from the writer on fit the usable L2: then L2 evicts only a share of them,
    the pipelines' write-back logistic over those bytes (cost.l2_residency);
  * what is still dirty when the region ends is written after it (cost.reuse.dirty_residue);
    in time, each kernel's end leaves the dirty lines in L2 to the next, whose allocations
    write them back (the region's first kernel: those of the kernel before it, entry_kernel):
    a streaming kernel pays them, a compute-bound GEMM hides them;
  * a tensor handed to another region is read there from L2 when it fits (handed_over);
  * a GEMM whose operands come from DRAM reads them again where later waves of its grid no
    longer find them in L2 (cost.gemm_l2.grid_reads).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kitsune_dse.cost.gemm_l2 import operand_reads
from kitsune_dse.cost.l2_residency import write_back_fraction
from kitsune_dse.cost.memo import table
from kitsune_dse.cost.reuse import EW_THREADS, dirty_residue, hit_fraction, touch_positions
from kitsune_dse.cost.roofline import (MEM_TILE_BYTES, SPLIT_K, KernelWork, best_gemm_tile,
                                       gemm_tile_options, gemm_tiles, simt_flops, split_k_partials_bytes)
from kitsune_dse.graph.ir import DTYPE_BYTES, Graph, OpClass
from kitsune_dse.hw.spec import HwSpec


@dataclass(frozen=True)
class Region:
    graph: Graph
    ops: tuple[str, ...]

    @staticmethod
    def of(graph: Graph, ops=None) -> "Region":
        return _region_of(graph, None if ops is None else tuple(ops))

    @cached_property
    def op_set(self) -> frozenset[str]:
        return frozenset(self.ops)

    @cached_property
    def produced(self) -> frozenset[str]:
        return frozenset(t for o in self.ops for t in self.graph.op(o).outputs)

    @cached_property
    def inputs(self) -> tuple[str, ...]:
        """Tensors read by the region and not produced inside it (inputs and weights)."""
        seen: dict[str, None] = {}
        for o in self.ops:
            for t in self.graph.op(o).inputs:
                if t not in self.produced:
                    seen[t] = None
        return tuple(seen)

    @cached_property
    def outputs(self) -> tuple[str, ...]:
        g = self.graph
        return tuple(t for o in self.ops for t in g.op(o).outputs
                     if t in g.outputs or any(c not in self.op_set for c in g.consumers(t)))

    @cached_property
    def flops(self) -> float:
        return sum(self.graph.op(o).info.flops for o in self.ops)

    def compulsory_bytes(self) -> tuple[float, float]:
        """(read, write): every region input once (as its ops read it), every output once."""
        g = self.graph
        reads = {}
        for o in self.ops:
            for t, b in g.op(o).info.read_bytes.items():
                if t not in self.produced:
                    reads[t] = max(reads.get(t, 0), b)
        writes = sum(g.stored_bytes(t) for t in self.outputs)
        return float(sum(reads.values())), float(writes)


@functools.lru_cache(maxsize=1 << 14)
def _region_of(graph: Graph, ops: tuple[str, ...] | None) -> Region:
    # one object per op set: the search builds the same regions (stages, windows) many times,
    # and each keeps its derived sets (cached properties) for the next
    names = [o.name for o in graph.ops] if ops is None else list(ops)
    return Region(graph, tuple(sorted(names, key=graph.index)))


@functools.lru_cache(maxsize=1 << 16)
def view_base(graph: Graph, t: str) -> str:
    """The tensor whose memory `t` is: free views (reshape, leading-axis split...) alias it."""
    while True:
        p = graph.producer(t)
        if p is None or not graph.op(p).info.is_view:
            return t
        t = graph.op(p).inputs[0]


@functools.lru_cache(maxsize=1 << 16)
def _real_consumers(graph: Graph, t: str) -> frozenset[str]:
    """Ops reading `t`'s memory, looking through free views."""
    out: set[str] = set()
    for c in graph.consumers(t):
        op = graph.op(c)
        if op.info.is_view:
            for t2 in op.outputs:
                out |= _real_consumers(graph, t2)
        else:
            out.add(c)
    return frozenset(out)


def _kernel_rw(graph: Graph, group: tuple[str, ...]):
    """Tensors (by the memory they alias) a fused kernel reads from outside itself and writes
    for others."""
    gs = set(group)
    inside = {view_base(graph, t) for o in group for t in graph.op(o).outputs
              if not graph.op(o).info.is_view}
    reads: dict[str, float] = {}
    for o in group:
        if graph.op(o).info.is_view:
            continue
        for t, b in graph.op(o).info.read_bytes.items():
            base = view_base(graph, t)
            if base not in inside:
                reads[base] = max(reads.get(base, 0.0), float(b))
    writes = {}
    for o in group:
        if graph.op(o).info.is_view:
            continue
        for t in graph.op(o).outputs:
            aliases_out = t in graph.outputs or any(
                x in graph.outputs for x in _view_closure(graph, t))
            if aliases_out or any(c not in gs for c in _real_consumers(graph, t)):
                writes[t] = float(graph.stored_bytes(t))
    return reads, writes


@functools.lru_cache(maxsize=1 << 16)
def _view_closure(graph: Graph, t: str) -> tuple[str, ...]:
    out: list[str] = []
    for c in graph.consumers(t):
        op = graph.op(c)
        if op.info.is_view:
            for t2 in op.outputs:
                out.append(t2)
                out += _view_closure(graph, t2)
    return tuple(out)


def handed_over(region: Region, spec: HwSpec, t: str) -> bool:
    """Whether tensor `t` crosses this region's boundary through L2 rather than DRAM: it is
    produced by one region and consumed by another (not a graph input, weight or output) and it
    fits the usable L2. Regions run back to back, so such a hand-off stays in L2; this keeps
    region costs additive for the solver (skip connections spanning large regions are the case
    this credits too generously)."""
    g = region.graph
    base = view_base(g, t)
    if g.producer(base) is None or base in g.outputs or any(x in g.outputs for x in _view_closure(g, base)):
        return False
    inside_p = g.producer(base) in region.op_set
    cons = _real_consumers(g, base)
    crosses = (not inside_p) or any(c not in region.op_set for c in cons)
    return crosses and g.stored_bytes(base) <= spec.l2_usable_bytes


def kernel_works(region: Region, groups: list[tuple[str, ...]], spec: HwSpec, sms=None,
                 ) -> list[KernelWork]:
    """KernelWork of each kernel of a sequence, with DRAM/L2 decided as the module says.
    Groups made only of free views launch nothing and are dropped."""
    g = region.graph
    sms = spec.sm_count if sms is None else sms
    groups = [grp for grp in groups if not all(g.op(o).info.is_view for o in grp)]
    rw = [_kernel_rw(g, grp) for grp in groups]
    touched = [sum(r.values()) + sum(w.values()) for r, w in rw]
    prefix = [0.0]
    for b in touched:
        prefix.append(prefix[-1] + b)
    budget = spec.l2_usable_bytes
    # distinct bytes the kernels from i on touch (a tensor once, however often it is read)
    tail, seen, acc = [0.0] * len(rw), set(), 0.0
    for i in range(len(rw) - 1, -1, -1):
        for t in (*rw[i][0], *rw[i][1]):
            if t not in seen:
                seen.add(t)
                acc += float(g.stored_bytes(t))
        tail[i] = acc
    outputs = {view_base(g, t) for t in region.outputs}
    last_touch: dict[str, int] = {}    # tensor -> last kernel index that wrote or read it
    works = []
    kept = 0.0                         # written intermediates no kernel of the region evicts
    kept_after: list[float] = []
    for i, (grp, (reads, writes)) in enumerate(zip(groups, rw)):
        d_r = l2_r = w_dram = a_dram = 0.0
        gemm_ops = [g.op(o) for o in grp if g.op(o).info.gemm is not None]
        for t, b in reads.items():
            j = last_touch.get(t)
            if handed_over(region, spec, t):
                hit = 1.0
            elif j is None or prefix[i] - prefix[j + 1] >= budget:
                hit = 0.0
            elif prefix[i + 1] - prefix[j] <= budget:     # both kernels whole and all between fit
                hit = 1.0
            else:
                hit = hit_fraction(_touch(g, tuple(groups[j]), t, spec)[1], _touch(g, tuple(grp), t, spec)[0],
                                   touched[j], prefix[i] - prefix[j + 1], touched[i], budget)
            l2_r += hit * b
            miss = (1.0 - hit) * b
            d_r += miss
            if miss > 0.0:
                if any(op.inputs[1:2] == (t,) for op in gemm_ops):
                    w_dram += miss     # a GEMM's B operand from DRAM (gemm_l2: re-read by later waves)
                elif any(op.inputs[:1] == (t,) for op in gemm_ops):
                    a_dram += miss
            last_touch[t] = i
        d_w = 0.0
        for t, b in writes.items():
            last_touch[t] = i
            # written back from L2 even when the next kernel finds it there, unless it is the
            # region's own intermediate and the distinct bytes from here on stay in L2; the
            # region's outputs always leave. Even then L2 evicts some of its dirty lines, the
            # more the nearer those bytes come to its size: the pipelines' rings' logistic
            # (cost.l2_residency; dlrm's 27 MB kernel-per-op baseline wrote back 3.2 MB, a
            # 27 MB probe sequence 7.7 of 21: bench/dram_probe.py seq-small-4)
            if tail[i] > budget or view_base(g, t) in outputs:
                d_w += b
            else:
                d_w += b * write_back_fraction(tail[i], spec)
        works.append(group_work(region, grp, spec, sms, d_r, d_w, l2_r, w_dram, a_dram))
        kept += sum(writes.values()) - d_w
        kept_after.append(kept)
    alloc = [w.dram_read_bytes + sum(x[1].values()) for w, x in zip(works, rw)]
    wrote = [w.dram_write_bytes for w in works]
    residue = dirty_residue(alloc, wrote, spec, kept)     # at the region's end from a clean L2 (ncu)
    # the dirty lines in L2 as each kernel ends, what ran before the region (entry_kernel)
    # counted as the kernel before the first: a kernel's end does not wait for the write-back
    # of those it leaves, and the evictions of its own allocations write back those it finds
    # (bench/dirty_probe.py: after a 256 MiB store a 16.8 MB relu took 16.8 us and wrote 17.8 MB,
    # after a 256 MiB load 12.2 us and 0.1 MB; a compute-bound GEMM 64.7 against 64.4 us)
    d = dirty_lines(region, spec, alloc, wrote, kept_after)
    return [w.but(deferred_write_bytes=r, after_end_write_bytes=d[k + 1], incoming_dirty_bytes=d[k])
            for k, (w, r) in enumerate(zip(works, residue))]


def dirty_lines(region: Region, spec: HwSpec, alloc: list[float], wrote: list[float],
                kept_after: list[float]) -> list[float]:
    """Dirty bytes in L2 as the region starts and as each of its kernels ends (alloc: bytes
    each brings into L2; wrote: its DRAM writes; kept_after: the region's intermediates kept in
    L2 so far), the kernel before the region (entry_kernel) counted first."""
    e_alloc, e_wrote = entry_kernel(region, spec)
    return [sum(dirty_residue([e_alloc] + alloc[:k], [e_wrote] + wrote[:k], spec,
                              kept_after[k - 1] if k else 0.0))
            for k in range(len(alloc) + 1)]


def entry_kernel(region: Region, spec: HwSpec) -> tuple[float, float]:
    """(bytes brought into L2, bytes written) of the kernel before the region, whose dirty lines
    its first kernel finds: the op before it in graph order as a lone kernel (the op before it in
    every plan the search's windows make); before the graph's first op, a store of twice L2
    (the harness's L2 flush, a 256 MiB store; in a stream of inferences, the last one's end)."""
    g = region.graph
    i = g.index(region.ops[0]) - 1
    while i >= 0 and g.ops[i].info.is_view:
        i -= 1
    if i < 0:
        return 2.0 * spec.l2_bytes, 2.0 * spec.l2_bytes
    reads, writes = _kernel_rw(g, (g.ops[i].name,))
    w = sum(writes.values())
    return sum(reads.values()) + w, w


def _touch(g: Graph, group: tuple[str, ...], t: str, spec: HwSpec):
    """Where in its run a kernel touches each part of tensor t (cost.reuse; an element-wise
    kernel's grid-stride order on the spec's SMs, as many 256-thread CTAs at once on each as
    its threads allow)."""
    names = frozenset(x for o in group for x in (*g.op(o).inputs, *g.op(o).outputs) if view_base(g, x) == t)
    return touch_positions(g, group, t, names | {t}, spec.sm_count, spec.elementwise_grid_ctas_per_sm,
                           max(1, min(spec.max_ctas_per_sm, spec.max_threads_per_sm // EW_THREADS)))


def group_work(region: Region, group: tuple[str, ...], spec: HwSpec, sms, dram_read: float,
               dram_write: float, l2_read: float, b_dram: float = 0.0, a_dram: float = 0.0) -> KernelWork:
    """KernelWork for a fused group with the given traffic (b_dram / a_dram: the parts of
    dram_read that are its GEMM's B and A operands, read once); a GEMM group picks its CTA tile.
    Memoised for one SM count: every window holding the group asks again (same traffic)."""
    if np.ndim(sms):
        return _group_work(region.graph, tuple(group), spec, sms, dram_read, dram_write, l2_read,
                           b_dram, a_dram)
    key = (region.graph, tuple(group), sms, dram_read, dram_write, l2_read, b_dram, a_dram)
    memo = table(spec, "group_work")
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _group_work(*key[:2], spec, *key[2:])
    return hit


def grid_reread_bytes(gd, tile, split_k: int, elem_bytes: int, cold: str, spec: HwSpec) -> float:
    """Operand bytes later waves of a one-pass GEMM grid with this CTA tile read from DRAM again
    (cost.gemm_l2), for the operands ("a", "b") that start in DRAM."""
    if not cold or gd.batch != 1 or split_k != 1:
        return 0.0
    ar, br = operand_reads(spec, gd.m, gd.n, gd.k, tile, elem_bytes)
    return (max(0.0, ar - gd.m * gd.k * elem_bytes) if "a" in cold else 0.0) + \
        (max(0.0, br - gd.k * gd.n * elem_bytes) if "b" in cold else 0.0)


def epilogue_inputs(g, atom, gd) -> tuple[int, int]:
    """(full [rows, cols] tensors, vectors) a GEMM group's epilogue reads from outside the group:
    a residual; a bias (the GEMM's own or an elementwise op's one-row operand)."""
    made = {t for o in atom for t in g.op(o).outputs}
    full = gd.batch * gd.m * gd.n
    outside = {t for o in atom for t in g.op(o).inputs[(2 if g.op(o).info.gemm is not None else 0):]
               if t not in made}
    n_full = len({t for t in outside if len(g.tensors[t].shape) >= 2 and g.tensors[t].numel >= full})
    n_vec = len({t for t in outside if g.tensors[t].numel < full and g.tensors[t].numel <= gd.n * gd.batch
                 and g.tensors[t].numel > 1})
    return n_full, n_vec


def _group_work(g: Graph, group: tuple[str, ...], spec: HwSpec, sms, dram_read: float,
                dram_write: float, l2_read: float, b_dram: float = 0.0, a_dram: float = 0.0) -> KernelWork:
    infos = [g.op(o).info for o in group]
    tensor = sum(i.flops for i in infos if i.unit == "tensor")
    gemms = [(o, i) for o, i in zip(group, infos) if i.gemm is not None]
    simt = simt_flops(infos, spec, standalone_epilogue=bool(gemms))
    dtype = g.tensors[g.op(group[0]).outputs[0]].dtype
    if gemms:
        o, i = max(gemms, key=lambda x: x[1].flops)
        dtype = g.tensors[g.op(o).inputs[0]].dtype
        gd = i.gemm

        cold = ("a" if a_dram else "") + ("b" if b_dram else "")
        # what its epilogue reads: the inputs of the ops after the GEMM (a prologue's are not)
        full_inputs = epilogue_inputs(g, group[group.index(o):], gd)[0]

        def make(tile, ks):
            again = grid_reread_bytes(gd, tile, ks, DTYPE_BYTES[dtype], cold, spec)
            return KernelWork(name="+".join(group), dtype=dtype, tensor_flops=tensor, simt_flops=simt,
                              dram_read_bytes=dram_read + again, dram_write_bytes=dram_write,
                              l2_bytes=l2_read + split_k_partials_bytes(gd.batch, gd.m, gd.n, ks),
                              tiles=gemm_tiles(gd.batch, gd.m, gd.n, tile) * ks, tile_shape=tile,
                              split_k=ks, grid_reread_bytes=again, cold_operands=cold, gemm_n=gd.n,
                              gemm_k=gd.k, epilogue_inputs=full_inputs,
                              paired_ctas=len(gemms) == 1 and tile[1] == 128)
        return best_gemm_tile(make, spec, sms, gd.k, gd.batch * gd.m, gd.n)[0]
    moved = sum(sum(i.read_bytes.values()) + sum(i.write_bytes.values()) for i in infos)
    tiles = max(1, math.ceil(moved / MEM_TILE_BYTES))
    wide_norm = any(g.op(o).kind == "layernorm" and cached_row_vectors(g.tensors[g.op(o).inputs[0]].shape[-1])
                    >= WIDE_ROW_VECTORS for o in group)
    return KernelWork(name="+".join(group), dtype=dtype, tensor_flops=tensor, simt_flops=simt,
                      dram_read_bytes=dram_read, dram_write_bytes=dram_write, l2_bytes=l2_read,
                      tiles=tiles, ctas_per_sm=1 if wide_norm else 2,
                      stream_share=spec.standalone_norm_stream_share if wide_norm else 1.0)


# a row op's kernel keeps a row in registers, 8 elements a vector, 1-8 warps a row, at most 8
# vectors a thread (validate.lower.row_cfg); a layernorm holding 8 (2,048 columns and up) needs
# 146-149 registers a thread (nvcc on bench/rowop_probe.py's kernels; 64 at 1,024 columns, 4
# vectors): one 256-thread CTA per SM, half a softmax's resident warps (105-127 registers)
MAX_ROW_VECTORS = 8
WIDE_ROW_VECTORS = MAX_ROW_VECTORS    # the rows kept at the most vectors a thread holds


def cached_row_vectors(cols: int) -> int:
    """Vectors of 8 elements each thread of a row op's kernel keeps of a row of `cols`
    (0: the row is too wide to keep, two passes over memory)."""
    for warps in (1, 2, 4, 8):
        vpl = -(-cols // (warps * 256))
        if vpl <= MAX_ROW_VECTORS:
            return vpl
    return 0


def kernel_variants(region: Region, group: tuple[str, ...], spec: HwSpec, work: KernelWork):
    """The same kernel (same traffic) with every CTA tile and split-K a GEMM library could pick;
    a non-GEMM kernel has one variant. Memoised: every window holding the kernel asks again."""
    key = (region.graph, tuple(group), work)
    memo = table(spec, "kernel_variants")
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = tuple(_kernel_variants(region.graph, tuple(group), spec, work))
    return list(hit)


def _kernel_variants(g: Graph, group: tuple[str, ...], spec: HwSpec, work: KernelWork):
    gemms = [g.op(o).info for o in group if g.op(o).info.gemm is not None]
    if not gemms:
        return [work]
    gd = max(gemms, key=lambda i: i.flops).gemm
    if spec.gemm_heuristic == "harness":      # its kernels have one tile and split each
        return [work]
    base_l2 = work.l2_bytes - split_k_partials_bytes(gd.batch, gd.m, gd.n, work.split_k)
    base_read = work.dram_read_bytes - work.grid_reread_bytes
    e = DTYPE_BYTES[work.dtype]
    out = []
    for tile in gemm_tile_options(spec):
        for ks in SPLIT_K:
            if ks > 1 and gd.k // ks < 256:
                break
            # the operand re-reads belong to the tile: a variant recomputes them
            again = grid_reread_bytes(gd, tile, ks, e, work.cold_operands, spec)
            out.append(work.but(tiles=gemm_tiles(gd.batch, gd.m, gd.n, tile) * ks,
                               tile_shape=tile, split_k=ks, dram_read_bytes=base_read + again,
                               grid_reread_bytes=again,
                               l2_bytes=base_l2 + split_k_partials_bytes(gd.batch, gd.m, gd.n, ks)))
    return out


def is_fusible_reduction_owner(region: Region, group: tuple[str, ...]) -> bool:
    """A row reduction can join a group only if one CTA owns whole rows of its output: no GEMM
    in the group, or the GEMM's N fits one CTA tile (<= 256 columns)."""
    g = region.graph
    for o in group:
        i = g.op(o).info
        if i.op_class is OpClass.GEMM and i.gemm is not None and i.gemm.n > 256:
            return False
    return True


def compose_sequential(graph: Graph, spec: HwSpec, parts, **breakdown):
    """Regions run one after another; hand-offs between them are already priced by each region
    (see handed_over), so totals add up, except the launch latency of every region after the
    first: it is launched while the one before runs (spec.launch_latency_s); the boundary
    itself costs spec.region_gap_s (the next launch from the host)."""
    from kitsune_dse.cost.estimate import sequential
    return sequential([e for _, e in parts], spec.region_overlap_s, **breakdown)
