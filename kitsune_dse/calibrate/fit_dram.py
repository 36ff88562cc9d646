"""Fit what a persistent pipeline's L2 keeps (cost.l2_residency) to DRAM bytes measured with ncu
on probe pipelines (bench/dram_probe.py: none of them a validation-suite plan), and what the
pipeline kernel's threads spill to local memory to nvcc's resource report (bench/frame_probe.py).

Fitted: efficiency.l2_weight_share, l2_writeback_center, l2_writeback_width, l2_resident_reread,
l2_local_frame_share, l2_inner_writeback_center and l2_inner_writeback_width, on the log ratio
of predicted (the writes still dirty when a probe ends left out) to measured read + write bytes;
local_frame_step_bytes and local_frame_concat_bytes on the kernels' stack frames.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import least_squares, nnls

from kitsune_dse.hw.spec import HwSpec

FIELDS = ("l2_weight_share", "l2_writeback_center", "l2_writeback_width", "l2_resident_reread",
          "l2_local_frame_share", "l2_inner_writeback_center", "l2_inner_writeback_width")
FRAME_FIELDS = ("local_frame_step_bytes", "local_frame_concat_bytes")


def pipeline_dram_bytes(spec: HwSpec, graph, choice) -> tuple[float, float]:
    """(read, write) DRAM bytes the pipeline model gives one probe's region within its run (no
    timing): the writes still dirty in L2 when it ends are not in ncu's range."""
    from kitsune_dse.cost.pipeline import plan_stages, stage_works
    from kitsune_dse.cost.region import Region
    region = Region.of(graph, [o for st in choice.stages for o in st])
    _, tot = stage_works(region, spec, plan_stages(region, spec, choice.normalized()))
    return tot["dram_read_bytes"], tot["dram_write_bytes"] - tot["dram_deferred_write_bytes"]


def _with(spec: HwSpec, x) -> HwSpec:
    return spec.model_copy(update={"efficiency": spec.efficiency.model_copy(
        update={k: float(v) for k, v in zip(FIELDS, x)})})


def fit_local_frame(rows: list[dict]) -> dict:
    """rows: {"frame_bytes" (nvcc's stack frame of a pipeline kernel), "stages" (each stage's
    cost.pipeline.stage_frame_features)}. Non-negative least squares of the frame on the
    kernel's steps and concatenating steps (summed over its stages: the kernel inlines them
    all). Returns the spec's two fields, the rms and the largest error in bytes."""
    if not rows:
        raise ValueError("no kernel frames")
    A = np.array([[sum(f.get("steps", 0) for f in r["stages"]), sum(f.get("concat", 0) for f in r["stages"])]
                  for r in rows], dtype=float)
    y = np.array([r["frame_bytes"] for r in rows], dtype=float)
    coef, _ = nnls(A, y)
    err = A @ coef - y
    return {"local_frame_step_bytes": float(coef[0]), "local_frame_concat_bytes": float(coef[1]),
            "rms_bytes": float(np.sqrt(np.mean(err ** 2))), "max_error_bytes": float(np.max(np.abs(err))),
            "points": len(rows)}


def fit_pipeline_l2(spec: HwSpec, probes: list[dict]) -> dict:
    """probes: {"name", "graph", "choice" (cost.pipeline.PipelineChoice), "read_bytes",
    "write_bytes"} (measured). Returns the fitted fields, the residuals per probe and their
    RMS before and after."""
    if not probes:
        raise ValueError("no DRAM probe measurements")
    meas = np.array([p["read_bytes"] + p["write_bytes"] for p in probes], dtype=float)

    def resid(x):
        sp = _with(spec, x)
        pred = np.array([sum(pipeline_dram_bytes(sp, p["graph"], p["choice"])) for p in probes])
        return np.log(pred / meas)

    e = spec.efficiency
    x0 = np.array([getattr(e, k) for k in FIELDS])
    before = resid(x0)
    # the logistic's centre trades off against the frames' share and the resident re-read:
    # least squares from one start can stop short; the best of a small grid of starts (the
    # spec's own among them) is kept
    # (each start gives the inner rings' logistic the queues' own)
    starts = [x0] + [np.array(x + x[1:3]) for x in itertools.product((0.7,), (0.5, 0.7), (0.05, 0.15), (0.3, 0.8),
                                                                     (0.0, 1.0))]
    best = None
    for x_start in starts:
        r = least_squares(resid, x_start, bounds=([0.05, 0.1, 0.01, 0.0, 0.0, 0.1, 0.01], [1.0, 2.0, 1.0, 4.0, 4.0, 2.0, 1.0]),
                          diff_step=0.02, x_scale=[0.2, 0.1, 0.05, 0.2, 0.3, 0.1, 0.05])
        if best is None or r.cost < best.cost - 1e-12:
            best = r
    x = best.x
    after = resid(x)
    fitted = {k: float(v) for k, v in zip(FIELDS, x)}
    return {**fitted, "points": len(probes),
            "rms_log_error_before": float(np.sqrt(np.mean(before ** 2))),
            "rms_log_error": float(np.sqrt(np.mean(after ** 2))),
            "residual_pct": {p["name"]: round(100 * (math.exp(v) - 1), 1) for p, v in zip(probes, after)}}


