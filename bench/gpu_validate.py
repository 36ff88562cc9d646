"""The device-machine script of the validation harness: builds, checks and times everything.

    python bench/gpu_validate.py [--runs 30] [--plans 'tests/data/plans/*.json'] [--no-micro]
                                 [--ncu] [--pytest] [--out $OUT]

1. device facts (GPU, clocks, driver, CuPy);
2. tile-kernel microbenchmarks: GEMM TFLOP/s against cuBLAS, GB/s of elementwise/softmax/norms
   -> kernels.csv;
3. every plan: plan / bsp-eager / bsp-graph / fusion / fusion-graph / cublas, checked on fresh
   inputs, timed cold (L2 flushed) and warm -> validation.csv;
4. a planted deadlock (a consumer waiting for a sub-tile nobody produces) must come back as a
   timeout error -> deadlock.txt;
5. optionally the GPU pytest file and the ncu DRAM-bytes pass;
then prints the tables last. Kernels precompiled by bench/precompile.py are used when present
(bench/.cubin_cache is git-ignored: name it in the device run's `carry`).

Typical session: here `python bench/precompile.py`, then on the device machine
`python3 bench/gpu_validate.py --runs 30 --pytest --ncu-all` with carry=["bench/.cubin_cache"];
copy $OUT to results/validation/h100/.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--plans", default=",".join([str(ROOT / "tests/data/plans/*.json"),
                                                 str(ROOT / "tests/data/plans/explorer/*.json")]),
                    help="comma-separated globs of plan files")
    ap.add_argument("--no-micro", action="store_true")
    ap.add_argument("--micro-only", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="DRAM bytes with ncu inside every validation")
    ap.add_argument("--ncu-all", action="store_true",
                    help="after the timing runs, a separate ncu pass per plan -> validation_ncu.csv")
    ap.add_argument("--ncu-budget-s", type=float, default=300.0)
    ap.add_argument("--ncu-check", action="store_true", help="only check that ncu range replay works")
    ap.add_argument("--pytest", action="store_true")
    ap.add_argument("--variants", default="plan,plan-1team,bsp-eager,bsp-graph,fusion,fusion-graph,cublas,cublas-graph")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    from rich.console import Console
    from rich.table import Table
    console = Console(width=170)
    from kitsune_dse.validate.harness import env_summary, table, validate_plan, write_csv
    env = env_summary()
    env["command"] = " ".join(["python"] + sys.argv)
    env["cubin_cache"] = os.environ.get("KDSE_CUBIN_CACHE", "")
    (out / "env.json").write_text(json.dumps(env, indent=1))
    console.print("env: " + json.dumps(env))
    t_start = time.time()

    if a.pytest:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            str(ROOT / "tests/test_validate_gpu.py")], capture_output=True, text=True)
        (out / "pytest_gpu.txt").write_text(p.stdout + p.stderr)
        console.print(f"pytest tests/test_validate_gpu.py: exit {p.returncode}; "
                      + (p.stdout.strip().splitlines() or ["?"])[-1])
        if p.returncode:
            console.print(p.stdout[-3000:])

    micro = []
    if not a.no_micro:
        from kitsune_dse.validate.microbench import run_microbench
        micro = run_microbench(runs=a.runs, console=console)
        import csv
        keys = ["kernel", "impl", "dtype", "shape", "time_s", "p10_s", "p90_s", "tflops", "gbps", "correct",
                "rel_err", "flops", "bytes", "launches", "resources", "error"]
        with open(out / "kernels.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            for r in micro:
                w.writerow({**r, "gpu": env.get("gpu")})
        console.print(f"[micro done at {time.time() - t_start:.0f} s]")

    if a.ncu_check:
        from kitsune_dse.validate.ncu import ncu_command
        console.print("ncu: " + subprocess.run(ncu_command("/dev/null")[:1] + ["--version"], capture_output=True,
                                              text=True).stdout.strip().splitlines()[-1])

    rows = []
    if not a.micro_only:
        variants = [v for v in a.variants.split(",") if v] or None
        for p in plan_files(a.plans):
            console.print(f"plan {p}")
            try:
                rows += validate_plan(p, runs=a.runs, warmup=3, checks=2, ncu=a.ncu, variants=variants,
                                      console=console, command=env["command"])
            except Exception as e:  # noqa: BLE001
                console.print(f"  FAILED: {type(e).__name__}: {e}")
                rows.append({"plan": Path(p).stem, "region": "-", "variant": "all", "error": str(e), "correct": False})
            import cupy as cp
            cp.get_default_memory_pool().free_all_blocks()
            console.print(f"[at {time.time() - t_start:.0f} s]")
        write_csv(rows, out / "validation.csv")
        dl = deadlock_demo(console)
        (out / "deadlock.txt").write_text(dl)

    ncu_rows = []
    if a.ncu_all:
        t_ncu = time.time()
        for p in plan_files(a.plans):
            left = a.ncu_budget_s - (time.time() - t_ncu)
            if left < 30:
                console.print(f"ncu: budget spent, skipping {p}")
                continue
            try:
                from kitsune_dse.validate import ncu as ncu_mod
                ncu_mod.DEFAULT_TIME_LIMIT_S = left
                ncu_rows += validate_plan(p, runs=5, warmup=2, checks=1, ncu=True, warm=False,
                                          variants=["plan", "bsp-eager", "fusion", "cublas"],
                                          command=env["command"] + " (ncu pass)")
            except Exception as e:  # noqa: BLE001
                console.print(f"ncu {p}: FAILED {type(e).__name__}: {e}")
            console.print(f"[ncu at {time.time() - t_ncu:.0f} s]")
        write_csv(ncu_rows, out / "validation_ncu.csv")

    if micro:
        t = Table(title=f"tile kernels on {env.get('gpu')} (SM clock {env.get('sm_clock_mhz')} MHz at start)")
        for c in ("kernel", "impl", "dtype", "shape", "us", "p10-p90 us", "TFLOP/s", "GB/s", "ok", "rel err"):
            t.add_column(c)
        for r in micro:
            if "time_s" not in r:
                t.add_row(r["kernel"], r["impl"], r["dtype"], r["shape"], "ERR", (r.get("error") or "")[:60], "", "", "", "")
                continue
            t.add_row(r["kernel"], r["impl"], r["dtype"], r["shape"], f"{r['time_s'] * 1e6:.1f}",
                      f"{r['p10_s'] * 1e6:.1f}-{r['p90_s'] * 1e6:.1f}",
                      f"{r['tflops']:.0f}" if r["tflops"] else "-", f"{r['gbps']:.0f}",
                      "yes" if r["correct"] else "NO", f"{r['rel_err']:.1e}")
        console.print(t)
    if ncu_rows:
        console.print(table(ncu_rows, title="DRAM bytes (ncu pass; its latencies are under the profiler)"))
    if rows:
        console.print(table([r for r in rows if "variant" in r], title=f"validation on {env.get('gpu')}"))
        bad = [r for r in rows if not r.get("correct")]
        console.print(f"{len(rows)} rows, {len(bad)} not correct; total {time.time() - t_start:.0f} s")
        for r in bad:
            console.print(f"  NOT CORRECT {r.get('plan')} {r.get('variant')}: {r.get('error') or r.get('rel_err')}")


def plan_files(globs: str) -> list[str]:
    out = []
    for g in globs.split(","):
        out += sorted(glob.glob(g))
    return out


def deadlock_demo(console) -> str:
    """Plant a wait for a sub-tile nobody produces; the pipeline must report it within the timeout."""
    import cupy as cp

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.plan import load_plan
    from kitsune_dse.validate.runtime import PipelineError, PipelineVariant, Tensors, gpu_info
    lines = []
    info, _ = gpu_info()
    for p in sorted(glob.glob(str(ROOT / "tests/data/plans/*.json"))):
        plan = load_plan(p)
        region = plan["regions"][0]
        if region["strategy"] != "pipeline":
            continue
        reg = Region(load_model(resolve_model_ref(plan), plan["model"]["sizes"]), region)
        v = PipelineVariant("plan", reg, Tensors(reg), info, region, timeout_s=0.05, plant_deadlock=True)
        v.prepare()
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            v.pre(True)
            t0 = time.perf_counter()
            v.run(s)
            s.synchronize()
        took = time.perf_counter() - t0
        try:
            v.after()
            msg = f"{Path(p).stem}: planted deadlock NOT reported (ran {took * 1e3:.1f} ms)"
        except PipelineError as e:
            msg = f"{Path(p).stem}: reported after {took * 1e3:.1f} ms: {e}"
        console.print("deadlock test " + msg)
        lines.append(msg)
        v.tensors.arrays.clear()
        cp.get_default_memory_pool().free_all_blocks()
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
