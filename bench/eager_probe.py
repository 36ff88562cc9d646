"""Why an eagerly launched baseline's measured time moves from run to run: each workload's
whole-model eager variants (cublas, bsp-eager, fusion) timed under two protocols, with the host
time of each run's issue loop and of each call in it.

  flushed   the suite's protocol: poison, L2 flush (a 256 MiB memset), start event, launches,
            end event. The host issues the run's first calls while the GPU still flushes.
  idle      the same, then the host waits for the flush before it records the start event: the
            host and the GPU start together, as the eager timeline model assumes.

    here:    python bench/validate_suite.py --prepare && python bench/validate_suite.py --precompile
    device:  python3 bench/eager_probe.py --out $OUT [--workloads dlrm-top-mlp ...] [--runs 30]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

SUITE = ROOT / "bench/suite"
DEFAULT = ["dlrm-top-mlp", "attention-head", "bert-base-ffn"]
VARIANTS = ["cublas", "bsp-eager", "fusion"]


def time_protocol(v, stream, flusher, runs: int, idle: bool) -> dict:
    """The harness's own timing (validate.measure.time_runs; host_start=idle), each call's host
    time recorded besides."""
    from kitsune_dse.validate.measure import time_runs
    issue, run = v._issue, v.run
    calls: list[list[float]] = []

    def timed_issue(call):
        t = time.perf_counter()
        issue(call)
        calls[-1].append(time.perf_counter() - t)

    def timed_run(s):
        calls.append([])
        run(s)
    v._issue = timed_issue
    try:
        t = time_runs(timed_run, v.pre, v.after, stream, runs, 0, flusher, host_start=idle)
    finally:
        v._issue = issue
    med = statistics.median
    return {"gpu_s": list(t.samples_s), "host_s": list(t.host_samples_s), "gpu_median_s": t.median_s,
            "host_median_s": t.host_s,
            "call_median_s": [med(c[i] for c in calls) for i in range(len(calls[0]))] if calls[0] else []}


def issue_costs(v, stream, busy_buf, passes: int = 20) -> dict:
    """Host time per call by kind (bmm: a cuBLAS call, k: a harness kernel) of the variant's
    calls, all of them or one kind alone, issued with the GPU idle (starved: each call reaches
    an empty queue) or busy (behind a long memset, so that every call queues)."""
    import cupy as cp
    out = {}
    for subset in ("all", "bmm", "k"):
        calls = [c for c in v.calls if subset == "all" or c[0] == subset]
        if not calls:
            continue
        for gpu in ("idle", "busy"):
            per: dict[str, list[float]] = {}
            for _ in range(passes):
                stream.synchronize()
                if gpu == "busy":   # ~1.4 ms of memset ahead of the calls
                    cp.cuda.runtime.memsetAsync(busy_buf.data.ptr, 0, busy_buf.nbytes, stream.ptr)
                for c in calls:
                    t = time.perf_counter()
                    v._issue(c)
                    per.setdefault(c[0], []).append(time.perf_counter() - t)
            stream.synchronize()
            out[f"{subset}/{gpu}"] = {k: statistics.median(x) for k, x in per.items()}
    return out


def flush_time(stream, flusher, runs: int = 10) -> float:
    import cupy as cp
    a, b = cp.cuda.Event(), cp.cuda.Event()
    xs = []
    for _ in range(runs):
        stream.synchronize()
        a.record(stream)
        flusher(stream)
        b.record(stream)
        b.synchronize()
        xs.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", nargs="*", default=DEFAULT)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2, help="protocols alternate this many times")
    a = ap.parse_args()
    import cupy as cp

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import check_variant, resolve_model_ref
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.plan import load_plan
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import Tensors, gpu_info, make_variants
    info, extra = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flusher = L2Flusher()
    out = {"device": info.name, "driver": extra.get("driver_version", extra.get("driver")),
           "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "command": " ".join(sys.argv),
           "workloads": {}}
    with stream:
        out["flush_s"] = flush_time(stream, flusher)
        busy_buf = cp.empty((4 * 2**30,), dtype=cp.uint8)
        for w in a.workloads:
            plan = load_plan(SUITE / w / "plans/whole.json")
            graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
            region = plan["regions"][0]
            reg = Region(graph, region)
            tensors = Tensors(reg)
            res = out["workloads"][w] = {}
            for v in make_variants(reg, region, tensors, info, 1.0, VARIANTS):
                v.prepare()
                check_variant(v, reg, tensors, input_roles(reg), stream, 1)
                for _ in range(3):
                    v.pre(True)
                    v.run(stream)
                    stream.synchronize()
                rows = res[v.name] = {"calls": [c[0] for c in v.calls], "flushed": [], "idle": []}
                for _ in range(a.rounds):
                    for idle in (False, True):
                        rows["idle" if idle else "flushed"].append(time_protocol(v, stream, flusher, a.runs, idle))
                rows["issue"] = issue_costs(v, stream, busy_buf)
                print(f"  {w} {v.name} host us per call: " + "; ".join(
                    f"{k} " + " ".join(f"{kk}:{x * 1e6:.1f}" for kk, x in d.items()) for k, d in rows["issue"].items()))
                fl = statistics.median(r["gpu_median_s"] for r in rows["flushed"])
                il = statistics.median(r["gpu_median_s"] for r in rows["idle"])
                hf = statistics.median(r["host_median_s"] for r in rows["idle"])
                print(f"{w:20s} {v.name:10s} calls {len(v.calls):3d}  flushed {fl * 1e6:8.1f} us  "
                      f"idle {il * 1e6:8.1f} us  host issue {hf * 1e6:8.1f} us  per call "
                      + " ".join(f"{c[0]}:{t * 1e6:.0f}" for c, t in
                                 zip(v.calls, rows["idle"][0]["call_median_s"])), flush=True)
        from kitsune_dse.calibrate.microbench import Bench
        out["calibration_launch"] = Bench().launch_overheads()
        sys.path.insert(0, str(ROOT / "bench"))
        from cublas_call_probe import probe
        out["cublas_call"] = probe(1000)
    print(f"L2 flush (256 MiB memset): {out['flush_s'] * 1e6:.1f} us")
    print("calibration's launch microbenchmark: " + ", ".join(
        f"{k} {v * 1e6:.2f} us" for k, v in out["calibration_launch"].items()))
    print("cuBLAS call probe: " + ", ".join(
        f"{'x'.join(map(str, r['shape']))} {r['host_s'] * 1e6:.1f} us" for r in out["cublas_call"]))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "eager_probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
