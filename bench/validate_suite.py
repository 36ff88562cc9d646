"""The validation suite: workloads of the zoo, each explored (5 alternatives) and hand-edited
(other SM split, tile rows, queue depth), predicted with the calibrated specs, then run on the GPU
with the harness's baselines.

    here:    python bench/validate_suite.py --prepare       # explore + evaluate -> bench/suite/
             python bench/validate_suite.py --precompile    # cubins -> bench/.cubin_cache
    device:  python3 bench/validate_suite.py --run --out $OUT [--runs 30]
             python3 bench/validate_suite.py --ncu --out $OUT [--ncu-budget-s 400]
    here:    python bench/validate_suite.py --collect DIR   # -> results/validation/h100/suite/

Per workload (bench/suite/<name>/):
  plans/explorer-1.json ... explorer-6.json   `kitsune-dse explore --alternatives 5` (ranked by
                                              predicted latency; explorer-1 is the pick)
  plans/hand-*.json                           hand-edited plans, re-predicted by `evaluate`
  plans/whole.json                            the whole model as one fusion region: its run gives
                                              the baselines bsp-eager, bsp-graph, fusion,
                                              fusion-graph, cublas and cublas-graph
  explore/                                    the explorer's own outputs (strategies.csv, ...)
bench/suite/manifest.json holds every plan's predictions and the baselines' predictions:
  bsp-graph <- bsp (CUDA-graph launches), bsp-eager <- bsp with eager launches, fusion-graph <-
  fusion (graph), fusion <- fusion (eager), all with hw_specs/h100-sxm.calibrated.yaml (the
  harness's GEMM tile efficiency); cublas <- library_bsp eager (the GEMMs priced with
  hw_specs/h100-sxm-cublas.calibrated.yaml, the bias and other kernels and the launches with the
  harness's spec), cublas-graph <- the same as a CUDA graph.
The GPU run validates every region of every plan ("plan" variant: each strategy as planned;
tilesync and concurrent regions with programmatic dependent launches and flag hand-offs) and all variants of
whole.json (with per-kernel event times of bsp-eager). The ncu pass measures DRAM bytes of each
workload's pick, hand plans and baselines in ONE Nsight Compute process (range replay).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

from kitsune_dse.validate.harness import writes_in_run  # noqa: E402

SUITE = ROOT / "bench/suite"
SPEC = ROOT / "hw_specs/h100-sxm.calibrated.yaml"
SPEC_CUBLAS = ROOT / "hw_specs/h100-sxm-cublas.calibrated.yaml"
RESULTS = ROOT / "results/validation/h100/suite"
ADDRESS_SETS = 5     # tensor placements a plan's end-to-end time is taken over (validate.e2e)
BASELINES = ["bsp-eager", "bsp-graph", "fusion", "fusion-graph", "cublas", "cublas-graph"]

# name, zoo model, sizes, what the explorer's models say should happen
WORKLOADS = [
    ("gpt3-mlp-t64", "gpt3-mlp", {"tokens": 64},
     "weight-streaming (2.4 GB of weights, 64 rows): memory bound; a pipeline can only tie"),
    ("gpt3-mlp-t2048-tp8", "gpt3-mlp", {"tokens": 2048, "tp": 8},
     "compute bound GEMMs (618 GFLOP); fusion/tilesync should beat bsp by the GELU round trip"),
    ("llama2-7b-mlp", "llama2-7b-mlp", {},
     "SwiGLU, compute bound (554 GFLOP); fusion of silu*mul into the dual GEMM"),
    ("nerf-mlp", "nerf-mlp", {},
     "262k points through 256-wide layers: activations (134 MB each) dominate; pipelines/fusion "
     "keep them on chip: the case where the pipeline should win"),
    ("ln-residual-gemm", "ln-residual-gemm", {},
     "LN + GEMM + residual x2 at 4096x4096: compute bound, little to gain"),
    ("dlrm-top-mlp", "dlrm-top-mlp", {},
     "tiny GEMMs (9 GFLOP, ~30 us): launch overhead matters; a persistent kernel should win over eager"),
    ("attention-head", "attention-head", {},
     "QK^T, softmax, PV with a 134 MB score matrix: fusion/pipelining keeps it in L2"),
    ("bert-base-ffn", "gpt3-mlp", {"hidden": 768, "tokens": 16384},
     "BERT-base FFN block (768-3072-768, 32 x 512 tokens): moderately compute bound"),
]


def _pipe(stages, sms, rows, depths, modes, slabs=1):
    return {"strategy": "pipeline", "ops": [o for s in stages for o in s],
            "stages": [{"id": i, "ops": list(s), "sms": n, "ctas": n, "tile": {"rows": rows, "slabs": slabs}}
                       for i, (s, n) in enumerate(zip(stages, sms))],
            "queues": [{"producer": i, "consumer": i + 1, "depth": d * slabs, "mode": m}
                       for i, (d, m) in enumerate(zip(depths, modes))]}


GPT = [["fc1", "gelu"], ["fc2", "residual"]]
LLAMA = [["gate_proj", "up_proj", "silu", "gate_mul"], ["down_proj", "residual"]]
LNG = [["ln1", "gemm1", "residual1"], ["ln2", "gemm2", "residual2"]]
NERF4 = [["fc1", "relu1", "fc2", "relu2", "fc3", "relu3"],
         ["fc4", "relu4", "fc5", "relu5", "skip_concat"],
         ["fc6", "relu6", "fc7", "relu7", "fc8", "relu8"],
         ["sigma_fc", "sigma_relu", "feature_fc", "dir_concat", "view_fc", "view_relu", "rgb_fc", "rgb_sigmoid"]]
DLRM3 = [["top_fc1", "top_relu1"], ["top_fc2", "top_relu2"],
         ["top_fc3", "top_relu3", "top_fc4", "top_relu4", "top_fc5", "sigmoid"]]
DLRM1 = [[o for s in DLRM3 for o in s]]
DLRM2 = [DLRM3[0] + DLRM3[1], DLRM3[2]]
ATT3 = [["qk", "scale"], ["softmax"], ["pv"]]
ATT2 = [["qk", "scale", "softmax"], ["pv"]]

# hand-edited plans (one region each): another SM split, tile rows, queue depth or mode
HAND = {
    "gpt3-mlp-t64": {
        "p88-44-r64-d16-splitk": [_pipe(GPT, [88, 44], 64, [1], ["split_k"], slabs=16)],
        "p66-66-r64-d2-row": [_pipe(GPT, [66, 66], 64, [2], ["row"])],
    },
    "gpt3-mlp-t2048-tp8": {     # a queue-depth sweep and an SM-split sweep around one pipeline
        "p66-66-r128-d8-splitk": [_pipe(GPT, [66, 66], 128, [8], ["split_k"])],
        "p66-66-r128-d2-splitk": [_pipe(GPT, [66, 66], 128, [2], ["split_k"])],
        "p66-66-r128-d4-splitk": [_pipe(GPT, [66, 66], 128, [4], ["split_k"])],
        "p66-66-r128-d16-splitk": [_pipe(GPT, [66, 66], 128, [16], ["split_k"])],
        "p44-88-r128-d8-splitk": [_pipe(GPT, [44, 88], 128, [8], ["split_k"])],
        "p99-33-r128-d8-splitk": [_pipe(GPT, [99, 33], 128, [8], ["split_k"])],
        "p88-44-r256-d4-row": [_pipe(GPT, [88, 44], 256, [4], ["row"])],
    },
    "llama2-7b-mlp": {
        "p88-44-r128-d8-splitk": [_pipe(LLAMA, [88, 44], 128, [8], ["split_k"])],
        "p66-66-r256-d4-row": [_pipe(LLAMA, [66, 66], 256, [4], ["row"])],
    },
    "nerf-mlp": {
        "p4x33-r1024-d4-row": [_pipe(NERF4, [33, 33, 33, 33], 1024, [4, 4, 4], ["row"] * 3)],
        "p4-r2048-d2-splitk": [_pipe(NERF4, [30, 36, 36, 30], 2048, [2, 2, 2], ["split_k"] * 3)],
    },
    "ln-residual-gemm": {
        "p66-66-r128-d8-row": [_pipe(LNG, [66, 66], 128, [8], ["row"])],
        "p44-88-r256-d4-row": [_pipe(LNG, [44, 88], 256, [4], ["row"])],
    },
    "dlrm-top-mlp": {
        "p1-132-r128": [_pipe(DLRM1, [132], 128, [], [])],
        "p3-40-60-32-r128-d4": [_pipe(DLRM3, [40, 60, 32], 128, [4, 4], ["split_k", "split_k"])],
        # the two-stage split_k pipeline the explorer picked in the eighth session (ran 100 us
        # against 77 predicted): one 2048-row block, its consumer a three-GEMM chain
        "p2-68-64-r2048-d4-splitk": [_pipe(DLRM2, [68, 64], 2048, [4], ["split_k"])],
    },
    "attention-head": {
        "p3-44x3-r128-d8": [_pipe(ATT3, [44, 44, 44], 128, [8, 8], ["row", "row"])],
        "p3-44x3-r128-d2": [_pipe(ATT3, [44, 44, 44], 128, [2, 2], ["row", "row"])],
        "p3-44x3-r128-d32": [_pipe(ATT3, [44, 44, 44], 128, [32, 32], ["row", "row"])],
        "p2-88-44-r256-d4": [_pipe(ATT2, [88, 44], 256, [4], ["row"])],
        "p1-132-r1024": [_pipe([[o for s in ATT3 for o in s]], [132], 1024, [], [])],
    },
    "bert-base-ffn": {
        "p88-44-r128-d8-splitk": [_pipe(GPT, [88, 44], 128, [8], ["split_k"])],
        "p1-132-r1024": [_pipe([[o for s in GPT for o in s]], [132], 1024, [], [])],
    },
}


def kd(*args) -> str:
    """The kitsune-dse CLI (as installed, or through the module)."""
    cmd = [sys.executable, "-c", "import sys; from kitsune_dse.cli import main; sys.argv=['kitsune-dse']+sys.argv[1:]; "
           "sys.exit(main())", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise RuntimeError(f"kitsune-dse {' '.join(args)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def _rel(p: Path) -> str:
    return str(Path(p).resolve().relative_to(ROOT))


def _est(e) -> dict:
    bd = e.breakdown or {}
    return {"latency_s": e.latency_s, "dram_read_bytes": e.dram_read_bytes,
            "dram_write_bytes": e.dram_write_bytes, "dram_write_deferred_bytes": e.dram_deferred_write_bytes,
            "kernel_launches": e.kernel_launches,
            # time not spent in kernels: launch gaps, and launched eagerly the host's issue
            "launch_s": bd.get("launch_s"),
            "kernels": [{"kernel": k["kernel"], "latency_s": k["latency_s"],
                         **{f: k[f] for f in ("eager_step_s", "device_step_s") if f in k}}
                        for k in bd.get("kernels", [])]}


def prepare() -> None:
    import glob
    import shutil

    from kitsune_dse.cost.region import Region as CRegion
    from kitsune_dse.cost.strategies import LaunchChoice, bsp, fusion, library_bsp
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    spec, cspec = load_spec(str(SPEC)), load_spec(str(SPEC_CUBLAS))
    manifest = {"spec": _rel(SPEC), "spec_cublas": _rel(SPEC_CUBLAS), "commands": [], "workloads": []}
    for name, model, sizes, expect in WORKLOADS:
        d = SUITE / name
        if d.exists():
            shutil.rmtree(d)
        (d / "plans").mkdir(parents=True)
        sets = [x for k, v in sizes.items() for x in ("--set", f"{k}={v}")]
        args = ["explore", model, "--hw", _rel(SPEC), *sets, "--alternatives", "5", "--out", _rel(d / "explore")]
        kd(*args)
        manifest["commands"].append("kitsune-dse " + " ".join(args))
        files = [d / "explore/plan.json"] + sorted(glob.glob(str(d / "explore/plan-*.json")),
                                                   key=lambda f: int(Path(f).stem.split("-")[1]))
        graph = load_model(model, sizes)
        plans = []
        for i, f in enumerate(files):
            p = json.loads(Path(f).read_text())
            dst = d / "plans" / f"explorer-{i + 1}.json"
            dst.write_text(json.dumps(p, indent=1))
            plans.append(_entry(dst, p, "explorer", i + 1))
        base = json.loads(files[0].read_text())
        for label, regions in HAND.get(name, {}).items():
            hp = {"schema": base["schema"], "model": base["model"], "hw": base["hw"], "objective": "hand",
                  "regions": [dict(r, id=j) for j, r in enumerate(copy.deepcopy(regions))]}
            src = d / "plans" / f"hand-{label}.src.json"
            src.write_text(json.dumps(hp, indent=1))
            try:
                new = evaluate_plan(hp, graph, spec, where=str(src))
            except Exception as e:  # noqa: BLE001 - an infeasible hand plan is reported, not run
                print(f"{name}: hand plan {label} rejected by evaluate: {e}")
                plans.append({"file": _rel(src), "kind": "hand", "label": label, "rejected": str(e)})
                continue
            new["model"] = base["model"]
            dst = d / "plans" / f"hand-{label}.json"
            dst.write_text(json.dumps(new, indent=1))
            src.unlink()
            plans.append(_entry(dst, new, "hand", None, label))
            manifest["commands"].append(f"kitsune-dse evaluate {_rel(src)} --hw {_rel(SPEC)}")
        # the whole model as one fusion region: its run gives every baseline variant
        wp = {"schema": base["schema"], "model": base["model"], "hw": base["hw"], "objective": "baseline",
              "regions": [{"id": 0, "strategy": "fusion", "ops": [o.name for o in graph.ops]}]}
        whole = evaluate_plan(wp, graph, spec, where="whole")
        whole["model"] = base["model"]
        (d / "plans/whole.json").write_text(json.dumps(whole, indent=1))
        region = CRegion.of(graph)
        baselines = {
            "bsp-graph": _est(bsp(region, spec)), "bsp-eager": _est(bsp(region, spec, LaunchChoice("eager"))),
            "fusion-graph": _est(fusion(region, spec)), "fusion": _est(fusion(region, spec, LaunchChoice("eager"))),
            "cublas": _est(library_bsp(region, spec, LaunchChoice("eager"), library_spec=cspec)),
            "cublas-graph": _est(library_bsp(region, spec, LaunchChoice("graph"), library_spec=cspec)),
        }
        manifest["workloads"].append({"name": name, "model": model, "sizes": sizes, "expect": expect,
                                      "plans": plans, "whole": _rel(d / "plans/whole.json"),
                                      "baselines": baselines})
        print(f"{name}: {len(plans)} plans; pick {plans[0]['predicted_s'] * 1e6:.1f} us; "
              + ", ".join(f"{k} {v['latency_s'] * 1e6:.1f}" for k, v in baselines.items()))
    (SUITE / "manifest.json").write_text(json.dumps(manifest, indent=1))


HARNESS_STRATEGIES = ("pipeline", "bsp", "fusion", "tilesync", "concurrent")   # run as planned


def _entry(path: Path, plan: dict, kind: str, rank, label=None) -> dict:
    strategies = [r["strategy"] for r in plan["regions"]]
    return {"file": _rel(path), "kind": kind, "rank": rank, "label": label or f"explorer-{rank}",
            "predicted_s": plan["predicted"]["latency_s"],
            "predicted_dram_read_bytes": plan["predicted"]["dram_read_bytes"],
            "predicted_dram_write_bytes": writes_in_run(plan["predicted"]),
            "strategies": strategies,
            "implemented": all(s in HARNESS_STRATEGIES for s in strategies),
            "regions": [{"id": r["id"], "strategy": r["strategy"], "predicted_s": r["predicted"]["latency_s"],
                         "stages": [{"ops": s["ops"], "sms": s["sms"], "tile": s.get("tile"),
                                     "unit_s": s.get("predicted_unit_latency_s"),
                                     "end_s": s.get("predicted_end_s")} for s in r.get("stages", [])],
                         "queues": [{"depth": q.get("depth"), "mode": q.get("mode")} for q in r.get("queues", [])],
                         "pipeline": r.get("pipeline")}
                        for r in plan["regions"]]}


def _jobs(manifest: dict) -> list[tuple[str, str, list[str]]]:
    """(workload, plan file, variants) in run order."""
    out = []
    for w in manifest["workloads"]:
        out.append((w["name"], w["whole"], BASELINES))
        for p in w["plans"]:
            if not p.get("rejected"):
                out.append((w["name"], p["file"], ["plan"]))
    return out


def precompile(arch: str = "sm_90", sms: int = 132) -> None:
    import concurrent.futures as cf

    sys.path.insert(0, str(ROOT / "bench"))
    from precompile import compile_one

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref, whole_region
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.plan import DeviceInfo, check_target, load_plan
    from kitsune_dse.validate.runtime import Tensors, make_variants
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch=arch, sm_count=sms)
    manifest = json.loads((SUITE / "manifest.json").read_text())
    srcs = []
    for _, f, variants in _jobs(manifest):
        plan, _ = check_target(load_plan(ROOT / f), info, False)
        graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        whole = whole_region(graph) if len(plan["regions"]) > 1 else None
        for region in plan["regions"]:
            reg = Region(graph, region, layouts=whole)
            for v in make_variants(reg, region, Tensors(reg), info, which=variants):
                try:
                    srcs.append(v.build())
                except Exception as e:  # noqa: BLE001
                    print(f"{f} region {region['id']} {v.name}: cannot build: {e}")
    srcs = list(dict.fromkeys(srcs))
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(srcs)} modules")
    with cf.ThreadPoolExecutor(8) as ex:
        for r in ex.map(lambda s: compile_one(s, arch, out), srcs):
            if "FAILED" in r or "spill" in r:
                print(r[:600], flush=True)


def _workload(manifest: dict, name: str) -> dict:
    return next(w for w in manifest["workloads"] if w["name"] == name)


def _last_plan(manifest: dict, name: str) -> str:
    """The file of a workload's last job (after which its plans run end to end)."""
    return [f for w, f, _ in _jobs(manifest) if w == name][-1]


