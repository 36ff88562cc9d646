"""Validation harness: run a plan (kitsune-dse/plan/v1) and its baselines on a real GPU with
CuPy-compiled CUDA C, check every output, and compare measured with predicted latency and DRAM
traffic. CuPy is imported lazily (inside functions): importing this package needs no GPU.

Modules
  plan.py       read and check a plan; refuse a plan for another SM count/arch unless retargeted
                (`--retarget` scales every stage's SMs proportionally, sum <= device SMs)
  lower.py      a region -> fusion groups (gemm / row / ew, see below) and, for a pipeline, its
                layout: steps, stages, ring queues, work items, control-block offsets
  codegen.py    CUDA C source from groups and layouts (pure Python; CI tests read it)
  kernels/      the tile functions as package data: gemm.cuh (tensor-core GEMM tile), rowops.cuh
                (layernorm / rmsnorm / softmax rows, elementwise tiles), queue.cuh (ring-queue
                synchronisation), common.cuh (types, 16-byte memory access, PTX wrappers)
  runtime.py    compile (NVRTC via cupy.RawModule, or a cubin precompiled by bench/precompile.py),
                allocate, launch the variants
  reference.py  fp32 reference on the GPU, error metrics, random inputs
  measure.py    CUDA-event timing, L2 flush
  harness.py    validate_plan(): all regions x variants -> rows -> validation.csv + rich table
  e2e.py        validate_plans_e2e(): plans' regions back to back (end-to-end time), over several
                placements of their tensors, the alternatives of one model taking turns
  ncu.py        DRAM bytes per variant with Nsight Compute in range-replay mode (--ncu)
  microbench.py the tile kernels alone: GEMM TFLOP/s against cuBLAS, GB/s of the others
  cli_cmds.py   `kitsune-dse validate PLAN.json [--out DIR] [--runs N] [--retarget] [--ncu]`
                (also `python -m kitsune_dse.validate PLAN.json ...` without the rest of the CLI)

Tile functions (one set, used by the standalone kernels AND by the persistent kernel)
  gemm_tile     C[BM x BN] = A[BM x K] @ B[K x BN], fp16/bf16 in, fp32 accumulate: mma.sync
                m16n8k16, ldmatrix (.trans for the row-major B), a 3-4 stage cp.async.cg
                shared-memory pipeline, 8 warps (2 x 4); NB = 2 computes two products sharing A
                (SwiGLU gate/up). The epilogue stages fp32 accumulators through shared memory and
                applies a generated functor on 8-column vectors (bias, activation, residual, ...)
                with 16-byte loads and stores. K ranges: split-K with fp32 partials + a reduce.
  row_tile      one row by WPR warps (1-8, so that a row stays in registers: <= 8 vectors of 8
                per thread), statistics by warp shuffles and named barriers, elementwise ops
                before (residual add) and after (activation) the row op fused.
  ew_tile       a chain of elementwise ops on 8-element vectors.
Fusion groups are found greedily (lower.fuse): a matmul (or two sharing A) absorbs the
elementwise ops after it; elementwise ops absorb a following row op and the elementwise ops after
that; every value needed outside a group is stored.

Variants per region (runtime.make_variants)
  plan          a pipeline region -> the persistent kernel below; a bsp / fusion region -> its
                kernel groups as one CUDA graph (as the explorer prices them); tilesync /
                concurrent -> programmatic dependent launches with flag hand-offs (tilesync.py)
  bsp-eager     one standalone kernel per op, eager launches (CuPy RawKernel)
  bsp-graph     the same kernels captured once in a CUDA graph (stream capture) and replayed
  fusion / fusion-graph   one kernel per plan "kernels" group, eager / CUDA graph
  cublas        cuBLAS (cublasGemmStridedBatchedEx through ctypes on CuPy's handle, eager) for
                each matmul, this harness's kernels for the bias and the other ops
  cublas-graph  the same calls captured once in a CUDA graph (CuPy's own cuBLAS bindings refuse
                a capturing stream; the direct call can be captured), which takes the host's
                Python cost per call, 15-57 us on the lent machines, out of the measurement
  Eager variants (bsp-eager, fusion, cublas) are timed from an idle GPU (the host waits for the
  L2 flush before the start event: their model is the host's issue timeline); graphs and single
  kernels from the GPU's start behind the flush.
  plan-1team    (on request) the persistent kernel with one team per CTA instead of two

The persistent pipeline kernel (codegen.pipeline_source)
  Grid: one CTA per SM, sum of the stages' CTA counts; each stage a contiguous blockIdx range.
  One CTA per SM is forced with dynamic shared memory (more than half an SM's), checked with
  cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor: a grid that cannot be co-resident
  raises PipelineError (a KitsuneError), it is never shrunk. Each CTA records %smid; after every
  run the host checks that all CTAs ran on distinct SMs and that stages are disjoint.
  Teams: a CTA has two teams of 256 threads (8 warps), each with its own named barrier and half
  of the shared memory; a team is one worker. (Two tiles in flight per SM match what two CTAs per
  SM give the standalone kernels; measured in NOTES.md.) One team where every step's items over
  all its row-blocks fit its stage's CTAs (lower.solo_team_fits; the plan's pipeline.teams_per_sm
  names the count the cost model priced; KDSE_SOLO_TEAM=0 forces two): the second team would
  only idle, and 256 threads may hold 255 registers each, so ptxas spills nothing. Worker c of a stage of C CTAs is team
  c // C of its CTA c % C: consecutive workers sit on distinct SMs, so a stage with fewer items
  than SMs runs each alone on its SM (the teams of one SM are workers c and c + C).
  Streaming: tensors stream by row-blocks of BM rows (tile.rows: 64 or 128). A step (a fusion
  group placed on a stage) has work items per row-block: GEMM column tiles (x K ranges, below),
  elementwise column chunks, or row groups. Worker c of a stage of S workers takes the items w of
  the flattened (row-block, item) sequence with w % S == c, row-block by row-block, steps of a
  stage in topological order; every wait is for an item earlier in that order, so progress is
  guaranteed once all CTAs are resident.
  Ring queues: every tensor crossing steps gets a ring of `depth` row-block slots in global memory
  (L2-resident), with monotonic u32 counters in a control block: full[slot] counts finished
  producer items (red.release.gpu after the team's barrier), empty[slot] counts consumer workers
  done with the slot (each worker with items in the row-block releases once, after its last item;
  the producer waits for gen x min(items, workers) releases before rewriting a slot). Consumers
  wait (one thread spins on ld.acquire.gpu, then bar.red.and hands the verdict to the team) for
  full >= (gen+1) x producer items ("row" mode: the whole row-block, all columns) and read slot
  data with .cg loads (cp.async.cg for GEMM operands, ld.global.cg otherwise). A region output
  that is also consumed inside is a "direct" ring: its slots are the output tensor itself.
  split_k queues: the producer also sets a flag per column slab (its output tile columns,
  st.release.gpu gen+1); a consumer GEMM waits inside its main loop, before loading each k-tile,
  only for the slab that holds it. When the consumer's column tiles divide badly among its
  workers, K is also split into ranges of whole slabs (lower._choose_ksplit): fp32 partials go to
  an L2-resident workspace, an acq_rel counter per tile finds the last range, which sums the
  partials and applies the epilogue.
  Timeouts: every spin reads %globaltimer; past the timeout (default 1 s) it records code, worker,
  ring, row-block, needed and seen counts in the control block's header and gives up; every spin
  also gives up once the header is set. The host checks the header after every run and raises
  PipelineError("pipeline deadlock: ..."): a deadlock is an error report, never a hang.

Layouts, concat, batched GEMMs (lower.Region)
  A last dimension that is not a multiple of 8 is stored padded to one (zeros in the pads: the
  harness fills inputs through reference.fill_physical and compares reference.to_logical(...)); a
  GEMM's B takes its A's K layout (zero rows), a last-axis concat lays each input out at a
  multiple of 8 and copies 8-column vectors (a "cat" ew group). Row ops over padded columns are
  refused. Matmul/bmm with trans_b (GemmCfg<..., TB=true>: B staged as [BN][BK], ldmatrix without
  .trans) and batched B (a batch per `mper` rows of A, which must be a multiple of the tile rows).
  Every region of a multi-region plan takes the whole graph's layouts (harness.whole_region).
Plan tiles of R > bm rows run as R/bm row-blocks: a plan queue of depth d becomes a ring of
  d x R/bm row-block slots (the plan's capacity); a ring between two steps of one stage gets
  max(2, R/bm) slots, at most 8 MiB (lower.INTRA_RING_BYTES).
End to end (e2e.validate_plan_e2e): a plan's regions back to back on shared tensors (one
  stream, eager between regions, cold L2 at the start), checked against the whole graph; with
  address_sets > 1 its runs are shared among that many placements of its tensors (a pad of
  another size before them): where they lie moves NeRF's MLP by up to 1.4% (bench/cut_probe.py).
Stage timers: every worker of the persistent kernel records %globaltimer at its start and end;
  placement["stage_end_us"] is when each stage's last worker finished (after the kernel's first
  worker started). bsp-eager can record per-kernel CUDA-event times (kernel_times=True).

Correctness: each variant runs `checks` times on fresh random inputs (weights N(0,1)/sqrt(K),
activations N(0,1)) with outputs (and ring slots) poisoned with NaN first; every region output is
compared with the fp32 reference (relative Frobenius error <= 1e-2 fp16, 2e-2 bf16; any NaN
fails); the last timed run is checked too. Each region is validated on its own inputs.
Timing: CUDA events around the run only (poisoning, counter reset and the 256 MiB L2 flush come
before the start event); warm-up, then median, p10 and p90 of `runs` (default 30) cold (L2
flushed) and warm runs. Every row carries GPU, SM clock, driver, CuPy version, date, command.
"""
from __future__ import annotations

__all__ = ["validate_plan", "load_plan"]


def validate_plan(*args, **kwargs):
    """See kitsune_dse.validate.harness.validate_plan (imported lazily: it needs CuPy)."""
    from kitsune_dse.validate.harness import validate_plan as _v
    return _v(*args, **kwargs)


def load_plan(path):
    from kitsune_dse.validate.plan import load_plan as _l
    return _l(path)
