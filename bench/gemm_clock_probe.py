"""The SM clock inside each calibration GEMM, timed as the calibration times it (cold L2, behind
the flush, from an idle GPU between runs): is the standalone GEMM fit's shape-by-shape residual
(+2% at 4096^3, +5% at 8192^3, -5% at 2048 x 4096 x 11008) the clock the power manager gives
each shape?

For each shape of bench/calibrate_device.py (SQUARES, SUITE_SHAPES, BALANCE_SHAPES): the
harness's standalone GEMM kernel as a one-kernel CUDA graph, timed cold (CUDA events, as the
calibration's `tile_time_s`), then the same kernel with per-CTA records (a one-kernel tilesync
region built with trace=True: %globaltimer and clock64 at each CTA's start and end) over a few
cold runs. Written: the kernel's span, its cycles over its nanoseconds summed over CTAs (the
mean SM clock while its CTAs ran), and the clock of its first and last quarter of CTAs.

--fit CSV [CSV ...] (here, no GPU): the standalone GEMM fit (calibrate.fit.fit_standalone_gemm,
from the committed calibrated spec) on each run's times as measured, and on the times scaled to
one SM clock (time x MHz / the run's median MHz): how much of the fit's residual the clock takes.

    here:    python bench/gemm_clock_probe.py --precompile
    device:  python3 bench/gemm_clock_probe.py --out $OUT [--runs 30] [--trace-runs 5] [--records]
             (--records: every traced CTA too, gemm_ctas.csv.gz, for bench/gemm_cta_report.py)
    here:    python bench/gemm_clock_probe.py --fit results/validation/h100/clock_probe/cold_gemm_2026-11-24/*.csv
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))


def shapes(spec: str = "") -> list[tuple[int, int, int]]:
    """The calibration's GEMM shapes, or `spec`'s: MxNxK,MxNxK,..."""
    if spec:
        return [tuple(int(x) for x in s.split("x")) for s in spec.split(",")]
    from calibrate_device import BALANCE_SHAPES, SQUARES, SUITE_SHAPES
    out = [(n, n, n) for n in SQUARES] + list(SUITE_SHAPES) + list(BALANCE_SHAPES)
    return list(dict.fromkeys(out))


def variants(info, dims):
    """(graph variant, traced tilesync variant) of one GEMM (sources only until prepared)."""
    from kitsune_dse.validate.lower import Region, fusion_groups
    from kitsune_dse.validate.microbench import case_model
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors, TilesyncVariant
    g, region = case_model("matmul", "fp16", dims)
    region = dict(region, strategy="tilesync", kernels=[[o.name for o in g.ops]])
    reg = Region(g, region)
    tensors = Tensors(reg)
    groups = fusion_groups(reg)
    graph_v = StandaloneVariant("graph", reg, tensors, info, groups, graph=True, prefix="gck")
    traced = TilesyncVariant("traced", reg, tensors, info, groups, "tilesync", trace=True)
    return graph_v, traced


def clock_summary(runs: list) -> dict:
    """Medians over runs of one kernel's CTA records: span (us), mean clock (MHz: cycles over
    nanoseconds summed over CTAs), clock of the first and last quarter of CTAs by start."""
    import numpy as np
    spans, mean, first, last = [], [], [], []
    for v in runs:
        v = v[v[:, 2] > 0].astype(np.int64)
        ns = np.maximum(v[:, 2] - v[:, 0], 1)
        cyc = v[:, 5] - v[:, 4]
        spans.append((v[:, 2].max() - v[:, 0].min()) / 1e3)
        mean.append(cyc.sum() / ns.sum() * 1e3)
        order = np.argsort(v[:, 0])
        q = max(1, len(order) // 4)
        mhz = cyc / ns * 1e3
        first.append(float(np.median(mhz[order[:q]])))
        last.append(float(np.median(mhz[order[-q:]])))
    med = lambda xs: float(np.median(xs))  # noqa: E731
    return {"span_us": med(spans), "mhz_mean": med(mean), "mhz_first_quarter": med(first),
            "mhz_last_quarter": med(last)}


def cta_rows(shape: str, runs: list) -> list[str]:
    """One CSV line per traced CTA: its SM, start and end (ns from the run's first start) and
    SM cycles (the schedule analysis of bench/gemm_schedule.py)."""
    import numpy as np
    out = []
    for r, v in enumerate(runs):
        v = v.astype(np.int64)
        t0 = v[v[:, 2] > 0, 0].min()
        out += [f"{shape},{r},{i},{row[3]},{row[0] - t0},{row[2] - t0},{row[5] - row[4]}\n"
                for i, row in enumerate(v) if row[2] > 0]
    return out


def fit_report(paths: list[str]) -> None:
    """The standalone GEMM fit on each run as measured and at one clock (see the docstring)."""
    import numpy as np

    from kitsune_dse.calibrate.fit import fit_standalone_gemm
    from kitsune_dse.hw import load_spec
    spec = load_spec(ROOT / "hw_specs/h100-sxm.calibrated.yaml")
    for path in paths:
        with open(path) as f:
            rows = list(csv.DictReader(f))
        ref = float(np.median([float(r["mhz_mean"]) for r in rows]))
        for scaled in (False, True):
            shapes = [{"m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"]),
                       "time_s": float(r["time_us"]) * 1e-6 * (float(r["mhz_mean"]) / ref if scaled else 1.0)}
                      for r in rows]
            g = fit_standalone_gemm(spec, shapes, read_overlap=True)
            print(f"{path} {'at ' + format(ref, '.0f') + ' MHz' if scaled else 'as measured'}: "
                  f"rms {g['rms_rel_error']:.2%}, max {g['max_rel_error']:.2%}, "
                  f"{g['tensor_flop_per_s'] / 1e12:.1f} TFLOP/s")
            print("   " + " ".join(f"{k} {v:+.3f}" for k, v in g["rel_error_by_shape"].items()))


def main() -> None:
    if sys.argv[1:2] == ["--fit"]:
        fit_report(sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--trace-runs", type=int, default=5)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--shapes", default="", help="MxNxK,... in place of the calibration's shapes")
    ap.add_argument("--records", action="store_true",
                    help="also write every traced CTA (gemm_ctas.csv.gz: SM, start, end, cycles)")
    a = ap.parse_args()
    if a.precompile:
        from precompile import compile_one

        from kitsune_dse.validate.plan import DeviceInfo
        info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
        cache = ROOT / "bench/.cubin_cache"
        cache.mkdir(parents=True, exist_ok=True)
        for dims in shapes(a.shapes):
            gv, tv = variants(info, dims)
            for v in (gv, tv):
                print(compile_one(v.build(), info.arch, cache), flush=True)
        return
    import cupy as cp

    from kitsune_dse.validate.measure import time_runs
    from tilesync_probe import probe_session, timing_fields, traced_cold_runs, write_rows
    info, stream, flush, stamp = probe_session(a.out, "gemm_clock_probe.py")
    rows, ctas = [], []
    for dims in shapes(a.shapes):
        gv, tv = variants(info, dims)
        with stream:
            gv.prepare()
            t = time_runs(gv.run, gv.pre, gv.after, stream, a.runs, 3, flush)
            tv.prepare()
            runs = traced_cold_runs(tv, stream, flush, a.trace_runs,
                                    lambda v: next(iter(v.trace_records().values())))
        c = clock_summary(runs)
        m, n, k = dims
        if a.records:
            ctas += cta_rows(f"{m}x{n}x{k}", runs)
        row = {**stamp, "m": m, "n": n, "k": k, **timing_fields(t),
               **{key: round(v, 1) for key, v in c.items()}}
        rows.append(row)
        print(f"{m}x{n}x{k}: {row['time_us']:9.1f} us  span {row['span_us']:9.1f}  "
              f"{row['mhz_mean']:6.0f} MHz (first {row['mhz_first_quarter']:.0f}, "
              f"last {row['mhz_last_quarter']:.0f})", flush=True)
        for v in (gv, tv):
            v.tensors.arrays.clear()
        cp.get_default_memory_pool().free_all_blocks()
    write_rows(Path(a.out or ".") / "gemm_clock.csv", rows)
    if a.records:
        import gzip
        with gzip.open(Path(a.out or ".") / "gemm_ctas.csv.gz", "wt", newline="") as f:
            f.write("# " + ",".join(f"{k}={stamp[k]}" for k in ("device", "driver", "date", "command")) + "\n")
            f.write("shape,run,cta,smid,start_ns,end_ns,cycles\n")
            f.writelines(ctas)


if __name__ == "__main__":
    main()