GRID_FIELDS = ("grid_reuse_center", "grid_reuse_halfwidth", "grid_drift_miss", "grid_drift_exponent",
               "grid_desync_exponent", "grid_drift_sharers")


def harness_grid_reads(spec: HwSpec, m: int, n: int, k: int, reuse=None) -> float:
    """A + B bytes the model gives one standalone fp16 GEMM grid of the harness's tile (128 x 128,
    64 x 128 for M <= 64; validate.codegen.choose_gemm_tile) with every wave at WAVE_CTAS."""
    from kitsune_dse.cost.gemm_l2 import WAVE_CTAS, grid_reads, grid_reuse
    tile_m = 64 if m <= 64 else 128
    return float(sum(grid_reads(m, n, k, tile_m, 128, 2, WAVE_CTAS, spec.l2_usable_bytes,
                                reuse=grid_reuse(spec) if reuse is None else tuple(reuse))))


def fit_grid_reuse(spec: HwSpec, rows: list[dict]) -> dict:
    """Fit the spec's grid_* fields (cost.gemm_l2: the drift of a GEMM grid's waves) to the DRAM
    reads ncu measured on standalone GEMM grids (rows: m, n, k, read_bytes; bench/dram_probe.py
    gemm-*, none of them a suite GEMM), on the log ratio of predicted to measured."""
    if not rows:
        raise ValueError("no GEMM grid measurements")
    meas = np.array([r["read_bytes"] for r in rows], dtype=float)

    def resid(x):
        # drift in percent, so that every parameter is of order one for the solver
        reuse = (x[0], x[1], x[2] / 100.0, x[3], x[4], x[5])
        return np.log(np.array([harness_grid_reads(spec, r["m"], r["n"], r["k"], reuse) for r in rows]) / meas)

    e = spec.efficiency
    x_spec = np.array([e.grid_reuse_center, e.grid_reuse_halfwidth, 100.0 * e.grid_drift_miss,
                       e.grid_drift_exponent, e.grid_desync_exponent, e.grid_drift_sharers])
    before = resid(x_spec)
    lo, hi = [0.3, 0.01, 0.0, 0.0, 0.0, 1.0], [4.0, 3.0, 50.0, 4.0, 2.0, 300.0]
    # the ramp and the sharers' cap are piecewise linear: the best of a grid of starts is kept
    starts = [np.array([c, h, 0.05, 1.9, 0.5, s]) for c in (0.8, 1.0, 1.3, 1.6) for h in (0.1, 0.3, 0.6)
              for s in (4.0, 16.0, 64.0)]
    best = None
    for x0 in starts:
        r = least_squares(resid, x0, bounds=(lo, hi))
        if best is None or r.cost < best.cost - 1e-12:
            best = r
    x = best.x
    after = resid(x)
    fitted = dict(zip(GRID_FIELDS, (float(x[0]), float(x[1]), float(x[2]) / 100.0, float(x[3]), float(x[4]),
                                    float(x[5]))))
    return {**fitted, "points": len(rows),
            "rms_log_error_before": float(np.sqrt(np.mean(before ** 2))),
            "rms_log_error": float(np.sqrt(np.mean(after ** 2))),
            "mape_pct": float(100 * np.mean(np.abs(np.exp(after) - 1))),
            "residual_pct": {f"{r['m']}x{r['n']}x{r['k']}": round(100 * (math.exp(v) - 1), 1)
                             for r, v in zip(rows, after)}}


def library_reads(spec: HwSpec, graph, ops) -> float:
    """DRAM bytes read by the cublas baseline of a region (cost.strategies.library_bsp's kernels:
    the library's plain product, then the bias added by a kernel of its own), traffic only."""
    from kitsune_dse.cost.region import Region, kernel_works
    from kitsune_dse.cost.strategies import BIAS_SUFFIX, bsp_groups, unfused_bias
    g = unfused_bias(graph)
    names = {op.name for op in g.ops}
    sub = Region.of(g, [x for o in ops for x in (o, o + BIAS_SUFFIX) if x in names])
    return float(sum(w.dram_read_bytes for w in kernel_works(sub, bsp_groups(sub), spec)))


