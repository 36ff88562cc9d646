"""What a region boundary changes when a plan runs end to end: each plan's regions back to back
(as validate_plan_e2e runs them), timed whole and region by region (an event between regions),
against each region alone on a flushed L2; with --ncu, the DRAM bytes of the whole run and of
each region alone (ncu range replay, --cache-control none: the probe flushes L2 itself, ncu must
not flush between the regions of the whole run).

Cases: NeRF's MLP at 48 samples a ray (196,608 points, not the suite's 64) run as one fusion
region and cut at one to four of its layer boundaries (the same kernels, so any difference is the
boundary's), and the suite's own nerf plans as diagnostics (never fitted).

    here:    python bench/cut_probe.py --prepare --precompile   # plans under bench/cut_probe/
    device:  python3 bench/cut_probe.py --run --out $OUT    # -> cut_probe_run.csv
             python3 bench/cut_probe.py --placements 5 --out $OUT   # -> cut_probe_placements.csv
             (each plan's e2e behind pads of validate.e2e.address_pad_bytes; --only PLAN,...)
             python3 bench/cut_probe.py --ncu --out $OUT    # -> cut_probe_ncu.csv
    here:    python bench/cut_probe.py --report DIR         # model beside each measurement
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

PLANS = ROOT / "bench/cut_probe"
SUITE_NERF = ROOT / "bench/suite/nerf-mlp/plans"
TRUNK = ["fc1", "relu1", "fc2", "relu2", "fc3", "relu3", "fc4", "relu4", "fc5", "relu5", "skip_concat",
         "fc6", "relu6", "fc7", "relu7", "fc8", "relu8"]
HEAD = ["sigma_fc", "sigma_relu", "feature_fc", "dir_concat", "view_fc", "view_relu", "rgb_fc", "rgb_sigmoid"]
ALL = TRUNK + HEAD
# cut after these ops (all regions fusion): the same kernels as the uncut plan
CUTS = {"cut0": [], "cut1": ["relu1"], "cut2": ["relu1", "relu4"], "cut3": ["relu1", "relu4", "relu8"],
        "cut4": ["relu1", "relu4", "relu8", "view_relu"], "cut1-late": ["view_relu"],
        "cut1-mid": ["relu4"], "cut2-late": ["relu8", "view_relu"]}
SIZES = {"samples": 48}


def _split(cuts):
    regions, cur = [], []
    for o in ALL:
        cur.append(o)
        if o in cuts:
            regions.append(cur)
            cur = []
    if cur:
        regions.append(cur)
    return regions


def prepare() -> None:
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    spec = load_spec(ROOT / "hw_specs/h100-sxm.calibrated.yaml")
    graph = load_model("nerf-mlp", SIZES)
    template = json.loads((SUITE_NERF / "explorer-1.json").read_text())
    PLANS.mkdir(exist_ok=True)
    for name, cuts in CUTS.items():
        plan = {**template, "objective": "probe",
                "model": {**template["model"], "sizes": {**template["model"]["sizes"], **SIZES,
                                                          "points": 4096 * SIZES["samples"]}},
                "regions": [{"id": i, "strategy": "fusion", "ops": ops, "stages": [], "queues": []}
                            for i, ops in enumerate(_split(cuts))]}
        new = evaluate_plan(plan, graph, spec)
        new.pop("_source", None)
        (PLANS / f"{name}.json").write_text(json.dumps(new, indent=1) + "\n")
        print(f"{name}: {len(new['regions'])} regions, predicted {new['predicted']['latency_s'] * 1e6:.1f} us")


def precompile() -> None:
    import concurrent.futures as cf

    from precompile import compile_one, plan_sources

    from kitsune_dse.validate.plan import DeviceInfo, load_plan
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    srcs = [s for p in plan_files() for s in plan_sources(load_plan(p), info)]
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    with cf.ThreadPoolExecutor(8) as ex:
        for r in ex.map(lambda s: compile_one(s, "sm_90", out), list(dict.fromkeys(srcs))):
            if "FAILED" in r:
                print(r[:600], flush=True)


def plan_files() -> list[Path]:
    return sorted(PLANS.glob("cut*.json")) + sorted(SUITE_NERF.glob("explorer-*.json"))


def _build(path: Path, ncu: bool = False):
    """(plan, [variant per region], shared tensors) of one plan, inputs filled, ready to run
    (ncu: plain launches, which range replay takes)."""
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.e2e import e2e_variants
    from kitsune_dse.validate.harness import _fill_inputs, load_plan, resolve_model_ref, whole_region
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    plan = load_plan(path)
    info, _ = gpu_info()
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    whole = whole_region(graph)
    vs, store, inputs = e2e_variants(plan, graph, whole, info, plain_launches=ncu)
    _fill_inputs(whole, inputs, input_roles(whole))
    return plan, vs, store


def placements(out: Path, runs: int, k: int, only: list[str]) -> None:
    """Each plan built k times, each time behind a pad allocation of another size, so that its
    tensors lie at other addresses: the e2e spread that placement alone makes."""
    import cupy as cp
    import numpy as np

    from kitsune_dse.validate.e2e import address_pad_bytes
    from kitsune_dse.validate.harness import _timing_context
    from kitsune_dse.validate.measure import time_runs
    stream, flush = _timing_context()
    rows = []
    for j in range(k):
        for path in plan_files():
            name = path.stem if path.parent == PLANS else f"nerf/{path.stem}"
            if only and name not in only:
                continue
            with stream:
                pad = cp.empty(address_pad_bytes(j), dtype=cp.uint8)
                plan, vs, store = _build(path)
                t = time_runs(lambda st: [v.run(st) for v in vs], lambda poison=True: [v.pre(poison) for v in vs],
                              lambda: [v.after() for v in vs], stream, runs, 3, flush).samples_s
                rows.append({"plan": name, "placement": j, "pad_bytes": pad.nbytes, "e2e_s": float(np.median(t))})
                print(f"{name:22s} placement {j} e2e {np.median(t) * 1e6:8.1f} us", flush=True)
                store.clear()
                vs.clear()
                del pad
                cp.get_default_memory_pool().free_all_blocks()
    _write(out / "cut_probe_placements.csv", rows)
    names = list(dict.fromkeys(r["plan"] for r in rows))
    for n in names:
        x = [r["e2e_s"] * 1e6 for r in rows if r["plan"] == n]
        print(f"{n:22s} " + " ".join(f"{v:7.1f}" for v in x) + f"  median {np.median(x):7.1f} spread {max(x) - min(x):5.1f}")


def run(out: Path, runs: int) -> None:
    import cupy as cp
    import numpy as np

    from kitsune_dse.validate.harness import _timing_context
    stream, flush = _timing_context()
    rows = []
    for path in plan_files():
        with stream:
            plan, vs, store = _build(path)
            n = len(vs)
            ev = [cp.cuda.Event() for _ in range(n + 1)]
            e2e, split, alone = [], [], [[] for _ in range(n)]
            for k in range(runs + 3):
                for v in vs:
                    v.pre(True)
                flush(stream)
                ev[0].record(stream)
                for v in vs:
                    v.run(stream)
                ev[n].record(stream)
                ev[n].synchronize()
                for v in vs:
                    v.after()
                if k >= 3:
                    e2e.append(cp.cuda.get_elapsed_time(ev[0], ev[n]) * 1e-3)
                for v in vs:
                    v.pre(True)
                flush(stream)
                ev[0].record(stream)
                for i, v in enumerate(vs):
                    v.run(stream)
                    ev[i + 1].record(stream)
                ev[n].synchronize()
                for v in vs:
                    v.after()
                if k >= 3:
                    split.append([cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) * 1e-3 for i in range(n)])
                for i, v in enumerate(vs):
                    v.pre(True)
                    flush(stream)
                    ev[0].record(stream)
                    v.run(stream)
                    ev[1].record(stream)
                    ev[1].synchronize()
                    v.after()
                    if k >= 3:
                        alone[i].append(cp.cuda.get_elapsed_time(ev[0], ev[1]) * 1e-3)
            med = np.median(np.asarray(split), axis=0)
            name = path.stem if path.parent == PLANS else f"nerf/{path.stem}"
            rows.append({"plan": name, "region": "all", "e2e_s": float(np.median(e2e)),
                         "in_sequence_s": float(med.sum()), "alone_s": float(sum(np.median(a) for a in alone))})
            for i in range(n):
                rows.append({"plan": name, "region": i, "e2e_s": "", "in_sequence_s": float(med[i]),
                             "alone_s": float(np.median(alone[i]))})
            print(f"{name:22s} e2e {rows[-n - 1]['e2e_s'] * 1e6:8.1f} us  split "
                  + " ".join(f"{x * 1e6:7.1f}" for x in med) + "  alone "
                  + " ".join(f"{np.median(a) * 1e6:7.1f}" for a in alone), flush=True)
            store.clear()
            vs.clear()
            cp.get_default_memory_pool().free_all_blocks()
    _write(out / "cut_probe_run.csv", rows)


def ncu_child(order_path: str) -> None:
    """Inside ncu: per plan a range of the whole run, then one per region alone, each on a
    flushed L2 (order_path: the ranges' names, in order)."""
    import cupy as cp

    from kitsune_dse.validate.harness import _timing_context
    stream, flush = _timing_context()
    names = []
    for path in plan_files():
        name = path.stem if path.parent == PLANS else f"nerf/{path.stem}"
        with stream:
            plan, vs, store = _build(path, ncu=True)
            for v in vs:     # one run outside any range: the kernels loaded
                v.pre(False)
                v.run(stream)
            stream.synchronize()
            for what in ["all", *range(len(vs))]:
                for v in vs:
                    v.pre(False)
                flush(stream)
                stream.synchronize()
                cp.cuda.runtime.profilerStart()
                for v in (vs if what == "all" else [vs[what]]):
                    v.run(stream)
                stream.synchronize()
                cp.cuda.runtime.profilerStop()
                names.append([name, what])
                Path(order_path).write_text(json.dumps(names))
            store.clear()
            vs.clear()
            cp.get_default_memory_pool().free_all_blocks()


def ncu(out: Path) -> None:
    from kitsune_dse.validate.ncu import ncu_command, parse_ncu_csv
    order, log = out / "cut_probe_order.json", out / "cut_probe_ncu_log.txt"
    cmd = ncu_command(str(log))
    cmd.insert(1, "--cache-control")
    cmd.insert(2, "none")
    p = subprocess.run(cmd + [sys.executable, __file__, "--ncu-child", str(order)], capture_output=True,
                       text=True, timeout=540)
    print((p.stdout + p.stderr)[-2000:])
    names = json.loads(order.read_text()) if order.exists() else []
    res = parse_ncu_csv(log.read_text()) if log.exists() else []
    rows = [{"plan": n, "region": w, "dram_read_bytes": r.get("dram__bytes_read.sum", ""),
             "dram_write_bytes": r.get("dram__bytes_write.sum", "")} for (n, w), r in zip(names, res)]
    _write(out / "cut_probe_ncu.csv", rows)
    for r in rows:
        print(f"{r['plan']:22s} {str(r['region']):4s} read {float(r['dram_read_bytes']) / 1e6:8.1f} MB "
              f"write {float(r['dram_write_bytes']) / 1e6:8.1f} MB")


def report(d: Path) -> None:
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    spec = load_spec(ROOT / "hw_specs/h100-sxm.calibrated.yaml")
    meas = {(r["plan"], r["region"]): r for r in csv.DictReader(open(d / "cut_probe_run.csv"))}
    dram = {}
    if (d / "cut_probe_ncu.csv").exists():
        dram = {(r["plan"], r["region"]): r for r in csv.DictReader(open(d / "cut_probe_ncu.csv"))}
    for path in plan_files():
        name = path.stem if path.parent == PLANS else f"nerf/{path.stem}"
        if (name, "all") not in meas:
            continue
        plan = json.loads(path.read_text())
        graph = load_model("nerf-mlp", plan["model"]["sizes"])
        new = evaluate_plan(plan, graph, spec)
        m = meas[(name, "all")]
        print(f"{name:18s} e2e meas {float(m['e2e_s']) * 1e6:8.1f} pred {new['predicted']['latency_s'] * 1e6:8.1f}"
              f"  alone-sum {float(m['alone_s']) * 1e6:8.1f}  e2e-alone {(float(m['e2e_s']) - float(m['alone_s'])) * 1e6:6.1f}")
        for i, r in enumerate(new["regions"]):
            mi = meas[(name, str(i))]
            pr = r["predicted"]
            line = (f"   r{i} {'+'.join(r['ops'][:1] + r['ops'][-1:]):22s} pred {pr['latency_s'] * 1e6:7.1f} seq "
                    f"{float(mi['in_sequence_s']) * 1e6:7.1f} alone {float(mi['alone_s']) * 1e6:7.1f}")
            if (name, str(i)) in dram:
                x = dram[(name, str(i))]
                line += (f"  rd pred {pr['dram_read_bytes'] / 1e6:6.1f} alone {float(x['dram_read_bytes']) / 1e6:6.1f}"
                         f" wr pred {pr['dram_write_bytes'] / 1e6:6.1f} alone {float(x['dram_write_bytes']) / 1e6:6.1f}")
            print(line)
        if (name, "all") in dram:
            x = dram[(name, "all")]
            print(f"   all DRAM read pred {new['predicted']['dram_read_bytes'] / 1e6:.1f} meas "
                  f"{float(x['dram_read_bytes']) / 1e6:.1f} MB; write pred {new['predicted']['dram_write_bytes'] / 1e6:.1f}"
                  f" meas {float(x['dram_write_bytes']) / 1e6:.1f} MB")


def _write(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--ncu-child")
    ap.add_argument("--placements", type=int, default=0, help="build each plan this many times at "
                    "other addresses (e2e only)")
    ap.add_argument("--only", default="", help="comma-separated plan names (with --placements)")
    ap.add_argument("--report", type=Path)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    if a.prepare:
        prepare()
    if a.precompile:
        precompile()
    if a.run:
        a.out.mkdir(parents=True, exist_ok=True)
        run(a.out, a.runs)
    if a.placements:
        a.out.mkdir(parents=True, exist_ok=True)
        placements(a.out, a.runs, a.placements, [x for x in a.only.split(",") if x])
    if a.ncu:
        a.out.mkdir(parents=True, exist_ok=True)
        ncu(a.out)
    if a.ncu_child:
        ncu_child(a.ncu_child)
    if a.report:
        report(a.report)


if __name__ == "__main__":
    main()