def _report(rs: list[dict], wname: str, t0: float) -> list[dict]:
    """The rows, named by workload, each printed as it is."""
    for r in rs:
        r["plan"] = f"{wname}/{r['plan']}"
        ok = "ok" if r.get("correct") else "NOT CORRECT"
        lat = r.get("measured_latency_s")
        print(f"[{time.time() - t0:6.1f} s] {r['plan']} r{r['region']} {r['variant']}: "
              + (f"{lat * 1e6:.1f} us (pred {r.get('predicted_latency_s') and r['predicted_latency_s'] * 1e6 or 0:.1f}) {ok}"
                 if isinstance(lat, float) else f"ERROR {r.get('error')}"), flush=True)
    return rs


def run(out: Path, runs: int, only: str = "") -> None:
    import cupy as cp

    from kitsune_dse.validate.e2e import validate_plans_e2e
    from kitsune_dse.validate.harness import env_summary, validate_plan, write_csv
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((SUITE / "manifest.json").read_text())
    env = env_summary()
    env["command"] = "python3 " + " ".join(sys.argv)
    env["cubin_cache"] = os.environ.get("KDSE_CUBIN_CACHE", "")
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print("env " + json.dumps(env), flush=True)
    t0 = time.time()
    rows = []
    for wname, f, variants in _jobs(manifest):
        if only and wname not in only.split(","):
            continue
        whole = variants != ["plan"]
        try:
            rs = validate_plan(ROOT / f, runs=runs, warmup=3, checks=2, variants=variants, warm=whole,
                               command=env["command"], kernel_times=whole)
        except Exception as e:  # noqa: BLE001
            rs = [{"plan": Path(f).stem, "region": "-", "variant": "all", "correct": False,
                   "error": f"{type(e).__name__}: {e}"}]
        rows += _report(rs, wname, t0)
        write_csv(rows, out / "validation.csv")
        cp.get_default_memory_pool().free_all_blocks()
        if f == _last_plan(manifest, wname):
            # the workload's plans end to end (one-region plans too, so that its alternatives
            # are all timed alike), taking turns over ADDRESS_SETS placements of their tensors
            files = [p["file"] for p in _workload(manifest, wname)["plans"] if not p.get("rejected")]
            try:
                rs = validate_plans_e2e([ROOT / x for x in files], runs=runs, warmup=3, checks=2,
                                        command=env["command"], address_sets=ADDRESS_SETS)
            except Exception as e:  # noqa: BLE001
                rs = [{"plan": Path(x).stem, "region": "all", "variant": "plan-e2e", "correct": False,
                       "error": f"{type(e).__name__}: {e}"} for x in files]
            rows += _report(rs, wname, t0)
            write_csv(rows, out / "validation.csv")
    bad = [r for r in rows if not r.get("correct")]
    from kitsune_dse.validate.runtime import MODULES_BY_COMPILER, kernel_compiler_note
    env["kernel_modules"] = dict(MODULES_BY_COMPILER)      # (which compiler built what ran)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(f"{len(rows)} rows, {len(bad)} not correct, {time.time() - t0:.0f} s; kernel modules: "
          + ", ".join(f"{v} {k}" for k, v in MODULES_BY_COMPILER.items()), flush=True)
    if kernel_compiler_note():
        print("note: " + kernel_compiler_note(), flush=True)
    for r in bad:
        print(f"  NOT CORRECT {r['plan']} r{r['region']} {r['variant']}: {r.get('error') or r.get('rel_err')}")


