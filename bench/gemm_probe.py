"""Where a persistent GEMM step's time goes: one-stage pipeline kernels of GEMMs that differ in
one thing at a time (issue 6: narrow-N GEMMs, whose row-blocks have one or two column tiles,
ran 25-38% slower than the persistent GEMM model; their A operand streams cold from DRAM).

    here:    python bench/gemm_probe.py --precompile          # cubins into bench/.cubin_cache
    device:  python3 bench/gemm_probe.py --out $OUT [--runs 10]

Series (all on cold L2 unless "warm"): A's columns (tiles per row-block) at fixed M and K; K at
one column tile; the same shapes with A resident in L2 (warm: not flushed, A + C fit L2); the
row-block count at fixed N and K. Writes gemm_probe.json (rows with time, p10, p90, the
per-item time of a worker) and prints a table.
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

# (series, (m, n, k), sms, L2 flushed)
CASES = [
    ("columns", (65536, 128, 256), 132, True),
    ("columns", (65536, 256, 256), 132, True),
    ("columns", (65536, 512, 256), 132, True),
    ("columns", (65536, 1024, 256), 132, True),
    ("columns", (65536, 2048, 256), 132, True),
    ("K at one column tile", (65536, 128, 512), 132, True),
    ("K at one column tile", (65536, 128, 1024), 132, True),
    ("K at one column tile", (65536, 128, 2048), 132, True),
    ("cold A", (16384, 256, 256), 132, True),
    ("warm A", (16384, 256, 256), 132, False),
    ("cold A", (16384, 128, 1024), 132, True),
    ("warm A", (16384, 128, 1024), 132, False),
    ("cold A", (16384, 1024, 256), 132, True),
    ("warm A", (16384, 1024, 256), 132, False),
    ("row-blocks", (8192, 256, 256), 132, True),
    ("row-blocks", (32768, 256, 256), 132, True),
    ("row-blocks", (262144, 256, 256), 132, True),
    ("quarter chip", (65536, 256, 256), 33, True),
    ("quarter chip", (65536, 1024, 256), 33, True),
    # fewer tiles than SMs (each alone on its SM, the chip quiet): a lone tile's latency vs K
    ("lone tiles", (1024, 128, 256), 132, True),
    ("lone tiles", (1024, 128, 1024), 132, True),
    ("lone tiles", (1024, 128, 4096), 132, True),
    ("lone tiles", (1024, 1024, 1024), 132, True),
]


def variants(info, cases=None):
    from calibrate_device import pipe_region

    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    out = []
    for series, dims, sms, flush, *rest in cases or CASES:
        kind, rows = (rest + ["matmul", 128])[:2] if rest else ("matmul", 128)
        g, region = pipe_region(kind, dims, sms, rows)
        reg = Region(g, region)
        out.append((series, dims, sms, flush, reg, PipelineVariant("plan", reg, Tensors(reg), info, region, 1.0)))
    return out


def parse_cases(specs: list[str]):
    """--case [KIND:]M,N,K@SMS[/rROWS] (cold L2) instead of the built-in series: KIND a
    microbench.case_model GEMM kind (matmul, mmrelu, mmgelu, ...), ROWS the plan's tile rows."""
    out = []
    for c in specs:
        kind, _, c = c.rpartition(":")
        c, _, rows = c.partition("/r")
        dims, sms = c.split("@")
        out.append(("case", tuple(int(x) for x in dims.split(",")), int(sms), True, kind or "matmul",
                    int(rows or 128)))
    return out or None


def precompile(arch: str = "sm_90", sms: int = 132, cases=None) -> None:
    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch=arch, sm_count=sms)
    srcs = list(dict.fromkeys(v.build() for *_, v in variants(info, cases)))
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    for s in srcs:
        print(compile_one(s, arch, out)[:200], flush=True)


def measure(out: Path, runs: int, cases=None) -> None:
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, env = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flusher = L2Flusher()
    rows = []
    with stream:
        for (series, dims, sms, flush, reg, v), case in zip(variants(info, cases), cases or CASES):
            m, n, k = dims
            row = {"series": series, "dims": list(dims), "sms": sms, "l2_flushed": flush}
            if len(case) > 4:
                row.update(kind=case[4], tile_rows=case[5])
            try:
                v.prepare()
                chk = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
                t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flusher if flush else None,
                              poison_every=False)
                items = (m // 128) * -(-n // 128)
                per_worker = items / (2 * sms)
                row.update(time_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s, correct=chk["correct"],
                           items=items, item_s_per_worker=t.median_s / max(1.0, per_worker),
                           placement=v.placement)
                lay = v.layout   # which SMs the hardware gave the CTAs (bench/gpc_probe.py: their GPCs)
                row["smids"] = [int(x) for x in v.ctrl.get()[lay.smid_off: lay.smid_off + lay.grid]]
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_probe.json").write_text(json.dumps(
        {"env": env, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
         "command": " ".join(["python3"] + sys.argv), "rows": rows}, indent=1))
    print(f"{'series':22s} {'m x n x k':>18s} {'SMs':>4s} {'time us':>9s} {'items':>6s} {'us/item/worker':>15s}")
    for r in rows:
        if "time_s" not in r:
            print(f"{r['series']:22s} {'x'.join(map(str, r['dims'])):>18s} {r['sms']:4d} {r['error']}")
            continue
        print(f"{r.get('kind', '') + ' r' + str(r.get('tile_rows', 128)) if r['series'] == 'case' else r['series']:22s} "
              f"{'x'.join(map(str, r['dims'])):>18s} {r['sms']:4d} {r['time_s'] * 1e6:9.1f} "
              f"{r['items']:6d} {r['item_s_per_worker'] * 1e6:15.2f} {'' if r['correct'] else 'WRONG'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--case", action="append", default=[], help="M,N,K@SMS instead of the built-in series")
    a = ap.parse_args()
    cases = parse_cases(a.case)
    if a.precompile:
        precompile(cases=cases)
    else:
        measure(Path(a.out), a.runs, cases)


if __name__ == "__main__":
    main()
