"""Where a tilesync region's time goes, against the same kernels as a CUDA graph (ln-residual's
chain, bert's fc1 -> fc2; the suite's plans, sliced as bench/tilesync_probe.py slices them).

Per slice, cold L2 behind the flush, each variant timed with CUDA events (30 runs, median):
- graph: the kernels as a plain CUDA graph (the harness's bsp / fusion regions);
- tilesync: programmatic launches with flag hand-offs (the harness's tilesync regions);
- tilesync-no-memset: the same graph without its flag-buffer memset node (the flags zeroed
  before the start event instead): what that node costs;
- tilesync-traced: the variant whose CTAs record %globaltimer and clock64 (another compile: its
  difference from `tilesync` is nvcc's scheduling of the same logic).
Then traced runs (8, median) between two one-thread marker kernels that read %globaltimer: the
time from the first marker to the first CTA's start, the CTAs' span, the time from the last
CTA's end to the second marker, and each kernel's first CTA start; with programmatic launches
and in plain stream order.

    here:    python bench/tilesync_overhead_probe.py --precompile
    device:  python3 bench/tilesync_overhead_probe.py --out $OUT
"""
from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

LNR = "bench/suite/ln-residual-gemm/plans/explorer-4.json"
# (plan, region, kernels slice, what it is)
CASES = [
    (LNR, 1, "2:3", "gemm2+residual2 alone"),
    (LNR, 1, "1:2", "ln2 alone"),
    (LNR, 1, "1:3", "ln2 -> gemm2+residual2"),
    (LNR, 1, "0:3", "gemm1+residual1 -> ln2 -> gemm2+residual2"),
    ("bench/suite/ln-residual-gemm/plans/explorer-6.json", 0, "0:2", "ln1 -> gemm1+residual1"),
    ("bench/suite/bert-base-ffn/plans/explorer-1.json", 0, "1:2", "fc2+residual alone"),
    ("bench/suite/bert-base-ffn/plans/explorer-1.json", 0, "0:2", "fc1+gelu -> fc2+residual"),
]
MARKER = r'''
extern "C" __global__ void marker(unsigned long long* out, int i) {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); out[i] = t; }'''


def case_args(plan, region, kernels):
    return argparse.Namespace(plan=plan, region=region, kernels=kernels, splits=[], sizes="")


def without_memset(v, stream):
    """Make tilesync variant `v` launch its kernels without the flag memset node; its pre() zeroes
    the flags instead (before the flush and the start event). Returns the pre() to time with."""
    from kitsune_dse.validate.runtime import SYNC_BUF, launch_programmatic
    flags = v.private[SYNC_BUF]

    def launch(self):
        for i, (_, (fn, ln)) in enumerate(self.calls):
            launch_programmatic(fn, ln.grid, ln.block, ln.smem, self.table.data.ptr, stream.ptr, i > 0)
    v._launch_all = types.MethodType(launch, v)
    v.graph = None

    def pre(poison):
        v.pre(poison)
        flags.fill(0)
    return pre


def marked_runs(traced, stream, flush, runs: int = 8) -> dict:
    """Medians over traced cold runs between two marker kernels (us)."""
    import cupy as cp
    import numpy as np
    marker = cp.RawKernel(MARKER, "marker")
    buf = cp.zeros(2, dtype=cp.uint64)
    recs = []
    for i in range(runs + 1):
        traced.pre(True)
        flush(stream)
        marker((1,), (1,), (buf, np.int32(0)))
        traced.run(stream)
        marker((1,), (1,), (buf, np.int32(1)))
        stream.synchronize()
        traced.after()
        m = buf.get().astype(np.int64)
        r = [v[v[:, 2] > 0].astype(np.int64) for v in traced.trace_records().values()]
        first = min(int(v[:, 0].min()) for v in r)
        last = max(int(v[:, 2].max()) for v in r)
        if i:       # the first run warms the module
            recs.append([(first - m[0]) / 1e3, (last - first) / 1e3, (m[1] - last) / 1e3,
                         (m[1] - m[0]) / 1e3] + [(int(v[:, 0].min()) - first) / 1e3 for v in r])
    med = np.median(np.array(recs), axis=0)
    return {"to_first_cta_us": round(float(med[0]), 1), "cta_span_us": round(float(med[1]), 1),
            "after_last_cta_us": round(float(med[2]), 1), "marker_to_marker_us": round(float(med[3]), 1),
            "kernel_first_starts_us": " ".join(f"{x:.1f}" for x in med[4:])}


def main() -> None:
    from tilesync_probe import build
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--precompile", action="store_true")
    a = ap.parse_args()
    if a.precompile:
        from precompile import compile_one

        from kitsune_dse.validate.plan import DeviceInfo
        info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
        for plan, region, kernels, _ in CASES:
            _, vs = build(case_args(plan, region, kernels), info)
            for v in vs:
                print(compile_one(v.build(), info.arch, ROOT / "bench/.cubin_cache"), flush=True)
        return
    import cupy as cp

    from kitsune_dse.validate.measure import time_runs
    from tilesync_probe import probe_session, write_rows
    info, stream, flush, stamp = probe_session(a.out, "tilesync_overhead_probe.py")
    rows = []
    for plan, region, kernels, what in CASES:
        _, (graph_v, pdl, _, _, traced) = build(case_args(plan, region, kernels), info)
        timed = {}
        with stream:
            for v in (graph_v, pdl, traced):
                v.prepare()
                timed[v.name] = time_runs(v.run, v.pre, v.after, stream, a.runs, 3, flush).median_s * 1e6
            pre = without_memset(pdl, stream)
            timed["tilesync-no-memset"] = time_runs(pdl.run, pre, pdl.after, stream, a.runs, 3, flush).median_s * 1e6
            for programmatic in (True, False):
                traced.programmatic = programmatic
                traced.graph = None
                row = {**stamp, "plan": plan, "region": region, "kernels": kernels, "what": what,
                       **{f"{k}_us": round(t, 1) for k, t in timed.items()},
                       "trace_launch": "programmatic" if programmatic else "plain",
                       **marked_runs(traced, stream, flush)}
                rows.append(row)
        print(f"{what:45s} graph {timed['graph']:7.1f}  tilesync {timed['tilesync']:7.1f}  "
              f"no-memset {timed['tilesync-no-memset']:7.1f}  traced {timed['tilesync-traced']:7.1f}  | "
              + "  ".join(f"{r['trace_launch']}: {r['to_first_cta_us']:.1f} + {r['cta_span_us']:.1f} + "
                          f"{r['after_last_cta_us']:.1f} (starts {r['kernel_first_starts_us']})" for r in rows[-2:]),
              flush=True)
        for v in (graph_v, pdl, traced):
            v.tensors.arrays.clear()
        cp.get_default_memory_pool().free_all_blocks()
    write_rows(Path(a.out or ".") / "tilesync_overhead.csv", rows)


if __name__ == "__main__":
    main()
