"""Where a tilesync region's time goes: the same kernels as one CUDA graph, under tilesync with
programmatic dependent launches, and under tilesync in plain stream order (flag waits only),
each timed on cold L2 (a diagnostic of the tilesync model, issue 6).

    device:  python3 bench/tilesync_probe.py PLAN.json [REGION] [--kernels A:B] [--runs 30]

--kernels A:B keeps the region's kernels A to B-1 (which hand-off of a chain costs what);
--splits I=S runs kernel I of the slice with S ranges of K (does splitting K cost the hand-off?).
--trace FILE.npz also runs the tilesync variant with every CTA recording its start, inputs-ready
and end times, its SM and clock64 (cold L2, `--trace-runs` runs kept) and prints where each kernel's
time went (`summarize_trace`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("region", nargs="?", type=int, default=0)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--kernels", default="", help="A:B, a slice of the region's kernels")
    ap.add_argument("--splits", action="append", default=[],
                    help="I=S: run kernel I (of the slice) with S ranges of K (a GEMM's split-K)")
    ap.add_argument("--sizes", default="", help="NAME=INT,...: the model's sizes instead of the plan's "
                    "(the same kernels at other shapes)")
    ap.add_argument("--trace", default="", help="FILE.npz: CTA timelines of the tilesync variant")
    ap.add_argument("--trace-runs", type=int, default=5)
    ap.add_argument("--precompile", default="", metavar="CACHE_DIR",
                    help="(this machine, nvcc) compile the probe's modules into CACHE_DIR and exit")
    a = ap.parse_args()
    if a.precompile:
        import importlib.util
        spec = importlib.util.spec_from_file_location("precompile", ROOT / "bench/precompile.py")
        pre = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pre)
        from kitsune_dse.validate.plan import DeviceInfo
        info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
        _, variants = build(a, info)
        Path(a.precompile).mkdir(parents=True, exist_ok=True)
        for v in variants:
            print(pre.compile_one(v.build(), info.arch, Path(a.precompile)), flush=True)
        return
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    (reg, tensors, groups, region), (graph_v, pdl, plain, eager, traced) = build(a, info)
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    with stream:
        for v in (graph_v, pdl, plain, eager):
            v.prepare()
            chk = check_variant(v, reg, tensors, input_roles(reg), stream, 1)
            chk.pop("_ref", None)
            t = time_runs(v.run, v.pre, v.after, stream, a.runs, 3, flush)
            rows.append((v.name, t.median_s * 1e6, t.p10_s * 1e6, t.p90_s * 1e6, chk["correct"]))
    print(f"{a.plan} region {a.region} {a.kernels} {' '.join(a.splits)} {a.sizes} "
          f"({region['strategy']}, {len(groups)} kernels)")
    for name, med, p10, p90, ok in rows:
        print(f"  {name:16s} {med:9.1f} us  (p10 {p10:.1f}, p90 {p90:.1f}) {'ok' if ok else 'WRONG'}")
    print(json.dumps({n: round(m, 2) for n, m, *_ in rows}))
    if a.trace:
        import numpy as np
        traced.prepare()
        # with programmatic launches (the tilesync plan), then in plain stream order (each
        # kernel after the last: the graph's order, with the records)
        for programmatic, path in ((True, a.trace), (False, a.trace.replace(".npz", "-plain.npz"))):
            traced.programmatic = programmatic
            traced.graph = None         # captured again with this launch mode
            with stream:
                runs = traced_cold_runs(traced, stream, flush, a.trace_runs, lambda v: v.trace_records())
            np.savez(path, **{f"run{i}_{k}": v for i, r in enumerate(runs) for k, v in r.items()})
            print(f"  CTA trace, {'programmatic launches' if programmatic else 'plain stream order'} "
                  f"(us from the first CTA's start; median of {len(runs)} cold runs):")
            print(summarize_trace(runs))


def build(a, info):
    """The region (slice, sizes, splits) and its variants: graph, tilesync, tilesync-no-pdl,
    eager, tilesync-traced (no CuPy: sources only until prepared)."""
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.lower import Region, fusion_groups
    from kitsune_dse.validate.plan import load_plan
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors, TilesyncVariant
    plan = load_plan(a.plan)
    sizes = dict(plan["model"].get("sizes") or {})
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in a.sizes.split(",") if kv)}
    if overrides:   # the plan records derived sizes too (nerf's points = rays * samples): drop
        sizes = {k: v for k, v in sizes.items() if k not in _derived_sizes(plan)}  # to re-derive
    sizes.update(overrides)
    graph = load_model(resolve_model_ref(plan), sizes)
    region = plan["regions"][a.region]
    if a.kernels:
        lo, hi = (int(x) if x else None for x in a.kernels.split(":"))
        kernels = region["kernels"][lo:hi]
        region = dict(region, kernels=kernels, ops=[o for k in kernels for o in k])
    reg = Region(graph, region)
    tensors = Tensors(reg)
    groups = fusion_groups(reg)
    for spec in a.splits:
        i, n = (int(x) for x in spec.split("="))
        groups[i].tile = dict(groups[i].tile or {}, splits=n)
    strategy = region["strategy"]
    pdl = TilesyncVariant("tilesync", reg, tensors, info, groups, strategy)
    plain = TilesyncVariant("tilesync-no-pdl", reg, tensors, info, groups, strategy)
    plain.programmatic = False
    graph_v = StandaloneVariant("graph", reg, tensors, info, groups, graph=True, prefix="fus")
    eager = StandaloneVariant("eager", reg, tensors, info, groups, prefix="fus")
    traced = TilesyncVariant("tilesync-traced", reg, tensors, info, groups, strategy, trace=True)
    return (reg, tensors, groups, region), (graph_v, pdl, plain, eager, traced)


def _derived_sizes(plan) -> set[str]:
    """The model's sizes written as expressions of others (a YAML model's `sizes:`)."""
    import yaml

    from kitsune_dse.validate.harness import resolve_model_ref
    ref = Path(resolve_model_ref(plan))
    path = ref if ref.suffix in (".yaml", ".yml") else ROOT / "models" / f"{ref}.yaml"
    if not path.exists():
        return set()
    raw = (yaml.safe_load(path.read_text()) or {}).get("sizes") or {}
    return {str(k) for k, v in raw.items() if isinstance(v, str)}


def summarize_trace(runs: list[dict]) -> str:
    """Per kernel, medians over runs of (us from the first CTA's start of the first kernel):
    first start, all CTAs started, first inputs ready, median wait, median CTA time from its
    inputs ready to its end, 10/50/90/100% of CTAs ended,
    the busy time summed over CTAs over the span (mean CTAs resident), SMs used. A split-K
    GEMM's CTAs that are not their tile's last K range record nothing (all-zero rows: left out)."""
    import numpy as np
    names = list(runs[0])
    rows = {n: [] for n in names}
    for r in runs:
        r = {n: v[v[:, 2] > 0].astype(np.int64) for n, v in r.items()}
        t0 = min(int(v[:, 0].min()) for v in r.values() if len(v))
        for n in names:
            v = r[n]
            st, rd, en = (v[:, 0] - t0) / 1e3, (v[:, 1] - t0) / 1e3, (v[:, 2] - t0) / 1e3
            span = en.max() - st.min()
            # the SM clock over each CTA (clock64 cycles per %globaltimer ns): the first and
            # the last quarter of the CTAs by start time
            mhz = (v[:, 5] - v[:, 4]) / np.maximum(v[:, 2] - v[:, 0], 1) * 1e3 if v.shape[1] > 5 else np.zeros(len(v))
            order = np.argsort(st)
            q = max(1, len(order) // 4)
            rows[n].append([st.min(), st.max(), rd.min(), float(np.median(rd - st)),
                            float(np.median(en - rd)), *np.percentile(en, [10, 50, 90]), en.max(),
                            float((en - rd).sum() / max(span, 1e-9)), len(set(v[:, 3].tolist())),
                            float(np.median(mhz[order[:q]])), float(np.median(mhz[order[-q:]]))])
    hdr = ("kernel", "first", "all in", "ready", "wait50", "cta50", "end10", "end50", "end90", "end",
           "work/span", "SMs", "MHz first", "MHz last")
    out = ["  " + " ".join(f"{h:>10s}" for h in hdr)]
    for n in names:
        med = np.median(np.array(rows[n]), axis=0)
        out.append("  " + f"{n:>10s} " + " ".join(f"{x:10.1f}" for x in med))
    return "\n".join(out)


def probe_session(out: str, script: str):
    """A device probe's common set-up: (DeviceInfo, stream, L2 flusher, the columns every row of
    its CSV starts with: device, driver, date, command), with `out` created."""
    import datetime as dt

    import cupy as cp

    from kitsune_dse.validate.harness import env_summary
    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    env = env_summary()
    Path(out or ".").mkdir(parents=True, exist_ok=True)
    stamp = {"device": env.get("gpu", ""), "driver": env.get("driver", ""),
             "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
             "command": f"python3 bench/{script} " + " ".join(sys.argv[1:])}
    return info, cp.cuda.Stream(non_blocking=True), L2Flusher(), stamp


def traced_cold_runs(v, stream, flush, runs: int, read, poison: bool = True) -> list:
    """read(v) after each of `runs` cold runs (behind the flush, outputs poisoned unless not
    `poison`) of a traced variant, after one more that warms its module."""
    out = []
    for i in range(runs + 1):
        v.pre(poison)
        flush(stream)
        v.run(stream)
        stream.synchronize()
        v.after()
        if i:
            out.append(read(v))
    return out


def timing_fields(t, digits: int = 2) -> dict:
    """A cold timing's median, p10 and p90 (us) as a probe row's columns."""
    return {"time_us": round(t.median_s * 1e6, digits), "p10_us": round(t.p10_s * 1e6, digits),
            "p90_us": round(t.p90_s * 1e6, digits)}


def write_rows(path: Path, rows: list[dict]) -> None:
    """A probe's rows as CSV (columns in order of first appearance)."""
    import csv
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
