"""Roofline with an SM share.

One kernel (an op or a fused group) described by its KernelWork runs on `sms` SMs:
  compute  = ceil(tiles / sms) * (tensor FLOP per tile / tensor rate per SM
                                  + SIMT FLOP per tile / SIMT rate per SM)
             (the block scheduler spreads CTAs over distinct SMs; the busiest SM sets the time)
  memory   = DRAM bytes / HBM bandwidth reachable from the min(sms, tiles) SMs in use
           + nothing else when L2 reads overlap; L2-resident bytes / L2 bandwidth bound apart
  latency  = max(compute, dram, l2)
so a grid of tiles just above a multiple of the SM count pays a nearly empty last wave. All functions accept
a NumPy array of SM counts and return arrays, so cost tables over every SM count are one call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kitsune_dse.cost.memo import table
from kitsune_dse.graph.ir import DTYPE_BYTES
from kitsune_dse.hw.spec import HwSpec

GEMM_TILES = ((128, 256), (128, 128), (64, 128), (64, 64))  # (rows, cols) CTA tile candidates
MEM_TILE_BYTES = 64 * 1024        # bytes a memory-bound CTA streams per work unit


@dataclass(frozen=True)
class KernelWork:
    """Everything the roofline needs to know about one kernel."""
    name: str
    dtype: str
    tensor_flops: float = 0.0
    simt_flops: float = 0.0
    dram_read_bytes: float = 0.0
    dram_write_bytes: float = 0.0
    l2_bytes: float = 0.0          # bytes served by L2 (resident operands, queue slots)
    tiles: int = 1                 # CTA work units
    ctas_per_sm: int = 1
    tile_shape: tuple[int, int] | None = None
    split_k: int = 1
    inflight: int = 1              # hand-off units this record covers at once (pipeline stages)
    persistent: bool = False       # a step of a persistent pipeline kernel (not a standalone kernel)
    solo_team: bool = False        # persistent: its kernel runs one team per SM, not two
                                   # (cost.pipeline.solo_team_fits): a lone item at its own share
    # weights too large for L2, streamed again for every few row-blocks (persistent steps): one
    # pass (already in dram_read_bytes) over `rbs` runtime row-blocks of `items_per_rb` items;
    # the workers (ctas_per_sm per SM) share a pass among the row-blocks they hold at once
    row_op: bool = False           # reduces over rows (softmax, norms): a persistent step's own stream rate
    epilogue_inputs: int = 0       # GEMM step: full [rows, cols] inputs its epilogue reads (a
                                   # residual): each tile waits out their loads
    epilogue_vectors: int = 0      # GEMM step: vectors its epilogue reads (a bias), likewise
    concat: bool = False           # concatenates (a persistent step's own stream rate, through its SMs)
    weight_pass_bytes: float = 0.0
    grid_reread_bytes: float = 0.0  # of dram_read_bytes: operand tiles later waves of this tile's
                                   # grid read again (cost.gemm_l2; another tile re-reads differently)
    gemm_k: int = 0                # the GEMM's reduction length (0: unknown, no K padding)
    gemm_n: int = 0                # the GEMM's columns (its tiles compute whole tile widths: a
                                   # product of N = 1 costs a full tile; 0: no padding)
    cold_operands: str = ""        # GEMM operands ("a", "b", "ab") read from DRAM: a variant with
                                   # another tile recomputes grid_reread_bytes from them
    slab_polls: float = 0.0        # split_k consumer: flag polls per tile (one per runtime slab of
                                   # K it reads), each a flag round trip its team waits out
    feed_sms: float = 0.0          # SMs sharing the L2 operand feed when more than its own (the
                                   # other stages of a pipeline load their tiles at the same time)
    chip_load: float = -1.0        # how loaded the chip is while this step runs (cost.pipeline
                                   # .chip_load: its GEMM stages' share of the SMs; < 0: the share
                                   # of the chip's SMs this step uses stands for it)
    rbs: int = 1
    items_per_rb: int = 1
    rbs_at_once_max: float = 1.0
    free_rbs: float = -1.0         # of the rbs, those run in lock-step rounds (the rest paced one
                                   # at a time: cost.l2_residency.free_row_blocks); < 0: all
    weight_share: float = 1.0      # efficiency.l2_weight_share of the spec it was costed with
    weight_l2_hit: float = 0.0     # share of a re-read pass L2 still holds (cost.l2_residency
                                   # .streamed_weight_hit: the stages' streamed weights against L2)
    stream_share: float = 1.0      # standalone: the share of the streaming rate its occupancy
                                   # reaches (HwSpec.standalone_norm_stream_share)
    a_stream_bytes: float = 0.0    # of dram_read_bytes: a persistent GEMM step's A operand, read
                                   # from DRAM slab by slab (HwSpec.efficiency.persistent_a_stream_share)
    a_stream_part: float = 1.0     # the share of the step's whole A stream this record covers (its
                                   # fill and drain, persistent_a_stream_fill_s, go pro rata)
    deferred_write_bytes: float = 0.0  # of dram_write_bytes: still dirty in L2 when its region
                                   # ends (cost.reuse.dirty_residue), written after it
    after_end_write_bytes: float = 0.0  # dirty lines in L2 when this kernel ends (its own and
                                   # earlier kernels'): written back while the next kernel runs,
                                   # so its time does not wait for them ...
    incoming_dirty_bytes: float = 0.0  # ... and those the kernel before left: its allocations
                                   # evict them, so its DRAM stream carries them (a compute-bound
                                   # GEMM hides them, a streaming kernel pays; cost.region)
    evicted_write_bytes: float = 0.0   # of dram_write_bytes: a persistent step's ring slots L2
                                   # evicts dirty before they are overwritten (cost.pipeline):
                                   # L2 writes them back on its own, the step's SMs do not wait
                                   # (the region's DRAM floor still carries them)
    paired_ctas: bool = False      # a standalone GEMM grid whose SMs run two CTAs each (the
                                   # harness's 128-wide one-B tile): a CTA alone on its SM runs at
                                   # standalone_lone_share of its rate, not half of it

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    @property
    def timed_dram_bytes(self) -> float:
        """The DRAM bytes the kernel's time waits for: its own, less the dirty lines it leaves
        in L2, plus those it finds there."""
        return max(self.dram_read_bytes, self.dram_bytes - self.evicted_write_bytes
                   - self.after_end_write_bytes + self.incoming_dirty_bytes)

    def but(self, **fields) -> "KernelWork":
        """dataclasses.replace without its per-call introspection (the search copies works
        ~10^4 times per model); the fields are this class's own, no validation runs."""
        new = object.__new__(KernelWork)
        d = new.__dict__
        d.update(self.__dict__)
        d.update(fields)
        return new

    def scaled(self, f: float, tiles: int | None = None) -> "KernelWork":
        """The same kernel on a fraction f of its data (one row-block of a pipeline stage)."""
        return self.but(tensor_flops=self.tensor_flops * f, simt_flops=self.simt_flops * f,
                       dram_read_bytes=self.dram_read_bytes * f,
                       dram_write_bytes=self.dram_write_bytes * f, l2_bytes=self.l2_bytes * f,
                       deferred_write_bytes=self.deferred_write_bytes * f,
                       after_end_write_bytes=self.after_end_write_bytes * f,
                       incoming_dirty_bytes=self.incoming_dirty_bytes * f,
                       evicted_write_bytes=self.evicted_write_bytes * f,
                       a_stream_bytes=self.a_stream_bytes * f, a_stream_part=self.a_stream_part * f,
                       weight_pass_bytes=self.weight_pass_bytes * f,
                       tiles=max(1, tiles if tiles is not None else math.ceil(self.tiles * f)))