# -- ncu: every profiled (plan, region, variant) in ONE Nsight Compute process --------------------------
def ncu_targets(manifest: dict) -> list[tuple[str, str, list[str]]]:
    out = []
    for w in manifest["workloads"]:
        out.append((w["name"], w["whole"], ["bsp-eager", "fusion", "cublas"]))
        for p in w["plans"]:
            if p.get("rejected"):
                continue
            if p["kind"] == "hand" or p.get("rank") == 1:
                out.append((w["name"], p["file"], ["plan"]))
    return out


def ncu(out: Path, budget_s: float, passes: int = 1) -> None:
    """`passes` Nsight Compute passes over the same ranges, in separate processes:
    validation_ncu.csv, then validation_ncu_repeat_<k>.csv (accuracy.py takes each range's median:
    the harness's GEMM grids read a few percent more or less from one pass to the next)."""
    from kitsune_dse.validate.harness import write_csv
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((SUITE / "manifest.json").read_text())
    targets = ncu_targets(manifest)
    tl = out / "ncu_targets.json"
    tl.write_text(json.dumps(targets))
    t_end = time.time() + budget_s
    for k in range(passes):
        order = out / "ncu_order.json"
        log = out / "ncu_raw.csv"
        for f in (order, log):
            f.unlink(missing_ok=True)
        t0 = time.time()
        names, res = ncu_process([str(Path(__file__).resolve()), "--ncu-child", str(tl), str(order)],
                                 log, order, max(1.0, t_end - t0))
        print(f"ncu pass {k + 1}: {len(res)} ranges for {len(names)} recorded in {time.time() - t0:.0f} s")
        write_csv(ncu_rows(names, res), out / ("validation_ncu.csv" if k == 0 else f"validation_ncu_repeat_{k}.csv"))
        if time.time() >= t_end:
            break


