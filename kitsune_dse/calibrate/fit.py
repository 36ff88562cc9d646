"""Fit a spec's efficiency parameters to microbenchmark measurements (no GPU needed).

Only microbenchmarks feed the fit (never the validation suite's own runs), so the accuracy
report measures prediction, not memorisation.
"""
from __future__ import annotations

import datetime as _dt
import json
import math

import numpy as np
from scipy.optimize import least_squares

from kitsune_dse.graph.ir import DTYPE_BYTES
from kitsune_dse.hw.spec import HwSpec, spec_from_dict


def saturating(s, per_sm, bmax, p):
    s = np.asarray(s, dtype=float)
    return ((s * per_sm) ** -p + bmax ** -p) ** (-1.0 / p)


def fit_saturating(points) -> dict:
    """Fit B(s) = ((s*b)^-p + Bmax^-p)^(-1/p) to (sms, bytes/s) points in log space."""
    s = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    b0 = float(np.max(y[s == s.min()] / s.min()))
    x0 = np.log([b0, float(y.max()), 3.0])

    def resid(x):
        per_sm, bmax, p = np.exp(x)
        return np.log(saturating(s, per_sm, bmax, p)) - np.log(y)

    r = least_squares(resid, x0, bounds=(np.log([1e6, 1e9, 0.5]), np.log([1e13, 1e15, 20.0])))
    per_sm, bmax, p = (float(v) for v in np.exp(r.x))
    rel = saturating(s, per_sm, bmax, p) / y - 1
    return {"per_sm_Bps": per_sm, "max_Bps": bmax, "exponent": p,
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))),
            "max_rel_error": float(np.max(np.abs(rel)))}


def persistent_outside_s(raw: dict) -> float | None:
    """The median over the one-stage persistent microbenchmarks of their time outside the
    workers' span: the pipe rows' `outside_s` (calibrations since the thirty-first session), or
    the raw file's `persistent_outside` rows added from bench/step_trace_probe.py --gaps."""
    # behind the L2 flush only: a warm run's start event waits on the host's launch
    xs = [r["outside_s"] for r in raw.get("pipe_rows", []) if r.get("outside_s") and r.get("l2_flushed", True)]
    if not xs:
        xs = [r["event_s"] - r["span_s"] for r in (raw.get("persistent_outside") or {}).get("rows", [])]
    return float(np.median(xs)) if xs else None


def calibrated_spec(base: HwSpec, m: dict, date: str | None = None,
                    stage_bandwidth: bool = False) -> tuple[HwSpec, dict]:
    """A copy of `base` with fitted efficiency parameters and the calibration provenance."""
    # the harness's own persistent-kernel stage (m["pipe_ew_sms"], when measured) is what its
    # kernels reach from a given number of SMs; the plain streaming read is the cuBLAS-like ceiling
    hbm_points = m["pipe_ew_sms"] if (stage_bandwidth and m.get("pipe_ew_sms")) else m["hbm_read"]
    hbm = fit_saturating(hbm_points)
    l2 = fit_saturating(m["l2_read"])
    data = base.model_dump(mode="python")
    eff = dict(data["efficiency"])
    eff["hbm"] = min(1.0, hbm["max_Bps"] / base.hbm_bandwidth_Bps)
    if hbm["max_Bps"] > base.hbm_bandwidth_Bps:
        data["hbm_bandwidth_Bps"] = hbm["max_Bps"]
    data["hbm_per_sm_bandwidth_Bps"] = hbm["per_sm_Bps"]
    eff["hbm_saturation_exponent"] = hbm["exponent"]
    if l2["max_Bps"] > base.l2_bandwidth_Bps:
        data["l2_bandwidth_Bps"] = l2["max_Bps"]
    eff["l2"] = min(1.0, l2["max_Bps"] / data["l2_bandwidth_Bps"])
    data["l2_per_sm_bandwidth_Bps"] = l2["per_sm_Bps"]
    fp32_peak = base.simt_peak_flop_per_s.get("fp32")
    if fp32_peak and m.get("fp32_flop_per_s"):
        eff["simt"] = min(1.0, m["fp32_flop_per_s"] / fp32_peak)
    gemm_best = max((r for _, r in m.get("gemm_fp16", [])), default=None)
    if gemm_best and base.tensor_peak_flop_per_s.get("fp16"):
        eff["tensor_core"] = min(1.0, gemm_best / base.tensor_peak_flop_per_s["fp16"])
    if m.get("tile_gemm_fp16"):
        # the harness's own GEMM tile: what pipelines and one-kernel-per-op baselines run
        eff["tensor_core"] = min(1.0, max(r for _, r in m["tile_gemm_fp16"])
                                 / base.tensor_peak_flop_per_s["fp16"])
    launch = m.get("launch", {})
    if launch:
        data["launch_overhead_s"] = launch["launch_overhead_s"]
        if launch.get("launch_first_s"):
            data["launch_first_s"] = launch["launch_first_s"]
        data["graph_launch_overhead_s"] = launch["graph_launch_overhead_s"]
        data["kernel_gap_s"] = max(launch["graph_launch_overhead_s"],
                                   launch["eager_per_kernel_s"] - launch["launch_overhead_s"])
    if m.get("sync_latency_s"):
        data["sync_latency_s"] = m["sync_latency_s"]
    if m.get("persistent_launch_s"):
        data["persistent_launch_s"] = m["persistent_launch_s"]
    if m.get("persistent_launch_outside_s"):
        data["persistent_launch_outside_s"] = m["persistent_launch_outside_s"]
    l2_res = fit_l2_residency(m["l2_residency"], base.l2_bytes) if m.get("l2_residency") else None
    if l2_res:
        eff["l2_usable_fraction"] = l2_res["l2_usable_fraction"]
    data["efficiency"] = eff
    data["name"] = f"{base.name}.calibrated"
    dev = m.get("device", {})
    residuals = {"hbm_rms_rel_error": hbm["rms_rel_error"], "hbm_max_rel_error": hbm["max_rel_error"],
                 "l2_rms_rel_error": l2["rms_rel_error"], "l2_max_rel_error": l2["max_rel_error"]}
    data["calibration"] = {
        "base_spec": base.name, "device": dev.get("device"), "driver": dev.get("driver"),
        "runtime": dev.get("runtime"), "cupy": dev.get("cupy"),
        "sm_clock_Hz": dev.get("sm_clock_Hz"), "date": date or _dt.date.today().isoformat(),
        "hbm_curve_source": "harness persistent-stage microbenchmark (pipe_ew_sms)"
        if hbm_points is not m["hbm_read"] else "streaming-read microbenchmark (hbm_read)",
        "method": "microbenchmarks only (HBM/L2 read vs SMs, FP32 FMA loop, cuBLAS GEMM, "
                  "launch overhead eager and in a CUDA graph, flag ping-pong, L2 residency vs size)",
        **residuals}
    if l2_res:
        data["calibration"]["l2_residency_capacity_bytes"] = l2_res["capacity_bytes"]
    if dev.get("sm_count") and dev["sm_count"] != base.sm_count:
        data["sm_count"] = dev["sm_count"]
    spec = spec_from_dict(data, "calibration")
    return spec, residuals