def simt_flops(infos, spec: HwSpec, standalone_epilogue: bool = False) -> float:
    """SIMT FLOPs of a group's ops, their special functions priced by the spec: in a standalone
    GEMM kernel's epilogue at its own price (standalone_transcendental_flops, partly hidden
    under the SM's other CTA), elsewhere at the persistent epilogue's."""
    price = spec.transcendental_flops
    if standalone_epilogue and spec.standalone_transcendental_flops is not None:
        price = spec.standalone_transcendental_flops
    return sum(i.flops + i.transcendentals * price for i in infos if i.unit == "simt")


def kernel_time(work: KernelWork, spec: HwSpec, sms, *, parts: bool = False):
    """Latency of `work` on `sms` SMs (scalar or array). With parts=True also returns the
    compute, DRAM and L2 terms, the wave count and the ramp."""
    if np.ndim(sms) == 0 and not parts:
        # memoised too: the search times the same step at the same SMs for many plans
        memo = table(spec, "kernel_time_scalar")
        key = (work, float(sms))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _kernel_time_scalar(work, spec, float(sms))
        return hit
    if not parts:
        # memoised over arrays of SM counts: the search prices the same kernel for many
        # windows, cuts and stages (a hit is a copy of the first result)
        a = np.asarray(sms)
        key = (work, a.dtype.str, a.shape, a.tobytes())
        memo = table(spec, "kernel_time")
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _kernel_time_parts(work, spec, sms, False)
        return hit.copy()
    return _kernel_time_parts(work, spec, sms, parts)


def _kernel_time_parts(work: KernelWork, spec: HwSpec, sms, parts: bool):
    s = np.maximum(np.asarray(sms, dtype=float), 1.0)
    cps = max(1, work.ctas_per_sm)
    tiles = max(1, work.tiles)
    waves = np.ceil(tiles / (s * cps))
    per_sm = busiest_sm_time(work, spec, s)
    per_tile = 0.0
    if work.tensor_flops:
        per_tile += work.tensor_flops * _tile_padding(work, spec) / tiles / _tensor_rate(work, spec)
    if work.simt_flops:
        per_tile += work.simt_flops / tiles / _simt_rate(work, spec)
    used = _sms_streaming(work, s)
    per_tile = (per_tile + _tile_fixed(work, spec, used)) * _narrow_tile_share(work, spec)
    # the busiest SM's math; its last round (a lone CTA, the pair's slower one) is math where
    # the grid's math binds, hidden where its stream does (tail_share)
    rounds = busiest_sm_tiles(work, s, lone_share(work, spec))
    compute = rounds * per_tile
    last = (per_sm - rounds) * per_tile + _tail_s(work, spec, s, per_tile)
    feed = per_sm * _fed_tile_s(work, spec, np.maximum(used, work.feed_sms))
    dram_bytes = work.timed_dram_bytes + weight_reread_bytes(work, s)
    dram = (dram_bytes / spec.hbm_bandwidth_from(used, _hbm_ceiling(work, spec), _sm_stream(work, spec))
            if work.dram_bytes else np.zeros_like(s))
    if work.dram_bytes and not work.persistent:
        dram = dram + _last_wave_s(work, spec, s)
    if _streams_l2_bytes(work, spec):   # a row-op step's SMs move its ring bytes too, on the
        # same saturating per-SM curve as its DRAM bytes
        dram = np.maximum(dram, (dram_bytes + work.l2_bytes)
                          / spec.hbm_bandwidth_from(used, _hbm_ceiling(work, spec), _sm_stream(work, spec)))
    l2 = work.l2_bytes / spec.l2_bandwidth_from(used) if work.l2_bytes else np.zeros_like(s)
    # a persistent step does not hide its DRAM stream under its math; its L2 reads are the
    # tile loads its calibrated rate already includes, so they only bound it; the operand feed
    # caps the step (its loads overlap the math and the DRAM stream they carry)
    ramp = _ramp(work, spec)
    # the read stream only where a norm takes it (the search's hot path takes none)
    norm = _read_overlap_exponent(work, spec)
    reads = ((work.dram_read_bytes + weight_reread_bytes(work, s))
             / spec.hbm_bandwidth_from(used, _hbm_ceiling(work, spec), _sm_stream(work, spec))
             if work.dram_bytes and norm else np.zeros_like(s))
    tail = last * tail_share(compute, reads if norm else dram)
    compute = compute + tail
    core = combine_core(work, spec, compute, dram, reads)
    # an epilogue's wait is per tile: the busiest SM's count of them, not its tile times
    epilogue = rounds * _epilogue_s(work, spec, per_tile)
    lat = _with_feed(np.maximum(core, l2), feed, spec) + ramp + epilogue
    if _a_stream_share(work, spec):
        lat = np.maximum(lat, _a_stream_floor(work, spec, used))
    if np.ndim(sms) == 0:
        lat, compute, dram, l2, waves, feed, reads, epilogue, tail = (
            float(x) for x in (lat, compute, dram, l2, waves, feed, reads, epilogue, tail))
    if parts:
        return lat, {"compute_s": compute, "dram_s": dram, "l2_s": l2, "waves": waves, "ramp_s": ramp,
                     "feed_s": feed, "read_s": reads, "epilogue_s": epilogue, "tail_s": tail}
    return lat


