"""Kitsune spatial pipeline: stages on disjoint SM shares, persistent CTAs, row-block tiles
through ring queues in L2, timed by the queue-occupancy model.

Tiles are row-blocks of `tile_rows` rows of the stream (N = ceil(rows / tile_rows) of them).
A queue in 'row' mode hands over whole row-blocks: a consumer that reduces over the producer's
columns (a GEMM's K) waits for the full row-block. In 'split_k' mode (Kitsune's reduction-
dimension parallelism) the producer publishes each row-block in `slabs` column slabs and the
consumer GEMM accumulates its partial sums slab by slab, so hand-offs are finer (N * slabs
sub-tiles) at the price of more flag hand-offs.

DRAM: region inputs are read and region outputs written once; queue slots live in L2 (the part
of the queues beyond the usable L2 spills: written and read back through DRAM); each stage's
weights are read once if they fit the L2 left beside the queues, else once per row-block (a
stage sees every weight again for every row-block it processes).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from kitsune_dse.cost.estimate import Estimate
from kitsune_dse.cost.l2_residency import (first_stage_free_row_blocks, free_row_blocks, local_frame_bytes,
                                          ring_cycle_stream_bytes, streamed_weight_hit, write_back_fraction)
from kitsune_dse.cost.memo import table
from kitsune_dse.cost.queues import simulate
from kitsune_dse.cost.region import Region, dirty_lines, epilogue_inputs, handed_over, view_base
from kitsune_dse.cost.reuse import dirty_residue
from kitsune_dse.cost.roofline import (MEM_TILE_BYTES, KernelWork, gemm_tiles, kernel_time,
                                       simt_flops, weight_reread_bytes)
from kitsune_dse.cost.stage_sim import (TEAMS_PER_SM, StageShape, prefetch_schedules,
                                         stage_unit_latency, stage_unit_time)
from kitsune_dse.errors import InfeasibleError
from kitsune_dse.graph.ir import DTYPE_BYTES, DepPattern, OpClass
from kitsune_dse.hw.spec import HwSpec

SPLIT_K_SLAB_COLS = 512


@dataclass(frozen=True)
class PipelineChoice:
    stages: tuple[tuple[str, ...], ...]
    sms: tuple[int, ...]
    tile_rows: int = 128
    depths: tuple[int, ...] = ()        # ring slots per queue; default 2
    modes: tuple[str, ...] = ()         # 'row' or 'split_k' per queue; default 'row'
    teams: int | None = None            # 256-thread teams per CTA: 1 or 2; None: as the harness
                                        # chooses (solo_team_fits), what the search leaves it to

    def normalized(self) -> "PipelineChoice":
        q = len(self.stages) - 1
        return PipelineChoice(tuple(tuple(s) for s in self.stages), tuple(int(x) for x in self.sms),
                              int(self.tile_rows), tuple(self.depths) or (2,) * q,
                              tuple(self.modes) or ("row",) * q,
                              None if self.teams is None else int(self.teams))


@dataclass(frozen=True)
class StagePlan:
    """Derived facts of a checked pipeline choice, shared by the estimate and the harness."""
    choice: PipelineChoice
    stream_rows: int
    row_blocks: int
    slabs: int
    queue_tensors: tuple[tuple[str, ...], ...]     # per queue: tensors crossing it
    slot_bytes: tuple[float, ...]                   # per queue: bytes of one ring slot
    stage_weights: tuple[float, ...]                # per stage: weight bytes
    stage_inputs: tuple[float, ...]                 # per stage: bytes of region inputs it reads
    stage_outputs: tuple[float, ...]                # per stage: bytes of region outputs it writes
    notes: dict = field(default_factory=dict)


def _stage_of(choice: PipelineChoice) -> dict[str, int]:
    return {o: j for j, st in enumerate(choice.stages) for o in st}


def plan_stages(region: Region, spec: HwSpec, choice: PipelineChoice) -> StagePlan:
    """Check a pipeline choice and derive its queues; InfeasibleError names stage and resource.
    Nothing derived depends on the SM counts: a choice checked before at other SM counts only
    has those checked again (the search re-plans one cut at many SM splits)."""
    c = choice.normalized()
    key = (region, c.stages, c.tile_rows, c.depths, c.modes)
    memo = table(spec, "plan_stages")
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _plan_stages(region, spec, c)
        return hit
    _check_sms(c, spec)
    return replace(hit, choice=c, notes={})


def _check_sms(c: PipelineChoice, spec: HwSpec) -> None:
    J = len(c.stages)
    if c.teams not in (None, 1, TEAMS_PER_SM):
        raise InfeasibleError(f"{c.teams} teams per CTA: the runtime runs 1 or {TEAMS_PER_SM}")
    if len(c.sms) != J:
        raise InfeasibleError(f"{J} stages but {len(c.sms)} SM counts")
    for j, s in enumerate(c.sms):
        if s < 1:
            raise InfeasibleError(f"stage {j} ({'+'.join(c.stages[j])}) has {s} SMs; it needs at least 1")
    if sum(c.sms) > spec.sm_count:
        raise InfeasibleError(f"stages use {sum(c.sms)} SMs ({'/'.join(map(str, c.sms))}) but "
                              f"{spec.name} has {spec.sm_count}")


def _plan_stages(region: Region, spec: HwSpec, c: PipelineChoice) -> StagePlan:
    g = region.graph
    J = len(c.stages)
    where = _stage_of(c)
    if J == 0 or any(not st for st in c.stages):
        raise InfeasibleError("a pipeline needs at least one stage and no empty stage")
    covered = [o for st in c.stages for o in st]
    if sorted(covered) != sorted(region.ops) or len(set(covered)) != len(covered):
        missing = sorted(set(region.ops) - set(covered))
        extra = sorted(set(covered) - set(region.ops))
        dup = sorted({o for o in covered if covered.count(o) > 1})
        raise InfeasibleError("pipeline stages must cover each op of the region once: "
                              + "; ".join(x for x in (f"missing {missing}" if missing else "",
                                                      f"not in region {extra}" if extra else "",
                                                      f"in two stages {dup}" if dup else "") if x))
    _check_sms(c, spec)
    if len(c.depths) != J - 1 or any(d < 1 for d in c.depths):
        raise InfeasibleError(f"{J - 1} queues need depths >= 1, got {list(c.depths)}")
    if c.tile_rows < 1:
        raise InfeasibleError(f"tile_rows must be >= 1, got {c.tile_rows}")
    queue_tensors: list[list[str]] = [[] for _ in range(J - 1)]
    for o in region.ops:
        op = g.op(o)
        for t, pat in op.info.patterns.items():
            p = g.producer(t)
            if p is None or p not in region.op_set:
                continue
            jp, jc = where[p], where[o]
            if jp > jc:
                raise InfeasibleError(f"stage {jc} ({o}) needs {t!r} from later stage {jp} ({p}): "
                                      f"stages must follow the data flow")
            if jp < jc and not pat.streamable:
                raise InfeasibleError(f"stage {jc} ({o}) needs all of {t!r} from stage {jp} "
                                      f"(a {pat.value} dependency), so tiles cannot stream between "
                                      f"them; cut the region there")
            for q in range(jp, jc):
                if t not in queue_tensors[q]:
                    queue_tensors[q].append(t)
    for q, mode in enumerate(c.modes):
        if mode not in ("row", "split_k"):
            raise InfeasibleError(f"queue {q}: mode {mode!r} is not 'row' or 'split_k'")
        if mode == "split_k":
            first = g.op(c.stages[q + 1][0])
            if first.info.op_class is not OpClass.GEMM or first.inputs[0] not in queue_tensors[q]:
                raise InfeasibleError(f"queue {q}: split_k needs stage {q + 1} to start with a GEMM "
                                      f"that reduces over the queued tensor")
            src = g.producer(first.inputs[0])
            if src is not None and g.op(src).info.op_class is OpClass.ROW_REDUCTION:
                # the runtime cannot publish column slabs of rows it finishes whole
                raise InfeasibleError(f"queue {q}: split_k needs column slabs, but {src!r} (stage "
                                      f"{where[src]}) is a row op that finishes whole rows; use 'row'")
    first_out = g.tensors[g.op(c.stages[0][0]).outputs[0]]
    rows = max(1, first_out.rows if len(first_out.shape) > 1 else first_out.numel)
    N = math.ceil(rows / c.tile_rows)
    slabs = 1
    for q, mode in enumerate(c.modes):
        if mode == "split_k":
            k = g.op(c.stages[q + 1][0]).info.gemm.k
            slabs = max(slabs, min(16, math.ceil(k / SPLIT_K_SLAB_COLS)))
    slot = tuple(sum(g.stored_bytes(t) for t in ts) / N for ts in queue_tensors)
    weights, ins, outs = [], [], []
    for st in c.stages:
        sset = set(st)
        w = i = 0.0
        seen = set()
        for o in st:
            for t, b in g.op(o).info.read_bytes.items():
                if t in seen or g.producer(t) in region.op_set:
                    continue
                seen.add(t)
                if t in g.weights and g.op(o).info.patterns[t] is DepPattern.FULL:
                    w += b        # every tile needs all of it: re-read per row-block unless in L2
                else:
                    i += b        # read once in total, a share per tile (gathered rows, inputs)
        ob = sum(g.stored_bytes(t) for t in region.outputs if g.producer(t) in sset)
        weights.append(w)
        ins.append(i)
        outs.append(float(ob))
    return StagePlan(c, rows, N, slabs, tuple(tuple(x) for x in queue_tensors), slot,
                     tuple(weights), tuple(ins), tuple(outs))


def runtime_row_blocks(plan: StagePlan) -> int:
    """Row-blocks the persistent runtime walks (a plan tile of R rows runs as R / bm of them)."""
    return max(1, math.ceil(plan.stream_rows / runtime_block(plan)[0]))


def runtime_block(plan: StagePlan) -> tuple[int, int]:
    """The runtime's row-block (bm rows) and how many of them one plan unit holds."""
    bm = pipe_tile(plan.choice.tile_rows, plan.stream_rows)[0]
    return bm, max(1, min(plan.choice.tile_rows, plan.stream_rows) // bm)


def _resident_weights(plan: StagePlan, budget: float) -> list[bool]:
    """Which stages keep their weights in L2 (smallest first, as long as they fit)."""
    left = budget
    single = runtime_row_blocks(plan) == 1
    res = [False] * len(plan.stage_weights)
    for j in sorted(range(len(res)), key=lambda k: plan.stage_weights[k]):
        w = plan.stage_weights[j]
        if single or w <= left:
            res[j] = True
            left -= 0.0 if single else w
    return res


def ring_bytes(plan: StagePlan) -> float:
    """L2 the ring queues occupy: depth slots each, but never more slots than tiles exist."""
    return float(sum(min(d, plan.row_blocks) * sb
                     for d, sb in zip(plan.choice.depths, plan.slot_bytes)))


# The persistent runtime's CTA tile: BM = the row-block (64 or 128 rows), BN = 128 columns, the
# whole K (split only along a split_k queue's slabs); its workers take the (row-block, tile)
# items of a stage round-robin, so a stage works on as many row-blocks at once as its rings let in
PIPE_TILE_COLS = 128


def pipe_tile(tile_rows: int, stream_rows: int | None = None) -> tuple[int, int]:
    """The runtime's tile (validate/lower.py _tile_rows): 64-row blocks for a plan tile of 64
    rows or fewer, or when the stream itself has no more than 64 rows."""
    small = tile_rows <= 64 or (stream_rows is not None and stream_rows <= 64)
    return (64 if small else 128, PIPE_TILE_COLS)


def _atom_work(region: Region, spec: HwSpec, atom, units, d_r, d_w, l2,
               k_streamed: bool = False, row_blocks: int = 1, inflight: int = 1,
               tile_rows: int = 128, slabs: int = 1, reread: dict | None = None,
               a_dram: float = 0.0, d_wb: float = 0.0) -> KernelWork:
    """`inflight` hand-off units of a stage's fused group, processed together (the stage's
    workers interleave the items of every row-block its rings admit). A GEMM fed slab by slab
    through a split_k queue keeps every output tile of its row-block busy on each slab."""
    name, flops, simt_total, dtype, gemm, moved, row_op, concat = _atom_facts(region.graph, spec, atom)
    k = max(1, int(inflight))
    tensor = flops / units * k
    simt = simt_total / units * k
    rr = {} if not reread else {**reread, "weight_pass_bytes": reread["weight_pass_bytes"] / units * k}
    if gemm is not None:
        dtype, gd, dual, epilogue_inputs, epilogue_vectors = gemm
        tile = pipe_tile(tile_rows)
        per = row_blocks if k_streamed else units
        tiles = max(1, math.ceil(gemm_tiles(gd.batch, gd.m, gd.n, tile) / per)) * k * dual
        return KernelWork(name, dtype, tensor, simt, d_r / units * k, d_w / units * k,
                          l2 / units * k, tiles, 2, tile, slabs if k_streamed else 1, k, True,
                          gemm_n=gd.n, gemm_k=gd.k, epilogue_inputs=epilogue_inputs,
                          epilogue_vectors=epilogue_vectors, a_stream_bytes=a_dram / units * k,
                          a_stream_part=min(1.0, k / units), evicted_write_bytes=d_wb / units * k,
                          **rr)
    return KernelWork(name, dtype, tensor, simt, d_r / units * k, d_w / units * k, l2 / units * k,
                      max(1, math.ceil(moved / units * k / MEM_TILE_BYTES)), 2, None, 1, k, True,
                      row_op=row_op, concat=concat, evicted_write_bytes=d_wb / units * k, **rr)


def _atom_facts(g, spec: HwSpec, atom):
    """What _atom_work takes from a fused group's ops alone, memoised (every plan with the
    group in a stage asks again): its name, tensor FLOPs, SIMT FLOPs, dtype, the GEMM it is
    timed as (input dtype, GemmInfo, products sharing it, epilogue inputs) or None, the bytes
    its ops move, whether it reduces rows and whether it concatenates."""
    memo = table(spec, "atom_facts")
    key = (g, atom)
    hit = memo.get(key)
    if hit is not None:
        return hit
    infos = [g.op(o).info for o in atom]
    flops = sum(i.flops for i in infos if i.unit == "tensor")
    dtype = g.tensors[g.op(atom[0]).outputs[0]].dtype
    gemms = [(o, i) for o, i in zip(atom, infos) if i.gemm is not None]
    gemm = None
    if gemms:
        o, gi = max(gemms, key=lambda x: x[1].flops)
        gd = gi.gemm
        # a dual-B step (two GEMMs on the same A) has both products' column tiles as items
        gemm = (g.tensors[g.op(o).inputs[0]].dtype, gd, sum(1 for _, i in gemms if i.gemm == gd),
                *epilogue_inputs(g, atom, gd))
    moved = sum(sum(i.read_bytes.values()) + sum(i.write_bytes.values()) for i in infos)
    # (narrow rows stream as fast per byte as wide ones: softmax of 1024 and of 4096 columns
    # within 2% at 68 SMs once the runtime stopped visiting others' row-blocks, harness v4)
    row_op = any(i.op_class is OpClass.ROW_REDUCTION for i in infos)
    concat = any(g.op(o).kind == "concat" for o in atom)
    hit = memo[key] = ("+".join(atom), flops, simt_flops(infos, spec), dtype, gemm, moved,
                       row_op, concat)
    return hit


def _gemm_writes_ring(g, c: PipelineChoice, j: int, atoms) -> bool:
    """Stage j's groups that write its output queue are all GEMMs, which wait for their ring
    slot only before their epilogue (a stage fed by a split_k queue too: the eighth session
    priced those waiting first to hide the slabs a several-step writer finishes together,
    which _stage_ratio now models)."""
    later = {o for st in c.stages[j + 1:] for o in st}
    writers = [a for a in atoms if any(x in later for o in a for t in g.op(o).outputs for x in g.consumers(t))]
    return bool(writers) and all(any(g.op(o).info.gemm is not None for o in a) for a in writers)


def _dual_gemms(g, atoms: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """A stage's steps as the runtime fuses them (validate/lower.py _try_absorb): a GEMM that
    reads the same A as an earlier step's only GEMM, with weights and output of the same shapes,
    joins that step (one dual-B GEMM: A loaded once for both products, llama's gate and up
    projections), its epilogue ops with it."""
    out = [list(a) for a in atoms]
    i = 0
    while i < len(out):
        gi = [o for o in out[i] if g.op(o).info.gemm is not None]
        if len(gi) == 1 and g.op(gi[0]).info.gemm.batch == 1:
            a0 = g.op(gi[0])
            for j in range(i + 1, len(out)):
                gj = [o for o in out[j] if g.op(o).info.gemm is not None]
                if len(gj) != 1 or g.op(out[j][0]).info.gemm is None:
                    continue
                b = g.op(gj[0])
                if (b.inputs[0] == a0.inputs[0] and b.info.gemm == a0.info.gemm
                        and g.tensors[b.inputs[1]].shape == g.tensors[a0.inputs[1]].shape):
                    out[i] = sorted(out[i] + out.pop(j), key=g.index)
                    break
        i += 1
    return [tuple(a) for a in out]


def stage_works(region: Region, spec: HwSpec, plan: StagePlan, sms=None):
    """Per stage, the KernelWork of each of its fused groups for one hand-off unit (a
    row-block, or one slab of it): a stage runs its groups one after another on every unit.
    Also the region's DRAM totals (read, write, weight re-reads, queue spill).
    Only the weight re-reads depend on the SMs (`sms`, default the plan's; with them how long
    the first stage runs free, _paced_by_rates): the rest is memoised per plan without them
    (the search re-times one plan at many SM splits)."""
    sms = plan.choice.sms if sms is None else sms
    core = _stage_works_core(region, spec, plan)
    units = plan.row_blocks * plan.slabs
    core_works, free0 = _paced_by_rates(core, plan, spec, sms)
    teams = plan.choice.teams
    solo = teams == 1 if teams is not None else solo_team_fits(core, sms)
    if solo:
        core_works = [_teams_of(ws, True) for ws in core_works]
    # the read total is summed in the order the groups were costed, re-reads at their place
    tot_r = reread = 0.0
    for x in core.read_terms:
        if isinstance(x, float):
            tot_r += x
        else:
            j, work = x
            if j == 0 and free0 is not None:
                work = work.but(free_rbs=free0)
            extra = float(weight_reread_bytes(work, sms[j])) * units / work.inflight
            reread += extra
            tot_r += extra
    partial, evicted = _l2_evictions(core, spec, sms)
    reads, writes = tot_r + partial + evicted, core.write_bytes + partial
    # what is still dirty in L2 when the kernel ends, as after any kernel (cost.reuse): its
    # ring stores are brought into L2 like its DRAM reads, so the share of the recent lines
    # that are its outputs is smaller than a kernel-per-op's (bench/dram_probe.py wbq-*)
    # (the ring slots' own dirty lines left out of the cap: as good a fit, the probes cannot
    # tell them apart)
    deferred = dirty_residue([reads + core.written_bytes + partial], [writes], spec)[0]
    # in time, as any kernel (cost.region.kernel_works): its end leaves its dirty lines to the
    # next kernel and its allocations write back those the kernel before left
    d_in, d_out = dirty_lines(region, spec, [reads + core.written_bytes + partial], [writes], [0.0])
    return [list(w) for w in core_works], {
        "dram_read_bytes": reads, "dram_write_bytes": writes, "dram_deferred_write_bytes": deferred,
        "dram_timed_bytes": reads + max(0.0, writes + d_in - d_out),
        "weight_reread_bytes": reread, "resident_weight_reread_bytes": evicted,
        "queue_bytes": core.queue_bytes,
        "queue_spill_bytes": core.spill_bytes, "queue_write_back_bytes": core.write_back_bytes,
        "partial_sum_write_back_bytes": partial, "l2_footprint_bytes": core.footprint,
        "l2_frame_bytes": core.frame_bytes, "teams_per_sm": 1 if solo else TEAMS_PER_SM,
        "weights_resident": list(core.resident), "stage_shapes": list(core.shapes),
        "stage_single_works": list(core.single), "stage_inflight": list(core.inflight),
        "stage_splitk": list(core.splitk), "stage_slab_writer": list(core.slab_writer)}


def solo_stage_fits(core: "_StageWorks", j: int, sms):
    """Stage j alone allows one team per SM at `sms` SMs (scalar or per SM count): none of its
    steps has more items over all the runtime's row-blocks than the stage has CTAs (one a SM),
    and its split_k consumer, if any, keeps each tile's K whole (runtime_ksplit at two teams:
    the runtime decides by the two-team layout, validate.lower.solo_team_fits)."""
    s = np.atleast_1d(np.asarray(sms, dtype=np.int64))
    ok = core.step_items[j] <= s
    sk = core.ksplit_info[j]
    if sk:
        ok &= np.array([runtime_ksplit(sk["n_tiles"], TEAMS_PER_SM * int(x), sk["k"], sk["slab_w"],
                                       sk["ws_per_split"]) == 1 for x in s])
    return ok if np.ndim(sms) else bool(ok[0])


def solo_team_fits(core: "_StageWorks", sms) -> bool:
    """The harness runs the kernel with one 256-thread team per SM (validate.lower.solo_team_fits,
    the same rule on its own layout): every stage allows it at its SM count. The second team
    would only idle there, and without it a thread may hold 255 registers instead of 128
    (bench/step_trace_probe.py --teams: 1-10% faster, no spills)."""
    return all(solo_stage_fits(core, j, int(s)) for j, s in enumerate(sms))


def _teams_of(works, solo: bool) -> list:
    """A stage's works priced as steps of a one-team (solo) or a two-team kernel."""
    return [w.but(solo_team=solo) if w.solo_team != solo else w for w in works]


def _l2_evictions(core, spec: HwSpec, sms) -> tuple[float, float]:
    """DRAM bytes of what L2 evicts beyond the rings' write-back (cost.l2_residency), at the
    stages' SM counts: split_k consumers' fp32 partial sums (every K range of a tile stores its
    partial and the last one reads them all back; the ksplit planes of workspace join the L2
    footprint; the share L2 evicts goes to DRAM and comes back, each way), and resident weights
    read again (per row-block, write_back_fraction x l2_resident_reread x their share of the L2
    of them; fitted on probes of 4-17 MB of weights, bench/dram_probe.py wb*-)."""
    partial, ws = 0.0, 0.0
    for j, sk in enumerate(core.splitk):
        if not sk:
            continue
        ks = runtime_ksplit(sk["n_tiles"], TEAMS_PER_SM * int(sms[j]), sk["k"], sk["slab_w"],
                            sk["ws_per_split"])
        if ks > 1:
            ws += ks * sk["ws_per_split"]
            f = write_back_fraction(core.footprint + ks * sk["ws_per_split"], spec)
            partial += f * ks * sk["partial_rb_bytes"] * sk["rbs"]
    w = core.resident_weight_bytes
    f = write_back_fraction(core.footprint + ws, spec)
    reread = f * spec.efficiency.l2_resident_reread * w * (w / spec.l2_bytes) * core.row_blocks
    return partial, reread


@dataclass(frozen=True)
class _StageWorks:
    """What stage_works derives from a plan without its SM counts."""
    works: tuple[tuple[KernelWork, ...], ...]
    shapes: tuple[StageShape | None, ...]
    read_terms: tuple          # DRAM read bytes per group, in order; (stage, work) = its re-reads
    write_bytes: float
    queue_bytes: float
    spill_bytes: float
    write_back_bytes: float
    resident: tuple[bool, ...]
    single: tuple[KernelWork | None, ...]   # one-step stages: the step on one unit alone
    inflight: tuple[int, ...]               # units a stage's rings let it hold at once
    splitk: tuple[dict | None, ...]         # one-step split_k consumers: what their K split needs
    slab_writer: tuple[int | None, ...] = ()  # several-step stages writing a split_k queue: the
                                            # items of their last step in one plan row-block
    footprint: float = 0.0                  # L2 footprint of one ring cycle (_l2_footprint)
    resident_weight_bytes: float = 0.0      # weights kept in L2 over several row-blocks
    row_blocks: int = 1                     # the runtime's row-blocks
    frame_bytes: float = 0.0                # of footprint: the kernel's spilled stack frames
    written_bytes: float = 0.0              # every byte its steps store (rings and outputs)
    step_items: tuple[int, ...] = ()        # per stage: its steps' most items over all the
                                            # runtime's row-blocks (solo_team_fits)
    ksplit_info: tuple[dict | None, ...] = ()  # per stage: its split_k consumer's _splitk_info


def _stage_works_core(region: Region, spec: HwSpec, plan: StagePlan) -> _StageWorks:
    c = plan.choice
    key = (region, c.stages, c.tile_rows, c.depths, c.modes, plan.stream_rows, plan.row_blocks,
           plan.slabs, plan.queue_tensors, plan.slot_bytes, plan.stage_weights,
           plan.stage_inputs, plan.stage_outputs)
    memo = table(spec, "stage_works")
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _derive_stage_works(region, spec, plan)
    return hit


def _derive_stage_works(region: Region, spec: HwSpec, plan: StagePlan) -> _StageWorks:
    g = region.graph
    c = plan.choice
    N, slabs = plan.row_blocks, plan.slabs
    units = N * slabs
    queue_bytes = ring_bytes(plan)
    budget = spec.l2_usable_bytes
    spill_frac = max(0.0, (queue_bytes - budget) / queue_bytes) if queue_bytes > 0 else 0.0
    # a stage's groups hand each unit's intermediates to each other through L2: reserve that
    # working set before pinning weights in what is left beside the queues
    subs = [Region.of(g, st) for st in c.stages]
    stage_atoms = [_stage_steps(g, spec, st, sub) for st, sub in zip(c.stages, subs)]
    # (a tensor made and used inside one fused group never leaves the SM)
    intra_ws = max((g.stored_bytes(t) / units for st, atoms in zip(c.stages, stage_atoms)
                    for a in atoms for o in a for t in g.op(o).outputs
                    if any(x in st and x not in a for x in g.consumers(t))), default=0.0)
    left = max(0.0, budget - min(queue_bytes, budget))
    resident = _resident_weights(plan, max(0.0, left - min(intra_ws, left)))
    resident_w = sum(w for w, r in zip(plan.stage_weights, resident) if r) if N > 1 else 0.0
    intra_budget = max(0.0, left - resident_w)
    rbs = runtime_row_blocks(plan)
    bm, rb_per_unit = runtime_block(plan)
    # (weights the runtime's row-blocks read again, kept in L2 or streamed each time)
    kept_w = sum(w for w, r in zip(plan.stage_weights, resident) if r) if rbs > 1 else 0.0
    footprint = _l2_footprint(region, plan, stage_atoms, resident, kept_w, queue_bytes, bm,
                              rb_per_unit, rbs)
    frames = 0.0
    if spec.efficiency.l2_local_frame_share:
        # the kernel's threads' stack frames (register spills) live in L2 beside the rings
        feats = [stage_frame_features(g, spec, st) for st in c.stages]
        frames = spec.efficiency.l2_local_frame_share * local_frame_bytes(
            feats, spec, TEAMS_PER_SM * TEAM_THREADS * sum(c.sms))
        footprint += frames
    wb_frac = write_back_fraction(footprint, spec)
    wb_inner = write_back_fraction(footprint, spec, inner=True)
    hit = streamed_weight_hit(sum(w for w, r in zip(plan.stage_weights, resident) if not r)
                              if rbs > 1 else 0.0, spec)
    # units a stage can work on at once: its input ring and its output ring bound how many
    # row-blocks are available and writable (a lone stage sees the whole stream)
    # (a GEMM writing the output ring waits for its slot only before its epilogue: its main
    # loops run on as many units as its input allows, the ring holds back only their ends,
    # which the queue simulation's blocking after service models; harness version 5)
    J = len(c.stages)
    inflight = []
    for j in range(J):
        lim = units
        if j > 0:
            lim = min(lim, c.depths[j - 1] * slabs)
        if j < J - 1 and not _gemm_writes_ring(g, c, j, stage_atoms[j]):
            lim = min(lim, c.depths[j] * slabs)
        inflight.append(max(1, lim))
    out, shapes, read_terms, single, splitk, writers = [], [], [], [], [], []
    step_items, ksplit_info = [], []
    tot_w = spill = write_back = written = 0.0
    inputs_read: set[str] = set()     # a region input is fetched from DRAM once, then hits L2
    for j, st in enumerate(c.stages):
        sub, atoms = subs[j], stage_atoms[j]
        # the stage's workers split over all its steps' items: row-blocks in flight at once
        stage_items = sum(_atom_items(g, a, bm, rbs) for a in atoms)
        step_items.append(max(_atom_items(g, a, bm, rbs) for a in atoms) * rbs)
        ksplit_info.append(None)
        at_once = float(min(rbs, max(1, inflight[j] // slabs) * rb_per_unit))
        works = []
        for k, atom in enumerate(atoms):
            aset = set(atom)
            d_r = d_w = d_wb = l2 = w_pass = a_dram = 0.0
            seen = set()
            for o in atom:
                for t, b in g.op(o).info.read_bytes.items():
                    if t in seen or g.producer(t) in aset:
                        continue
                    seen.add(t)
                    p = g.producer(t)
                    if p is None or p not in region.op_set:       # region input or weight
                        if t in g.weights and g.op(o).info.patterns[t] is DepPattern.FULL:
                            d_r += b                       # the first pass
                            if resident[j]:
                                l2 += b * N if N > 1 else 0.0
                            else:                          # streamed again (weight_reread_bytes)
                                w_pass += b
                        elif handed_over(region, spec, t) or t in inputs_read:
                            l2 += b
                        else:
                            d_r += b
                            inputs_read.add(t)
                            if g.op(o).info.gemm is not None and t == g.op(o).inputs[0]:
                                a_dram += b                # a GEMM's A, slab by slab from DRAM
                    elif p in sub.op_set:                          # from an earlier group of the stage
                        if b / units <= intra_budget:
                            l2 += b
                        else:                                      # a unit's worth overflows L2
                            d_r += b
                    else:                                          # through an input queue
                        d_r += spill_frac * b
                        spill += spill_frac * b
                        l2 += (1 - spill_frac) * b
            for o in atom:
                for t in g.op(o).outputs:
                    b = g.stored_bytes(t)
                    if t in region.outputs:        # written back from L2 (cost.region)
                        d_w += b
                    cons = [x for x in g.consumers(t) if x in region.op_set and x not in aset]
                    if cons or t in region.outputs:
                        written += b
                    if any(x in sub.op_set for x in cons):
                        if b / units <= intra_budget:
                            l2 += b                    # a ring between the stage's steps, whose
                            if not any(x not in sub.op_set for x in cons):  # slots L2 may evict
                                d_w += wb_inner * b
                                d_wb += wb_inner * b
                                write_back += wb_inner * b
                        else:                                      # written once, re-read by each
                            d_w += b
                    if any(x not in sub.op_set for x in cons):    # into an output queue
                        # the slots' dirty lines also go to DRAM when L2 evicts them before
                        # the next generation overwrites them (their reads still hit L2)
                        d_w += (spill_frac + (1 - spill_frac) * wb_frac) * b
                        d_wb += (1 - spill_frac) * wb_frac * b
                        spill += spill_frac * b
                        write_back += (1 - spill_frac) * wb_frac * b
                        l2 += (1 - spill_frac) * b
            read_terms.append(d_r)
            tot_w += d_w
            k_streamed = (k == 0 and j > 0 and plan.slabs > 1 and c.modes[j - 1] == "split_k")
            # a stage of several steps is timed worker by worker (stage_sim) on one unit's work
            k_inf = inflight[j] if len(atoms) == 1 else 1
            reread_info = {"weight_pass_bytes": w_pass, "rbs": rbs, "items_per_rb": stage_items,
                           "rbs_at_once_max": at_once,
                           "free_rbs": free_row_blocks(j, J, rbs, c.depths[0] * rb_per_unit if J > 1 else rbs),
                           "weight_share": spec.efficiency.l2_weight_share,
                           "weight_l2_hit": hit} if w_pass else None
            work = _atom_work(region, spec, atom, units, d_r, d_w, l2, k_streamed, N,
                              k_inf, bm, slabs, reread_info, a_dram, d_wb)
            if J > 1:       # the other stages load their tiles from L2 meanwhile (all the chip)
                work = work.but(feed_sms=float(spec.sm_count))
            sk = _splitk_info(region, plan, j, atom, bm, rbs) if k_streamed else None
            if sk:
                ksplit_info[j] = sk
            if sk and work.tile_shape:
                # the runtime polls the slab flag before each slab of K it loads (SlabWait):
                # K / (slabs x slab width) polls per tile of this unit
                work = work.but(slab_polls=sk["k"] / (sk["slab_w"] * plan.slabs))
            if w_pass:
                read_terms.append((j, work))
            works.append(work)
            if len(atoms) == 1:
                single.append(work if k_inf == 1 else
                              replace(_atom_work(region, spec, atom, units, d_r, d_w, l2, k_streamed, N,
                                                 1, bm, slabs, reread_info, a_dram, d_wb),
                                      feed_sms=work.feed_sms))
                splitk.append(sk)
        if len(atoms) > 1:
            single.append(None)
            splitk.append(None)
        writers.append(_atom_items(g, atoms[-1], bm, rbs) * rb_per_unit
                       if len(atoms) > 1 and j < J - 1 and c.modes[j] == "split_k" and slabs > 1 else None)
        out.append(tuple(works))
        shapes.append(_stage_shape(region, plan, atoms, inflight[j]) if len(atoms) > 1 else None)
    # a stage holds the units its rings admit (a several-step stage writing a split_k queue at
    # least the slabs of one row-block, which it may finish together: _stage_ratio)
    return _StageWorks(tuple(out), tuple(shapes), tuple(read_terms), tot_w, queue_bytes, spill,
                       write_back, tuple(resident), tuple(single),
                       tuple(i if len(a) == 1 or not w else max(i, slabs)
                             for i, a, w in zip(inflight, stage_atoms, writers)),
                       tuple(splitk), tuple(writers), footprint, kept_w, rbs, frames, written,
                       tuple(step_items), tuple(ksplit_info))


def _stage_steps(g, spec: HwSpec, stage, sub: Region) -> list[tuple[str, ...]]:
    """A stage's steps: its fused groups (views alone are no step) as the runtime fuses them
    (_dual_gemms), memoised (every plan with the stage asks again; read only)."""
    from kitsune_dse.cost.strategies import fusion_groups
    memo = table(spec, "stage_steps")
    key = (g, tuple(stage))
    hit = memo.get(key)
    if hit is None:
        atoms = [a for a in fusion_groups(sub) if not all(g.op(o).info.is_view for o in a)]
        hit = memo[key] = _dual_gemms(g, atoms) or [tuple(stage)]
    return hit


def stage_frame_features(g, spec: HwSpec, stage) -> dict[str, int]:
    """What the pipeline kernel's local memory per thread grows with, for one stage's ops
    (cost.l2_residency.local_frame_bytes; bench/frame_probe.py fits it on nvcc's report): its
    steps, GEMM steps, narrow GEMMs (fewer than 128 output columns), concatenations, row ops."""
    stage = tuple(stage)
    out = {"steps": 0, "gemm": 0, "narrow": 0, "concat": 0, "row": 0}
    for atom in _stage_steps(g, spec, stage, Region.of(g, stage)):
        _, _, _, _, gemm, _, row_op, concat = _atom_facts(g, spec, atom)
        out["steps"] += 1
        out["gemm"] += gemm is not None
        out["narrow"] += gemm is not None and gemm[1].n < 128
        out["concat"] += bool(concat)
        out["row"] += bool(row_op)
    return out


@functools.lru_cache(maxsize=1 << 12)
def _region_bytes(region: Region) -> tuple[float, float, float]:
    """A region's compulsory (read, write) bytes and the weight bytes its ops read, memoised
    (every plan of the window asks)."""
    g = region.graph
    reads, writes = region.compulsory_bytes()
    return reads, writes, sum(b for o in region.ops for t, b in g.op(o).info.read_bytes.items()
                              if t in g.weights)


def _intra_slots(g, atom, bm: int, rb_per_unit: int, rbs: int) -> tuple[int, int]:
    """(slots, slot bytes) of the ring a stage's step writes for the next step of the same
    stage (validate/lower.py: room for the plan tile's row-blocks, at least two, capped)."""
    t = g.op(atom[-1]).outputs[0]
    slot = bm * g.stored_cols(t) * DTYPE_BYTES[g.tensors[t].dtype]
    return min(rbs, max(2, min(rb_per_unit, INTRA_RING_BYTES // max(1, slot)))), slot


def _l2_footprint(region: Region, plan: StagePlan, stage_atoms, resident, resident_w: float,
                  queue_bytes: float, bm: int, rb_per_unit: int, rbs: int) -> float:
    """What a pipeline keeps in L2 while its rings turn over once (cost.l2_residency): the
    queues' and the stages' inner rings' slots, the resident weights, and the DRAM stream of
    one ring cycle (the weights that do not stay resident stream once per row-block)."""
    g = region.graph
    c = plan.choice
    later_of = [{o for st in c.stages[j + 1:] for o in st} for j in range(len(c.stages))]
    intra, cycle = 0.0, 1
    for j, atoms in enumerate(stage_atoms):
        for a in atoms[:-1]:
            if any(x in later_of[j] for o in a for t in g.op(o).outputs for x in g.consumers(t)):
                continue        # its ring is a plan queue (already in queue_bytes)
            n, slot = _intra_slots(g, a, bm, rb_per_unit, rbs)
            intra += n * slot
            cycle = max(cycle, n)
    for d in c.depths:
        cycle = max(cycle, min(rbs, d * rb_per_unit))
    reads, writes, weights = _region_bytes(region)
    streamed = sum(w for w, r in zip(plan.stage_weights, resident) if not r) if rbs > 1 else 0.0
    stream = max(0.0, reads - weights) + writes + streamed * rbs
    return queue_bytes + intra + resident_w + ring_cycle_stream_bytes(stream, rbs, cycle)


# The runtime's items per row-block (validate/lower.py): a GEMM's output column tiles of 128 (a
# dual-B GEMM: 64, the same count as its two products' 128-column tiles), an elementwise chunk of
# 128 columns, a row op's rows of 8 // (warps per row) per item (rows of <= MAX_VPL 16-byte
# vectors per thread are held in registers). validate/lower.py keeps its own copies (MAX_VPL,
# INTRA_RING_BYTES): the GPU harness imports no pydantic-backed module; a test checks they agree
ROW_VPL_MAX = 8
INTRA_RING_BYTES = 8 * 2**20      # cap of a ring between two steps of one stage (no plan queue)
TEAM_THREADS = 256                # threads of one team (validate/lower.py THREADS)


def _row_items(bm: int, cols: int) -> int:
    for wpr in (1, 2, 4, 8):
        if -(-cols // (wpr * 256)) <= ROW_VPL_MAX:
            return -(-bm // (8 // wpr))
    return bm


@functools.lru_cache(maxsize=1 << 14)
def _atom_items(g, atom, bm: int, rbs: int) -> int:
    """The runtime's items per row-block of one fused group (validate/lower.py); memoised
    (graphs hash by identity: an entry keeps its graph, so no other takes its place)."""
    infos = [g.op(o).info for o in atom]
    out = g.tensors[g.op(atom[-1]).outputs[0]]
    cols = out.shape[-1] if out.shape else 1
    gemms = [i.gemm for i in infos if i.gemm is not None]
    if gemms:
        n = sum(math.ceil(gemm_tiles(gd.batch, gd.m, gd.n, (bm, PIPE_TILE_COLS)) / rbs) for gd in gemms)
    elif any(i.op_class is OpClass.ROW_REDUCTION for i in infos):
        n = _row_items(bm, cols)
    else:
        n = math.ceil(cols / PIPE_TILE_COLS)
    return max(1, n)


def _stage_shape(region: Region, plan: StagePlan, atoms, inflight_units: int) -> StageShape:
    g = region.graph
    c = plan.choice
    bm, rb_per_unit = runtime_block(plan)
    rbs = max(1, math.ceil(plan.stream_rows / bm))
    items, slots = [], []
    for atom in atoms:
        t = g.op(atom[-1]).outputs[0]
        items.append(_atom_items(g, atom, bm, rbs))
        slot_bytes = bm * g.stored_cols(t) * DTYPE_BYTES[g.tensors[t].dtype]
        slots.append(max(2, min(rb_per_unit, INTRA_RING_BYTES // max(1, slot_bytes))))
    look = max(1, inflight_units // max(1, plan.slabs)) * rb_per_unit
    # a GEMM step waits for its ring slot to the next step only before its epilogue (harness
    # versions 5 and 6), the first step of a stage fed by a split_k queue as well
    j = next((i for i, st in enumerate(c.stages) if atoms[0][0] in st), 0)
    late = tuple(any(g.op(o).info.gemm is not None for o in atom) for atom in atoms)
    # the stage's input ring frees a row-block's slot once the last step reading it is done with
    # it (the runtime's "done with" arrive), not when the stage's last step is (traced: dlrm's
    # fc3 -> fc4 -> fc5 stage ran 2 row-blocks per 16.5 us, 24.5 priced waiting for the last step)
    earlier = {o for st in c.stages[:j] for o in st}
    readers = [k for k, atom in enumerate(atoms)
               if any(g.producer(t) in earlier for o in atom for t in g.op(o).inputs)]
    return StageShape(tuple(items), rbs, min(rbs, look), tuple(slots), rb_per_unit, max(1, plan.slabs),
                      late, max(readers) if readers else -1, *_step_links(g, atoms))


def _step_links(g, atoms) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per step of a stage, the last earlier step whose output it reads (through views; -1:
    none) and the last later step that reads its output (-1: none). The runtime's step waits on
    the rings it reads and for the slots of those it writes, nothing else: a step that reads
    only the stage's input starts as soon as its worker is free, and one whose output leaves
    the stage never waits for a slot (nerf's sigma head beside feature_fc: that stage alone on
    33 SMs, bench/dram_probe.py lat-nerf-s3a, ran in 455 us where the chain gave 2,293). Each ()
    where it is the usual chain (every step reads the one before it)."""
    step_of = {o: k for k, atom in enumerate(atoms) for o in atom}
    K = len(atoms)
    # (the step writing the memory a tensor views, if any)
    reads = [{j for j in (step_of.get(g.producer(view_base(g, t))) for o in atom for t in g.op(o).inputs)
              if j is not None and j < k} for k, atom in enumerate(atoms)]
    after = [max(r, default=-1) for r in reads]
    reader = [max((c for c in range(K) if k in reads[c]), default=-1) for k in range(K)]
    chain = after == list(range(-1, K - 1)) and reader == list(range(1, K)) + [-1]
    return ((), ()) if chain else (tuple(after), tuple(reader))


def servers_for(t, single_t, cap: int, units: int):
    """Units a stage works on at once (its servers in the queue model), per SM count: the one
    unit's latency alone over the per-unit time at full occupancy (_stage_ratio: from the
    runtime's items per unit and its workers), to the nearest divisor of the units (a stage
    alone then takes exactly units x t) no larger than what its rings hold.
    The runtime's workers take the items of consecutive row-blocks round robin, so a stage
    whose unit fills a fraction of its workers runs that many units side by side, and the
    first unit leaves after its own latency, not after t."""
    t = np.asarray(t, dtype=float)
    ratio = np.asarray(single_t, dtype=float) / np.maximum(t, 1e-30)
    # (rounded first: a ratio halfway between two divisors must not tip either way with the
    # last bits of t, or one SM more on the chip could double a stage's servers; ties go to
    # the fewer servers)
    ratio = np.round(ratio, 9)
    divs = _divisors(int(units), int(max(1, min(cap, units))))
    k = np.argmin(np.abs(ratio.reshape(-1, 1) - divs.reshape(1, -1)), axis=1)
    return divs[k].reshape(t.shape).astype(np.int64)


def _servers_at(t: float, single_t: float, cap: int, units: int) -> int:
    """servers_for at one SM count in plain floats (the queue model asks once per stage of
    every plan it prices): the same division, rounding (np.round(x, 9) is rint(x * 1e9) / 1e9,
    and round() rounds half to even as rint does) and first nearest divisor."""
    y = single_t / max(t, 1e-30) * 1e9
    if not math.isfinite(y):
        return int(servers_for(t, single_t, cap, units))
    ratio = round(y) / 1e9
    divs = _divisors(int(units), int(max(1, min(cap, units)))).tolist()
    best, gap = divs[0], abs(ratio - divs[0])
    for d in divs[1:]:
        if abs(ratio - d) < gap:
            best, gap = d, abs(ratio - d)
    return int(best)


@functools.lru_cache(maxsize=1 << 12)
def _divisors(units: int, most: int) -> np.ndarray:
    """The divisors of `units` up to `most`, ascending (read only: shared by every caller)."""
    divs = np.array([d for d in range(1, most + 1) if units % d == 0], dtype=float)
    divs.flags.writeable = False
    return divs


def _stage_ratio(totals: dict, j: int, sms):
    """One unit's latency over the per-unit time of stage j (scalar or per SM count), or None
    for a stage of one server. A split_k consumer's unit latency is the runtime's item: one
    output tile over its K range (runtime_ksplit), slabs / ksplit units of one tile's work,
    while the stage's workers share every unit: ratio = slabs x workers / (ksplit x row-blocks
    per unit x tiles per row-block)."""
    w1, cap = totals["stage_single_works"][j], totals["stage_inflight"][j]
    writer = (totals.get("stage_slab_writer") or [None] * (j + 1))[j]
    if w1 is None and writer and cap > 1:
        # a several-step stage writing a split_k queue: when its last step's items of a row-block
        # fit its workers at once, the row-block's slabs are finished together, not one after
        # another (traced: dlrm's fc1 + fc2 on 68 SMs wrote both K slabs of its 2048-row block
        # at 52-53 us; the model had the first one at half that): `slabs` units per latency
        W = TEAMS_PER_SM * np.asarray(sms, dtype=float)
        out = np.where(writer <= W, float(cap), 1.0)
        return out if np.ndim(sms) else float(out)
    if w1 is None or cap <= 1:
        return None
    sk = totals["stage_splitk"][j]
    if sk is None:
        # a unit's items fill items / workers of the stage: that many units run side by side.
        # From the item structure only, not the rates: a faster GPU then never gets more
        # servers (a longer first unit) for the same plan (cost-property test: doubled HBM
        # bandwidth made a fixed pipeline 2% slower when the ratio of times was used)
        W = TEAMS_PER_SM * np.asarray(sms, dtype=float)
        out = np.maximum(1.0, W / max(1, w1.tiles))
        return out if np.ndim(sms) else float(out)
    out = []
    for s in np.atleast_1d(np.asarray(sms)):
        W = TEAMS_PER_SM * int(s)
        ks = runtime_ksplit(sk["n_tiles"], W, sk["k"], sk["slab_w"], sk["ws_per_split"])
        out.append(sk["slabs"] * W / (ks * sk["rb_per_unit"] * sk["n_tiles"]))
    return np.array(out) if np.ndim(sms) else out[0]


def _unit_latency(works, totals: dict, j: int, spec: HwSpec, sms, t):
    """One unit's latency through stage j (scalar or per SM count `sms`, per-unit times t), or
    None for a stage of one server: _stage_ratio's, or a several-step stage's first unit alone
    through all its steps (stage_sim.stage_unit_latency: dlrm's fc3 -> fc4 -> fc5 stage took
    48 us for a row-block it worked on for 8.3 us of period)."""
    cap = totals["stage_inflight"][j]
    ratio = _stage_ratio(totals, j, sms)
    if ratio is not None:
        return ratio * t
    shape = totals["stage_shapes"][j]
    if shape is None or cap <= 1:
        return None
    return stage_unit_latency(list(works[j]), spec, sms, shape)


def stage_servers(totals: dict, sms, t, units: int, works, spec: HwSpec) -> np.ndarray:
    """servers_for of every stage at its SM count (sms: one per stage; t: per-unit times)."""
    out = np.ones(len(t), dtype=np.int64)
    for j, cap in enumerate(totals["stage_inflight"]):
        lat = _unit_latency(works, totals, j, spec, sms[j], t[j])
        if lat is not None:
            out[j] = _servers_at(float(t[j]), float(lat), cap, units)
    return out


# The runtime's K split of a split_k consumer (validate/lower.py _choose_ksplit, which keeps its
# own copy: the GPU harness imports no pydantic-backed module; a test checks they agree)
KSPLIT_MIN_RANGE = 1024
KSPLIT_WS_BYTES = 24 * 2**20


@functools.lru_cache(maxsize=1 << 14)
def runtime_ksplit(n_tiles: int, workers: int, k: int, slab_w: int, ws_per_split: int) -> int:
    """K ranges per output tile the runtime gives a split_k consumer GEMM of n_tiles column
    tiles per row-block on `workers` workers (K fed in slabs of slab_w columns)."""
    nslabs = -(-k // slab_w)
    best, best_t = 1, float(-(-n_tiles // workers))
    s_max = max(1, min(32, nslabs, KSPLIT_WS_BYTES // max(1, ws_per_split)))
    for s in range(2, s_max + 1):
        per = -(-nslabs // s)
        if per * slab_w < KSPLIT_MIN_RANGE:
            break
        s_eff = -(-nslabs // per)
        t = -(-(n_tiles * s_eff) // workers) * per / nslabs
        if t < 0.9 * best_t:
            best, best_t = s_eff, t
    return best


def _splitk_info(region: Region, plan: StagePlan, j: int, atom, bm: int, rbs: int) -> dict:
    """What runtime_ksplit needs of stage j's split_k consumer GEMM (validate/lower.py's view:
    the producer publishes slabs of its output tile width, 64 columns for a dual GEMM)."""
    g = region.graph
    c = plan.choice
    gemms = [g.op(o) for o in atom if g.op(o).info.gemm is not None]
    a = gemms[0].inputs[0]
    nb = sum(1 for op in gemms if op.inputs[0] == a)
    src = g.producer(a)
    src_atom_gemms = [o for o in c.stages[j - 1] if g.op(o).info.gemm is not None
                      and g.op(o).inputs[0] == g.op(src).inputs[0]] if src else []
    slab_w = 64 if len(src_atom_gemms) == 2 else PIPE_TILE_COLS
    gd = gemms[0].info.gemm
    rb_per_unit = runtime_block(plan)[1]
    nslots = min(c.depths[j - 1] * rb_per_unit, rbs)
    return {"n_tiles": _atom_items(g, atom, bm, rbs), "k": gd.k, "slab_w": slab_w,
            "ws_per_split": nslots * nb * bm * gd.n * 4, "slabs": plan.slabs,
            "rb_per_unit": rb_per_unit, "rbs": rbs, "partial_rb_bytes": nb * bm * gd.n * 4}


def pipeline(region: Region, spec: HwSpec, choice: PipelineChoice) -> Estimate:
    plan = plan_stages(region, spec, choice)
    c = plan.choice
    works, totals = stage_works(region, spec, plan)
    units = plan.row_blocks * plan.slabs
    load = chip_load(works, plan, spec)
    t, srv, sim, bw_bound = _time_stages(_with_load(works, load) if load >= 0 else works,
                                         totals, plan, spec, units)
    latency = max(sim.makespan_s, bw_bound) + spec.persistent_launch_cost_s
    busy = float(sum(t[j] * units * c.sms[j] for j in range(len(t))))
    return Estimate(
        latency_s=latency, dram_read_bytes=totals["dram_read_bytes"],
        dram_write_bytes=totals["dram_write_bytes"],
        dram_deferred_write_bytes=totals["dram_deferred_write_bytes"],
        l2_bytes=min(totals["queue_bytes"], spec.l2_usable_bytes), kernel_launches=1,
        sm_busy_fraction=min(1.0, busy / (latency * spec.sm_count)), flops=region.flops,
        breakdown={"strategy": "pipeline", "stages": [list(s) for s in c.stages],
                   "sms": list(c.sms), "tile_rows": c.tile_rows, "depths": list(c.depths),
                   "modes": list(c.modes), "row_blocks": plan.row_blocks, "slabs": plan.slabs,
                   "chip_load": load,
                   "stage_tile_s": t.tolist(), "stage_servers": srv.tolist(),
                   "makespan_s": sim.makespan_s,
                   "dram_bound_s": bw_bound, "fill_s": sim.fill_s, "drain_s": sim.drain_s,
                   "period_s": sim.period_s, "bottleneck_stage": sim.bottleneck_stage,
                   "stall_s": sim.stall_s.tolist(),
                   # after the first worker's start (what the harness measures per stage)
                   "stage_end_s": (sim.stage_ends_s + spec.persistent_ramp_s).tolist(),
                   "queue_mean_occupancy": sim.mean_occupancy.tolist(),
                   "queue_max_occupancy": sim.max_occupancy.tolist(),
                   "slot_bytes": list(plan.slot_bytes),
                   "queue_tensors": [list(q) for q in plan.queue_tensors],
                   **{k: v for k, v in totals.items() if k not in ("dram_read_bytes", "dram_write_bytes",
                                                                   "dram_deferred_write_bytes",
                                                                   "dram_timed_bytes")}},
    ).check()


def splitk_unit_time(works_j, sk: dict, spec: HwSpec, sms):
    """Per unit, a one-step split_k consumer's time (scalar or per SM count) as the runtime
    splits it: each output tile's K in runtime_ksplit ranges, one item each (a whole tile's
    fixed cost, a poll per slab of its range), not in the queue's slabs. Its work for the units
    it holds at once has n_tiles x ksplit / slabs items per unit (measured: a 2048-K consumer
    split 2 ways on 66 SMs ran 4.4 us a row-block, where 4 slab-tiles a unit priced 2.0)."""
    (w,) = works_j
    s_arr = np.atleast_1d(np.asarray(sms, dtype=float))
    out = np.empty(s_arr.shape)
    ks_of = np.array([runtime_ksplit(sk["n_tiles"], TEAMS_PER_SM * int(x), sk["k"], sk["slab_w"],
                                     sk["ws_per_split"]) for x in s_arr])
    for ks in np.unique(ks_of):
        idx = ks_of == ks
        item = w.but(tiles=max(1, math.ceil(w.tiles * int(ks) / sk["slabs"])), split_k=1,
                     slab_polls=sk["k"] / (sk["slab_w"] * int(ks)))
        out[idx] = kernel_time(item, spec, s_arr[idx]) / w.inflight
    return out if np.ndim(sms) else float(out[0])


def _stage_time(works_j, shape, sk, spec: HwSpec, sms):
    """Per-unit time of one stage (scalar or per SM count): a split_k consumer's by the
    runtime's K ranges, any other's by stage_sim."""
    return splitk_unit_time(works_j, sk, spec, sms) if sk else stage_unit_time(works_j, spec, sms, shape)


def _paced_by_rates(core: _StageWorks, plan: StagePlan, spec: HwSpec, sms):
    """(works, free row-blocks of the first stage or None): the first stage's row-blocks run in
    lock-step (cost.l2_residency.first_stage_free_row_blocks) from its rate against the slowest
    stage after it at these SM counts, each stage timed without its weight re-reads (what it
    can do, not what the pacing makes of it)."""
    J = len(core.works)
    w0 = next((w for w in core.works[0] if w.weight_pass_bytes), None) if J > 1 else None
    # (the works' own free_rbs is the rule's other answer: nothing to time where it already
    # covers every row-block, nothing to rebuild where the rule gives it)
    if w0 is None or w0.free_rbs >= core.row_blocks:
        return core.works, None
    bare = [[w.but(weight_pass_bytes=0.0) if w.weight_pass_bytes else w for w in ws] for ws in core.works]
    t = _unit_times(bare, {"stage_shapes": core.shapes, "stage_splitk": core.splitk}, sms, spec)
    at_once = min(max(max(1, w0.ctas_per_sm) * float(sms[0]) / max(1, w0.items_per_rb), 1.0),
                  max(1.0, min(float(core.row_blocks), w0.rbs_at_once_max)))
    free = first_stage_free_row_blocks(core.row_blocks, plan.choice.depths[0] * runtime_block(plan)[1],
                                       float(t[0] / max(t[1:])), at_once)
    if free == w0.free_rbs:
        return core.works, None
    return tuple(tuple(w.but(free_rbs=free) if w.weight_pass_bytes else w for w in ws) if j == 0 else ws
                 for j, ws in enumerate(core.works)), free


def _unit_times(works, totals: dict, sms, spec: HwSpec):
    """Per-unit time of every stage at its SM count."""
    return np.array([_stage_time(w, sh, sk, spec, s)
                     for w, s, sh, sk in zip(works, sms, totals["stage_shapes"], totals["stage_splitk"])])


def _time_stages(works, totals: dict, plan: StagePlan, spec: HwSpec, units: int):
    """Per-unit stage times, servers, the tandem-queue simulation and the DRAM bound."""
    c = plan.choice
    t = _unit_times(works, totals, c.sms, spec)
    srv = stage_servers(totals, c.sms, t, units, works, spec)
    depths = tuple(d * plan.slabs for d in c.depths)
    sim = _tandem(t, srv, units, depths, plan.slabs, spec)
    bw_bound = _bw_floor(works, totals, spec, sum(c.sms), units)
    # weight-streaming stages fed slab by slab: their DRAM share, not the slabs' tandem, sets
    # when they end (earlier or later than the tandem)
    flow = _weight_stream_flow(works, plan, spec, t * units)
    if flow is not None:
        bw_bound = max(bw_bound, flow)
    if flow is not None or bw_bound > sim.makespan_s:
        # the stages share one DRAM: when together they ask for more than the chip delivers,
        # every stage slows by the same factor (keeps the per-tile timeline consistent)
        t = t * (bw_bound / sim.makespan_s)
        sim = _tandem(t, srv, units, depths, plan.slabs, spec)
    return t, srv, sim, bw_bound


def _weight_stream_flow(works, plan: StagePlan, spec: HwSpec, alone_s) -> float | None:
    """When the last of a slab-fed pipeline's weight-streaming stages ends (None where the model
    does not apply: no spec rate, several row-blocks, a row-mode queue, a stage without DRAM
    bytes, stages that together stream no faster than the chip gives them). One row-block
    streamed through split_k queues (decode): every stage streams its
    weights at once, each alone at its bytes over its time on its SMs. While a later stage
    streams beside it, a stage keeps efficiency.producer_stream_share of its rate, upstream
    first, of concurrent_stream_Bps in all; the last one streaming keeps its own rate. Measured
    (bench/dram_probe.py ws-*, 64 x 8192 x 32768 at four SM splits): the producer ends at
    0.8-0.98 of its alone rate, the consumer streams what is left and then alone: 578-788 us
    where the slabs' tandem said 647-941."""
    rate = spec.concurrent_stream_Bps
    c = plan.choice
    if (rate is None or len(works) < 2 or plan.row_blocks != 1
            or any(m != "split_k" for m in c.modes)):
        return None
    need = np.array([sum(w.dram_bytes for w in stage) for stage in works], dtype=float)
    alone = np.asarray(alone_s, dtype=float)
    if (need <= 0).any() or (alone <= 0).any():
        return None
    own = need / alone
    if own.sum() <= rate:       # they do not compete for DRAM: the slabs' tandem holds
        return None
    share = spec.efficiency.producer_stream_share
    left, clock, active = need.copy(), 0.0, list(range(len(works)))
    ends = np.zeros(len(works))
    while active:
        x = np.zeros(len(works))
        room = rate if len(active) > 1 else math.inf
        for k, j in enumerate(active):
            want = own[j] * (share if k < len(active) - 1 else 1.0)
            x[j] = max(0.0, min(want, room))
            room -= x[j]
        dt = min(left[j] / x[j] for j in active if x[j] > 0)
        clock += dt
        for j in list(active):
            left[j] -= x[j] * dt
            if left[j] <= 1e-9 * need[j]:
                ends[j] = clock
                active.remove(j)
    return float(np.maximum.accumulate(ends)[-1])     # no stage ends before its producer


def _bw_floor(works, totals: dict, spec: HwSpec, used: int, units: int) -> float:
    """The stages share one DRAM: the region's bytes at the bandwidth its SMs reach, and every
    step's stream floor (_stream_floor)."""
    dram = totals["dram_timed_bytes"]
    if np.ndim(used):       # the solver's floor steps at once (one kernel_time per step)
        u = np.asarray(used, dtype=float)
        return np.maximum(dram / spec.hbm_bandwidth_from(u), _stream_floor(works, spec, u, units)).tolist()
    return max(dram / spec.hbm_bandwidth_from(used), _stream_floor(works, spec, used, units))


def dram_floor_s(region: Region, spec: HwSpec, plan: StagePlan, used) -> float | list[float]:
    """The pipeline's DRAM floor on `used` SMs in all, or on each of a list of totals (what
    cost.pipeline stretches its stage times to; the solver's floor reads it, never its own
    arithmetic)."""
    works, totals = _works_at_plan_load(region, spec, plan)
    units = plan.row_blocks * plan.slabs
    return _bw_floor(works, totals, spec, used, units)


def _works_at_plan_load(region: Region, spec: HwSpec, plan: StagePlan):
    """stage_works at the chip load the plan's own SM split gives (the search's tables and
    floor take it from the plan they probe; cost.pipeline takes it from the plan it prices)."""
    works, totals = stage_works(region, spec, plan)
    load = chip_load(works, plan, spec)
    return (_with_load(works, load) if load >= 0 else works), totals


def prefetch_stage_schedules(spec: HwSpec, plans) -> None:
    """Replay the worker schedules of the several-step stages of these (region, plan) pairs
    side by side (stage_sim.prefetch_schedules), as stage_tables and pipeline() will ask for
    them (stage works at the plan's own chip load): the search prices hundreds of plans of one
    window, and their replays together cost a fraction of one by one. Changes no number."""
    stages = []
    for region, plan in plans:
        try:
            works, totals = _works_at_plan_load(region, spec, plan)
        except InfeasibleError:     # its pricing will say so
            continue
        stages += [(w, sh) for w, sh in zip(works, totals["stage_shapes"]) if sh is not None]
    prefetch_schedules(stages, spec)


def _load_matters(works, spec: HwSpec) -> bool:
    """Some step's cost depends on the chip's load: a GEMM tile's fixed cost (when the spec
    tells a quiet chip's apart) or a row op's stream (when the spec slows it with the load)."""
    gemm = spec.gemm_tile_fixed_idle_s is not None
    row = spec.persistent_row_load_slowdown > 0
    return (gemm or row) and any(w.persistent and ((gemm and w.tile_shape) or (row and w.row_op)) for stage in works for w in stage)


def _with_load(works, load: float):
    return [[w.but(chip_load=load) if w.persistent and (w.tile_shape or w.row_op) else w for w in stage]
            for stage in works]


def chip_load(works, plan: StagePlan, spec: HwSpec) -> float:
    """How loaded the chip's memory system is while a multi-stage pipeline runs: the share of
    the chip's SMs its GEMM stages hold (their tiles' operand loads are most of its L2
    traffic, at a rate their SMs set). A GEMM tile's fixed cost (gemm_tile_fixed_idle_s) and a
    row op's stream (persistent_row_load_slowdown) depend on it. -1: a one-stage pipeline or
    no load-dependent cost (the stage's own SMs stand for it)."""
    if len(works) < 2 or not _load_matters(works, spec):
        return -1.0
    gemm_sms = sum(s for s, stage in zip(plan.choice.sms, works) if any(w.tile_shape for w in stage))
    return min(1.0, gemm_sms / spec.sm_count)


def _stream_floor(works, spec: HwSpec, used: int, units: int) -> float:
    """The stages share one DRAM: a memory-bound step streams its bytes no faster than the
    same step over all the stages' work would on all the pipeline's SMs (measured: gpt3 t64's
    two weight-streaming GEMMs on 74 + 58 SMs took 1,159 us, 2.1 TB/s, where one GEMM alone
    streams at 2.2 TB/s on 66 or 132 SMs), and so does a step its tiles' operand loads from L2
    bound (roofline._operand_feed_s); every step at least its bytes at the chip's streaming
    bandwidth."""
    if np.ndim(used) == 0:      # memoised: plans of the same stages at other SM splits ask again
        memo = table(spec, "stream_floor")
        key = (tuple(tuple(stage) for stage in works), used, units)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _stream_floor_of(works, spec, used, units)
        return hit
    return _stream_floor_of(works, spec, used, units)


def _stream_floor_of(works, spec: HwSpec, used, units: int):
    floor = 0.0 if np.ndim(used) == 0 else np.zeros(len(used))
    bw = spec.hbm_bandwidth_from(used if np.ndim(used) == 0 else np.asarray(used, dtype=float))
    for stage in works:
        for w in stage:
            if not w.dram_bytes:
                continue
            f = units / max(1, w.inflight)
            whole = w.scaled(f, tiles=max(1, math.ceil(w.tiles * f)))
            if w.split_k > 1:
                # a step fed slab by slab: its slabs follow one another on each output tile, so
                # the tiles of all units at once are its items (and the SMs that stream): gpt3
                # t64's fc2 (96 tiles, 16 slabs) streams as a 96-tile GEMM (582 us alone on 132
                # SMs), not as 1,536 tiles (512 us modelled)
                whole = whole.but(tiles=max(1, math.ceil(whole.tiles / w.split_k)), split_k=1)
            lat = kernel_time(whole, spec, used if np.ndim(used) == 0 else np.asarray(used, dtype=float))
            # its time on all the SMs (the stages share the DRAM and the L2 operand feed; the
            # math of a step scales with its SMs at best), never less than its bytes at the
            # chip's streaming bandwidth. (Counting a step's whole time only when it is memory
            # bound made the floor jump: a property test found twice the FLOP/s 5% slower)
            floor = floor + np.maximum(lat, whole.dram_bytes / bw)
    return float(floor) if np.ndim(floor) == 0 else floor


TANDEM_UNITS_MAX = 1024       # units of a multi-server tandem replay beyond which it is extrapolated


def _tandem(t: np.ndarray, servers: np.ndarray, units: int, depths: tuple[int, ...], slabs: int,
            spec: HwSpec):
    """queues.simulate of `units` equal units per stage (per-unit times t; a stage of c servers
    takes c * t per unit; slots freed a row-block of `slabs` units at a time), memoised: plans
    of different cuts or tiles often end up with the same stage times (read only)."""
    key = (t.tobytes(), servers.tobytes(), units, depths, slabs)
    memo = table(spec, "tandem")
    hit = memo.get(key)
    if hit is None:
        lat = t * servers
        n = units
        if (servers > 1).any() and units > TANDEM_UNITS_MAX:
            # equal units settle into a periodic schedule: replay a whole number of server
            # rounds and release groups, extrapolate the rest (the multi-server recurrence is
            # evaluated unit by unit when its sweeps do not settle: thousands of units cost
            # tens of ms, every candidate split of a long model)
            step = math.lcm(*(int(x) for x in servers), max(1, slabs))
            n = max(2 * step, TANDEM_UNITS_MAX // step * step)
        sim = simulate(np.repeat(lat[:, None], min(n, units), axis=1), list(depths),
                       spec.ring_handoff_cost_s, servers=servers, group=[slabs] * len(depths))
        hit = memo[key] = sim if n >= units else _extrapolated(sim, lat, servers, units)
    return hit


def _extrapolated(sim, lat: np.ndarray, servers: np.ndarray, units: int):
    """A tandem replay of its first units carried to `units`: each stage's departures go on at
    the period of the replay's second half (never faster than its own units' work)."""
    from kitsune_dse.cost.queues import QueueResult
    D = sim.departures
    n = D.shape[1]
    half = n // 2
    period = np.maximum((D[:, -1] - D[:, half - 1]) / (n - half), lat / servers)
    last = D[:, -1] + (units - n) * period
    makespan = float(last[-1])
    busy = lat * units / servers
    stall = np.maximum((last - sim.starts[:, 0]) - busy, 0.0)
    return QueueResult(D, sim.starts, makespan, sim.fill_s, float(makespan - last[0]), float(period[-1]),
                       int(np.argmax(busy)), stall, sim.mean_occupancy, sim.max_occupancy, last)


def stage_time_table(region: Region, spec: HwSpec, plan: StagePlan) -> np.ndarray:
    """[stages, sm_count + 1] per-unit time of each stage for every SM count (column 0 = inf);
    the SM count of the plan's choice is ignored. Used by the search to balance stages."""
    return stage_tables(region, spec, plan)[0]


def stage_tables(region: Region, spec: HwSpec, plan: StagePlan):
    """stage_time_table, the servers of every stage at every SM count ([stages, sm_count + 1],
    column 0 = 1) and the stage_works totals."""
    S = spec.sm_count
    axis = np.arange(1, S + 1)
    works, totals = _works_at_plan_load(region, spec, plan)
    core = _stage_works_core(region, spec, plan)
    tab = np.empty((len(works), S + 1))
    tab[:, 0] = np.inf
    solo_priced = spec.efficiency.persistent_solo_team is not None
    for j, (w, sh, sk) in enumerate(zip(works, totals["stage_shapes"], totals["stage_splitk"])):
        tab[j, 1:] = _stage_time(_teams_of(w, False), sh, sk, spec, axis)
        if plan.choice.teams is not None:       # the plan names the count
            fits = np.full(S, plan.choice.teams == 1)
        else:
            fits = solo_stage_fits(core, j, axis) if solo_priced else np.zeros(S, dtype=bool)
        if fits.any():
            # each stage by its own SM count: exact where every stage allows one team (the
            # allocations that matter: the rule is all stages' at once, cost.pipeline re-times)
            tab[j, 1:][fits] = _stage_time(_teams_of(w, True), sh, sk, spec, axis[fits])
    srv = np.ones((len(works), S + 1), dtype=np.int64)
    units = plan.row_blocks * plan.slabs
    for j, cap in enumerate(totals["stage_inflight"]):
        lat = _unit_latency(works, totals, j, spec, axis, tab[j, 1:])
        if lat is not None:
            srv[j, 1:] = servers_for(tab[j, 1:], lat, cap, units)
    return tab, srv, totals