def fit_l2_residency(rows: list[dict], l2_bytes: float, key: str = "hit_reread") -> dict:
    """The L2 capacity that keeps data for the next kernel: the size at which the share of a
    re-read tensor found in L2 (microbench.Bench.l2_residency) falls through one half, linearly
    interpolated between the sizes measured; as a fraction of the L2 (l2_usable_fraction).
    Measured on the H100: re-read data holds to ~24 MiB and is mostly gone by 32 MiB, written
    data holds longer (the residency rule of cost.region counts neither the consumer's own other
    traffic nor which kernel wrote the bytes, so it takes the re-read curve)."""
    pts = sorted((float(r["bytes"]), float(r[key])) for r in rows if r.get(key) is not None)
    if not pts:
        raise ValueError("no L2 residency measurements")
    cap = pts[-1][0]
    for (b0, h0), (b1, h1) in zip(pts, pts[1:]):
        if h0 >= 0.5 > h1:
            cap = b0 + (b1 - b0) * (h0 - 0.5) / (h0 - h1)
            break
    else:
        if pts[0][1] < 0.5:
            cap = pts[0][0]
    return {"capacity_bytes": cap, "l2_usable_fraction": min(1.0, cap / l2_bytes), "curve": key,
            "points": len(pts)}


def fit_kernel_chain(rows: list[dict], key: str = "graph_s") -> dict:
    """Chains of N tiny kernels (rows: dims (rows, cols, N) and their time): T(N) = a + N b by
    least squares. a is once per launch (the first kernel's wait), b each kernel's marginal
    cost (its node gap, ramp and tail, and its own few bytes)."""
    pts = sorted((float(r["dims"][2]), float(r[key])) for r in rows if r.get(key))
    if len(pts) < 2:
        raise ValueError("a kernel chain fit needs two chain lengths")
    n = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    b, a = np.polyfit(n, t, 1)
    rel = (a + b * n) / t - 1
    return {"latency_s": float(max(0.0, a)), "per_kernel_s": float(b),
            "max_rel_error": float(np.max(np.abs(rel))), "points": len(pts)}


def fit_region_boundaries(rows: list[dict]) -> dict:
    """Region A then region B on one stream against each alone (bench/region_boundary.py):
    hidden = a + b - ab is what B's run hides of its own launch behind A's. One figure for every
    kind of boundary (graph or persistent kernel on either side: the H100's cases differ by
    less than their noise, 0.2-1.3 us), their median; per kind for the record."""
    pts = [(str(r.get("label", "")), float(r["a_s"]) + float(r["b_s"]) - float(r["ab_s"]))
           for r in rows if r.get("ab_s") and r.get("correct", True)]
    if not pts:
        raise ValueError("no region-boundary case was measured")
    hidden = np.array([h for _, h in pts])
    by_kind: dict[str, list[float]] = {}
    for k, h in pts:
        by_kind.setdefault(k, []).append(h)
    return {"region_boundary_hidden_s": float(max(0.0, np.median(hidden))), "points": len(pts),
            "min_s": float(hidden.min()), "max_s": float(hidden.max()),
            "median_by_kind_s": {k: float(np.median(v)) for k, v in sorted(by_kind.items())}}


def check_finite(m: dict) -> None:
    for key in ("hbm_read", "l2_read"):
        for s, v in m[key]:
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{key} at {s} SMs is {v}")


def one_stage_time(spec: HwSpec, kind: str, dims, sms: int, dtype: str = "fp16", rows: int = 128,
                   teams: int | None = None) -> float:
    """The model's time of a one-stage persistent pipeline kernel of a microbenchmark case
    (validate.microbench.case_model: a GEMM (m, n, k), a row op (rows, cols), a chain of GEMMs
    (rows, width, layers): its ops the stage's steps) on `sms` SMs, `rows`-row blocks, as the
    explorer prices a pipeline stage; `teams` per CTA as measured (None: as the harness
    chooses by default, cost.pipeline.solo_team_fits)."""
    return _one_stage(spec, kind, dims, sms, dtype, rows, teams).latency_s


def one_stage_teams(spec: HwSpec, kind: str, dims, sms: int, dtype: str = "fp16", rows: int = 128) -> int:
    """The teams per SM the harness runs that kernel with (cost.pipeline.solo_team_fits)."""
    return _one_stage(spec, kind, dims, sms, dtype, rows).breakdown["teams_per_sm"]


def _one_stage(spec: HwSpec, kind: str, dims, sms: int, dtype: str, rows: int, teams: int | None = None):
    from kitsune_dse.cost.pipeline import PipelineChoice, pipeline
    from kitsune_dse.cost.region import Region
    from kitsune_dse.validate.microbench import case_model
    g, _ = case_model(kind, dtype, tuple(dims))
    ops = tuple(o.name for o in g.ops)
    return pipeline(Region.of(g), spec, PipelineChoice((ops,), (sms,), rows, teams=teams))


def ring_pair_time(spec: HwSpec, kind: str, dims, sms, dtype: str = "fp16", rows: int = 128,
                   depth: int = 8, teams: int | None = None) -> float:
    """The model's time of a microbenchmark case as a pipeline of one stage per op (`sms`: one
    SM count per op), each handing its output to the next through a ring `depth` tiles deep."""
    from kitsune_dse.cost.pipeline import PipelineChoice, pipeline
    from kitsune_dse.cost.region import Region
    from kitsune_dse.validate.microbench import case_model
    g, _ = case_model(kind, dtype, tuple(dims))
    ops = tuple(o.name for o in g.ops)
    n = len(ops) - 1
    choice = PipelineChoice(tuple((o,) for o in ops), tuple(int(x) for x in sms), rows, (depth,) * n, ("row",) * n,
                            teams)
    return pipeline(Region.of(g), spec, choice).latency_s


def _teams_tag(r: dict) -> str:
    """A case name's suffix for a row measured at a named team count (twins of one kernel)."""
    return f"/{r['teams']}team" if r.get("teams") else ""


def _case_key(r: dict) -> tuple:
    return (json.dumps(r["dims"]), json.dumps(r["sms"]), r.get("tile_rows", 128), r.get("depth", 8), r.get("teams"))


def _fit_one(spec: HwSpec, rows: list[dict], field: str, scale: float, x0: float, lo: float, hi: float,
             time_of, refs: dict[str, str] | None = None) -> dict:
    """Least squares on the relative error of one spec field (in units of `scale`) through the
    model (time_of(spec, row)); the residuals by case. With `refs` (a case's kind -> the kind
    of its reference), a case that has a reference case (same dims, SMs, tile rows, depth: the
    same GEMM without the cost the field prices) is fitted on its increment: the model's time
    less the model's time of the reference, on the reference's measured time. The field then
    prices what the two measurements differ by, not the base kernel's own residual (the GEMM
    fit's, a few percent either way), which a one-parameter fit would otherwise absorb. Cases of
    a reference kind only serve as references."""
    refs = refs or {}
    ref_kinds = set(refs.values()) - set(refs)
    by_key: dict = {}
    for r in rows:      # the first reference of a shape (the label's own before others')
        if r["kind"] in ref_kinds:
            by_key.setdefault((r["kind"],) + _case_key(r), r)
    fitted = [r for r in rows if r["kind"] not in ref_kinds]
    ref_of = [by_key.get((refs.get(r["kind"], ""),) + _case_key(r)) for r in fitted]
    meas = np.array([r["time_s"] for r in fitted], float)

    def with_x(x):
        return spec.model_copy(update={field: float(x) * scale})

    def resid(x):
        sp = with_x(x[0])
        out = []
        for r, ref in zip(fitted, ref_of):
            t = time_of(sp, r)
            if ref is not None:
                t = t - time_of(sp, ref) + ref["time_s"]
            out.append(t)
        return np.array(out) / meas - 1
    fit = least_squares(resid, [x0], bounds=([lo], [hi]), diff_step=1e-3)
    rel = resid(fit.x)
    return {field: float(fit.x[0]) * scale, "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))),
            "max_rel_error": float(np.max(np.abs(rel))), "points": len(fitted),
            **({"fitted_on": "increments over the reference case of the same shape where there is one: "
                + ", ".join(f"{k} over {v}" for k, v in refs.items())} if refs else {}),
            "rel_error_by_case": {f"{r['kind']}{'x'.join(map(str, r['dims']))}@{r['sms']}{_teams_tag(r)}"
                                  + ("" if ref is None else f" over {ref['kind']}"): round(float(e), 3)
                                  for r, ref, e in zip(fitted, ref_of, rel)}}