def _a_stream_share(work: KernelWork, spec: HwSpec) -> float:
    return spec.efficiency.persistent_a_stream_share if work.a_stream_bytes and work.persistent else 0.0


def _a_stream_floor(work: KernelWork, spec: HwSpec, used):
    """A persistent GEMM step that reads its A operand from DRAM slab by slab (128 rows of 128
    bytes each: short row segments) cannot end before the chip has streamed those bytes at
    the A stream's ceiling, a share of the step's own (efficiency.persistent_a_stream_share),
    plus the stream's fill and drain (persistent_a_stream_fill_s: the first slabs of the first
    tiles in, the last tiles' epilogues out). It binds where A is most of the step's traffic and
    every SM streams it: one column tile on the whole chip (grid_2026-11-23: 1.2-1.9 TB/s
    read by 65536 x 128 x K on 132 SMs)."""
    share = _a_stream_share(work, spec)
    cap = (_hbm_ceiling(work, spec) or spec.efficiency.hbm) * share
    bw = spec.hbm_bandwidth_from(used, cap, _sm_stream(work, spec))
    return work.a_stream_bytes / bw + spec.persistent_a_stream_fill_s * work.a_stream_part


def combine_core(work: KernelWork, spec: HwSpec, compute, dram, reads):
    """A kernel's math and memory times combined: a standalone GEMM's math and read stream
    by their p-norm (efficiency.gemm_read_overlap_exponent), its whole DRAM stream a floor; any
    other kernel the larger plus the share of the smaller its overlap does not hide."""
    p = _read_overlap_exponent(work, spec)
    if p:
        c, r = np.asarray(compute, dtype=float), np.asarray(reads, dtype=float)
        out = np.maximum((c ** p + r ** p) ** (1.0 / p), dram)
    else:
        ov = 1.0 - _overlap(work, spec)
        out = np.maximum(compute, dram) + ov * np.minimum(compute, dram)
    return float(out) if np.ndim(out) == 0 else out


def busiest_sm_tiles(work: KernelWork, s, lone: float = 0.5):
    """Tile times the busiest SM spends, a tile time being the SM's time per tile when its
    teams are all busy. A standalone grid: the block scheduler spreads CTAs over distinct SMs
    first, ceil(tiles / s). A persistent step: items go round robin to the workers, worker c
    on SM c mod s (validate: consecutive workers on distinct SMs), so the busiest SM gets
    k = ceil(tiles / s) items; its ctas_per_sm teams run them side by side, c tile times per
    round of c, and a last item alone takes 1 / lone tile times (lone: its share of the SM's
    rate alone, 0.5 for no faster than beside another team). A kernel of one team per SM
    (work.solo_team): k / lone, every item alone (lone: the solo share)."""
    tiles = max(1, work.tiles)
    if work.solo_team:      # one team: its k items one after another, each alone on the SM
        k = np.ceil(tiles / np.maximum(np.asarray(s, dtype=float), 1e-9)) / lone
        return float(k) if np.ndim(s) == 0 else k
    cps = max(1, work.ctas_per_sm) if work.persistent else 1
    if np.ndim(s) == 0:     # the search's scalar calls: no NumPy dispatch
        k = math.ceil(tiles / max(float(s), 1e-9))
        if cps == 1:
            return float(k)
        left = k % cps
        return float(k - left) + (max(left, 1.0 / lone) if left else 0.0)
    k = np.ceil(tiles / np.asarray(s, dtype=float))
    if cps == 1:
        return k
    left = np.mod(k, cps)
    return (k - left) + np.where(left > 0, np.maximum(left, 1.0 / lone), 0.0)


