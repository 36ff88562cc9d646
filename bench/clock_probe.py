"""Does the SM clock depend on how many SMs run tensor-core work? The harness's one-stage
persistent GEMM (4096^3, the calibration's SM sweep) run back to back for a few seconds on 132,
99, 66, 33 and 16 SMs, and cuBLAS's 8192^3 on the whole chip, while nvidia-smi samples the SM
clock, the power draw and the clock-event reasons every 50 ms (read only: nothing is set).
--standalone: instead, the harness's standalone GEMM kernel (what bsp and fusion regions launch)
at the calibration's GEMM shapes (bench/calibrate_device.py SQUARES and SUITE_SHAPES), each run
back to back on random operands: which of them meet the power cap, and at what clock.

    here:    python bench/clock_probe.py --precompile [--standalone]
    device:  python3 bench/clock_probe.py --out $OUT [--seconds 3] [--standalone]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

DIMS = (4096, 4096, 4096)
SMS = (132, 99, 66, 33, 16)
QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu"


def variants(info):
    from calibrate_device import pipe_region

    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    out = []
    for sms in SMS:
        g, region = pipe_region("matmul", DIMS, sms)
        reg = Region(g, region)
        out.append((sms, PipelineVariant("plan", reg, Tensors(reg), info, region, 1.0)))
    return out


def standalone_variants(info):
    """(label, variant) of the harness's standalone GEMM at each calibration shape."""
    from calibrate_device import SQUARES, SUITE_SHAPES

    from kitsune_dse.validate.microbench import case_variants
    cases = [("clock", "fp16", "matmul", dims) for dims in [(n, n, n) for n in SQUARES] + list(SUITE_SHAPES)]
    # each case's first variant is the harness's own tile (the second, cuBLAS, is never built)
    return [("standalone " + "x".join(map(str, dims)), vs[0])
            for (_, _, _, dims), _, _, vs in case_variants(info, cases=cases)]


def sampler(path: Path):
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                             "-lms", "50", "-f", str(path)])


def run(out: Path, seconds: float, standalone: bool = False) -> None:
    import cupy as cp

    from kitsune_dse.validate.runtime import gpu_info
    info, env = gpu_info()
    out.mkdir(parents=True, exist_ok=True)
    smi = out / "clock_samples.csv"
    proc = sampler(smi)
    time.sleep(1.0)
    stream = cp.cuda.Stream(non_blocking=True)
    windows = []

    def loop(label, step, sms):
        step()
        stream.synchronize()
        t0 = time.time()
        ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
        n = 0
        ev0.record(stream)
        while time.time() - t0 < seconds:
            for _ in range(20):
                step()
            n += 20
            stream.synchronize()
        ev1.record(stream)
        ev1.synchronize()
        gpu_s = cp.cuda.get_elapsed_time(ev0, ev1) * 1e-3
        windows.append({"label": label, "sms": sms, "start": t0, "end": time.time(), "runs": n,
                        "per_run_s": gpu_s / n})
        print(f"{label}: {n} runs, {gpu_s / n * 1e6:.1f} us a run", flush=True)
        time.sleep(1.0)     # an idle gap between cases in the samples

    with stream:
        if standalone:
            from kitsune_dse.validate.harness import check_variant
            from kitsune_dse.validate.reference import input_roles
            for label, v in standalone_variants(info):
                v.prepare()
                check_variant(v, v.reg, v.tensors, input_roles(v.reg), stream, 1)   # random operands
                loop(label, lambda v=v: (v.pre(False), v.run(stream)), 132)
                v.tensors.arrays.clear()
                cp.get_default_memory_pool().free_all_blocks()
        for sms, v in ([] if standalone else variants(info)):
            v.prepare()
            v.pre(False)
            loop(f"persistent 4096^3 on {sms} SMs", lambda v=v: (v.pre(False), v.run(stream)), sms)
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
        if not standalone:
            a = cp.random.random((8192, 8192), dtype=cp.float32).astype(cp.float16)
            b = cp.random.random((8192, 8192), dtype=cp.float32).astype(cp.float16)
            loop("cuBLAS 8192^3 on the whole chip", lambda: a @ b, 132)
    time.sleep(0.5)
    proc.terminate()
    proc.wait()
    rows = []
    for line in smi.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            # nvidia-smi prints this machine's local time, which mktime reads back on time()'s clock
            stamp, frac = (parts[0].split(".") + ["0"])[:2]
            ts = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
            rows.append({"t": ts, "sm_mhz": float(parts[1]), "power_w": float(parts[2]), "reasons": parts[3],
                         "temp_c": float(parts[4])})
        except (ValueError, IndexError):
            continue
    summary = []
    for w in windows:
        inside = [r for r in rows if w["start"] + 0.3 <= r["t"] <= w["end"]]
        mhz = sorted(r["sm_mhz"] for r in inside)
        pw = sorted(r["power_w"] for r in inside)
        summary.append({**w, "samples": len(inside), "sm_mhz_median": mhz[len(mhz) // 2] if mhz else None,
                        "sm_mhz_min": mhz[0] if mhz else None, "power_w_median": pw[len(pw) // 2] if pw else None,
                        "reasons": sorted({r["reasons"] for r in inside})})
    (out / "clock_probe.json").write_text(json.dumps(
        {"env": env, "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "seconds": seconds,
         "command": " ".join(["python3"] + sys.argv), "query": QUERY, "windows": summary}, indent=1))
    print(f"{'case':36s} {'us/run':>8s} {'MHz':>6s} {'min':>6s} {'W':>6s}  reasons")
    for s in summary:
        print(f"{s['label']:36s} {s['per_run_s'] * 1e6:8.1f} {s['sm_mhz_median'] or 0:6.0f} "
              f"{s['sm_mhz_min'] or 0:6.0f} {s['power_w_median'] or 0:6.0f}  {' '.join(s['reasons'])}")


def precompile(standalone: bool = False) -> None:
    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    for s in dict.fromkeys(v.build() for _, v in (standalone_variants(info) if standalone else variants(info))):
        print(compile_one(s, "sm_90", ROOT / "bench/.cubin_cache")[:200], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--standalone", action="store_true", help="the standalone GEMM kernel at the "
                    "calibration's shapes instead of the persistent one over SM counts")
    a = ap.parse_args()
    if a.precompile:
        precompile(a.standalone)
        return
    run(Path(a.out), a.seconds, a.standalone)


if __name__ == "__main__":
    main()