def fit_concat_stream(spec: HwSpec, rows: list[dict]) -> dict:
    """A persistent concat step's bytes per second per SM and the share of the chip's HBM
    bandwidth its SMs together reach (efficiency.persistent_concat_hbm), from one-stage concat
    kernels on a few SM counts, by least squares on the relative error through the model: the
    runtime's concat loads one input vector per output vector, latency-bound on few SMs, and
    saturates the chip early (a per-SM rate alone missed 5 and 66 SMs by +11% and -12%)."""
    from scipy.optimize import least_squares

    def with_x(x):
        return spec.model_copy(update={
            "persistent_concat_sm_stream_Bps": float(x[0]) * 1e9,
            "efficiency": spec.efficiency.model_copy(update={"persistent_concat_hbm": float(x[1])})})

    meas = np.array([r["time_s"] for r in rows], float)

    def time_of(sp, r):
        return one_stage_time(sp, r["kind"], r["dims"], r["sms"], teams=r.get("teams"))

    def resid(x):
        sp = with_x(x)
        return np.array([time_of(sp, r) for r in rows]) / meas - 1
    x0 = [spec.hbm_per_sm_bandwidth_Bps / 2e9, 0.5]
    if len({r["sms"] for r in rows}) < 2:       # one SM count cannot tell the two apart
        return _fit_one(spec, rows, "persistent_concat_sm_stream_Bps", 1e9, x0[0], 1.0, 1000.0, time_of)
    fit = least_squares(resid, x0, bounds=([1.0, 0.05], [1000.0, 1.0]), diff_step=1e-3)
    e = resid(fit.x)
    return {"persistent_concat_sm_stream_Bps": float(fit.x[0]) * 1e9,
            "persistent_concat_hbm": float(fit.x[1]),
            "efficiency": {"persistent_concat_hbm": float(fit.x[1])},
            "rms_rel_error": float(np.sqrt(np.mean(e ** 2))), "max_rel_error": float(np.max(np.abs(e))),
            "points": len(rows),
            "rel_error_by_case": {f"{r['kind']}{'x'.join(map(str, r['dims']))}@{r['sms']}{_teams_tag(r)}": round(float(v), 3)
                                  for r, v in zip(rows, e)}}


def fit_ring_handoff(spec: HwSpec, rows: list[dict]) -> dict:
    """The one-way hand-off of a row-block through a ring between two stages (release of the
    producer's item, the consumer's poll, the slot's release back), from two-stage pipelines
    whose rings, eight tiles deep, keep the stages waiting on each other."""
    return _fit_one(spec, rows, "ring_handoff_s", 1e-6, spec.sync_latency_s * 1e6, 0.0, 50.0,
                    lambda sp, r: ring_pair_time(sp, r["kind"], r["dims"], r["sms"],
                                                 rows=r.get("tile_rows", 128), depth=r.get("depth", 8),
                                                 teams=r.get("teams")))


def fit_transcendental(spec: HwSpec, rows: list[dict]) -> dict:
    """The SIMT FLOP-equivalents of one special-function evaluation, from one-stage GEMMs with a
    GELU or SiLU epilogue of the shapes the GEMM fit knows, each on its increment over the same
    GEMM with a ReLU epilogue (which has none)."""
    return _fit_one(spec, rows, "transcendental_flops", 1.0, 8.0, 0.0, 1000.0,
                    lambda sp, r: one_stage_time(sp, r["kind"], r["dims"], r["sms"], teams=r.get("teams")), refs=EPILOGUE_REFS)


# a GEMM with a special function in its epilogue -> the same GEMM without (the increment is
# what the function costs)
EPILOGUE_REFS = {"mmgelu": "mmrelu", "mmsilu": "mmrelu", "mmbiasgelu": "mmbias"}


def fused_time(spec: HwSpec, kind: str, dims, dtype: str = "fp16") -> float:
    """The model's time of a microbenchmark case as one standalone fused kernel (the case's
    ops as a fusion region, launched as a CUDA graph)."""
    from kitsune_dse.cost.region import Region
    from kitsune_dse.cost.strategies import fusion
    from kitsune_dse.validate.microbench import case_model
    g, _ = case_model(kind, dtype, tuple(dims))
    return fusion(Region.of(g), spec).latency_s


def fit_standalone_transcendental(spec: HwSpec, rows: list[dict]) -> dict:
    """standalone_transcendental_flops: a special function in a standalone GEMM kernel's
    epilogue, from bench/epilogue_probe.py's fused kernels (rows: kind, dims, fused_s), each
    GELU/SiLU case on its increment over the same GEMM with a ReLU (with a bias: bias + ReLU)."""
    kinds = set(EPILOGUE_REFS) | set(EPILOGUE_REFS.values())
    pts = [{"kind": r["kind"], "dims": r["dims"], "sms": spec.sm_count, "time_s": r["fused_s"]}
           for r in rows if r.get("kind") in kinds and r.get("fused_s") and r.get("fused_correct", True)]
    if not any(p["kind"] in EPILOGUE_REFS for p in pts):
        raise ValueError("no standalone GEMM with a GELU/SiLU epilogue was measured")
    return _fit_one(spec, pts, "standalone_transcendental_flops", 1.0, 30.0, 0.0, 1000.0,
                    lambda sp, r: fused_time(sp, r["kind"], r["dims"]), refs=EPILOGUE_REFS)


