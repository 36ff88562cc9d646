"""Standalone elementwise and row-op kernels (what a bsp or fusion region launches for them): one
kernel of each kind at row widths from 256 to 8192 columns and a few sizes, as a CUDA graph on
cold L2, beside the model's time for the same one-op bsp region. None is a suite kernel's shape.

    here:    python bench/rowop_probe.py --precompile
    device:  python3 bench/rowop_probe.py --out $OUT [--runs 15]
    here:    python bench/rowop_probe.py --report DIR      # the model beside each measurement
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

KINDS = ("relu", "add", "softmax", "layernorm")
WIDTHS = (256, 512, 1024, 2048, 4096, 8192)
ELEMS = 1 << 25              # 64 MB of fp16 per [rows, cols] tensor
SIZES = (1 << 23, 1 << 27)   # and 16 MB, 256 MB at 1024 columns


def cases() -> list[tuple[str, tuple[int, int]]]:
    out = [(k, (ELEMS // w, w)) for k in KINDS for w in WIDTHS]
    out += [(k, (n // 1024, 1024)) for k in KINDS for n in SIZES]
    return out


def variants(info):
    from kitsune_dse.validate.lower import Region, bsp_groups
    from kitsune_dse.validate.microbench import case_model
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors
    out = []
    for kind, dims in cases():
        g, region = case_model(kind, "fp16", dims)
        reg = Region(g, region)
        out.append((kind, dims, reg, StandaloneVariant("bsp", reg, Tensors(reg), info, bsp_groups(reg),
                                                       graph=True, prefix="rp")))
    return out


def measure(runs: int) -> list[dict]:
    return measure_variants(variants, runs)


def measure_variants(variants_of, runs: int) -> list[dict]:
    """Each (kind, dims, Region, standalone variant) of `variants_of(info)` checked once
    against the reference and timed on cold L2 (device); one row each."""
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    with stream:
        for kind, dims, reg, v in variants_of(info):
            row = {"kind": kind, "dims": list(dims)}
            try:
                v.prepare()
                chk = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
                t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flush, poison_every=False)
                row.update(time_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s, correct=chk["correct"])
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
            rows.append(row)
    return rows


def model_time(spec, kind: str, dims) -> float:
    from kitsune_dse.cost.region import Region
    from kitsune_dse.cost.strategies import LaunchChoice, bsp
    from kitsune_dse.validate.microbench import case_model
    g, _ = case_model(kind, "fp16", tuple(dims))
    # one kernel timed alone as a graph: its launch latency as the suite's bsp-graph rows pay it
    return bsp(Region.of(g), spec, LaunchChoice("graph")).latency_s


def report(src: Path) -> None:
    from kitsune_dse.hw import load_spec
    spec = load_spec(str(ROOT / "hw_specs/h100-sxm.calibrated.yaml"))
    d = json.loads((src / "rowop_probe.json" if src.is_dir() else src).read_text())
    print(f"{'kind':10s} {'rows x cols':>14s} {'meas us':>8s} {'model us':>9s} {'err':>6s} {'TB/s':>6s}")
    for r in d["rows"]:
        if not r.get("time_s"):
            print(r["kind"], r["dims"], r.get("error"))
            continue
        pred = model_time(spec, r["kind"], r["dims"])
        n = r["dims"][0] * r["dims"][1] * 2
        moved = n * (3 if r["kind"] == "add" else 2)
        print(f"{r['kind']:10s} {'x'.join(map(str, r['dims'])):>14s} {r['time_s'] * 1e6:8.1f} {pred * 1e6:9.1f} "
              f"{100 * (pred / r['time_s'] - 1):+5.1f}% {moved / r['time_s'] / 1e12:6.2f}")


def precompile() -> None:
    precompile_variants(variants)


def precompile_variants(*variants_of) -> None:
    """nvcc cubins (bench/.cubin_cache) of every variant the `variants_of(info)` give on an H100."""
    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    for s in dict.fromkeys(v.build() for f in variants_of for *_, v in f(info)):
        r = compile_one(s, "sm_90", ROOT / "bench/.cubin_cache")
        if "FAILED" in r or "spill" in r:
            print(r[:300], flush=True)


def probe_parser(doc: str, runs: int) -> argparse.ArgumentParser:
    """The probes' common command line: --out, --runs, --precompile, --report."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--report", default="")
    return ap


def save_rows(out: str, name: str, env: dict, runs: int, rows: list[dict], label: str = "",
              echo: bool = True) -> None:
    """A probe's rows as OUT/NAME with the device, date and command, and (echo) a line each on
    stdout (`label`: a row field printed beside its kind and dims)."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(json.dumps(
        {"env": env, "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "runs": runs,
         "command": " ".join(["python3"] + sys.argv), "rows": rows}, indent=1))
    for r in rows if echo else ():
        print(r["kind"], "x".join(map(str, r["dims"])), *([r.get(label)] if label else []),
              f"{r.get('time_s', 0) * 1e6:.1f} us", "" if r.get("correct", False) else r.get("error", "WRONG"))


def main() -> None:
    a = probe_parser(__doc__, 15).parse_args()
    if a.precompile:
        precompile()
        return
    if a.report:
        report(Path(a.report))
        return
    from kitsune_dse.validate.runtime import gpu_info
    _, env = gpu_info()
    save_rows(a.out, "rowop_probe.json", env, a.runs, measure(a.runs))


if __name__ == "__main__":
    main()