def lone_share(work: KernelWork, spec: HwSpec) -> float:
    """A persistent item's share of its SM's rate when the SM's other team is idle (GEMM steps,
    calibrated; other steps are bound by their loads, which a lone team halves). In a kernel of
    one team per SM (work.solo_team) the team has the SM to itself and twice the registers:
    efficiency.persistent_solo_team (measured: 1-10% faster than the same item beside an idle
    second team, whose 512 threads leave 128 registers a thread and ptxas spills)."""
    if not (work.persistent and _is_gemm(work)):
        return 0.5
    e = spec.efficiency
    return e.persistent_solo_team if work.solo_team and e.persistent_solo_team is not None \
        else e.persistent_lone_team


def busiest_sm_time(work: KernelWork, spec: HwSpec, s):
    """busiest_sm_tiles in tile times, as kernel_time prices the busiest SM: a standalone grid
    of paired CTAs (two a SM) runs its busiest SM's k = ceil(tiles / s) tiles k tile times for
    an even k, and k - 1 + 1 / standalone_lone_share for an odd one, the last CTA alone (CTA
    traces: a lone CTA's tile takes 0.64-0.79 of a paired one's, i.e. 1.3-1.6 tile times where
    the rule before priced one)."""
    if work.paired_ctas and not work.persistent and _is_gemm(work):
        if np.ndim(s) == 0:     # the search's scalar calls: no NumPy dispatch
            k = math.ceil(max(1, work.tiles) / max(float(s), 1e-9))
            return k + (1.0 / spec.standalone_lone_share - 1.0 if k % 2 else 0.0)
        k = np.ceil(max(1, work.tiles) / np.maximum(np.asarray(s, dtype=float), 1e-9))
        return k + np.where(np.mod(k, 2) > 0, 1.0 / spec.standalone_lone_share - 1.0, 0.0)
    return busiest_sm_tiles(work, s, lone_share(work, spec))


def weight_reread_bytes(work: KernelWork, s):
    """DRAM bytes of a persistent step's weights read again beyond the first pass: the stage's
    workers hold cps * s / items_per_rb row-blocks at once (at most rbs_at_once_max, what its
    rings admit) and, while the stage runs free, those share each fetch of a weight tile
    through L2; paced row-blocks read the weights each; of every pass again, L2 still holds
    weight_l2_hit (cost.l2_residency)."""
    if not work.weight_pass_bytes or work.rbs <= 1:
        return np.zeros_like(np.asarray(s, dtype=float)) if np.ndim(s) else 0.0
    cap = max(1.0, min(float(work.rbs), work.rbs_at_once_max))
    free = float(work.rbs) if work.free_rbs < 0 else min(float(work.rbs), work.free_rbs)
    cps = max(1, work.ctas_per_sm)
    if np.ndim(s) == 0:     # the search's scalar calls: no NumPy dispatch
        a = min(max(cps * float(s) / max(1, work.items_per_rb), 1.0), cap)
        a = max(1.0, 1.0 + work.weight_share * (a - 1.0))
        return work.weight_pass_bytes * (1.0 - work.weight_l2_hit) * (free / a + (work.rbs - free) - 1.0)
    a = np.clip(cps * np.asarray(s, dtype=float) / max(1, work.items_per_rb), 1.0, cap)
    a = np.maximum(1.0, 1.0 + work.weight_share * (a - 1.0))
    return work.weight_pass_bytes * (1.0 - work.weight_l2_hit) * (free / a + (work.rbs - free) - 1.0)


def _sms_streaming(work: KernelWork, s):
    """SMs whose loads are in flight: a standalone grid's min(s, tiles); a persistent step's
    items fill at most tiles / ctas_per_sm SMs' worth of workers (96 tiles keep 96 of the 264
    teams of 132 SMs busy: measured 1.39 TB/s against 2.16 with every team streaming)."""
    tiles = max(1, work.tiles)
    if work.persistent:
        return np.minimum(np.asarray(s, dtype=float), tiles / max(1, work.ctas_per_sm))
    return np.minimum(np.asarray(s, dtype=float), tiles)


def _last_wave_s(work: KernelWork, spec: HwSpec, s):
    """What a standalone grid's last, partial wave adds to its DRAM stream: its r tiles stream
    on r SMs only, below the chip's saturated bandwidth (gpt3's 64 x 12288 x 49152 fc2, split
    along K into 288 CTAs on 132 SMs: 24 CTAs of 4 MB of weights each stream alone at the end).
    Zero when the last wave is full or is the only one (the base term already streams it on
    min(tiles, s) SMs). Each tile moves an equal share of the grid's bytes."""
    tiles = max(1, work.tiles)
    slots = np.maximum(np.asarray(s, dtype=float), 1.0) * max(1, work.ctas_per_sm)
    full = np.floor(tiles / slots)
    last = tiles - full * slots                # tiles of the last, partial wave (0: none)
    on = np.where((full >= 1) & (last > 0), np.ceil(last / max(1, work.ctas_per_sm)), 0.0)
    ceiling = _hbm_ceiling(work, spec)
    tile_bytes = work.dram_bytes / tiles
    bw_all = spec.hbm_bandwidth_from(np.minimum(np.asarray(s, dtype=float), tiles), ceiling)
    bw_last = spec.hbm_bandwidth_from(np.maximum(on, 1.0), ceiling)
    out = np.where(on > 0, last * tile_bytes * (1.0 / bw_last - 1.0 / bw_all), 0.0)
    return float(out) if np.ndim(out) == 0 else out