def fit_standalone_epilogue_input(spec: HwSpec, rows: list[dict]) -> dict:
    """standalone_epilogue_input_s: a residual read in a standalone GEMM kernel's epilogue, from
    bench/epilogue_probe.py's fused kernels (rows: kind, dims, fused_s), each GEMM + add on its
    increment over the same GEMM alone (so the GEMM fit's own residual stays out), by least
    squares on the relative error of the GEMM + add's time. The lone CTA's share of its SM
    (standalone_lone_share) is the GEMM fit's: the wait costs (1 - share) of it where the other
    CTA computes and all of it where the other CTA waits too (short tiles)."""
    ok = [r for r in rows if r.get("fused_s") and r.get("fused_correct", True)]
    base = {tuple(r["dims"]): r["fused_s"] for r in ok if r["kind"] == "matmul"}
    cases = [r for r in ok if r["kind"] == "mmadd" and tuple(r["dims"]) in base]
    if not cases:
        raise ValueError("no fused GEMM + add kernel beside the same GEMM alone was measured")
    meas = np.array([r["fused_s"] for r in cases], float)

    def resid(x):
        sp = spec.model_copy(update={"standalone_epilogue_input_s": float(x[0]) * 1e-6})
        t = [fused_time(sp, "mmadd", r["dims"]) - fused_time(sp, "matmul", r["dims"]) + base[tuple(r["dims"])]
             for r in cases]
        return np.array(t) / meas - 1
    fit = least_squares(resid, [2.0], bounds=([0.0], [50.0]), diff_step=1e-3)
    rel = resid(fit.x)
    return {"standalone_epilogue_input_s": float(fit.x[0]) * 1e-6,
            "standalone_lone_share": spec.standalone_lone_share,
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))), "max_rel_error": float(np.max(np.abs(rel))),
            "points": len(cases), "fitted_on": "increments of mmadd over matmul of the same shape",
            "rel_error_by_case": {f"mmadd{'x'.join(map(str, r['dims']))} over matmul": round(float(e), 3)
                                  for r, e in zip(cases, rel)}}


def standalone_time(spec: HwSpec, kind: str, dims, dtype: str = "fp16") -> float:
    """The model's time of a microbenchmark case as one-op standalone kernels (a bsp region
    launched as a CUDA graph: bench/rowop_probe.py's kernels)."""
    from kitsune_dse.cost.region import Region
    from kitsune_dse.cost.strategies import LaunchChoice, bsp
    from kitsune_dse.validate.microbench import case_model
    g, _ = case_model(kind, dtype, tuple(dims))
    return bsp(Region.of(g), spec, LaunchChoice("graph")).latency_s


def fit_standalone_norm(spec: HwSpec, rows: list[dict]) -> dict:
    """standalone_norm_stream_share: a standalone layernorm kernel that keeps its rows in
    registers, 8 vectors a thread, at half a streaming kernel's occupancy; from
    bench/rowop_probe.py's kernels (rows: kind, dims, time_s), each such layernorm on its
    increment over the softmax of the same shape (same bytes, same row tile, two CTAs per SM)."""
    from kitsune_dse.cost.region import WIDE_ROW_VECTORS, cached_row_vectors
    pts = [{"kind": r["kind"], "dims": list(r["dims"]), "sms": spec.sm_count, "time_s": r["time_s"]}
           for r in rows if r.get("time_s") and r.get("correct", True) and r.get("kind") in ("layernorm", "softmax")
           and cached_row_vectors(r["dims"][-1]) >= WIDE_ROW_VECTORS]
    if not any(p["kind"] == "layernorm" for p in pts):
        raise ValueError("no standalone layernorm of 2,048 columns or more was measured")
    return _fit_one(spec, pts, "standalone_norm_stream_share", 1.0, 0.9, 0.2, 1.0,
                    lambda sp, r: standalone_time(sp, r["kind"], r["dims"]), refs={"layernorm": "softmax"})


def fit_epilogue_vector(spec: HwSpec, rows: list[dict]) -> dict:
    """Per tile (128 columns) and vector a persistent GEMM's epilogue reads (a bias): one-stage
    GEMMs with a bias, each on its increment over the same GEMM without (cases with no such
    reference are left out: their total would carry the GEMM fit's own residual)."""
    keys = {_case_key(r) for r in rows if r["kind"] == "matmul"}
    rows = [r for r in rows if r["kind"] == "matmul" or (r["kind"] == "mmbias" and _case_key(r) in keys)]
    if not any(r["kind"] == "mmbias" for r in rows):
        raise ValueError("no GEMM with a bias beside the same GEMM without")
    return _fit_one(spec, rows, "epilogue_vector_s", 1e-6, 0.5, 0.0, 50.0,
                    lambda sp, r: one_stage_time(sp, r["kind"], r["dims"], r["sms"], teams=r.get("teams")), refs={"mmbias": "matmul"})


def fit_epilogue_input(spec: HwSpec, rows: list[dict]) -> dict:
    """Per tile and full input a persistent GEMM's epilogue reads (a residual add): one-stage
    GEMMs with one, of four shapes, each on its increment over the same GEMM without."""
    return _fit_one(spec, rows, "epilogue_input_s", 1e-6, 1.0, 0.0, 50.0,
                    lambda sp, r: one_stage_time(sp, r["kind"], r["dims"], r["sms"], teams=r.get("teams")), refs={"mmadd": "matmul"})


def _fit_narrow_saving(spec: HwSpec, rows: list[dict], field: str, key, time_of, name_of, what: str) -> dict:
    """Fit a narrow-tile saving `field` on the GEMMs narrower than the tile, each on its
    increment over its reference (the row of the same `key` a full tile wide, measured beside
    it), so that the reference's own model error does not leak into the saving."""
    full = {key(r): r for r in rows if r["dims"][1] >= 128}
    narrow = [r for r in rows if r["dims"][1] < 128 and key(r) in full]
    if not narrow:
        raise ValueError(f"no {what} narrower than its tile beside the same GEMM a full tile wide")
    meas = np.array([r["time_s"] for r in narrow], float)

    def resid(x):
        sp = spec.model_copy(update={field: float(x[0])})
        return np.array([time_of(sp, r) - time_of(sp, full[key(r)]) + full[key(r)]["time_s"]
                         for r in narrow]) / meas - 1
    fit = least_squares(resid, [0.2], bounds=([0.0], [1.0]), diff_step=1e-3)
    rel = resid(fit.x)
    return {field: float(fit.x[0]),
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))), "max_rel_error": float(np.max(np.abs(rel))),
            "points": len(narrow), "fitted_on": "increments over the same GEMM with N = 128",
            "rel_error_by_case": {name_of(r): round(float(e), 3) for r, e in zip(narrow, rel)}}


def fit_narrow_tile(spec: HwSpec, rows: list[dict]) -> dict:
    """The share of a persistent GEMM tile's time a product narrower than the tile saves
    (roofline._narrow_tile_share): one-stage GEMMs of N = 8 and 64, each on its increment over
    the same kind, M, K, SMs and tile rows at N = 128 (its reference, measured beside it)."""
    def key(r):
        m, n, k = r["dims"]
        return (r["kind"], m, k, json.dumps(r["sms"]), r.get("tile_rows", 128), r.get("teams"))
    return _fit_narrow_saving(
        spec, rows, "persistent_narrow_tile_saving", key,
        lambda sp, r: one_stage_time(sp, r["kind"], r["dims"], r["sms"], rows=r.get("tile_rows", 128),
                                     teams=r.get("teams")),
        lambda r: f"{r['kind']}{'x'.join(map(str, r['dims']))}@{r['sms']}/{r.get('tile_rows', 128)}",
        "persistent GEMM")


def fit_standalone_narrow_tile(spec: HwSpec, rows: list[dict]) -> dict:
    """standalone_narrow_tile_saving: the same saving in the standalone fused GEMM kernel (what
    bsp and fusion regions launch), from bench/narrow_probe.py (rows: kind, dims, time_s), each
    case narrower than the tile on its increment over the same kind, M and K at N = 128."""
    return _fit_narrow_saving(
        spec, [r for r in rows if r.get("time_s") and r.get("correct", True)],
        "standalone_narrow_tile_saving", lambda r: (r["kind"], r["dims"][0], r["dims"][2]),
        lambda sp, r: fused_time(sp, r["kind"], r["dims"]),
        lambda r: f"{r['kind']}{'x'.join(map(str, r['dims']))}", "standalone GEMM")


