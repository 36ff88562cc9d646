"""A fusion plan's kernels in context: the first k kernels of a plan's fusion region (k = 1 .. all)
as one CUDA graph on cold L2, and each kernel alone, so that the increments give every kernel's
time where the one before it left its output in L2 (what the suite's fusion-graph runs), beside
the model's (cost.strategies.fusion of the same ops). Written when dlrm's fusion pick was priced
3% under the suite's measurement while its pipelines were within 1.5%. The answer was the suite's
measurement state, not a kernel (--calls; results/validation/h100/fusion_chain_probe/).

    here:    python bench/fusion_chain_probe.py --precompile [--plan FILE]
    device:  python3 bench/fusion_chain_probe.py --out $OUT [--runs 30] [--plan FILE]
    here:    python bench/fusion_chain_probe.py --report DIR [--plan FILE]
    device:  python3 bench/fusion_chain_probe.py --settings [--runs 30]   # the whole chain as
             the suite times it (outputs poisoned before every run) and as the probe does (not)
    device:  python3 bench/fusion_chain_probe.py --calls [--runs 30]   # the suite's own
             measurement (validate_plan) of dlrm's fusion pick, pipeline pick and fusion-graph
             baseline, one call after another in one process
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

PLAN = ROOT / "bench/suite/dlrm-top-mlp/plans/explorer-1.json"


def cases(plan_path: Path) -> list[tuple[str, list[list[str]]]]:
    """(name, kernels): every prefix of the plan's first fusion region's kernels, then each kernel
    alone (its inputs cold)."""
    plan = json.loads(plan_path.read_text())
    region = next(r for r in plan["regions"] if r["strategy"] == "fusion")
    kernels = [list(k) for k in region["kernels"]]
    out = [(f"first{k}", kernels[:k]) for k in range(1, len(kernels) + 1)]
    out += [(f"alone{i + 1}", [k]) for i, k in enumerate(kernels[1:], start=1)]
    return out


def _graph(plan_path: Path):
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    plan = json.loads(plan_path.read_text())
    return load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})


def variants(info, plan_path: Path = PLAN):
    from kitsune_dse.validate.lower import Region, fusion_groups
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors
    g = _graph(plan_path)
    out = []
    for name, kernels in cases(plan_path):
        ops = [o for k in kernels for o in k]
        reg = Region(g, {"id": 0, "ops": ops, "strategy": "fusion", "kernels": kernels})
        out.append((name, [len(kernels)], reg, StandaloneVariant("fused", reg, Tensors(reg), info,
                                                                 fusion_groups(reg), graph=True, prefix="fc")))
    return out


def settings(runs: int, plan_path: Path = PLAN) -> None:
    """The whole chain timed with and without the suite's output poisoning before each run,
    alternating, on one machine: does the setting explain a probe/suite difference?"""
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    *_, (name, _, reg, v) = [c for c in variants(info, plan_path) if c[0].startswith("first")]
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    with stream:
        v.prepare()
        check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
        for rep in range(3):
            for poison in (True, False):
                t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flush, poison_every=poison)
                print(f"{name} poison={poison!s:5s} rep {rep}: {t.median_s * 1e6:.2f} us "
                      f"(p10 {t.p10_s * 1e6:.2f}, p90 {t.p90_s * 1e6:.2f})", flush=True)
        # the suite times every plan after its workload's cuBLAS baselines: a cuBLAS call first
        a = cp.ones((2048, 1024), dtype=cp.float16)
        (a @ a.T).sum().get()
        for rep in range(3):
            t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flush)
            print(f"{name} after a cuBLAS call, rep {rep}: {t.median_s * 1e6:.2f} us "
                  f"(p10 {t.p10_s * 1e6:.2f}, p90 {t.p90_s * 1e6:.2f})", flush=True)


def calls(runs: int) -> None:
    """validate_plan, as the suite calls it, on dlrm's plans one after another in one process:
    does a plan's time depend on the calls before it?"""
    from kitsune_dse.validate.harness import validate_plan
    d = ROOT / "bench/suite/dlrm-top-mlp/plans"
    seq = [("explorer-1", ["plan"]), ("explorer-1", ["plan"]), ("whole", ["fusion-graph"]),
           ("explorer-2", ["plan"]), ("explorer-1", ["plan"]), ("whole", ["fusion-graph", "cublas"]),
           ("explorer-1", ["plan"]), ("whole", ["fusion-graph"])]
    for i, (f, which) in enumerate(seq):
        for r in validate_plan(d / f"{f}.json", runs=runs, variants=which, warm=False):
            print(f"call {i}: {f} {r['variant']}: {float(r['measured_latency_s']) * 1e6:.2f} us "
                  f"correct={r.get('correct')}", flush=True)


def report(src: Path, plan_path: Path = PLAN) -> None:
    from kitsune_dse.cost.region import Region
    from kitsune_dse.cost.strategies import fusion
    from kitsune_dse.hw import load_spec
    spec = load_spec(str(ROOT / "hw_specs/h100-sxm.calibrated.yaml"))
    g = _graph(plan_path)
    d = json.loads((src / "fusion_chain_probe.json" if src.is_dir() else src).read_text())
    meas = {r["kind"]: r.get("time_s") for r in d["rows"]}
    print(f"{'case':8s} {'kernels':40s} {'meas us':>8s} {'model us':>9s} {'err':>6s} {'incr meas':>9s} {'incr model':>10s}")
    prev = None
    for name, kernels in cases(plan_path):
        ops = tuple(o for k in kernels for o in k)
        pred = fusion(Region.of(g, ops), spec).latency_s
        m = meas.get(name)
        if not m:
            print(name, "not measured")
            continue
        inc = ""
        if name.startswith("first"):
            if prev is not None:
                inc = f"{(m - prev[0]) * 1e6:9.1f} {(pred - prev[1]) * 1e6:10.1f}"
            prev = (m, pred)
        print(f"{name:8s} {'+'.join(k[0] for k in kernels)[:40]:40s} {m * 1e6:8.1f} {pred * 1e6:9.1f} "
              f"{100 * (pred / m - 1):+5.1f}% {inc}")


def main() -> None:
    from rowop_probe import measure_variants, precompile_variants, probe_parser, save_rows
    ap = probe_parser(__doc__, 30)
    ap.add_argument("--plan", type=Path, default=PLAN)
    ap.add_argument("--settings", action="store_true")
    ap.add_argument("--calls", action="store_true")
    a = ap.parse_args()
    if a.settings:
        settings(a.runs, a.plan)
        return
    if a.calls:
        calls(a.runs)
        return
    if a.precompile:
        precompile_variants(lambda info: variants(info, a.plan))
        return
    if a.report:
        report(Path(a.report), a.plan)
        return
    from kitsune_dse.validate.runtime import gpu_info
    _, env = gpu_info()
    rows = measure_variants(lambda info: variants(info, a.plan), a.runs)
    save_rows(a.out, "fusion_chain_probe.json", env, a.runs, rows)


if __name__ == "__main__":
    main()
