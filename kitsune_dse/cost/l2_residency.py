"""What a persistent pipeline's L2 keeps and what it sends back to DRAM: pure functions the
pipeline model (cost.pipeline) and the roofline (weight re-reads) call.

Measured with ncu on probe pipelines that are not the validation suite's (bench/dram_probe.py,
results/validation/h100/dram_probe/):

* Weight sharing. A GEMM stage's workers take the items (row-block, column tile) in order;
  the items of the row-blocks one round of workers holds start together and share each
  weight tile's fetch through L2. Only a stage that runs free keeps that lock-step:
  - one stage alone: 0.77-0.93 of the ideal sharing (efficiency.l2_weight_share);
  - a stage fed through a queue gets each row-block when its producer publishes it, a period
    later than the last: its weights stream once per row-block (fed-*: 32.0-32.8 passes over
    32 row-blocks at ring depths 4 and 6);
  - the first stage runs free until its output ring holds it back, then the consumer paces
    it one row-block at a time (held-fc2-d8: 17.3 passes where 2 x depth = 16 free row-blocks
    and 16 paced ones make 18).
* Write-back. A ring slot's dirty lines reach DRAM when L2 evicts them before the next
  generation overwrites them. With the weights streaming (re-read per row-block) that is every
  line; with everything resident it grows with the footprint the rings, the resident weights,
  the K-split partial sums, the stream of one ring cycle and the kernel's local memory make:
  a logistic over the footprint (efficiency.l2_writeback_center / _width) for the queues between
  stages, 1.5% of their ring bytes at 17 MB, 35% at 27 MB, 92% at 43 MB of the H100's 50 MB, and
  a wider one (l2_inner_writeback_*) for the rings between one stage's own steps, 5% of NeRF's
  at 17.5 MB, 12% at 24 MB, 70% at 37 MB (bench/dram_probe.py wbq-*, wbr-*, wbn-*).
* Local memory. The persistent kernel's threads spill registers to their stack frames, which
  L2 holds beside the rings: NeRF's one-stage kernel 216 bytes a thread (14.6 MB over 132 SMs
  of 512 threads), and ncu counted 461 MB of its local stores through L2. Its small inner
  rings were written back where the footprint without the frames said none (wbx-*: a chain
  of 12 plain GEMM steps, 120 bytes a thread, wrote back a third as much).
"""
from __future__ import annotations

import math

from kitsune_dse.hw.spec import HwSpec

# the first stage of a pipeline runs free for this many times its output ring's row-blocks
# before its consumer paces it (a consumer drains while the producer fills: held-fc2-d8)
PACED_FREE_DEPTHS = 2.0


def free_row_blocks(stage: int, n_stages: int, rbs: int, out_ring_rbs: int) -> float:
    """Row-blocks stage `stage` of `n_stages` processes in lock-step rounds (sharing weight
    fetches across row-blocks); the rest it processes one row-block at a time."""
    if n_stages <= 1:
        return float(rbs)
    if stage > 0:
        return 0.0
    return float(min(rbs, PACED_FREE_DEPTHS * max(1, out_ring_rbs)))


def first_stage_free_row_blocks(rbs: int, out_ring_rbs: int, rate_ratio: float, at_once: float) -> float:
    """free_row_blocks of a pipeline's first stage at its stages' rates (`rate_ratio`: the
    slowest later stage's rate over the first stage's, each without weight re-reads; `at_once`:
    the row-blocks one round of its workers holds). A first stage no faster than its consumers
    whose output ring holds two of its rounds is never held back: it runs free over all its
    row-blocks. ncu (bench/dram_probe.py, not the suite's sizes): ln-residual's two alike
    stages at 8192 tokens, 64 row-blocks, 44 + 88 SMs: 2,830 MB where two rings' worth free
    says 3,377 and all free 3,137; at 66 + 66 SMs, depth 8 (wsh-lnr4096-t8192): 71.2 weight
    passes of 128, 71.1 all free, 87 two rings free. Any other first stage: two rings' worth
    (held-fc2-d8, a round of 8 row-blocks against 8 slots, is broken up by slots freed one at a
    time). Tried and not kept: a faster first stage free for its ring plus what its consumers
    drain meanwhile, ring x (1 + ratio): pace-gpt-* at ratios 0.2-0.5 measured 1-16% under it
    and within 2% of two rings' worth."""
    if rate_ratio >= 1.0 - 1e-6 and 2.0 * at_once <= out_ring_rbs:
        return float(rbs)
    return free_row_blocks(0, 2, rbs, out_ring_rbs)


def streamed_weight_hit(streamed_weight_bytes: float, spec: HwSpec) -> float:
    """Share of a weight pass beyond the first that L2 still holds when the stages stream
    `streamed_weight_bytes` of weights that do not fit it between two passes: exp(-D / L2), a
    cache that evicts lines at random rather than strictly the least recent. No parameter: the
    probes' fit improves with it (rms log error 0.092 -> 0.084; 134-268 MB of weights, within
    8% of no hit), and it is what the suite's ln-residual hand plans showed first (two 33.5 MB
    weights: 42 passes measured of the 58 their row-blocks make; exp(-67 / 52) = 0.28)."""
    if streamed_weight_bytes <= 0:
        return 0.0
    return math.exp(-streamed_weight_bytes / spec.l2_bytes)


def write_back_fraction(footprint_bytes: float, spec: HwSpec, inner: bool = False) -> float:
    """Share of a pipeline's ring (and partial-sum) bytes written back to DRAM: a logistic over
    its L2 footprint, half at efficiency.l2_writeback_center of the L2, of width
    l2_writeback_width (a cache that replaces lines by age only in part: some lines go early,
    some stay late, so no footprint below the L2 is free of write-back, nor one near it total).
    `inner`: the rings between a stage's own steps, on their own logistic
    (l2_inner_writeback_center / _width): bench/dram_probe.py's one-stage probes climb from 5%
    at 17.5 MB to 56% at 30 MB, its queues between stages from 1.5% at 17.3 MB to 35% at 27 MB."""
    eff = spec.efficiency
    if not math.isfinite(footprint_bytes):
        return 1.0
    center, width = ((eff.l2_inner_writeback_center, eff.l2_inner_writeback_width) if inner
                     else (eff.l2_writeback_center, eff.l2_writeback_width))
    z = (footprint_bytes - center * spec.l2_bytes) / (width * spec.l2_bytes)
    if abs(z) > 30.0:       # beyond e^-30 of either end: none, or all
        return 0.0 if z < 0 else 1.0
    return 1.0 / (1.0 + math.exp(-z))


def local_frame_bytes(stage_features, spec: HwSpec, threads: int) -> float:
    """L2 bytes of a persistent pipeline kernel's threads' local memory: per thread, its
    stages' steps and concatenating steps at the spec's frame bytes each (the kernel inlines
    every stage, and nvcc's frames add up over them: bench/frame_probe.py), times `threads`."""
    per_thread = sum(spec.local_frame_step_bytes * f.get("steps", 0)
                     + spec.local_frame_concat_bytes * f.get("concat", 0) for f in stage_features)
    return per_thread * threads


def ring_cycle_stream_bytes(stream_bytes: float, rbs: int, cycle_rbs: int) -> float:
    """DRAM bytes the region moves while its rings turn over once (cycle_rbs of rbs row-blocks):
    they pass through L2 beside the slots."""
    return stream_bytes * min(1.0, cycle_rbs / max(1, rbs))