def fit_row_load(spec: HwSpec, rows: list[dict]) -> dict:
    """How much a row-op stage's stream slows as the chip loads: two-stage pipelines of a GEMM
    feeding a softmax through a ring (attention's scores), against the row op alone."""
    return _fit_one(spec, rows, "persistent_row_load_slowdown", 1.0, 0.5, 0.0, 20.0,
                    lambda sp, r: ring_pair_time(sp, r["kind"], r["dims"], r["sms"],
                                                 rows=r.get("tile_rows", 128), depth=r.get("depth", 8),
                                                 teams=r.get("teams")))


def persistent_gemm_time(spec: HwSpec, m: int, n: int, k: int, sms: int, dtype: str = "fp16",
                         rows: int = 128, teams: int | None = None) -> float:
    return one_stage_time(spec, "matmul", (m, n, k), sms, dtype, rows, teams)


def fit_persistent_gemm(spec: HwSpec, rows: list[dict]) -> dict:
    """Fit the persistent runtime's GEMM step to one-stage pipeline microbenchmarks (rows: dims
    (m, n, k), sms, time_s) through the model itself (persistent_gemm_time), by least squares on
    the relative error: its tensor rate, a fixed cost per 128x128 output tile, the DRAM bytes
    per second one SM's tiles stream (cp.async loads of two teams, latency-bound far below what
    a streaming kernel pulls), how much of that stream hides under the math, its ceiling over
    datasheet HBM, the L2 feed every SM's tile loads share (roofline._operand_feed_s) and the p-norm
    exponent it combines with the math by (roofline._with_feed), and the
    A operand's own DRAM stream, a floor with its fill and drain (roofline._a_stream_floor).
    Returns the constants, the residuals and the spec that carries them."""
    peak = spec.tensor_peak_flop_per_s["fp16"]
    meas = np.array([r["time_s"] for r in rows], float)
    # the kernels the harness ran with one team per SM (every item on an SM of its own) carry
    # their lone item's own share; without any, the spec keeps none (persistent_lone_team)
    solo_rows = [r["dims"] for r in rows
                 if (r.get("teams") or one_stage_teams(spec, "matmul", r["dims"], r["sms"],
                                                       rows=r.get("tile_rows", 128))) == 1]

    def with_params(x):
        eff, tile_us, stream_GBps, overlap, hbm, feed_TBps, idle_us, lone, a_share, fill_us, feed_p, solo, load_q = (float(v) for v in x)
        return spec.model_copy(update={
            "gemm_tile_fixed_s": tile_us * 1e-6, "gemm_tile_fixed_idle_s": idle_us * 1e-6,
            "gemm_tile_fixed_load_exponent": load_q, "persistent_gemm_sm_stream_Bps": stream_GBps * 1e9,
            "persistent_gemm_l2_Bps": feed_TBps * 1e12, "persistent_a_stream_fill_s": fill_us * 1e-6,
            "efficiency": spec.efficiency.model_copy(update={
                "persistent_tensor_core": eff, "mem_compute_overlap": overlap, "persistent_gemm_hbm": hbm,
                "persistent_lone_team": lone, "persistent_a_stream_share": a_share,
                "persistent_feed_exponent": feed_p, "persistent_solo_team": solo if solo_rows else None})})

    def resid(x):
        sp = with_params(x)
        return np.array([persistent_gemm_time(sp, *r["dims"], r["sms"], rows=r.get("tile_rows", 128),
                                              teams=r.get("teams"))
                         for r in rows]) / meas - 1
    # the feed cap is a max() beside the math: started above it, it has no gradient, so start
    # from a few feeds below the L2's streaming rate and keep the best
    l2_TBps = spec.l2_bandwidth_Bps * spec.efficiency.l2 / 1e12
    # a GEMM's operand stream never beats the chip's measured streaming ceiling (left free, the
    # fit ran it to the datasheet bandwidth, and two pipeline stages streaming weights at once
    # were priced at 3.35 TB/s together: gpt3 t64's two-stage plan, 986 us against 1,160)
    hbm_max = spec.efficiency.hbm
    # (the A stream's floor, roofline._a_stream_floor, binds only at one column tile on the
    # whole chip: its share starts at 0.6)
    # (and from two overlaps: with the one-team rows and their two-team twins, a start at 0.5
    # stopped in a minimum of rms 5.3% with the A stream's share at 0.76, pricing 65536 x 128 x
    # 1024 on 132 SMs 14% under; from 0.85: rms 4.7%, that case within 1%)
    fit = min((least_squares(resid, [spec.efficiency.tensor_core, 2.0, spec.hbm_per_sm_bandwidth_Bps / 1e9,
                                     ov, 0.95 * hbm_max, f * l2_TBps, 2.0, 0.7, 0.6, 8.0, 4.0, 0.9, q0],
                             bounds=([0.05, 0.0, 1.0, 0.0, 0.2, 0.5, 0.0, 0.5, 0.2, 0.0, 1.0, 0.5, 0.25],
                                     [1.0, 50.0, 500.0, 1.0, hbm_max, 50.0, 50.0, 1.0, 1.0, 50.0, 64.0, 1.0, 8.0]),
                             diff_step=1e-3, max_nfev=150) for f in (0.6, 0.8, 1.0) for ov in (0.5, 0.85)
                 for q0 in (1.0, 3.0)),
              key=lambda r: r.cost)
    rel = resid(fit.x)
    eff, tile_us, stream_GBps, overlap, hbm, feed_TBps, idle_us, lone, a_share, fill_us, feed_p, solo, load_q = (float(v) for v in fit.x)
    return {"persistent_tensor_core": eff, "sm_rate_flop_per_s": eff * peak / spec.sm_count,
            "tile_fixed_s": tile_us * 1e-6, "tile_fixed_idle_s": idle_us * 1e-6,
            "tile_fixed_load_exponent": load_q,
            "persistent_lone_team": lone, "persistent_solo_team": solo if solo_rows else None,
            "solo_team_cases": len(solo_rows), "sm_stream_Bps": stream_GBps * 1e9,
            "mem_compute_overlap": overlap, "persistent_gemm_hbm": hbm,
            "operand_l2_Bps": feed_TBps * 1e12,
            "persistent_a_stream_share": a_share, "a_stream_fill_s": fill_us * 1e-6,
            "persistent_feed_exponent": feed_p,
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))),
            "max_rel_error": float(np.max(np.abs(rel))), "points": len(rows),
            "rel_error_by_case": {f"{'x'.join(map(str, r['dims']))}@{r['sms']}{_teams_tag(r)}"
                                  + (f"/r{r['tile_rows']}" if r.get("tile_rows", 128) != 128 else ""):
                                  round(float(e), 3) for r, e in zip(rows, rel)},
            "spec": with_params(fit.x)}