def _streams_l2_bytes(work: KernelWork, spec: HwSpec) -> bool:
    """A persistent row-op or concat step loads and stores every byte through its SMs at its
    calibrated per-SM rate, ring (L2) bytes as well as DRAM ones (latency-bound passes)."""
    return bool(work.persistent and work.l2_bytes and (
        (work.row_op and spec.persistent_row_sm_stream_Bps)
        or (work.concat and spec.persistent_concat_sm_stream_Bps)))


def _sm_stream(work: KernelWork, spec: HwSpec) -> float | None:
    """A persistent GEMM, row-op or concat step's DRAM stream per SM (calibrated apart:
    latency-bound tile loads, rows read twice by a team's warps, one load per concatenated
    vector; all well below a streaming kernel's)."""
    if not work.persistent:
        return None
    if _is_gemm(work):
        return spec.persistent_gemm_sm_stream_Bps
    if work.row_op and spec.persistent_row_sm_stream_Bps:
        # its latency-bound passes slow down as the other stages load the chip (chip_load)
        return spec.persistent_row_sm_stream_Bps / (1.0 + spec.persistent_row_load_slowdown
                                                     * max(0.0, work.chip_load))
    if work.concat and spec.persistent_concat_sm_stream_Bps:
        return spec.persistent_concat_sm_stream_Bps
    return None


def _smooth_min(lin: float, bmax: float, p: float) -> float:
    return (lin ** -p + bmax ** -p) ** (-1.0 / p)


def _kernel_time_scalar(work: KernelWork, spec: HwSpec, sms: float) -> float:
    """kernel_time for one SM count without NumPy overhead (the search calls it ~10^5 times);
    tests check it equals the vectorised form."""
    s = max(sms, 1.0)
    tiles = max(1, work.tiles)
    per_tile = 0.0
    if work.tensor_flops:
        per_tile += work.tensor_flops * _tile_padding(work, spec) / tiles / _tensor_rate(work, spec)
    if work.simt_flops:
        per_tile += work.simt_flops / tiles / _simt_rate(work, spec)
    busiest = float(busiest_sm_time(work, spec, s))
    count = float(busiest_sm_tiles(work, s, lone_share(work, spec)))
    used = max(float(_sms_streaming(work, s)), 1e-9)
    per_tile = (per_tile + _tile_fixed(work, spec, used)) * _narrow_tile_share(work, spec)
    compute = count * per_tile
    last = (busiest - count) * per_tile + float(_tail_s(work, spec, s, per_tile))
    feed = busiest * _fed_tile_s(work, spec, max(used, work.feed_sms))
    e = spec.efficiency
    p = e.hbm_saturation_exponent
    dram = l2 = reads = 0.0
    norm = _read_overlap_exponent(work, spec)
    if work.dram_bytes:
        cap = _hbm_ceiling(work, spec) or e.hbm
        per_sm = _sm_stream(work, spec) or spec.hbm_per_sm_bandwidth_Bps
        bw = _smooth_min(used * per_sm, spec.hbm_bandwidth_Bps * cap, p)
        again = float(weight_reread_bytes(work, s))
        dram = (work.timed_dram_bytes + again) / bw
        if norm:
            reads = (work.dram_read_bytes + again) / bw
        if not work.persistent:
            dram += float(_last_wave_s(work, spec, s))
    if _streams_l2_bytes(work, spec):
        cap = _hbm_ceiling(work, spec) or e.hbm
        bw = _smooth_min(used * _sm_stream(work, spec), spec.hbm_bandwidth_Bps * cap, p)
        dram = max(dram, (work.timed_dram_bytes + float(weight_reread_bytes(work, s)) + work.l2_bytes) / bw)
    if work.l2_bytes:
        bw = _smooth_min(used * spec.l2_per_sm_bandwidth_Bps, spec.l2_bandwidth_Bps * e.l2, p)
        l2 = work.l2_bytes / bw
    if last:
        compute += last * tail_share(compute, reads if norm else dram)
    # combine_core without NumPy (this path's reason to be)
    if norm:
        core = max((compute ** norm + reads ** norm) ** (1.0 / norm), dram)
    else:
        core = max(compute, dram) + (1.0 - _overlap(work, spec)) * min(compute, dram)
    lat = _with_feed(max(core, l2), feed, spec) + _ramp(work, spec) + count * _epilogue_s(work, spec, per_tile)
    if _a_stream_share(work, spec):
        lat = max(lat, float(_a_stream_floor(work, spec, used)))
    return lat


# Calibrated on the persistent runtime's GEMM steps (one-stage pipelines of several shapes): their
# own tensor rate, a fixed cost per output tile and how little memory and compute overlap there.
# Standalone kernels keep the plain roofline with the standalone tile GEMM's efficiency.
def _overlap(work: KernelWork, spec: HwSpec) -> float:
    return spec.efficiency.mem_compute_overlap if work.persistent else 1.0


def _tensor_rate(work: KernelWork, spec: HwSpec) -> float:
    e = spec.efficiency
    r = spec.tensor_rate_per_sm(work.dtype)
    if work.persistent and e.persistent_tensor_core:
        r *= e.persistent_tensor_core / e.tensor_core
    return r


def _fed_tile_s(work: KernelWork, spec: HwSpec, loading_sms):
    """A persistent GEMM tile's time when the operand feed bounds it: its A and B slices loaded
    while `loading_sms` SMs load at once, then its epilogue's SIMT math, which the team does
    after its main loop and so does not hide under the next tile's loads
    (`bench/epilogue_probe.py`: a GELU added 10.5 us to the feed-bound 16384 x 768 x 3072 and
    nothing when priced under the feed)."""
    feed = _operand_feed_s(work, spec)
    if not feed:
        return 0.0 * loading_sms
    simt = work.simt_flops / max(1, work.tiles) / _simt_rate(work, spec) \
        if work.simt_flops else 0.0
    return feed * loading_sms + simt


