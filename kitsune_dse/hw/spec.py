"""GPU hardware specs: a pydantic schema with units in every field name.

A spec file is YAML; a value may be a plain SI number or a string with a unit whose dimension
must match the field's suffix (`_Bps` bytes/s, `_bytes` bytes, `_Hz` hertz, `_s` seconds,
`_flop_per_s` FLOP/s). Unknown fields, missing required fields, non-positive counts and
bandwidths, and wrong unit suffixes are one-line errors naming the file and field.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator)

from kitsune_dse import resources
from kitsune_dse.errors import KitsuneError, closest
from kitsune_dse.units import UnitError, parse_quantity
from kitsune_dse.yamlio import read_yaml

Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Frac = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
_PEAK_TABLES = {"tensor_peak_flop_per_s", "simt_peak_flop_per_s"}


def _dimension(field_name: str) -> str:
    for suffix, dim in (("_flop_per_s", "flop_per_s"), ("_Bps", "bytes_per_s"),
                        ("_bytes", "bytes"), ("_Hz", "hz"), ("_s", "seconds")):
        if field_name.endswith(suffix):
            return dim
    return "count"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _units(cls, v, info: ValidationInfo):
        name = info.field_name or ""
        if isinstance(v, bool) and name != "vendor":
            raise ValueError("expected a number, not true/false")
        if isinstance(v, dict) and name in _PEAK_TABLES:
            out = {}
            for k, x in v.items():
                if isinstance(x, bool):
                    raise ValueError(f"{k}: expected a number, not true/false")
                try:
                    out[k] = parse_quantity(x, "flop_per_s") if isinstance(x, str) else x
                except UnitError as e:
                    raise ValueError(f"{k}: {e}") from None
            return out
        if isinstance(v, str) and _dimension(name) != "count":
            try:
                return parse_quantity(v, _dimension(name))
            except UnitError as e:
                raise ValueError(str(e)) from None
        if isinstance(v, str) and name in _NUMERIC_FIELDS:
            try:
                return parse_quantity(v, "fraction" if name in _FRACTION_FIELDS else "count")
            except UnitError as e:
                raise ValueError(str(e)) from None
        return v


class Efficiency(_Strict):
    """Fractions of datasheet peaks that real kernels reach; `calibrate` fits them."""
    tensor_core: Frac = 0.75      # of dense tensor-core peak, a well-tuned GEMM tile (cuBLAS ~0.76 on H100)
    simt: Frac = 0.75             # of SIMT FP32 peak
    hbm: Frac = 0.87              # saturated streaming bandwidth over datasheet (H100: 2.9 of 3.35 TB/s)
    l2: Frac = 0.7                # of l2_bandwidth_Bps for L2-resident operands
    l2_usable_fraction: Frac = 0.75  # share of L2 that reliably keeps data between kernels / for queues
    hbm_saturation_exponent: Pos = 3.0  # p in B(s) = ((s*b_sm)^-p + B_max^-p)^(-1/p)
    small_gemm_k_ref: Annotated[float, Field(ge=0)] = 0.0  # K below which tile efficiency drops (0: off)
    persistent_tensor_core: Frac | None = None  # persistent GEMM steps' own rate (None: tensor_core)
    mem_compute_overlap: Annotated[float, Field(ge=0, le=1)] = 1.0  # persistent steps: share of the
                                  # shorter of compute and memory hidden under the longer (1: ideal)
    gemm_read_overlap_exponent: Annotated[float, Field(ge=0, le=64, allow_inf_nan=False)] = 0.0
                                  # standalone GEMM kernels: their math and the stream of their
                                  # DRAM reads combine as the p-norm of the two times, this p (the
                                  # main loop waits for loads its prefetch does not cover as the
                                  # two near each other); 0: the larger of the two (ideal overlap)
    gemm_hbm: Frac | None = None  # standalone GEMM kernels' operand streaming over datasheet HBM
                                  # bandwidth (None: hbm; the tile's loads may not saturate DRAM)
    persistent_gemm_hbm: Frac | None = None  # the same for persistent GEMM steps (None: hbm)
    persistent_concat_hbm: Frac | None = None  # the same for persistent concat steps: their
                                  # one load per output vector saturates the chip at about half
                                  # a streaming kernel's bandwidth (None: hbm)
    persistent_a_stream_share: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
                                  # of that ceiling, what a persistent GEMM step's A operand read
                                  # from DRAM slab by slab reaches: a floor on the step's time
                                  # (0: none)
    persistent_feed_exponent: Annotated[float, Field(ge=0, le=64, allow_inf_nan=False)] = 0.0
                                  # a persistent GEMM step's time against its L2 operand feed:
                                  # the p-norm of the two, this p (4096^3 per tile is flat to 48
                                  # SMs, +3% at 66, +14% at 99, +21% at 132: rising before the
                                  # feed saturates); 0: the larger of the two
    persistent_lone_team: Annotated[float, Field(ge=0.5, le=1)] = 0.5  # a persistent GEMM tile
                                  # alone on its SM: its share of the SM's two-team rate (0.5:
                                  # no faster than beside the other team)
    persistent_solo_team: Annotated[float, Field(ge=0.5, le=1)] | None = None  # the same for a
                                  # kernel of one 256-thread team per SM (the harness runs one where
                                  # no step has more items than its stage has SMs,
                                  # cost.pipeline.solo_team_fits): 255 registers a thread, no
                                  # spills (None: persistent_lone_team)
    l2_weight_share: Frac = 0.8   # a persistent GEMM stage running free: of the row-blocks its
                                  # workers hold at once beyond the first, the share whose weight
                                  # tiles come from one L2 fetch (measured 0.77-0.93 with ncu,
                                  # bench/dram_probe.py free-*)
    l2_writeback_center: Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)] = 0.6
                                  # a pipeline's L2 footprint (rings, resident weights, K-split
                                  # partials, the stream of one ring cycle, its threads' local
                                  # frames) as a share of l2_bytes at which half its dirty ring
                                  # lines are evicted before the next generation overwrites them
                                  # (written back to DRAM) ...
    l2_writeback_width: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.1
                                  # ... on a logistic of this width (x l2_bytes), for the queues
                                  # between stages: bench/dram_probe.py wb*- (1.5% of a queue's
                                  # ring bytes at 17 MB, 35% at 27 MB, 92% at 43 MB)
    l2_inner_writeback_center: Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)] = 0.6
    l2_inner_writeback_width: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.1
                                  # the same logistic for the rings between one stage's own
                                  # steps (its workers' hand-offs; bench/dram_probe.py's
                                  # one-stage wb*-p1 probes)
    l2_local_frame_share: Annotated[float, Field(ge=0, le=4, allow_inf_nan=False)] = 0.0
                                  # of the pipeline kernel's local memory (register spills: its
                                  # threads' stack frames, HwSpec.local_frame_*), the share that
                                  # joins the L2 footprint (0: none)
    producer_stream_share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
                                  # such a stage's share of its own streaming rate while a later
                                  # stage streams beside it (the later one gets what is left of
                                  # HwSpec.concurrent_stream_Bps, then its own rate alone)
    l2_resident_reread: Annotated[float, Field(ge=0, le=4, allow_inf_nan=False)] = 0.37
                                  # weights a pipeline keeps in L2: per row-block it reads this x
                                  # their share of the L2 x the write-back fraction of them again
                                  # (evicted beside the rings; bench/dram_probe.py wb*-: 0.30-0.41)
    l2_recent_fraction: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 0.0
                                  # when a sequence of kernels ends, L2 holds the last this x
                                  # l2_bytes of what they brought into it (reads and writes) ...
    l2_dirty_fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
                                  # ... with at most this x l2_bytes of it dirty: written to DRAM
                                  # only after the sequence (cost.reuse.dirty_residue; 0: every
                                  # write reaches DRAM within it)
    # a standalone GEMM grid's operand tiles (cost.gemm_l2; fitted to ncu's bytes of 26 GEMM grids,
    # bench/dram_probe.py gemm-*): the defaults are waves in lockstep and a hard L2 threshold
    grid_reuse_center: Annotated[float, Field(gt=0, le=8, allow_inf_nan=False)] = 1.0
                                  # a tile a later wave reads again hits L2 when the bytes touched
                                  # since its last use are below this x the usable L2 ...
    grid_reuse_halfwidth: Annotated[float, Field(ge=0, le=8, allow_inf_nan=False)] = 0.0
                                  # ... with a ramp this half-width (x usable L2) that widens as the
                                  # waves drift apart (grid_desync_exponent), to one wave's bytes
    grid_drift_miss: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
                                  # a tile shared by CTAs of one wave: share of its further uses
                                  # that miss L2 when the wave's operand bytes equal the usable L2
                                  # (the CTAs drift apart along K) ...
    grid_drift_exponent: Annotated[float, Field(ge=0, le=6, allow_inf_nan=False)] = 2.0
                                  # ... growing as (wave's operand bytes / usable L2)^this ...
    grid_drift_sharers: Annotated[float, Field(ge=1, le=1e4, allow_inf_nan=False)] = 16.0
                                  # ... of at most this many further uses of one tile ...
    grid_desync_exponent: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 0.5
                                  # ... and as (wave index + 1)^this (0.5: a random walk)


_NUMERIC_FIELDS = {"sm_count", "max_ctas_per_sm", "max_threads_per_sm", "registers_per_sm",
                   "sm_granularity", "gemm_k_tile", "tensor_core", "simt", "hbm", "l2", "l2_usable_fraction",
                   "hbm_saturation_exponent", "small_gemm_k_ref", "mem_compute_overlap",
                   "gemm_read_overlap_exponent", "persistent_feed_exponent", "persistent_tensor_core", "gemm_hbm", "persistent_gemm_hbm", "persistent_concat_hbm", "persistent_a_stream_share",
                   "persistent_lone_team", "persistent_solo_team", "l2_weight_share", "l2_writeback_center",
                   "l2_writeback_width", "l2_inner_writeback_center", "l2_inner_writeback_width",
                   "l2_local_frame_share", "l2_resident_reread",
                   "producer_stream_share", "l2_recent_fraction", "l2_dirty_fraction",
                   "grid_reuse_center", "grid_reuse_halfwidth", "grid_drift_miss",
                   "grid_drift_exponent", "grid_desync_exponent", "grid_drift_sharers"}
_FRACTION_FIELDS = {"tensor_core", "simt", "hbm", "l2", "l2_usable_fraction", "mem_compute_overlap",
                    "persistent_tensor_core", "gemm_hbm", "persistent_gemm_hbm", "persistent_concat_hbm",
                    "persistent_a_stream_share", "persistent_lone_team", "persistent_solo_team", "l2_weight_share",
                    "producer_stream_share"}


class Calibration(BaseModel):
    """Provenance of a calibrated spec (free-form, recorded by `calibrate`)."""
    model_config = ConfigDict(extra="allow", frozen=True)


class HwSpec(_Strict):
    name: str
    full_name: str
    vendor: str = "NVIDIA"
    arch: str                                   # e.g. sm_90
    sm_count: Annotated[int, Field(gt=0)]
    sm_clock_Hz: Pos                            # boost clock the peaks are quoted at
    tensor_peak_flop_per_s: Annotated[dict[str, Pos], Field(min_length=1)]  # dense, whole GPU, per input dtype
    simt_peak_flop_per_s: Annotated[dict[str, Pos], Field(min_length=1)]    # whole GPU, per dtype
    hbm_bytes: Pos
    hbm_bandwidth_Bps: Pos
    hbm_per_sm_bandwidth_Bps: Pos               # what one SM can pull from DRAM (H100: ~38 GB/s)
    l2_bytes: Pos
    l2_bandwidth_Bps: Pos
    l2_per_sm_bandwidth_Bps: Pos                # one SM's share of L2 bandwidth (H100: ~80 GB/s)
    smem_per_sm_bytes: Pos
    smem_per_cta_max_bytes: Pos
    registers_per_sm: Annotated[int, Field(gt=0)]
    max_ctas_per_sm: Annotated[int, Field(gt=0)]
    max_threads_per_sm: Annotated[int, Field(gt=0)]
    launch_overhead_s: Pos                      # host time to issue one kernel eagerly
    library_call_s: Pos | None = None           # host time of one GEMM library call issued
                                                # eagerly (cuBLAS from Python: its handle, stream
                                                # and heuristics; calibrated; None: the launch)
    launch_first_s: Pos | None = None           # host time of an eager run's first launch,
                                                # right after the host waited for the GPU
                                                # (calibrated; None: launch_overhead_s)
    library_call_first_s: Pos | None = None     # the same for a first library call (None:
                                                # library_call_s)
    graph_launch_overhead_s: Pos                # device gap per kernel node in a CUDA graph
    kernel_gap_s: Pos                           # device gap between dependent eager kernels
    sync_latency_s: Pos                         # one-way inter-CTA flag hand-off through L2
    gemm_tile_fixed_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    gemm_tile_fixed_idle_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # the same on a quiet chip (few SMs loading):
                                                # interpolated by the share of SMs in use
                                                # (default gemm_tile_fixed_s at any load)
    gemm_tile_fixed_load_exponent: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
                                                # how the fixed cost rises with that share:
                                                # share ** exponent (None: 1, linear)
    persistent_a_stream_fill_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # the A stream floor's fill and drain (roofline
                                                # ._a_stream_floor)
    persistent_gemm_sm_stream_Bps: Pos | None = None  # DRAM operand bytes one SM's persistent
                                                # GEMM tiles stream per second (latency-bound
                                                # cp.async loads; default hbm_per_sm_bandwidth_Bps)
    persistent_gemm_l2_Bps: Pos | None = None   # L2 to SM bytes per second all SMs' persistent
                                                # GEMM tiles load their operands at, together (the
                                                # A and B slices of every output tile; None: no cap)
    concurrent_stream_Bps: Pos | None = None    # DRAM bytes per second the chip gives two or
                                                # more weight-streaming stages of a slab-fed
                                                # pipeline together (a producer and its split_k
                                                # consumer, one row-block: decode); None: not
                                                # modelled (the stages' tandem and DRAM floor)
    persistent_row_sm_stream_Bps: Pos | None = None  # the same for persistent row-op steps
                                                # (softmax, norms; default hbm_per_sm_bandwidth_Bps)
    local_frame_step_bytes: Annotated[float, Field(ge=0, le=4096, allow_inf_nan=False)] = 0.0
                                                # the persistent pipeline kernel's local memory
                                                # per thread (register spills) per step of its
                                                # stages ...
    local_frame_concat_bytes: Annotated[float, Field(ge=0, le=4096, allow_inf_nan=False)] = 0.0
                                                # ... and more per concatenating step (fitted on
                                                # nvcc's resource report, bench/frame_probe.py)
    epilogue_input_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # per 128x128 tile of a persistent GEMM step and
                                                # full input its epilogue reads (a residual): the
                                                # loads' latency the tile waits out (calibrated on
                                                # GEMMs with and without a residual add)
    epilogue_vector_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # the same per 128 columns and vector it reads
                                                # (a bias; calibrated on GEMMs with and without)
    persistent_narrow_tile_saving: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
                                                # share of a persistent GEMM tile's time (math and
                                                # fixed cost) a product narrower than the tile
                                                # saves per share of the tile's columns it leaves
                                                # empty: no B loads or epilogue for them, only the
                                                # MMAs (calibrated on one-stage GEMMs N = 8 / 64
                                                # against N = 128)
    standalone_narrow_tile_saving: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
                                                # the same for a standalone GEMM kernel's tile
                                                # (calibrated on fused kernels N = 1..64 against
                                                # N = 128, bench/narrow_probe.py)
    standalone_epilogue_input_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # a standalone GEMM CTA's wait, per 128x128 tile
                                                # and full input its epilogue reads (a residual),
                                                # after its main loop; its SM keeps only
                                                # standalone_lone_share of its rate meanwhile,
                                                # all of it lost where the other CTA waits too
                                                # (calibrated on fused GEMMs with and without a
                                                # residual add, bench/epilogue_probe.py's cases)
    standalone_lone_share: Annotated[float, Field(ge=0.5, le=1, allow_inf_nan=False)] = 1.0
                                                # share of its SM's rate one CTA of a standalone
                                                # GEMM (two CTAs per SM) keeps alone: an odd last
                                                # tile, a single-wave grid, an epilogue's wait
                                                # (fitted with the GEMM's rate; CTA traces of
                                                # the calibration's GEMMs gave 0.64-0.80; 1: a
                                                # lone CTA as fast as a pair, no such loss)
    transcendental_flops: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # SIMT FLOP-equivalents of one special-function
                                                # evaluation (a GELU's tanh, a SiLU's exp) in a
                                                # kernel's epilogue (calibrated on GEMMs with and
                                                # without a GELU/SiLU epilogue; 0: free)
    standalone_transcendental_flops: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # the same in a standalone GEMM kernel's epilogue:
                                                # its two CTAs per SM hide part of it under each
                                                # other's main loop (measured: a GELU epilogue adds
                                                # 17 us to 16384 x 3072 x 768 there, 31 in the
                                                # persistent kernel; None: transcendental_flops)
    standalone_norm_stream_share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
                                                # a standalone layernorm kernel whose rows the
                                                # harness keeps in registers, 8 vectors a thread
                                                # (2,048 columns and up: 146-149 registers, one
                                                # CTA of 256 threads per SM where a softmax fits
                                                # two): the share of the streaming rate it
                                                # reaches (bench/rowop_probe.py; 1: the same)
    persistent_row_load_slowdown: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # a row-op step's stream rate over 1 + this x the
                                                # chip's load (GEMM stages beside it; calibrated
                                                # on a GEMM feeding a softmax through a ring)
    persistent_row_item_fixed_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # per item of a persistent row-op step (a team's
                                                # pass over a few rows: its reductions' latency)
    tile_signal_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # per tile on its SM: a tilesync producer counting
                                                # a finished tile (fence + flag; default sync_latency_s)
    tile_signal_shared_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # ... of a producer whose SM holds other CTAs of
                                                # it (row and element-wise kernels): the CTA's
                                                # store drain before its release overlaps their
                                                # work (default tile_signal_s)
    tile_wait_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # per tile: a consumer checking its rows are ready
                                                # before it starts (default sync_latency_s)
    tilesync_fixed_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # per tilesync/concurrent region: resetting its flags
    step_handoff_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # a persistent stage's dependent steps: from a
                                                # row-block's last item of one step to the next
                                                # step's items starting on it (ring publish, flag
                                                # poll, first loads; default sync_latency_s)
    ring_handoff_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # one-way hand-off of a row-block between two
                                                # pipeline stages through their ring: the
                                                # producer's release of its item, the consumer's
                                                # poll seeing it (and a slot's release back);
                                                # calibrated on two-stage pipelines (default
                                                # sync_latency_s, the idle flag ping-pong)
    persistent_concat_sm_stream_Bps: Pos | None = None  # bytes per second one SM moves in a
                                                # persistent step that concatenates (one load per
                                                # output vector, split over its inputs; measured
                                                # at ~45% of an elementwise step's rate; default
                                                # the elementwise rate)
    tilesync_handoff_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # per tilesync hand-off between kernels beyond
                                                # the per-tile flags: the consumer launched early
                                                # waits resident beside its producer (calibrated
                                                # on chains of GEMMs)
                                                # persistent GEMM steps: per 128x128 output tile on
                                                # one SM (prologue, epilogue, hand-offs; calibrated)
    kernel_fixed_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # per standalone kernel beyond its roofline and its
                                                # launch gap: grid ramp-up and tail (calibrated)
    gemm_standalone_tile_fixed_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # standalone GEMM kernels: per 128x128 output tile
                                                # on one SM beyond its FLOPs (calibrated)
    gemm_ramp_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # standalone GEMM kernels: the first tile's prologue
                                                # and the last one's epilogue (calibrated)
    gemm_tail_tiles: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 0.0
                                                # a standalone GEMM grid of more tiles than SMs:
                                                # tile times its busiest SM spends past its whole
                                                # rounds, the slower CTA of its last pair (two CTAs
                                                # share an SM unevenly; CTA traces: 0.13-0.5;
                                                # calibrated with the GEMM's rate)
    gemm_k_tile: Annotated[int, Field(ge=0, le=4096)] = 0
                                                # a GEMM tile's main loop steps through K in
                                                # slabs of this many (the harness's 64): a K that
                                                # is not a multiple costs the whole last slab of
                                                # math (0: K as it is)
    gemm_tile_shapes: list[tuple[Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)]]] | None = None
                                                # CTA tiles (rows, cols) the GEMM library offers
                                                # (None: cost.roofline.GEMM_TILES)
    gemm_heuristic: Literal["fastest", "harness"] = "fastest"
                                                # how the GEMM library picks tile and split-K:
                                                # the fastest of gemm_tile_shapes x SPLIT_K, or the
                                                # validation harness's fixed rule (its kernels)
    elementwise_grid_ctas_per_sm: Annotated[int, Field(ge=0, le=1024)] = 0
                                                # a standalone element-wise kernel's grid-stride
                                                # loop: at most this many 256-thread CTAs per SM,
                                                # those its threads allow resident at once sweeping
                                                # the whole tensor before the next start (cost.reuse:
                                                # where in its run it touches each part; the
                                                # harness: 32); 0: memory order
    gemm_read_grids: list[tuple[Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)],
                                Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)]]] | None = None
                                                # (up to M rows, tile rows, tile cols, CTAs per
                                                # wave): the grid a library's standalone GEMM of M
                                                # rows reads its operands with (cost.gemm_l2; the
                                                # first whose bound holds M), where its kernels are
                                                # not the priced tile (cuBLAS: fitted to ncu's
                                                # bytes); None: the priced tile, WAVE_CTAS a wave
    persistent_launch_s: Pos | None = None      # launch + teardown of a one-CTA-per-SM persistent
                                                # kernel (default: graph_launch_overhead_s)
    persistent_launch_outside_s: Pos | None = None
                                                # the part of persistent_launch_s outside the
                                                # workers' span (the CUDA events' time less the
                                                # first worker's start to the last one's end);
                                                # the rest is a ramp inside it, before every
                                                # stage's end (default: all outside)
    launch_latency_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # once per launched CUDA graph: from the launch to
                                                # its first kernel running (calibrated: a chain of
                                                # N tiny kernels takes a + N b; default 0)
    region_gap_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
                                                # what a region boundary adds: the next region's
                                                # launch from the host after the last one's, beyond
                                                # a graph node's gap (calibrated: N one-kernel
                                                # graphs back to back against one graph of N)
    region_boundary_hidden_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
                                                # what a region hides of its own cost when it runs
                                                # right after another (calibrated directly: A then
                                                # B against each alone, bench/region_boundary.py;
                                                # default: launch_latency_s - region_gap_s)
    sm_granularity: Annotated[int, Field(gt=0)] = 1  # green-context partition step
    efficiency: Efficiency = Efficiency()
    calibration: Calibration | None = None
    sources: list[str] = []

    @field_validator("tensor_peak_flop_per_s", "simt_peak_flop_per_s")
    @classmethod
    def _dtypes(cls, v):
        from kitsune_dse.graph.ir import DTYPE_BYTES
        for k in v:
            if k not in DTYPE_BYTES:
                raise ValueError(f"unknown dtype {k!r}{closest(k, DTYPE_BYTES)}")
        return v

    # -- derived figures the cost models use ---------------------------------------------------
    def tensor_rate_per_sm(self, dtype: str) -> float:
        """Achievable tensor-core FLOP/s of one SM for this input dtype."""
        rate = self.tensor_peak_flop_per_s.get(dtype)
        if rate is None:
            rate = self.tensor_peak_flop_per_s.get("fp16") if dtype == "bf16" else None
        if rate is None:
            return self.simt_rate_per_sm(dtype)
        return rate * self.efficiency.tensor_core / self.sm_count

    def simt_rate_per_sm(self, dtype: str) -> float:
        r = self.simt_peak_flop_per_s
        rate = r.get(dtype) or r.get("fp32") or next(iter(r.values()))
        return rate * self.efficiency.simt / self.sm_count

    @property
    def tile_signal_cost_s(self) -> float:
        return self.sync_latency_s if self.tile_signal_s is None else self.tile_signal_s

    @property
    def tile_signal_shared_cost_s(self) -> float:
        return self.tile_signal_cost_s if self.tile_signal_shared_s is None else self.tile_signal_shared_s

    @property
    def step_handoff_cost_s(self) -> float:
        return self.sync_latency_s if self.step_handoff_s is None else self.step_handoff_s

    @property
    def ring_handoff_cost_s(self) -> float:
        return self.sync_latency_s if self.ring_handoff_s is None else self.ring_handoff_s

    @property
    def tile_wait_cost_s(self) -> float:
        return self.sync_latency_s if self.tile_wait_s is None else self.tile_wait_s

    def hbm_bandwidth_from(self, sms, ceiling: float | None = None, per_sm_Bps: float | None = None):
        """HBM bandwidth reachable from `sms` SMs: linear at first, saturating at the chip's
        achievable maximum (a smooth minimum of the two, fitted to H100 measurements);
        `ceiling` replaces efficiency.hbm as the saturated fraction (a GEMM's operand stream)."""
        import numpy as np
        s = np.asarray(sms, dtype=float)
        p = self.efficiency.hbm_saturation_exponent
        bmax = self.hbm_bandwidth_Bps * (ceiling or self.efficiency.hbm)
        lin = np.maximum(s, 1e-9) * (per_sm_Bps or self.hbm_per_sm_bandwidth_Bps)
        out = (lin ** -p + bmax ** -p) ** (-1.0 / p)
        return out if out.ndim else float(out)

    def l2_bandwidth_from(self, sms):
        import numpy as np
        s = np.asarray(sms, dtype=float)
        p = self.efficiency.hbm_saturation_exponent
        bmax = self.l2_bandwidth_Bps * self.efficiency.l2
        lin = np.maximum(s, 1e-9) * self.l2_per_sm_bandwidth_Bps
        out = (lin ** -p + bmax ** -p) ** (-1.0 / p)
        return out if out.ndim else float(out)

    @property
    def launch_latency_cost_s(self) -> float:
        return self.launch_latency_s or 0.0

    @property
    def region_overlap_s(self) -> float:
        """What each region after the first hides of its own cost when regions run back to
        back: its launch latency (launched while the last one runs), less the boundary's gap;
        measured directly where calibrated (region_boundary_hidden_s: 0.2-1.3 us on the H100,
        against the 1.85 us the kernel chains' latency less their gap would give)."""
        if self.region_boundary_hidden_s is not None:
            return self.region_boundary_hidden_s
        return self.launch_latency_cost_s - self.region_gap_s

    @property
    def library_call_cost_s(self) -> float:
        return self.library_call_s if self.library_call_s is not None else self.launch_overhead_s

    @property
    def launch_first_cost_s(self) -> float:
        return self.launch_first_s if self.launch_first_s is not None else self.launch_overhead_s

    @property
    def library_call_first_cost_s(self) -> float:
        return self.library_call_first_s if self.library_call_first_s is not None else self.library_call_cost_s

    @property
    def persistent_launch_cost_s(self) -> float:
        return self.persistent_launch_s if self.persistent_launch_s is not None \
            else self.graph_launch_overhead_s

    @property
    def persistent_ramp_s(self) -> float:
        """What of the persistent kernel's fixed cost falls inside its workers' span: a stage's
        last unit ends this much later after the first worker starts than the queue model says."""
        if self.persistent_launch_outside_s is None:
            return 0.0
        return max(0.0, self.persistent_launch_cost_s - self.persistent_launch_outside_s)

    @property
    def l2_usable_bytes(self) -> float:
        return self.l2_bytes * self.efficiency.l2_usable_fraction

    def content_hash(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _one_line(e: ValidationError, where: str) -> KitsuneError:
    # a misspelt field shows up as both 'unknown' and 'missing': name the misspelling first
    errs = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
    err = errs[0]
    loc = ".".join(str(x) for x in err["loc"])
    typ = err["type"]
    if typ == "extra_forbidden":
        fields = (list(Efficiency.model_fields) if err["loc"][0] == "efficiency"
                  else list(HwSpec.model_fields))
        msg = f"unknown field {loc!r}{closest(str(err['loc'][-1]), fields)}"
    elif typ == "missing":
        msg = f"missing required field {loc!r}"
    else:
        m = err["msg"].removeprefix("Value error, ")
        msg = f"field {loc!r}: {m} (got {err.get('input')!r})"
    more = len(e.errors()) - 1
    return KitsuneError(msg + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""),
                        where=where)


def spec_from_dict(data: object, where: str) -> HwSpec:
    if not isinstance(data, dict):
        raise KitsuneError("a hardware spec must be a YAML mapping of fields", where=where)
    try:
        return HwSpec.model_validate(data)
    except ValidationError as e:
        raise _one_line(e, where) from None


def list_specs() -> dict[str, Path]:
    return resources.hw_specs()


def resolve_spec_path(ref: str) -> Path:
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise KitsuneError("hardware spec file not found", where=str(p))
        return p
    specs = list_specs()
    if ref not in specs:
        raise KitsuneError(f"unknown hardware spec {ref!r}{closest(ref, specs)}; "
                           f"`kitsune-dse hw list` shows the shipped ones")
    return specs[ref]


def load_spec(ref: str | Path | HwSpec) -> HwSpec:
    """A spec by shipped name (e.g. 'h100-sxm') or YAML path."""
    if isinstance(ref, HwSpec):
        return ref
    path = resolve_spec_path(str(ref))
    return spec_from_dict(read_yaml(path), str(path))


def spec_with_overrides(spec: HwSpec, overrides: dict[str, str]) -> HwSpec:
    """What-if hardware: FIELD=VALUE (dotted for efficiency.*), units accepted."""
    data = spec.model_dump(mode="python")
    for key, value in overrides.items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise KitsuneError(f"--hw-set {key}: unknown field {part!r}"
                                   f"{closest(part, data)}")
            node = node[part]
        if parts[-1] not in node:
            raise KitsuneError(f"--hw-set {key}: unknown field {parts[-1]!r}"
                               f"{closest(parts[-1], node)}")
        node[parts[-1]] = value
    return spec_from_dict(data, "--hw-set")