def fit_library_read_grid(spec: HwSpec, probes: list[dict]) -> dict:
    """The grids a GEMM library's standalone kernels read their operands with (the spec's
    gemm_read_grids): one tile that cuBLAS offers (128 x 128, 128 x 256, 256 x 128) at one or two
    CTAs per SM up to a bound on M, another above it, chosen as the pair and bound whose reads
    come nearest ncu's on the probes (rows: name, graph, ops, read_bytes; bench/dram_probe.py
    gemm-*, variant cublas), by rms log error; one grid for all M where a pair gains nothing."""
    if not probes:
        raise ValueError("no library GEMM measurements")
    meas = np.array([p["read_bytes"] for p in probes], dtype=float)
    rows_m = [max(t.shape[0] for t in (p["graph"].tensors[p["graph"].op(o).inputs[0]] for o in p["ops"]))
              for p in probes]

    def reads_with(grid):   # one grid for every probe: its reads (memoised per grid)
        sp = spec.model_copy(update={"gemm_read_grids": [(2 ** 31 - 1, *grid)]})
        return np.array([library_reads(sp, p["graph"], p["ops"]) for p in probes])

    def err(pred):
        return np.log(pred / meas)

    def rms(v):
        return float(np.sqrt(np.mean(v ** 2)))
    before = err(np.array([library_reads(spec, p["graph"], p["ops"]) for p in probes]))
    cands = [(tm, tn, c * spec.sm_count) for tm, tn in ((128, 128), (128, 256), (256, 128)) for c in (1, 2)]
    table = {c: reads_with(c) for c in cands}
    best = min(((rms(err(table[c])), [(2 ** 31 - 1, *c)]) for c in cands), key=lambda x: x[0])
    for bound in sorted(set(rows_m))[:-1]:
        low = np.array([m <= bound for m in rows_m])
        for lo_g in cands:
            for hi_g in cands:
                if lo_g != hi_g:
                    r = rms(err(np.where(low, table[lo_g], table[hi_g])))
                    if r < best[0] - 1e-9:
                        best = (r, [(bound, *lo_g), (2 ** 31 - 1, *hi_g)])
    grids = best[1]
    after = err(np.array([library_reads(spec.model_copy(update={"gemm_read_grids": grids}), p["graph"], p["ops"])
                          for p in probes]))
    return {"gemm_read_grids": [list(g) for g in grids], "points": len(probes),
            "rms_log_error_before": rms(before), "rms_log_error": rms(after),
            "mape_pct": float(100 * np.mean(np.abs(np.exp(after) - 1))),
            "rms_log_error_one_grid": {"x".join(map(str, c)): round(rms(err(table[c])), 4) for c in cands},
            "residual_pct": {p["name"]: round(100 * (math.exp(v) - 1), 1) for p, v in zip(probes, after)}}


RESIDUE_FIELDS = ("l2_recent_fraction", "l2_dirty_fraction")


def sequence_dram_bytes(spec: HwSpec, graph, ops, kernels) -> tuple[float, float]:
    """(read, write) DRAM bytes the model gives a kernel sequence (cost.region.kernel_works) as
    one ncu range sees it: the writes still dirty in L2 at its end left out."""
    from kitsune_dse.cost.region import Region, kernel_works
    works = kernel_works(Region.of(graph, list(ops)), [tuple(k) for k in kernels], spec)
    return (sum(w.dram_read_bytes for w in works),
            sum(w.dram_write_bytes - w.deferred_write_bytes for w in works))


def fit_dirty_residue(spec: HwSpec, rows: list[dict]) -> dict:
    """Fit efficiency.l2_recent_fraction and l2_dirty_fraction (cost.reuse.dirty_residue) to the
    DRAM write bytes ncu measured on kernel sequences (rows: graph, ops, kernels, write_bytes;
    bench/dram_probe.py seq-*, none a suite size), least squares in bytes: the residue is a few
    MB whatever the sequence writes. The residue is piecewise linear in both: the best of a grid,
    then refined."""
    if not rows:
        raise ValueError("no kernel-sequence measurements")
    meas = np.array([r["write_bytes"] for r in rows], dtype=float)

    def resid(x):
        s = spec.model_copy(update={"efficiency": spec.efficiency.model_copy(
            update=dict(zip(RESIDUE_FIELDS, (float(x[0]), float(x[1])))))})
        return np.array([sequence_dram_bytes(s, r["graph"], r["ops"], r["kernels"])[1] for r in rows]) - meas

    before = resid([0.0, 0.0])
    grid = [(a, b) for a in np.arange(0.3, 1.51, 0.1) for b in np.arange(0.1, 0.71, 0.05)]
    x0 = min(grid, key=lambda x: float(np.sum(resid(x) ** 2)))
    r = least_squares(resid, np.array(x0), bounds=([0.0, 0.0], [2.0, 1.0]), diff_step=0.02)
    x = r.x if r.cost <= 0.5 * float(np.sum(resid(x0) ** 2)) else np.array(x0)
    after = resid(x)
    return {"l2_recent_fraction": float(x[0]), "l2_dirty_fraction": float(x[1]), "points": len(rows),
            "rms_write_error_bytes_before": float(np.sqrt(np.mean(before ** 2))),
            "rms_write_error_bytes": float(np.sqrt(np.mean(after ** 2))),
            "residual_MB": {r["name"]: round(v / 1e6, 2) for r, v in zip(rows, after)}}
