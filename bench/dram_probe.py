"""DRAM microbenchmark of persistent pipelines (issue 6): which bytes a pipeline moves beyond its
compulsory traffic, measured with ncu on probe plans that are NOT the validation suite's
workloads (other sizes of the zoo's models), each built to isolate one mechanism:

  free-*     a GEMM stage alone on S SMs: how many row-blocks share a weight fetch through L2
  fed-*      a weightless stage feeding a GEMM stage: the queue-fed GEMM's weight re-reads
  held-*     a GEMM stage held back by a slow weightless consumer: the throttled GEMM's re-reads
  pair-*     the two GEMM stages of an MLP over a queue-depth sweep
  wb-*       ring and K-split write-back: slots (and fp32 partials) written back to DRAM when
             other traffic evicts them before the next generation overwrites them
  ws-*       two weight-streaming stages fed slab by slab (their shared DRAM rate)
  wsh-*      two stages with 13-52 MB weights: the share of a weight pass L2 keeps
  gemm-*     standalone GEMM grids: which operand tiles later waves read again
  seq-*      kernel sequences (kernel per op and fused): what a kernel finds in L2 of the kernels
             before it, and what is still dirty when the sequence ends (variants plan, cublas)
  diag-*     the suite's own shapes cut the same way: diagnostics, never fitted

    here:    python bench/dram_probe.py --prepare && python bench/dram_probe.py --precompile
             (--only PROBES with --prepare: re-plan those probes, keep the others' plans)
    device:  python3 bench/dram_probe.py --ncu --out $OUT      # -> dram_probe_ncu.csv
             (--only wb-nerf,wbn: those probes; KDSE_RING_ALLOC=arena: rings in one allocation;
             KDSE_PROBE_DRAIN=1: each probe also as `plan+drain`, a read sweep of 4x the L2 in the
             same range after it: its writes beyond the plain range's are what it left dirty)
             python3 bench/dram_probe.py --run --out $OUT      # -> dram_probe_run.csv (latency)
    here:    python bench/dram_probe.py --report DIR            # model beside each measurement
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

from validate_suite import kd, ncu_process  # noqa: E402

PROBES_DIR = ROOT / "bench/dram_probe"
SPEC = ROOT / "hw_specs/h100-sxm.calibrated.yaml"
RESULTS = ROOT / "results/validation/h100/dram_probe"

from dram_probe_defs import PROBED, PROBES, SEQ_VARIANTS  # noqa: E402


def probed_region(regions, name: str = "") -> int:
    """The region a probe measures: its pipeline, else its first (or the one PROBED names)."""
    if name in PROBED:
        return PROBED[name]
    return next((i for i, r in enumerate(regions) if r["strategy"] == "pipeline"), 0)


# every pipeline probe is fitted: NeRF's many small rings (wb-nerf, wbr-nerf, wbn-w) wrote back
# where the footprint without the kernel's local memory said none; with its spilled frames
# (bench/frame_probe.py) they follow the same logistic as the one-ring probes
def _probe_medians(csvs: list[Path], keep, columns: dict[str, str]) -> list[dict]:
    """Each probe whose name `keep` accepts, with its graph and pipeline choice and, per key of
    `columns`, the median over the CSVs given of that CSV column."""
    import statistics

    import pandas as pd

    from kitsune_dse.graph import load_model
    from kitsune_dse.report.plan import choice_from_region
    d = pd.concat([pd.read_csv(c) for c in csvs])
    if "variant" in d.columns:      # the drained ranges (--ncu with KDSE_PROBE_DRAIN) apart
        d = d[~d["variant"].astype(str).str.endswith("+drain")]
    out = []
    for name, grp in d.groupby("probe", sort=True):
        if not keep(name):
            continue
        (model, sizes), regions = PROBES[name]
        rd = next(r for r in regions if r["strategy"] == "pipeline")
        out.append({"name": name, "graph": load_model(model, sizes), "choice": choice_from_region(rd),
                    **{k: statistics.median(grp[col]) for k, col in columns.items()}})
    return out


def fit_probes(csvs: list[Path]) -> list[dict]:
    """The measured probes (median over the CSVs given) as calibrate.fit_dram wants them."""
    return _probe_medians(csvs, lambda n: n in PROBES and not n.startswith(("gemm-", "seq-", "diag-", "gg-")),
                          {"read_bytes": "measured_dram_read_bytes", "write_bytes": "measured_dram_write_bytes"})


WEIGHT_STREAM_CSVS = "results/validation/h100/dram_probe/weight_stream/dram_probe_run_*.csv"


def weight_stream_rows(csvs: list[Path]) -> list[dict]:
    """The slab-fed weight-streaming pairs (ws-pair-*), median latency over the run CSVs given,
    as calibrate.fit.fit_concurrent_stream wants them."""
    return _probe_medians(csvs, lambda n: n.startswith("ws-pair-"), {"time_s": "measured_latency_s"})


SEQ_CSVS = "results/validation/h100/dram_probe/seq/dram_probe_ncu_*.csv"


def sequence_rows(csvs: list[Path]) -> list[dict]:
    """The kernel sequences (seq-*, not the diagnostic diag-*) as the harness ran them (variant
    plan), median over the CSVs given, as calibrate.fit_dram.fit_dirty_residue wants them."""
    import pandas as pd

    from kitsune_dse.graph import load_model
    d = pd.concat([pd.read_csv(c) for c in csvs])
    if "variant" in d.columns:      # the drained ranges (--ncu with KDSE_PROBE_DRAIN) apart
        d = d[~d["variant"].astype(str).str.endswith("+drain")]
    d = d[d["probe"].str.startswith("seq-") & (d["variant"] == "plan")]
    out = []
    for name, grp in d.groupby("probe", sort=True):
        (model, sizes), regions = PROBES[name]
        plan = json.loads((PROBES_DIR / f"{name}.json").read_text())
        region = plan["regions"][probed_region(regions, name)]
        out.append({"name": name, "graph": load_model(model, sizes), "ops": region["ops"],
                    "kernels": region["kernels"], "read_bytes": float(grp["measured_dram_read_bytes"].median()),
                    "write_bytes": float(grp["measured_dram_write_bytes"].median())})
    return out


GEMM_CSVS = "results/validation/h100/dram_probe/gemm/dram_probe_ncu_*.csv"


def _gemm_read_medians(csvs: list[Path], variant: str) -> dict[str, float]:
    """Each standalone GEMM grid's (gemm-*) measured DRAM read bytes as `variant` ran it, median
    over the CSVs given."""
    import pandas as pd
    d = pd.concat([pd.read_csv(c) for c in csvs])
    if "variant" in d.columns:      # the drained ranges (--ncu with KDSE_PROBE_DRAIN) apart
        d = d[~d["variant"].astype(str).str.endswith("+drain")]
    d = d[d["probe"].str.startswith("gemm-") & (d.get("variant", "plan") == variant)]
    return {name: float(grp["measured_dram_read_bytes"].median()) for name, grp in d.groupby("probe", sort=True)}


def gemm_grid_rows(csvs: list[Path]) -> list[dict]:
    """The harness's standalone GEMM grids (variant plan) as calibrate.fit_dram.fit_grid_reuse
    wants them."""
    out = []
    for name, read in _gemm_read_medians(csvs, "plan").items():
        m, n, k = (int(v) for v in name[len("gemm-"):].split("x"))
        out.append({"m": m, "n": n, "k": k, "read_bytes": read})
    return out


def library_grid_rows(csvs: list[Path]) -> list[dict]:
    """The same grids as cuBLAS runs them (variant cublas: the product, then the bias kernel) as
    calibrate.fit_dram.fit_library_read_grid wants them."""
    from kitsune_dse.graph import load_model
    out = []
    for name, read in _gemm_read_medians(csvs, "cublas").items():
        (model, sizes), regions = PROBES[name]
        out.append({"name": name, "graph": load_model(model, sizes), "ops": regions[0]["ops"],
                    "read_bytes": read})
    return out


def prepare() -> None:
    import shutil
    import tempfile

    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    spec = load_spec(str(SPEC))
    only = [x for x in os.environ.get("KDSE_PROBE_ONLY", "").split(",") if x]
    manifest = []
    if only:    # the selected probes only: the others' plans and manifest rows stay as they are
        manifest = [m for m in json.loads((PROBES_DIR / "manifest.json").read_text())
                    if not any(x in m["probe"] for x in only)]
    else:
        if PROBES_DIR.exists():
            shutil.rmtree(PROBES_DIR)
        PROBES_DIR.mkdir(parents=True)
    bases = {}
    for name, ((model, sizes), regions) in PROBES.items():
        if only and not any(x in name for x in only):
            continue
        key = (model, json.dumps(sizes, sort_keys=True))
        if key not in bases:
            with tempfile.TemporaryDirectory() as td:
                sets = [x for k, v in sizes.items() for x in ("--set", f"{k}={v}")]
                kd("explore", model, "--hw", str(SPEC.relative_to(ROOT)), *sets, "--out", td)
                bases[key] = json.loads((Path(td) / "plan.json").read_text())
        base = bases[key]
        graph = load_model(model, sizes)
        hp = {"schema": base["schema"], "model": base["model"], "hw": base["hw"], "objective": "probe",
              "regions": [dict(r, id=j) for j, r in enumerate(json.loads(json.dumps(regions)))]}
        new = evaluate_plan(hp, graph, spec, where=name)
        new["model"] = base["model"]
        f = PROBES_DIR / f"{name}.json"
        f.write_text(json.dumps(new, indent=1))
        r = new["regions"][probed_region(regions, name)]
        p = r["predicted"]
        pl = r.get("pipeline") or {}
        manifest.append({"probe": name, "file": str(f.relative_to(ROOT)), "region": r["id"],
                         "predicted_latency_s": p["latency_s"],
                         "predicted_dram_read_bytes": p["dram_read_bytes"],
                         "predicted_dram_write_bytes": p["dram_write_bytes"],
                         "weight_reread_bytes": pl.get("weight_reread_bytes"),
                         "queue_write_back_bytes": pl.get("queue_write_back_bytes")})
        print(f"{name}: {p['latency_s'] * 1e6:.0f} us, read {p['dram_read_bytes'] / 1e6:.1f} MB, "
              f"write {p['dram_write_bytes'] / 1e6:.1f} MB")
    (PROBES_DIR / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _regions():
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.plan import load_plan
    only = [x for x in os.environ.get("KDSE_PROBE_ONLY", "").split(",") if x]
    for m in json.loads((PROBES_DIR / "manifest.json").read_text()):
        if only and not any(x in m["probe"] for x in only):
            continue
        plan = load_plan(ROOT / m["file"])
        graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        yield m, plan, graph, plan["regions"][m["region"]]


def precompile() -> None:
    import concurrent.futures as cf

    from precompile import compile_one

    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.plan import DeviceInfo
    from kitsune_dse.validate.runtime import Tensors, make_variants
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    srcs = []
    for m, _, graph, region in _regions():
        reg = Region(graph, region)
        which = SEQ_VARIANTS[:1] if m["probe"].startswith(("seq-", "diag-")) else ["plan"]
        srcs += [v.build() for v in make_variants(reg, region, Tensors(reg), info, which=which)]
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    with cf.ThreadPoolExecutor(8) as ex:
        for r in ex.map(lambda s: compile_one(s, "sm_90", out), list(dict.fromkeys(srcs))):
            if "FAILED" in r or "spill" in r:
                print(r[:600], flush=True)


def ncu_child(order_path: str) -> None:
    import cupy as cp

    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.ncu import profile_region
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    order = []
    stream.__enter__()
    drain = None
    if os.environ.get("KDSE_PROBE_DRAIN"):
        # after each probe, in the same range, a read-only sweep of 4x the L2 (a sum): every
        # dirty line the probe left in L2 is evicted by it and reaches DRAM inside the range
        sweep = cp.ones((info.l2_bytes,), dtype=cp.float32)
        total = cp.zeros((), dtype=cp.float32)

        def drain(s):
            cp.sum(sweep, out=total)
        drain(stream)                      # (its kernel compiled outside any range)
        flush(stream)
        stream.synchronize()
        cp.cuda.runtime.profilerStart()    # the sweep alone: what it moves by itself
        drain(stream)
        stream.synchronize()
        cp.cuda.runtime.profilerStop()
        order.append(["ctl-drain", "drain"])
    for m, _, graph, region in _regions():
        def on_range(v, m=m):
            order.append([m["probe"], v.name])
            Path(order_path).write_text(json.dumps(order))
        # a standalone GEMM grid also as cuBLAS runs it (the cublas baselines' reads)
        variants = (["plan", "cublas"] if m["probe"].startswith("gemm-") else
                    SEQ_VARIANTS if m["probe"].startswith(("seq-", "diag-")) else ["plan"])
        profile_region(Region(graph, region), region, info, variants, stream, flush, on_range,
                       drain=drain)


def ncu(out: Path, budget_s: float) -> None:
    from kitsune_dse.validate.harness import env_summary
    out.mkdir(parents=True, exist_ok=True)
    env = env_summary()
    order, log = out / "dram_probe_order.json", out / "dram_probe_ncu_raw.csv"
    t0 = time.time()
    names, res = ncu_process([str(Path(__file__).resolve()), "--ncu-child", str(order)], log, order, budget_s)
    by = {m["probe"]: m for m in json.loads((PROBES_DIR / "manifest.json").read_text())}
    rows = []
    for (name, variant), r in zip(names, res):
        rows.append({**by.get(name, {"probe": name}), "variant": variant,
                     "measured_dram_read_bytes": r.get("dram__bytes_read.sum", float("nan")),
                     "measured_dram_write_bytes": r.get("dram__bytes_write.sum", float("nan")),
                     **{k: v for k, v in r.items() if not k.startswith("dram__")},
                     "gpu": env.get("gpu"), "driver": env.get("driver"), "date": env.get("date"),
                     "command": ("KDSE_PROBE_DRAIN=1 " if os.environ.get("KDSE_PROBE_DRAIN") else "")
                     + "python3 bench/dram_probe.py --ncu (ncu --clock-control none "
                       "--replay-mode range --metrics dram__bytes_read.sum,dram__bytes_write.sum)"})
    import pandas as pd
    pd.DataFrame(rows).to_csv(out / "dram_probe_ncu.csv", index=False)
    print(f"ncu: {len(rows)} probes in {time.time() - t0:.0f} s")


def run(out: Path, runs: int) -> None:
    """Each probe's pipeline region timed by the harness (an unseen-plan check of the latency
    model as well: none of these plans is in the suite)."""
    import pandas as pd

    from kitsune_dse.validate.harness import validate_plan
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    only = [x for x in os.environ.get("KDSE_PROBE_ONLY", "").split(",") if x]
    for m in json.loads((PROBES_DIR / "manifest.json").read_text()):
        if only and not any(x in m["probe"] for x in only):
            continue
        plan = json.loads((ROOT / m["file"]).read_text())
        plan["regions"] = [r for r in plan["regions"] if r["id"] == m["region"]]
        try:
            rs = validate_plan(plan, runs=runs, warmup=2, checks=1, variants=["plan"], warm=False)
        except Exception as e:  # noqa: BLE001
            rs = [{"error": f"{type(e).__name__}: {e}"}]
        for r in rs:
            rows.append({"probe": m["probe"], **{k: r.get(k) for k in (
                "predicted_latency_s", "measured_latency_s", "p10_latency_s", "p90_latency_s",
                "correct", "error", "placement", "gpu", "driver", "date")}})
            lat = r.get("measured_latency_s")
            print(f"{m['probe']}: {lat and lat * 1e6 or 0:.0f} us (pred {m['predicted_latency_s'] * 1e6:.0f}) "
                  f"{'ok' if r.get('correct') else r.get('error')}", flush=True)
        pd.DataFrame(rows).to_csv(out / "dram_probe_run.csv", index=False)


def report(src: Path) -> None:
    """The measured CSV beside the model's current prediction of each probe (a GEMM grid's cublas
    row: the region priced as the cublas baseline, with the cuBLAS spec)."""
    import pandas as pd

    from kitsune_dse.cost.region import Region as CRegion
    from kitsune_dse.cost.strategies import LaunchChoice, library_bsp
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    spec = load_spec(str(SPEC))
    cspec = load_spec(str(ROOT / "hw_specs/h100-sxm-cublas.calibrated.yaml"))
    d = pd.read_csv(src / "dram_probe_ncu.csv" if src.is_dir() else src)
    if "variant" not in d:
        d["variant"] = "plan"
    cur = {}
    for name, ((model, sizes), regions) in PROBES.items():
        f = PROBES_DIR / f"{name}.json"
        if not f.exists():
            continue
        plan = json.loads(f.read_text())
        graph = load_model(model, sizes)
        new = evaluate_plan({k: v for k, v in plan.items() if k != "predicted"}, graph, spec, where=name)
        r = new["regions"][probed_region(regions, name)]
        # (the writes still dirty in L2 when the probe ends are not in ncu's range: as the fit)
        cur[name, "plan"] = (r["predicted"]["dram_read_bytes"],
                             r["predicted"]["dram_write_bytes"] - r["predicted"].get("dram_write_deferred_bytes", 0.0))
        if name.startswith(("gemm-", "seq-", "diag-")):
            e = library_bsp(CRegion.of(graph, r["ops"]), spec, LaunchChoice("eager"), library_spec=cspec)
            cur[name, "cublas"] = (e.dram_read_bytes, e.dram_write_bytes)
    print(f"{'probe':34s} {'meas R':>8s} {'pred R':>8s} {'err':>6s} {'meas W':>8s} {'pred W':>8s} {'err':>6s}  (MB)")
    for _, r in d.iterrows():
        v = r["variant"] if isinstance(r["variant"], str) else "plan"
        pr, pw = cur.get((r["probe"], v), (r["predicted_dram_read_bytes"], r["predicted_dram_write_bytes"]))
        mr, mw = r["measured_dram_read_bytes"], r["measured_dram_write_bytes"]
        label = r["probe"] + ("" if v == "plan" else f" [{v}]")
        print(f"{label:34s} {mr / 1e6:8.1f} {pr / 1e6:8.1f} {100 * (pr / mr - 1):+5.0f}% "
              f"{mw / 1e6:8.1f} {pw / 1e6:8.1f} {100 * (pw / mw - 1):+5.0f}%")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--ncu-child", default="")
    ap.add_argument("--ncu-budget-s", type=float, default=300.0)
    ap.add_argument("--report", default="")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--only", default="", help="comma-separated substrings of the probes to run "
                    "(--ncu, --run)")
    a = ap.parse_args()
    if a.only:
        os.environ["KDSE_PROBE_ONLY"] = a.only      # (the ncu child inherits it)
    if a.prepare:
        prepare()
    if a.precompile:
        precompile()
    if a.run:
        run(Path(a.out), a.runs)
    if a.ncu:
        ncu(Path(a.out), a.ncu_budget_s)
    if a.ncu_child:
        ncu_child(a.ncu_child)
    if a.report:
        report(Path(a.report))


if __name__ == "__main__":
    main()