def _with_feed(core, feed, spec: HwSpec):
    """A persistent GEMM step's time with its L2 operand feed (feed 0: none): the p-norm of the
    two (efficiency.persistent_feed_exponent), or the larger where p is 0. The 4096^3 one-stage
    kernel's time per tile is flat up to 48 SMs and then rises before the feed binds (+3% at 66
    SMs, +14% at 99, +21% at 132: bench/sm_sweep_probe.sh), as if the tile loads contended at L2
    before the feed saturates (the mechanism is not measured apart)."""
    p = spec.efficiency.persistent_feed_exponent
    if np.ndim(core) == 0 and np.ndim(feed) == 0:     # the search's scalar path
        core, feed = float(core), float(feed)
        hi = max(core, feed)
        if not p or feed <= 0.0:
            return hi
        return hi * ((core / hi) ** p + (feed / hi) ** p) ** (1.0 / p)
    hi = np.maximum(core, feed)
    if not p:
        return hi
    safe = np.where(hi > 0, hi, 1.0)
    return hi * ((core / safe) ** p + (feed / safe) ** p) ** (1.0 / p)


def _operand_feed_s(work: KernelWork, spec: HwSpec) -> float:
    """Seconds one output tile of a persistent GEMM step takes to load its A and B slices
    from L2 when every SM in use loads at once and they share the calibrated L2 feed
    (multiply by the SMs in use): its bytes are the tile's FLOP x (1/rows + 1/cols) x element
    size / 2, 1/64 of a byte per FLOP for 128x128 fp16 tiles. Measured (one-stage pipelines,
    long K): 2.6 TFLOP/s per SM up to 99 SMs, 2.37 at 132 (4.9 TB/s of operand loads). The
    feed caps the step's time; it hides the math and the DRAM stream its bytes include."""
    if not (work.persistent and _is_gemm(work) and spec.persistent_gemm_l2_Bps):
        return 0.0
    bm, bn = work.tile_shape
    tile_flops = work.tensor_flops * _tile_padding(work, spec) / max(1, work.tiles)
    tile_bytes = tile_flops * (1.0 / bm + 1.0 / bn) * 0.5 \
        * DTYPE_BYTES.get(work.dtype, 2)
    return tile_bytes / spec.persistent_gemm_l2_Bps


