"""Fit what a persistent pipeline's L2 keeps (cost.l2_residency) to DRAM bytes measured with ncu
on probe pipelines (bench/dram_probe.py: none of them a validation-suite plan).

Fitted: efficiency.l2_weight_share, l2_writeback_onset, l2_writeback_full and
l2_resident_reread, on the log ratio of predicted to measured read + write bytes.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import least_squares

from kitsune_dse.hw.spec import HwSpec

FIELDS = ("l2_weight_share", "l2_writeback_onset", "l2_writeback_full", "l2_resident_reread")


def pipeline_dram_bytes(spec: HwSpec, graph, choice) -> tuple[float, float]:
    """(read, write) DRAM bytes the pipeline model gives one probe's region (no timing)."""
    from kitsune_dse.cost.pipeline import plan_stages, stage_works
    from kitsune_dse.cost.region import Region
    region = Region.of(graph, [o for st in choice.stages for o in st])
    _, tot = stage_works(region, spec, plan_stages(region, spec, choice.normalized()))
    return tot["dram_read_bytes"], tot["dram_write_bytes"]


def _with(spec: HwSpec, x) -> HwSpec:
    share, onset, span, reread = (float(v) for v in x)
    eff = spec.efficiency.model_copy(update={
        "l2_weight_share": share, "l2_writeback_onset": onset,
        "l2_writeback_full": min(1.0, onset + span), "l2_resident_reread": reread})
    return spec.model_copy(update={"efficiency": eff})


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
    x0 = np.array([e.l2_weight_share, e.l2_writeback_onset, e.l2_writeback_full - e.l2_writeback_onset,
                   e.l2_resident_reread])
    before = resid(x0)
    # the write-back ramp is piecewise linear: least squares from one start stops where another
    # start goes on; the best of a small grid of starts (the spec's own among them) is kept
    starts = [x0] + [np.array(x) for x in itertools.product((0.6, 0.8), (0.3, 0.4), (0.3, 0.5), (0.3, 0.6))]
    best = None
    for x_start in starts:
        r = least_squares(resid, x_start, bounds=([0.05, 0.05, 0.05, 0.0], [1.0, 0.95, 1.0, 4.0]),
                          diff_step=0.03, x_scale=[0.2, 0.1, 0.1, 0.2])
        if best is None or r.cost < best.cost - 1e-12:
            best = r
    x = best.x
    x[2] = min(x[2], 1.0 - x[1])
    after = resid(x)
    fitted = dict(zip(FIELDS, (float(x[0]), float(x[1]), float(x[1] + x[2]), float(x[3]))))
    return {**fitted, "points": len(probes),
            "rms_log_error_before": float(np.sqrt(np.mean(before ** 2))),
            "rms_log_error": float(np.sqrt(np.mean(after ** 2))),
            "residual_pct": {p["name"]: round(100 * (math.exp(v) - 1), 1) for p, v in zip(probes, after)}}

