"""Tile-level hand-offs between the standalone kernels of a tilesync or concurrent region
(pure Python: the C lines the generated kernels add; no CuPy).

The kernels are launched back to back with programmatic dependent launch (PDL): every CTA
executes `griddepcontrol.launch_dependents` first, so the next kernel's CTAs may start once all
of this kernel's CTAs are resident, on the SMs its last wave leaves idle. No CTA ever waits on a
CTA that is not resident, so the scheme cannot deadlock. Dependencies are kept by counters in a
global flag buffer instead of kernel boundaries:

- each kernel counts its finished tiles per *unit* (a GEMM row-block of BM rows, a row kernel's
  CTA of rows, an element-wise CTA's rows), plus one count for the whole kernel;
- a consumer tile waits (each thread on one unit's counter), before it reads anything, for the
  units covering the rows it reads of a row-aligned input (a GEMM's A, an epilogue or
  element-wise operand: tilesync, cuSync's row
  policy), and for the whole producer where rows do not line up (a batched GEMM's B, a vector)
  or where the strategy is `concurrent` (independent kernels of a level overlap; a dependent
  level waits for its producers to finish).

Buffer: words 0..7 are the error record written by `spin_geq` (queue.cuh) on a timeout; then,
per group, its unit counters and its whole-kernel counter; then split-K arrival counters.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kitsune_dse.validate.lower import Group, row_cfg

SYNC_BUF = "__tilesync_flags"
HEADER_WORDS = 8
ERR_WAIT = 4                 # error code of a timed-out hand-off (queue.cuh's codes are 1..3)


def ew_rows_per_cta(cols: int) -> int:
    """Rows an element-wise kernel's CTA covers in tilesync mode: whole rows, about 8 vectors
    per thread (a hand-off per few hundred bytes would cost more than the work)."""
    nv = max(1, cols // 8)
    return max(1, 2048 // nv)


@dataclass
class GroupSync:
    name: str
    unit_rows: int                   # rows per counted unit
    units: int
    per_unit: int                    # finished tiles that complete a unit
    off: int                         # first unit counter
    done: int                        # whole-kernel counter
    total: int                       # finished tiles that complete the kernel
    arrive: int = -1                 # split-K arrival counters (one per output tile), or -1
    waits: list = field(default_factory=list)   # [(producer GroupSync, "rows" | "all", tensor)]
    cg_mask: int = 0                 # full inputs written during the launch (read through L2)
    index: int = 0                   # launch position
    count_units: bool = False        # a consumer waits for rows of this kernel
    count_done: bool = False         # a consumer waits for all of this kernel
    ctas: int = 0                    # the kernel's grid
    trace_base: int = -1             # first CTA record of a traced run (diagnostics), or -1


@dataclass
class SyncPlan:
    strategy: str
    groups: dict
    words: int
    timeout_ns: int
    trace_off: int = -1              # u32 word of the first trace record (8-byte aligned), or -1

    TRACE_WORDS = 12                 # per CTA: u64 start, inputs ready, end, SM id, and the
                                     # SM's clock64 at start and end (its clock rate over the CTA)

    @property
    def buf(self) -> str:
        return SYNC_BUF

    def describe(self, what: int) -> str:
        """The wait a timeout record names (what = launch position * 64 + wait index)."""
        gs = next((g for g in self.groups.values() if g.index == what // 64), None)
        if gs is None or what % 64 >= len(gs.waits):
            return f"wait code {what}"
        p, how, t = gs.waits[what % 64]
        return (f"kernel {gs.name} waiting for {'rows of ' if how == 'rows' else 'all of '}{t} "
                f"from kernel {p.name}")

    def start(self, grp: Group, bufs_idx: int, r0: str, r1: str) -> list[str]:
        """Kernel prologue: release the next kernel's launch, then wait for the inputs' rows."""
        gs = self.groups[grp.name]
        out = ["    kdse_launch_dependents();"]
        if self.trace_off >= 0:
            out += ["    const u64 kdse_t0 = globaltimer();",
                    "    const long long kdse_c0 = clock64();"]
        if not gs.waits:
            return out + (["    const u64 kdse_t1 = kdse_t0;"] if self.trace_off >= 0 else [])
        out += [f"    u32* const sync = (u32*)bufs[{bufs_idx}];"]
        for j, (p, how, t) in enumerate(gs.waits):
            if how == "rows":   # every thread: one unit each, so the units' waits overlap
                out.append(f"    tilesync_wait_rows(sync, {p.off}, {p.unit_rows}, {p.per_unit}, {r0}, {r1}, "
                           f"{self.timeout_ns}ull, {gs.index * 64 + j});   // {t} from {p.name}")
            else:
                out.append(f"    if (threadIdx.x == 0) tilesync_wait_all(sync, {p.done}, {p.total}, "
                           f"{self.timeout_ns}ull, {gs.index * 64 + j});   // {t} from {p.name}")
        out += ["    __syncthreads();"]
        if self.trace_off >= 0:
            out += ["    const u64 kdse_t1 = globaltimer();"]
        return out

    def signal(self, grp: Group, bufs_idx: int, unit: str) -> list[str]:
        """Count the finished tile where a consumer waits for it (nothing otherwise); a traced
        run also records the CTA's start, inputs-ready and end times, its SM and its SM clock."""
        gs = self.groups[grp.name]
        out = []
        if gs.count_units or gs.count_done:
            unit_word = f"{gs.off} + ({unit})" if gs.count_units else "-1"
            done_word = str(gs.done) if gs.count_done else "-1"
            out.append(f"    tilesync_signal((u32*)bufs[{bufs_idx}], {unit_word}, {done_word});")
        if self.trace_off >= 0:
            out += ["    __syncthreads();",
                    "    if (threadIdx.x == 0) {",
                    f"        u64* tr = (u64*)((u32*)bufs[{bufs_idx}] + {self.trace_off}) + "
                    f"{self.TRACE_WORDS // 2} * ({gs.trace_base} + blockIdx.x);",
                    "        u32 smid; asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));",
                    "        tr[0] = kdse_t0; tr[1] = kdse_t1; tr[2] = globaltimer(); tr[3] = smid;",
                    "        tr[4] = (u64)kdse_c0; tr[5] = (u64)clock64();",
                    "    }"]
        return out