def ncu_process(child_args: list[str], log: Path, order: Path, budget_s: float) -> tuple[list, list]:
    """One Nsight Compute process over a Python child (`child_args`) that records the order of
    its profiled ranges in `order`: (that order, ncu's parsed ranges), as far as the budget got."""
    from kitsune_dse.validate.ncu import ncu_command, parse_ncu_csv
    cmd = ncu_command(str(log)) + [sys.executable, *child_args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s,
                           env=dict(os.environ, KDSE_NCU_CHILD="1"))
        print((p.stdout + p.stderr)[-3000:])
    except subprocess.TimeoutExpired:
        print(f"ncu: budget of {budget_s:.0f} s spent; keeping the ranges profiled so far")
    names = json.loads(order.read_text()) if order.exists() else []
    res = parse_ncu_csv(log.read_text()) if log.exists() else []
    return names, res


def ncu_rows(names: list, res: list) -> list[dict]:
    """validation_ncu.csv rows: the recorded range order paired with ncu's parsed ranges."""
    rows = []
    for (wname, stem, region, variant, prd), r in zip(names, res):
        rows.append({"plan": f"{wname}/{stem}", "region": region, "variant": variant,
                     "predicted_dram_read_bytes": prd.get("dram_read_bytes", ""),
                     "predicted_dram_write_bytes": writes_in_run(prd),
                     "measured_dram_read_bytes": r.get("dram__bytes_read.sum", float("nan")),
                     "measured_dram_write_bytes": r.get("dram__bytes_write.sum", float("nan")),
                     "correct": True, "command": "ncu --clock-control none --replay-mode range "
                                                 "--metrics dram__bytes_read.sum,dram__bytes_write.sum"})
    return rows