def fit_concurrent_stream(spec: HwSpec, probes: list[dict]) -> dict:
    """Fit HwSpec.concurrent_stream_Bps and efficiency.producer_stream_share to slab-fed
    weight-streaming pipelines (probes: {"name", "graph", "choice" (PipelineChoice), "time_s"}:
    bench/dram_probe.py ws-pair-*, none a suite plan) through the pipeline model, least squares
    on the relative error from a few starts. Returns both fields, the residuals and their rms
    before (the spec as given) and after."""
    from kitsune_dse.cost.pipeline import pipeline
    from kitsune_dse.cost.region import Region
    if not probes:
        raise ValueError("no weight-streaming probes")
    meas = np.array([p["time_s"] for p in probes], dtype=float)
    regions = [Region.of(p["graph"], [o for st in p["choice"].stages for o in st]) for p in probes]

    def with_params(x):
        rate_TBps, share = (float(v) for v in x)
        return spec.model_copy(update={"concurrent_stream_Bps": rate_TBps * 1e12, "efficiency":
                                       spec.efficiency.model_copy(update={"producer_stream_share": share})})

    def resid(x, sp=None):
        sp = sp or with_params(x)
        return np.array([pipeline(r, sp, p["choice"]).latency_s for r, p in zip(regions, probes)]) / meas - 1
    before = resid(None, spec)
    peak = spec.hbm_bandwidth_Bps / 1e12
    fit = min((least_squares(resid, [f * peak, sh], bounds=([0.2 * peak, 0.3], [peak, 1.0]), diff_step=1e-3)
               for f in (0.5, 0.65, 0.8) for sh in (0.6, 0.8, 0.95)), key=lambda r: r.cost)
    rel = resid(fit.x)
    return {"concurrent_stream_Bps": float(fit.x[0]) * 1e12, "producer_stream_share": float(fit.x[1]),
            "rms_rel_error_before": float(np.sqrt(np.mean(before ** 2))),
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))), "points": len(probes),
            "rel_error_by_probe": {p["name"]: round(float(e), 3) for p, e in zip(probes, rel)}}


def fit_persistent_rows(spec: HwSpec, rows: list[dict]) -> dict:
    """Fit a persistent row-op step (rows: kind, dims (rows, cols), sms, time_s) through the
    model (one_stage_time), least squares on the relative error: the bytes per second one SM
    streams and a fixed cost per item (a team's pass over a few rows; narrow rows make many)."""
    meas = np.array([r["time_s"] for r in rows], float)

    def with_params(x):
        return spec.model_copy(update={"persistent_row_sm_stream_Bps": float(x[0]) * 1e9,
                                       "persistent_row_item_fixed_s": float(x[1]) * 1e-6})

    def resid(x):
        sp = with_params(x)
        return np.array([one_stage_time(sp, r["kind"], r["dims"], r["sms"], teams=r.get("teams"))
                         for r in rows]) / meas - 1
    fit = least_squares(resid, [spec.hbm_per_sm_bandwidth_Bps / 1e9, 0.1], bounds=([0.5, 0.0], [1000.0, 50.0]),
                        diff_step=1e-3)
    rel = resid(fit.x)
    return {"sm_stream_Bps": float(fit.x[0]) * 1e9, "item_fixed_s": float(fit.x[1]) * 1e-6,
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))),
            "max_rel_error": float(np.max(np.abs(rel))), "points": len(rows),
            "rel_error_by_case": {f"{r['kind']}{'x'.join(map(str, r['dims']))}@{r['sms']}{_teams_tag(r)}": round(float(e), 3)
                                  for r, e in zip(rows, rel)}}


def standalone_gemm_time(spec: HwSpec, m: int, n: int, k: int, dtype: str = "fp16") -> float:
    """The model's time of one standalone GEMM kernel C[m,n] = A[m,k] B[k,n] (operands read and
    the result written once), as a bsp kernel is priced: the roofline of the best CTA tile the
    spec's GEMM library offers, plus the per-kernel fixed cost and (one kernel timed alone) the
    launch latency."""
    from kitsune_dse.cost.gemm_l2 import operand_reads
    from kitsune_dse.cost.roofline import KernelWork, best_gemm_tile, gemm_tiles, split_k_partials_bytes
    nbytes = DTYPE_BYTES[dtype]

    def make(tile, ks):
        # operands read from DRAM as kernel_works prices a GEMM: again where later waves miss L2
        reads = (sum(operand_reads(spec, m, n, k, tile, nbytes))
                 if ks == 1 else (m * k + k * n) * nbytes)
        return KernelWork(name="gemm", dtype=dtype, tensor_flops=2.0 * m * n * k,
                          dram_read_bytes=float(reads),
                          dram_write_bytes=float(m * n * nbytes),
                          l2_bytes=split_k_partials_bytes(1, m, n, ks),
                          tiles=gemm_tiles(1, m, n, tile) * ks, tile_shape=tile, split_k=ks,
                          gemm_n=n, gemm_k=k, paired_ctas=tile[1] == 128)
    return best_gemm_tile(make, spec, spec.sm_count, k, m, n)[1] + spec.kernel_fixed_s + spec.launch_latency_cost_s


def fit_standalone_gemm(spec: HwSpec, rows: list[dict], read_overlap: bool = False, pairs: bool = False) -> dict:
    """Fit the standalone GEMM tile's constants to microbenchmarks of single GEMM kernels
    (rows: m, n, k, time_s) through the model itself (standalone_gemm_time), by least squares on
    the relative error: the tensor-core efficiency (its FLOP rate), a fixed cost per 128x128
    output tile, a ramp per kernel, the HBM ceiling of its operand stream (skinny GEMMs are
    bound by it), with `pairs` (the harness's kernel, two CTAs an SM) the tail past the busiest
    SM's whole rounds (gemm_tail_tiles) and a lone CTA's share of its SM
    (standalone_lone_share), and, with `read_overlap`, the p-norm exponent its math and read stream
    combine by (efficiency.gemm_read_overlap_exponent; without, the spec's own stays). Returns
    the constants, the fit's residuals and the spec that carries them."""
    from scipy.optimize import least_squares
    peak = spec.tensor_peak_flop_per_s["fp16"]
    meas = np.array([r["time_s"] for r in rows], float)
    p0 = spec.efficiency.gemm_read_overlap_exponent

    def with_params(x):
        eff, tile_us, ramp_us, hbm = (float(v) for v in x[:4])
        tail, lone = (float(x[4]), float(x[5])) if pairs else (spec.gemm_tail_tiles, spec.standalone_lone_share)
        p = float(x[-1]) if read_overlap else p0
        return spec.model_copy(update={
            "gemm_standalone_tile_fixed_s": tile_us * 1e-6, "gemm_ramp_s": ramp_us * 1e-6,
            "gemm_tail_tiles": tail, "standalone_lone_share": lone,
            "efficiency": spec.efficiency.model_copy(update={"tensor_core": eff, "gemm_hbm": hbm,
                                                             "gemm_read_overlap_exponent": p})})

    def resid(x):
        sp = with_params(x)
        return np.array([standalone_gemm_time(sp, r["m"], r["n"], r["k"]) for r in rows]) / meas - 1
    # its operand stream's ceiling at most the chip's measured streaming one (as the persistent
    # fit's: left free, it ran to the datasheet's)
    x0 = [spec.efficiency.tensor_core, 1.0, 1.0, 0.95 * spec.efficiency.hbm]
    lo, hi = [0.05, 0.0, 0.0, 0.2], [1.0, 50.0, 100.0, spec.efficiency.hbm]
    if pairs:
        x0, lo, hi = x0 + [0.2, 0.75], lo + [0.0, 0.5], hi + [2.0, 1.0]
    if read_overlap:    # (from 1.2: a p near 1 adds the two whole; 40 is the max in effect)
        x0, lo, hi = x0 + [p0 or 3.0], lo + [1.2], hi + [40.0]
    fit = least_squares(resid, x0, bounds=(lo, hi), diff_step=1e-3)
    rel = resid(fit.x)
    eff, tile_us, ramp_us, hbm = (float(v) for v in fit.x[:4])
    tail, lone = (float(fit.x[4]), float(fit.x[5])) if pairs else (spec.gemm_tail_tiles, spec.standalone_lone_share)
    return {"tensor_core": eff, "tensor_flop_per_s": eff * peak,
            "tile_fixed_s": tile_us * 1e-6, "ramp_s": ramp_us * 1e-6, "gemm_hbm": hbm,
            "gemm_hbm_Bps": hbm * spec.hbm_bandwidth_Bps, "tail_tiles": tail, "lone_share": lone,
            "read_overlap_exponent": float(fit.x[-1]) if read_overlap else p0,
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))),
            "max_rel_error": float(np.max(np.abs(rel))), "points": len(rows),
            "rel_error_by_shape": {f"{r['m']}x{r['n']}x{r['k']}": round(float(e), 3)
                                   for r, e in zip(rows, rel)},
            "spec": with_params(fit.x)}