def _tiles(grp: Group, tile: dict) -> tuple[int, int]:
    """(row-blocks, column tiles) of a GEMM group under the tile the kernel uses."""
    return -(-grp.rows // tile["bm"]), -(-grp.cols // tile["bn"])


def plan_sync(groups: list[Group], strategy: str, tiles: dict, timeout_ns: int,
              probe: str = "", trace: bool = False) -> SyncPlan:
    """Counters and waits for `groups` (launch order). tiles: group name -> GEMM tile dict.
    probe (calibration): "signal": every kernel counts its tiles (a producer's per-tile cost);
    "both": it also waits for the rows of an always-complete counter before each tile (plus a
    consumer's). trace (diagnostics): every CTA records when it started, when its inputs were
    ready and when it ended, its SM and its clock64 at start and end (`SyncPlan.TRACE_WORDS` words
    each, after the counters)."""
    by_name: dict[str, GroupSync] = {}
    writer: dict[str, GroupSync] = {}
    word = HEADER_WORDS
    for grp in groups:
        if grp.kind == "gemm":
            n_rb, n_ct = _tiles(grp, tiles[grp.name])
            unit_rows, units, per_unit = tiles[grp.name]["bm"], n_rb, n_ct
        elif grp.kind == "row":
            rpc = 8 // row_cfg(grp.cols)[0]
            unit_rows, units, per_unit = rpc, -(-grp.rows // rpc), 1
        else:
            r = ew_rows_per_cta(grp.cols)
            unit_rows, units, per_unit = r, -(-grp.rows // r), 1
        gs = GroupSync(grp.name, unit_rows, units, per_unit, off=word, done=word + units,
                       total=units * per_unit, index=len(by_name))
        word += units + 1
        gs.ctas = gs.total * (tiles[grp.name]["splits"] if grp.kind == "gemm" else 1)
        if grp.kind == "gemm" and tiles[grp.name]["splits"] > 1:
            gs.arrive = word       # n_rb x n_ct from the unit counts above
            word += n_rb * n_ct
        row_aligned = ([grp.a] if grp.a else []) + grp.full_inputs()
        for t in grp.reads():
            p = writer.get(t)
            if p is None:
                continue
            how = "rows" if strategy == "tilesync" and t in row_aligned else "all"
            if all(w[0] is not p or w[1] != how for w in gs.waits):
                gs.waits.append((p, how, t))
                p.count_units |= how == "rows"
                p.count_done |= how == "all"
        if probe == "both":
            dummy = GroupSync("probe", unit_rows, units, 0, off=gs.off, done=gs.done, total=0, index=-1)
            gs.waits.append((dummy, "rows", "probe"))
        if probe:
            gs.count_units = True
        full = grp.full_inputs()
        gs.cg_mask = sum(1 << i for i, t in enumerate(full) if t in writer)
        for t in grp.stores:
            writer[t] = gs
        by_name[grp.name] = gs
    trace_off = -1
    if trace:
        trace_off = (word + 1) // 2 * 2
        ctas = 0
        for gs in by_name.values():
            gs.trace_base, ctas = ctas, ctas + gs.ctas
        word = trace_off + ctas * SyncPlan.TRACE_WORDS
    return SyncPlan(strategy, by_name, word, timeout_ns, trace_off)


CUDA_HELPERS = r"""
// ---- tilesync / concurrent hand-offs (validate/tilesync.py) ----
KDSE_INLINE void kdse_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// every thread: wait for units [r0 / unit_rows, ceil(r1 / unit_rows)) of a producer to be
// complete, thread i for unit u0 + i (+ k blockDim): a 128-row GEMM tile fed by a row kernel
// of 8-row CTAs waits on 16 counters, whose acquire loads one thread made one after the other
// (+30 us on a 4096^3 GEMM fed by a LayerNorm, bench/tilesync_probe.py); the caller's
// __syncthreads then orders every thread after all of them
KDSE_INLINE void tilesync_wait_rows(u32* sync, int off, int unit_rows, u32 per_unit, int r0, int r1,
                                    u64 timeout_ns, u32 what) {
    for (int u = r0 / unit_rows + (int)threadIdx.x; u < (r1 + unit_rows - 1) / unit_rows; u += (int)blockDim.x)
        if (!spin_geq(sync + off + u, per_unit, sync, timeout_ns, 4u, what, (u32)u, blockIdx.x)) return;
}
KDSE_INLINE void tilesync_wait_all(u32* sync, int done, u32 total, u64 timeout_ns, u32 what) {
    spin_geq(sync + done, total, sync, timeout_ns, 4u, what, 0xffffffffu, blockIdx.x);
}
// every thread: the CTA's stores precede thread 0's release (bar.sync orders them before it and
// a gpu-scope release is cumulative: CUTLASS's barrier arrive does the same), then thread 0
// counts the tile; a word < 0 is not counted
KDSE_INLINE void tilesync_signal(u32* sync, int unit_word, int done_word) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if (unit_word >= 0) red_release_add(sync + unit_word, 1u);
        if (done_word >= 0) red_release_add(sync + done_word, 1u);
    }
}
"""