def ncu_child(targets_path: str, order_path: str) -> None:
    import cupy as cp

    from kitsune_dse.errors import KitsuneError
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import predicted_for, resolve_model_ref, whole_region
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.ncu import profile_region
    from kitsune_dse.validate.plan import check_target, load_plan
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    order = []
    stream.__enter__()
    for wname, f, variants in json.loads(Path(targets_path).read_text()):
        plan, _ = check_target(load_plan(ROOT / f), info, False)
        graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        whole = whole_region(graph) if len(plan["regions"]) > 1 else None
        for ri, region in enumerate(plan["regions"]):
            try:
                reg = Region(graph, region, layouts=whole)
            except KitsuneError:
                continue

            def on_range(v, region=region, ri=ri, f=f, wname=wname, plan=plan):
                prd = predicted_for(plan, region, v.name)
                order.append([wname, Path(f).stem, region.get("id", ri), v.name,
                              {k: prd.get(k) for k in ("dram_read_bytes", "dram_write_bytes",
                                                       "dram_write_deferred_bytes") if k in prd}])
                Path(order_path).write_text(json.dumps(order))
            profile_region(reg, region, info, variants, stream, flush, on_range)


def collect(src: Path) -> None:
    import shutil
    RESULTS.mkdir(parents=True, exist_ok=True)
    if (src / "validation.csv").exists():           # a new run: the last run's extra runs are stale
        for old in RESULTS.glob("validation_repeat_*.csv"):
            old.unlink()
    for name in ("validation.csv", "validation_ncu.csv", "env.json", "log.txt", "ncu_log.txt"):
        if (src / name).exists():
            shutil.copy(src / name, RESULTS / name)
    if (src / "validation_ncu.csv").exists():      # this run's ncu passes replace the last run's
        for old in RESULTS.glob("validation_ncu_repeat_*.csv"):
            old.unlink()
        for p in src.glob("validation_ncu_repeat_*.csv"):
            shutil.copy(p, RESULTS / p.name)
    shutil.copy(SUITE / "manifest.json", RESULTS / "manifest.json")
    print(f"copied into {RESULTS}")