def fit_tile_handoff(spec: HwSpec, rows: list[dict]) -> dict:
    """Per-tile hand-off costs of the harness's tilesync kernels, from probes (rows: kind,
    dims, plain_s, signal_s, both_s: one kernel plain, counting its tiles, and also checking a
    flag before each tile). Through the model's own tile count on the busiest SM (x):
    signal - plain = fixed + x * tile_signal_s (x * tile_signal_shared_s for a kernel of more
    than one CTA per SM) and both - signal = x * tile_wait_s, by non-negative robust least
    squares on the microseconds themselves: the costs add time, not a share of it, and a
    probe's kernel with its hand-offs is compiled anew, so now and then nvcc schedules it a
    few microseconds better or worse than the plain one (layernorm 16384 x 2048 signalling
    ran 1.9 us faster than plain, session 26): a soft-L1 loss with a 1 us scale keeps one
    such case from setting the constants. An element-wise kernel's probes are left out: its
    tilesync form (whole rows per CTA) is another kernel than its plain grid-stride loop, so
    their difference is not a hand-off (NeRF's skip concat: +19 us, 16%, where a concat of two
    512-column halves pays +3.4 us)."""
    from scipy.optimize import least_squares

    from kitsune_dse.cost.region import Region as CRegion
    from kitsune_dse.cost.region import kernel_works
    from kitsune_dse.cost.roofline import busiest_sm_tiles
    from kitsune_dse.graph.ir import OpClass
    from kitsune_dse.validate.microbench import case_model
    same_form = (OpClass.GEMM, OpClass.ROW_REDUCTION)
    kept, left_out, xs, shared = [], [], [], []
    for r in rows:
        g, _ = case_model(r["kind"], "fp16", tuple(r["dims"]))
        if not any(o.info.op_class in same_form for o in g.ops):
            left_out.append(r)
            continue
        w = kernel_works(CRegion.of(g), [(o.name,) for o in g.ops], spec)[0]
        kept.append(r)
        xs.append(float(busiest_sm_tiles(w, spec.sm_count)))
        shared.append(w.ctas_per_sm > 1)
    rows = kept
    xs, shared = np.asarray(xs), np.asarray(shared)
    sig = np.asarray([r["signal_s"] - r["plain_s"] for r in rows])
    both = np.asarray([r["both_s"] - r["signal_s"] for r in rows])
    n = len(rows)
    # unknowns: fixed, signal per tile (one CTA per SM), signal per tile (shared SM), wait per tile
    a = np.zeros((2 * n, 4))
    a[:n, 0] = 1.0
    a[:n, 1] = np.where(shared, 0.0, xs)
    a[:n, 2] = np.where(shared, xs, 0.0)
    a[n:, 3] = xs
    y = np.concatenate([sig, both])
    fit = least_squares(lambda p: a @ p - y * 1e6, x0=np.asarray([1.0, 0.2, 0.05, 0.2]),
                        bounds=(0.0, np.inf), loss="soft_l1", f_scale=1.0, xtol=1e-12, ftol=1e-12)
    sol = fit.x * 1e-6
    pred = a @ sol
    # a class without probes keeps the other's cost (the fit would leave it at 0)
    sol[2] = sol[2] if shared.any() else sol[1]
    sol[1] = sol[1] if (~shared).any() else sol[2]
    return {"fixed_s": float(sol[0]), "tile_signal_s": float(sol[1]), "tile_signal_shared_s": float(sol[2]),
            "tile_wait_s": float(sol[3]), "busiest_sm_tiles": xs.tolist(),
            "shared_sm": shared.tolist(), "signal_extra_s": sig.tolist(), "wait_extra_s": both.tolist(),
            "probes": [f"{r['kind']} {'x'.join(map(str, r['dims']))}" for r in rows],
            "left_out": [f"{r['kind']} {'x'.join(map(str, r['dims']))}: signal - plain "
                         f"{(r['signal_s'] - r['plain_s']) * 1e6:.1f} us" for r in left_out],
            "rms_s": float(np.sqrt(np.mean((pred - y) ** 2)))}


def fit_step_handoff(spec: HwSpec, rows: list[dict]) -> dict:
    """The hand-off between dependent steps of one persistent stage (step_handoff_s), from
    one-stage kernels of GEMM chains (rows: dims (rows, width, layers), sms, tile_rows, time_s)
    through the pipeline model, by bounded least squares on the relative error."""
    from scipy.optimize import minimize_scalar

    def rel(x: float) -> np.ndarray:
        sp = spec.model_copy(update={"step_handoff_s": x * 1e-6})
        return np.array([one_stage_time(sp, r.get("kind", "chain"), r["dims"], r["sms"],
                                        rows=r.get("tile_rows", 128), teams=r.get("teams")) / r["time_s"] - 1
                         for r in rows])
    best = minimize_scalar(lambda x: float(np.sum(rel(x) ** 2)), bounds=(0.0, 50.0), method="bounded")
    e = rel(best.x)
    return {"step_handoff_s": float(best.x) * 1e-6, "rms_rel_error": float(np.sqrt(np.mean(e ** 2))),
            "max_rel_error": float(np.max(np.abs(e))), "points": len(rows),
            "rel_error_by_case": {f"{'x'.join(map(str, r['dims']))}@{r['sms']}{_teams_tag(r)}": round(float(v), 3)
                                  for r, v in zip(rows, e)}}


