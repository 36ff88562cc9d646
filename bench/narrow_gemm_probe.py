"""Why a narrow GEMM (nerf's rgb_fc: M = 262144 points, K = 128, N = 3 padded to 8) with its
sigmoid fused into the epilogue runs ~30 us slower than without it (bench/handoff_probes.sh,
2026-11-23: 86.6 against ~55 us), when the sigmoid itself is 1024 values per CTA: the same
kernel with the epilogue's activation swapped in the source, each as a CUDA graph on cold L2
(a diagnostic of the harness kernel, issue 6).

    here:    python bench/narrow_gemm_probe.py --precompile   (nvcc cubins into bench/.cubin_cache)
    device:  python3 bench/narrow_gemm_probe.py --out $OUT [--runs 20]   (+ SASS of each when
             cuobjdump is there)
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

PLAN = ROOT / "bench/probe_plans/nerf-view-rgb.json"
SIGMOID = "act_sigmoid(v0[q])"
# name: (plan region, its kernel slice, the sigmoid epilogue's replacement or None)
CASES = {
    "gemm": (2, "1:2", None),
    "gemm+sigmoid": (0, "1:2", None),
    "gemm+identity": (0, "1:2", "(v0[q])"),
    "gemm+relu": (0, "1:2", "fmaxf(v0[q], 0.f)"),
    "gemm+fast-sigmoid": (0, "1:2", "__fdividef(1.f, 1.f + __expf(-v0[q]))"),
    "gemm+exp": (0, "1:2", "__expf(-v0[q])"),
}
SIZES = ("", "view_width=256")


def variant(info, region: int, kernels: str, sizes: str, patch: str | None):
    """The slice as a CUDA graph of fused kernels, the epilogue's sigmoid replaced by `patch`."""
    import tilesync_probe

    from kitsune_dse.validate import codegen
    from kitsune_dse.validate.runtime import StandaloneVariant
    a = argparse.Namespace(plan=str(PLAN), region=region, kernels=kernels, sizes=sizes, splits=[])
    (reg, tensors, groups, _), _ = tilesync_probe.build(a, info)
    v = StandaloneVariant("graph", reg, tensors, info, groups, graph=True, prefix="fus")
    if patch is not None:
        def build(v=v, patch=patch):
            src, launches, ws = codegen.standalone_source(v.reg, v.groups, bt := codegen.BufTable(),
                                                           v.info.sm_count, v.prefix)
            if SIGMOID not in src:
                raise SystemExit("narrow_gemm_probe: the fused kernel has no sigmoid epilogue to swap")
            v.source, v._launches, v._ws, v._names, v._groups = (
                src.replace(SIGMOID, patch), launches, ws, bt.names, v.groups)
            return v.source
        v.build = build
    return reg, tensors, v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--precompile", action="store_true")
    a = ap.parse_args()
    from kitsune_dse.validate.plan import DeviceInfo
    from kitsune_dse.validate.runtime import source_key
    if a.precompile:
        import precompile as pre
        info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
        for sizes in SIZES:
            for name, (r, k, patch) in CASES.items():
                _, _, v = variant(info, r, k, sizes, patch)
                print(name, sizes, pre.compile_one(v.build(), info.arch, ROOT / "bench/.cubin_cache"))
        return
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import MODULES_BY_COMPILER, gpu_info
    info, _ = gpu_info()
    out = Path(a.out) if a.out else None
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    for sizes in SIZES:
        for name, (r, k, patch) in CASES.items():
            reg, tensors, v = variant(info, r, k, sizes, patch)
            with stream:
                v.prepare()
                ok = check_variant(v, reg, tensors, input_roles(reg), stream, 1)["correct"]
                t = time_runs(v.run, v.pre, v.after, stream, a.runs, 3, flush)
            key = source_key(v.source, info.arch)
            rows.append((sizes or "suite", name, t.median_s * 1e6, t.p10_s * 1e6, t.p90_s * 1e6,
                         ok or patch is not None, key))
            cubin = Path(os.environ.get("KDSE_CUBIN_CACHE", "")) / f"{key}.cubin"
            if out and cubin.exists() and shutil.which("cuobjdump"):
                sass = subprocess.run(["cuobjdump", "--dump-sass", str(cubin)], capture_output=True,
                                      text=True).stdout
                (out / f"sass_{(sizes or 'suite').replace('=', '')}_{name}.txt").write_text(sass)
    print(f"modules: {dict(MODULES_BY_COMPILER)}")
    print(f"{'sizes':16s} {'kernel':18s} {'median us':>10s} {'p10':>8s} {'p90':>8s}  checked  cubin")
    for s, n, med, p10, p90, ok, key in rows:
        print(f"{s:16s} {n:18s} {med:10.1f} {p10:8.1f} {p90:8.1f}  {'ok' if ok else 'WRONG':7s}  {key}")


if __name__ == "__main__":
    main()
