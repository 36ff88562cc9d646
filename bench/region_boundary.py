"""What a region boundary costs when a plan's regions run back to back (calibration, on the
device): region A, then region B launched right after it on the same stream (as
validate_plan_e2e runs a plan), against each alone. a + b - ab is the part of B's own cost that
A's run hides: its launch latency, less the boundary's gap (spec.region_overlap_s for a region
of standalone kernels; spec.persistent_region_overlap_s for a persistent pipeline kernel, which
waits for A's last CTA like any kernel but has its own launch path: one CTA per SM, the
device's whole shared memory each).

    device:  python3 bench/region_boundary.py [--runs 30]    # table of a, b, ab per case
    (bench/calibrate_device.py runs the same cases into calibration.raw.json, key boundary_rows)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

# a region: ("graph", kind, dims): the case's kernels one per op as a CUDA graph (a bsp/fusion
# region); ("pipe", kind, dims, sms): one persistent stage of all its ops on `sms` SMs
EW4 = ("graph", "ewchain", (128, 1024, 4))
MM_GRAPH = ("graph", "matmul", (2048, 1024, 1024))
PIPE_ADD = ("pipe", "add", (128, 1024), 132)
PIPE_MM = ("pipe", "matmul", (2048, 256, 512), 132)
MM_SMALL_GRAPH = ("graph", "matmul", (2048, 256, 512))
BOUNDARIES = [
    ("graph->pipe", EW4, PIPE_ADD),
    ("graph->pipe", MM_GRAPH, PIPE_MM),
    ("graph->pipe", MM_GRAPH, PIPE_ADD),
    ("graph->graph", EW4, EW4),
    ("graph->graph", MM_GRAPH, MM_SMALL_GRAPH),
    ("pipe->graph", PIPE_ADD, EW4),
    ("pipe->graph", PIPE_MM, MM_SMALL_GRAPH),
    ("pipe->pipe", PIPE_ADD, PIPE_ADD),
    ("pipe->pipe", PIPE_MM, PIPE_MM),
]


def region_variant(what, info):
    """(Region, Variant) of one side of a boundary (build only)."""
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.microbench import case_model
    from kitsune_dse.validate.runtime import Tensors, make_variants
    if what[0] == "pipe":
        from calibrate_device import pipe_region
        g, region = pipe_region(what[1], what[2], what[3])
    else:
        g, region = case_model(what[1], "fp16", what[2])
        region = {**region, "strategy": "bsp"}
    reg = Region(g, region)
    return reg, make_variants(reg, region, Tensors(reg), info, 1.0, ["plan"])[0]


def boundary_variants(info):
    """(label, A, B, [(Region, Variant) of A, of B]) per case (build only)."""
    return [(label, a, b, [region_variant(a, info), region_variant(b, info)]) for label, a, b in BOUNDARIES]


def describe(what) -> str:
    return f"{what[0]} {what[1]} {'x'.join(str(d) for d in what[2])}" + (f"@{what[3]}" if what[0] == "pipe" else "")


def measure_boundaries(runs: int, log) -> list[dict]:
    """Each case: A alone, B alone, A then B; every region checked once against the reference."""
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
        for label, a, b, sides in boundary_variants(info):
            row = {"label": label, "a": describe(a), "b": describe(b)}
            try:
                vs = []
                for reg, v in sides:
                    v.prepare()
                    row.setdefault("correct", True)
                    row["correct"] = row["correct"] and check_variant(v, reg, v.tensors, input_roles(reg),
                                                                      stream, 1)["correct"]
                    vs.append(v)
                for name, seq in (("a_s", vs[:1]), ("b_s", vs[1:]), ("ab_s", vs)):
                    def pre(poison, seq=seq):
                        for v in seq:
                            v.pre(poison)

                    def run(s, seq=seq):
                        for v in seq:
                            v.run(s)

                    def after(seq=seq):
                        for v in seq:
                            v.after()
                    row[name] = time_runs(run, pre, after, stream, runs, 2, flush, poison_every=False).median_s
                row["hidden_s"] = row["a_s"] + row["b_s"] - row["ab_s"]
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            log(f"  boundary {label} [{row['a']}] -> [{row['b']}]: " +
                (f"a {row['a_s'] * 1e6:.2f} b {row['b_s'] * 1e6:.2f} ab {row['ab_s'] * 1e6:.2f} us, "
                 f"hidden {row['hidden_s'] * 1e6:.2f} us" if "hidden_s" in row else row.get("error", "")))
            for _, v in sides:
                v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--precompile", action="store_true", help="here: cubins into bench/.cubin_cache")
    args = ap.parse_args()
    if args.precompile:
        from precompile import compile_one

        from kitsune_dse.validate.plan import DeviceInfo
        info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
        srcs = list(dict.fromkeys(v.build() for *_, sides in boundary_variants(info) for _, v in sides))
        out = ROOT / "bench/.cubin_cache"
        out.mkdir(parents=True, exist_ok=True)
        for s in srcs:
            print(compile_one(s, "sm_90", out)[:200], flush=True)
        return
    rows = measure_boundaries(args.runs, print)
    print(f"{'boundary':14s} {'A':32s} {'B':32s} {'a':>8s} {'b':>8s} {'ab':>8s} {'hidden':>8s}")
    for r in rows:
        if "hidden_s" in r:
            print(f"{r['label']:14s} {r['a']:32s} {r['b']:32s} {r['a_s'] * 1e6:8.2f} {r['b_s'] * 1e6:8.2f} "
                  f"{r['ab_s'] * 1e6:8.2f} {r['hidden_s'] * 1e6:8.2f}")


if __name__ == "__main__":
    main()