def fit_tilesync_chains(spec: HwSpec, rows: list[dict]) -> dict:
    """The cost of one tilesync hand-off between kernels beyond its per-tile flags
    (tilesync_handoff_s), from chains of dependent GEMMs run as a CUDA graph and under tilesync
    (rows: kind, dims, graph_s, tilesync_s): what tilesync costs over the graph beyond what the
    model gives it without the term, per hand-off, by least squares on the relative error."""
    from kitsune_dse.cost.region import Region as CRegion
    from kitsune_dse.cost.strategies import bsp, tilesync
    from kitsune_dse.validate.microbench import case_model
    base = spec.model_copy(update={"tilesync_handoff_s": 0.0})
    n, extra, scale = [], [], []
    for r in rows:
        g, _ = case_model(r["kind"], "fp16", tuple(r["dims"]))
        region = CRegion.of(g)
        model = tilesync(region, base).latency_s - bsp(region, base).latency_s
        n.append(len(g.ops) - 1)
        extra.append(r["tilesync_s"] - r["graph_s"] - model)
        scale.append(1.0 / r["graph_s"])
    n, extra, w = np.asarray(n, float), np.asarray(extra), np.asarray(scale) ** 2
    x = max(0.0, float(np.sum(w * n * extra) / max(np.sum(w * n * n), 1e-30)))
    return {"tilesync_handoff_s": x, "handoffs": n.tolist(), "unexplained_s": extra.tolist(),
            "rel_residual": ((extra - n * x) * np.asarray(scale)).round(4).tolist(),
            "chains": [r["dims"] for r in rows]}


HARNESS_KEYS = ("pipe_", "tile_gemm_", "tile_rows", "tilesync_", "kernel_chain_", "boundary_", "epilogue_")


def _unwrapped_before_v8(key: str, row: dict) -> bool:
    """Harness 8 emits a persistent step's item-offset wrap in every stage; before, it was left
    out of steps with at least as many items per row-block as their stage has workers, and nvcc
    scheduled those GEMM main loops worse (7-12% a tile: bench/codegen_probe.py). True for a
    calibration pipe case that had such a step: it ran other code then."""
    if key != "pipe_rows" or "kind" not in row or "dims" not in row or "sms" not in row:
        return False
    from kitsune_dse.validate.lower import Region, layout_pipeline
    from kitsune_dse.validate.microbench import pipe_case_region
    g, region = pipe_case_region(row["kind"], row["dims"], row["sms"], row.get("tile_rows", 128), row.get("depth", 8))
    lay = layout_pipeline(Region(g, region), region)
    return any(lay.steps[s].items >= st.ctas * lay.teams for st in lay.stages for s in st.steps)


# harness versions that changed only some kernels (the rest changed them all): key prefixes
# whose measurements the change made stale, and predicates (key, case) -> stale of single cases.
# 7, a tilesync consumer's threads wait on the unit counters in parallel (only tilesync's waits
# differ); 8, the item-offset wrap in every persistent stage (the one-stage cases that lacked it,
# the sweeps' curves, the epilogue and region-boundary probes' persistent kernels)
HARNESS_CHANGES = {7: ("tilesync_",),
                   8: ("pipe_gemm_fp16_sms", "pipe_ew_sms", "epilogue_", "boundary_", _unwrapped_before_v8)}


def harness_version(raw: dict) -> int:
    return int(raw.get("harness_version", raw.get("persistent_layout", 0)))


def cublas_version(raw: dict) -> int:
    """How the run called cuBLAS: 0 CuPy's matmul for a plain product (37-52 us of host time a
    call, its own cuBLAS entry point), 1 cublasGemmStridedBatchedEx through ctypes for every
    product, as the cublas variants call it since session 11."""
    return int(raw.get("cublas_version", 0))


def _without_cublas(raw: dict) -> dict:
    out = {k: v for k, v in raw.items() if k != "cublas_call_rows"}
    if "tile_gemm_shapes" in out:
        out["tile_gemm_shapes"] = [{k: v for k, v in r.items() if not k.startswith("cublas_")}
                                   for r in out["tile_gemm_shapes"]]
    if "tile_rows" in out:
        out["tile_rows"] = [r for r in out["tile_rows"] if r.get("impl") != "cublas"]
    return out


def merge_raw(raws: list[dict]) -> dict:
    """One raw calibration from several runs (on the machine instances the device lends, whose
    rates differ by a few percent): every measured number is the median over the runs that
    measured it. Cases are matched by their non-numeric fields (label, kind, dims, SM count,
    ...); `[x, value]` curves by x; a case measured in one run only keeps its value. Device and
    environment come from the first run; `merged_from` lists the runs' dates."""
    def is_num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def med(vals):
        return float(np.median(vals))

    def key_of(d: dict):    # what identifies a case: names, shapes, SM counts (not results)
        return tuple((k, json.dumps(v)) for k, v in sorted(d.items())
                     if (isinstance(v, (str, int, list)) and not isinstance(v, bool)
                         and not k.endswith("error") and k != "resources"))

    def merge(vals: list):
        vals = [v for v in vals if v is not None]
        if not vals:
            return None
        first = vals[0]
        if isinstance(first, float) and all(is_num(v) for v in vals):
            return med(vals)
        if isinstance(first, dict):
            keys = list(dict.fromkeys(k for v in vals if isinstance(v, dict) for k in v))
            return {k: merge([v.get(k) for v in vals if isinstance(v, dict)]) for k in keys}
        if isinstance(first, list) and first and all(isinstance(x, list) and len(x) == 2 and is_num(x[1])
                                                     for v in vals for x in v):
            xs = list(dict.fromkeys(x[0] for v in vals for x in v))
            return [[x, med([y for v in vals for xx, y in v if xx == x])] for x in xs]
        if isinstance(first, list) and first and all(isinstance(x, dict) for v in vals for x in v):
            groups: dict = {}
            for v in vals:
                for x in v:
                    groups.setdefault(key_of(x), []).append(x)
            out = []
            for items in groups.values():
                m = {}
                for k in dict.fromkeys(k for it in items for k in it):
                    got = [it[k] for it in items if k in it]
                    if all(isinstance(g, bool) for g in got):
                        m[k] = all(got)
                    elif all(isinstance(g, float) for g in got):
                        m[k] = med(got)
                    else:
                        m[k] = got[0]
                out.append(m)
            return out
        return first
    # the validation harness's own kernels change with it: runs of an older harness (1: the two
    # teams of an SM as consecutive workers; 0: also K split for up to all SMs' tiles) keep
    # only their measurements of the GPU itself (bandwidths, launches, cuBLAS)
    version = max((harness_version(r) for r in raws), default=0)

    def stale(v: int) -> tuple[tuple[str, ...], list]:
        """What the harness changed since version v: the keys whose kernels differ, and the
        predicates of single stale cases."""
        changed = [k for n in range(v + 1, version + 1) for k in HARNESS_CHANGES.get(n, HARNESS_KEYS)]
        return tuple(dict.fromkeys(k for k in changed if isinstance(k, str))), [k for k in changed if callable(k)]

    def current(r: dict) -> dict:
        if harness_version(r) == version:
            return r
        prefixes, cases = stale(harness_version(r))
        out = {k: v for k, v in r.items() if not k.startswith(prefixes)}
        for k, v in out.items():
            if cases and isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                out[k] = [x for x in v if not any(p(k, x) for p in cases)]
        return out
    raws = [current(r) for r in raws]
    # cuBLAS's figures only from the runs that called it as the cublas variants now do
    cv = max((cublas_version(r) for r in raws), default=0)
    raws = [r if cublas_version(r) == cv else _without_cublas(r) for r in raws]
    out = {k: merge([r.get(k) for r in raws]) for k in dict.fromkeys(k for r in raws for k in r)}
    out["cublas_version"] = cv
    out["env"] = raws[0].get("env")
    out["device"] = raws[0].get("device")
    out["merged_from"] = [r.get("env", {}).get("date") for r in raws]
    out["harness_version"] = version
    return out