def add_runs(dirs: list[Path]) -> None:
    """Add more runs of the same plans (another call, another lent machine) beside the collected
    ones: each DIR's validation.csv (a --run output) as the next validation_repeat_N.csv, and each
    DIR's validation_ncu.csv and validation_ncu_repeat_*.csv (an --ncu output) as the next
    validation_ncu_repeat_N.csv. bench/accuracy.py takes the median over all of them. Refused
    when a DIR's rows are not the collected run's plans."""
    import csv
    import re
    import shutil

    def keys(path: Path) -> set:
        return {(r["plan"], r["region"], r["variant"]) for r in csv.DictReader(open(path))}

    def next_free(stem: str) -> int:
        used = [int(m.group(1)) for q in RESULTS.glob(f"{stem}_*.csv")
                if (m := re.fullmatch(rf"{stem}_(\d+)\.csv", q.name))]
        return max(used, default=0) + 1

    def add(src: Path, ref: str, stem: str, what: str) -> None:
        if not (RESULTS / ref).exists() or keys(src) != keys(RESULTS / ref):
            raise SystemExit(f"error: {src}: its {what} of {RESULTS / ref}")
        dst = RESULTS / f"{stem}_{next_free(stem)}.csv"
        shutil.copy(src, dst)
        print(f"{src} -> {dst.name}")

    for d in dirs:
        runs = [d / "validation.csv"] if (d / "validation.csv").exists() else []
        ncus = sorted(d.glob("validation_ncu*.csv"))
        if not runs and not ncus:
            raise SystemExit(f"error: {d}: no validation.csv or validation_ncu*.csv to add")
        for src in runs:
            add(src, "validation.csv", "validation_repeat", "rows are not the plans")
        for src in ncus:
            add(src, "validation_ncu.csv", "validation_ncu_repeat", "ranges are not those")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--ncu-child", nargs=2)
    ap.add_argument("--collect", default="")
    ap.add_argument("--add-runs", nargs="+", default=[], metavar="DIR",
                    help="more runs of the collected plans: --run or --ncu output folders")
    ap.add_argument("--only", default="", help="comma-separated workloads (--run)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--ncu-budget-s", type=float, default=400.0, help="for all the ncu passes")
    ap.add_argument("--ncu-passes", type=int, default=1)
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    a = ap.parse_args()
    if a.prepare:
        prepare()
    if a.precompile:
        precompile()
    if a.run:
        run(Path(a.out), a.runs, a.only)
    if a.ncu:
        ncu(Path(a.out), a.ncu_budget_s, a.ncu_passes)
    if a.ncu_child:
        ncu_child(*a.ncu_child)
    if a.collect:
        collect(Path(a.collect))
    if a.add_runs:
        add_runs([Path(x) for x in a.add_runs])


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