def _narrow_tile_share(work: KernelWork, spec: HwSpec) -> float:
    """A GEMM tile's time where its product is narrower than the tile (a head: NeRF's sigma
    and rgb, N = 1 and 3 padded to 8), over a full tile's: its MMAs still run every column, its
    B loads and epilogue only the valid ones. One-stage persistent kernels (calibration label
    'gemm narrow N'): N = 8 took 0.73-0.87 of N = 128's time, N = 64 0.85; standalone fused
    kernels (bench/narrow_probe.py): N = 1..32 0.83-0.87, N = 64 0.86-0.89, whatever N."""
    saving = spec.persistent_narrow_tile_saving if work.persistent else spec.standalone_narrow_tile_saving
    if not (saving and work.gemm_n and work.tile_shape):
        return 1.0
    bn = work.tile_shape[1]
    valid = min(bn, -(-work.gemm_n // 8) * 8)
    return 1.0 - saving * (1.0 - valid / bn)


def _tile_padding(work: KernelWork, spec: HwSpec) -> float:
    """Math a GEMM's tiles do per useful FLOP: a tile computes its whole width (dlrm's last
    layer, N = 1, and NeRF's rgb head, N = 3, cost a full 128-column tile per row-block) and
    its main loop whole slabs of K (spec.gemm_k_tile: NeRF's view layer, K = 280, runs five
    slabs of 64 like K = 320; measured 61.5 against 61.3 us on 131072 x 128)."""
    if not (work.gemm_n and work.tile_shape):
        return 1.0
    bn = work.tile_shape[1]
    pad = -(-work.gemm_n // bn) * bn / work.gemm_n
    bk = spec.gemm_k_tile
    if bk and work.gemm_k:
        kper = -(-work.gemm_k // max(1, work.split_k))      # each K range in whole slabs
        pad *= -(-kper // bk) * bk / kper
    return pad


def _read_overlap_exponent(work: KernelWork, spec: HwSpec) -> float:
    """p of the p-norm a standalone GEMM's math and read stream combine by (0: their max).
    Its tiles' main loops prefetch two slabs ahead; where the read stream nears the math, loads
    arrive late and the loop waits: a one-column-tile GEMM that streams A (65536 x 128 x 1024:
    57 us of math, 51 of reads) took 81 us. Stores do not stall it: the same bytes written
    (65536 x 1024 x 128) cost no more than its math."""
    if work.persistent or not _is_gemm(work):
        return 0.0
    return spec.efficiency.gemm_read_overlap_exponent


# the runtime's kernels load half-precision and 8-bit values into floats and do their SIMT math
# (epilogues, element-wise and row ops) in fp32: the fp32 pipes' rate, not the packed one
SIMT_COMPUTE_DTYPE = {"fp16": "fp32", "bf16": "fp32", "fp8": "fp32", "fp8_e4m3": "fp32", "fp8_e5m2": "fp32"}


def _simt_rate(work: KernelWork, spec: HwSpec) -> float:
    return spec.simt_rate_per_sm(SIMT_COMPUTE_DTYPE.get(work.dtype, work.dtype))


def _is_gemm(work: KernelWork) -> bool:
    return bool(work.tensor_flops and work.tile_shape)


def _tile_fixed(work: KernelWork, spec: HwSpec, used=None):
    """A GEMM tile's fixed cost on its SM (prologue, epilogue, hand-offs), per 128x128 of area;
    persistent steps and standalone kernels are calibrated apart (a standalone kernel's two
    CTAs per SM hide much of it under each other's main loop)."""
    if not _is_gemm(work):
        return spec.persistent_row_item_fixed_s if work.persistent and work.row_op else 0.0
    if work.persistent:    # a tile fed slab by slab (split_k queue) pays it once over its slabs
        # and, per runtime slab of K, a load of the slab's flag from L2 (about the one-way
        # hand-off latency) that its whole team waits for; per SM-tile time: over the teams.
        # Traced: gpt3 t64's split_k consumer took 346 us for its last K range (77 slabs) after
        # the producer ended, 1.8x the same GEMM's time per K step without the waits
        polls = work.slab_polls * spec.sync_latency_s / max(1, work.ctas_per_sm)
        fixed = _loaded_tile_fixed(work, spec, used) * work.tile_shape[0] * work.tile_shape[1] / (128 * 128)
        return fixed / max(1, work.split_k) + polls
    return spec.gemm_standalone_tile_fixed_s * work.tile_shape[0] * work.tile_shape[1] / (128 * 128)


def _loaded_tile_fixed(work: KernelWork, spec: HwSpec, used):
    """A persistent tile's fixed cost (its first operand slabs in, its output out: latencies
    that grow with the traffic of the SMs loading at once), between the quiet chip's and the
    full chip's by the share of the chip's SMs in use: a one-stage kernel's own, a multi-stage
    pipeline's GEMM stages' (chip_load). Harness version 5's probes: 1.5 us on a full chip,
    1.2 on a quiet one (version 3's 4.3 and 0.9 held the runtime's visits of every row-block).
    It rises with the share to a power (gemm_tile_fixed_load_exponent, None: linear): latencies
    that queue climb steeply only as the chip fills (one column of 131072 x 128 x 128: a team's
    item 6.1, 6.4, 7.5, 8.4 us on 33, 66, 99, 132 SMs; calibration label 'gemm one column
    short K')."""
    full = spec.gemm_tile_fixed_s
    idle = spec.gemm_tile_fixed_idle_s
    if idle is None or used is None:
        return full
    if work.chip_load >= 0:
        share = min(1.0, work.chip_load)
    else:
        share = np.minimum(1.0, np.maximum(used, work.feed_sms) / spec.sm_count)
    q = spec.gemm_tile_fixed_load_exponent
    out = idle + (full - idle) * (share if q is None else share ** q)
    return float(out) if np.ndim(out) == 0 else out


def _epilogue_s(work: KernelWork, spec: HwSpec, tile_s: float = 0.0) -> float:
    """Per output tile of a persistent GEMM step, what its epilogue's inputs cost its team: a
    full-tile input (a residual, per 128x128 of area) and a vector (a bias, per 128 columns),
    loads the team waits for after its main loop, which neither the operand feed nor the DRAM
    stream hides (one-stage probes at 132 SMs: a residual added 4-5.5 us per tile on the busiest
    SM, a bias 0.3-0.9, whatever the step's bound). A standalone kernel's: _standalone_epilogue_s."""
    if not work.persistent:
        return _standalone_epilogue_s(work, spec, tile_s)
    if not (_is_gemm(work) and (work.epilogue_inputs or work.epilogue_vectors)):
        return 0.0
    bm, bn = work.tile_shape
    return (work.epilogue_inputs * spec.epilogue_input_s * bm * bn / (128 * 128)
            + work.epilogue_vectors * spec.epilogue_vector_s * bn / 128) / max(1, work.split_k)


def _standalone_epilogue_s(work: KernelWork, spec: HwSpec, tile_s) -> float:
    """Per tile-time of the busiest SM, what a standalone GEMM's full epilogue inputs (a
    residual) cost: each CTA waits w = standalone_epilogue_input_s per input after its main
    loop, while its SM runs the other CTA alone at standalone_lone_share r of its rate, losing
    w (1 - r); where the other CTA waits too (a share w / d of the time, d = two tile-times, a
    paired CTA's tile), all of w. Fused 16384 x N x K GEMMs with and without a residual: +33.5 us
    at K = 768, +17 at K = 256, +6 at K = 3072, where their DRAM streams hide it (0.6-3 us in
    the p-norm): the short tiles' CTAs wait together."""
    w = spec.standalone_epilogue_input_s
    if not (w and work.epilogue_inputs and _is_gemm(work)):
        return 0.0
    bm, bn = work.tile_shape
    d = np.maximum(2.0 * np.asarray(tile_s, dtype=float), w)
    out = work.epilogue_inputs * w * bm * bn / (128 * 128) * ((1.0 - spec.standalone_lone_share) + w / d)
    return float(out) if np.ndim(out) == 0 else out


def tail_share(compute, stream):
    """How much of a grid's last round (its lone CTA's slower tile, the pair's slower CTA) adds
    to its math: all of it where the math binds, its math's share where the read stream is as
    long (a DRAM-bound grid's lone CTA streams faster, not slower: CTA traces give the
    weight-streaming 64 x 49152 x 12288 a lone share of 1.07)."""
    if np.ndim(compute) == 0 and np.ndim(stream) == 0:     # the search's scalar calls
        c, r = float(compute), float(stream)
        return c / (c + r) if c + r > 0 else 1.0
    c, r = np.asarray(compute, dtype=float), np.asarray(stream, dtype=float)
    return np.where(c + r > 0, c / np.maximum(c + r, 1e-30), 1.0)


def _tail_s(work: KernelWork, spec: HwSpec, s, tile_s):
    """A standalone GEMM grid's tail past its busiest SM's whole rounds: two CTAs share an SM
    unevenly (one of a pair ends ~10% before the other), so the last round ends with the slower
    one, gemm_tail_tiles tile times on (CTA traces of the calibration's GEMMs: the span is whole
    rounds plus 0.07-0.13 of a paired CTA's time, `cta_trace_2026-11-24/`). None where no SM
    runs two CTAs (tiles <= SMs); a tilesync producer's fluid time has none (its tail is what
    the next kernel fills)."""
    th = spec.gemm_tail_tiles
    if not th or work.persistent or not work.paired_ctas or not _is_gemm(work):
        return 0.0 * np.asarray(s, dtype=float) if np.ndim(s) else 0.0
    if np.ndim(s) == 0 and np.ndim(tile_s) == 0:
        return th * float(tile_s) if float(s) < max(1, work.tiles) else 0.0
    out = np.where(np.asarray(s, dtype=float) < max(1, work.tiles), th * np.asarray(tile_s, dtype=float), 0.0)
    return float(out) if np.ndim(out) == 0 else out


def _ramp(work: KernelWork, spec: HwSpec) -> float:
    """A standalone GEMM kernel's first prologue and last epilogue, which no other tile hides;
    split along K, a second kernel sums the partials (its own fixed cost and ramp)."""
    if not _is_gemm(work) or work.persistent:
        return 0.0
    if work.split_k > 1:
        return 2.0 * spec.gemm_ramp_s + spec.kernel_fixed_s
    return spec.gemm_ramp_s


def _hbm_ceiling(work: KernelWork, spec: HwSpec) -> float | None:
    """A GEMM streams its operands at its own calibrated ceiling (cp.async tile loads of two
    CTAs or teams per SM), not at a streaming kernel's; standalone and persistent apart. A
    standalone kernel of fewer resident warps streams at its share of the streaming one's; a
    persistent concat step at its own (262144 x 320 on 66 SMs: 1.2 TB/s, where 5 and 17 SMs
    stream 26-27 GB/s each)."""
    if not _is_gemm(work):
        if work.persistent and work.concat and spec.efficiency.persistent_concat_hbm:
            return spec.efficiency.persistent_concat_hbm
        if work.stream_share < 1.0 and not work.persistent:
            return spec.efficiency.hbm * work.stream_share
        return None
    return spec.efficiency.persistent_gemm_hbm if work.persistent else spec.efficiency.gemm_hbm


def gemm_tile_options(spec: HwSpec) -> tuple[tuple[int, int], ...]:
    return tuple(tuple(t) for t in spec.gemm_tile_shapes) if spec.gemm_tile_shapes else GEMM_TILES


def gemm_tiles(batch: int, m: int, n: int, tile: tuple[int, int]) -> int:
    return batch * math.ceil(m / tile[0]) * math.ceil(n / tile[1])


SPLIT_K = (1, 2, 4, 8, 16)


# The validation harness's standalone GEMM (validate/codegen.py choose_gemm_tile keeps its own
# copy: the GPU machine imports no pydantic-backed module; a test checks they agree)
HARNESS_GEMM_BK = 64


def harness_gemm_choice(m: int, n: int, k: int, sm_count: int) -> tuple[tuple[int, int], int]:
    """(tile, split-K) the harness runs a GEMM of m rows (all batches) with: 128x128 tiles (64 rows
    for M <= 64), and K split when the tiles fill less than the GPU, into ranges of 1024 or more."""
    bm, bn = (64 if m <= 64 else 128), 128
    tiles = -(-m // bm) * -(-n // bn)
    splits = 1
    if tiles < sm_count:
        splits = max(1, min(-(-2 * sm_count // tiles), -(-k // HARNESS_GEMM_BK) // 16, 16))
    return (bm, bn), splits


def best_gemm_tile(work_for_tile, spec: HwSpec, sms, k: int | None = None,
                   m: int | None = None, n: int | None = None) -> tuple[KernelWork, float]:
    """Pick the CTA tile (and split-K factor, for GEMMs with too few output tiles to fill the
    SMs) with the lowest latency on `sms` SMs, as a GEMM library's heuristic would;
    `work_for_tile(tile, split_k) -> KernelWork`. Ties go to the larger tile, then no split.
    A spec whose gemm_heuristic is "harness" runs the harness's own choice (m, n: rows of all batches
    and columns of the GEMM)."""
    if spec.gemm_heuristic == "harness" and m and n and k:
        tile, ks = harness_gemm_choice(m, n, k, spec.sm_count)
        w = work_for_tile(tile, ks)
        return w, kernel_time(w, spec, sms)
    best = None
    tiles = gemm_tile_options(spec)
    for tile in tiles:
        for ks in SPLIT_K:
            if ks > 1 and (k is None or k // ks < 256):
                break
            w = work_for_tile(tile, ks)
            if ks > 1 and w.tiles // ks >= float(np.max(sms)):
                break          # the output tiles already fill the SMs: no split along K
            t = kernel_time(w, spec, sms)
            if best is None or t < best[1] * (1 - 1e-9):
                best = (w, t)
    return best


def split_k_partials_bytes(batch: int, m: int, n: int, ks: int) -> float:
    """fp32 partial sums written and read back once more per extra K split (L2 traffic)."""
    return 0.0 if ks <= 1 else 2.0 * batch * m * n * 4 * ks
