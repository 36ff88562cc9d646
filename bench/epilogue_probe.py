"""A GEMM's epilogue in the two runtimes: the same GEMM with different fused epilogues (none,
ReLU, bias + ReLU, GELU, bias + GELU, a residual add) as one standalone fused kernel (a CUDA
graph of it: what a fusion region runs) and as a one-stage persistent pipeline kernel on all
SMs (what a one-stage pipeline region runs), on cold L2.

    here:    python bench/epilogue_probe.py --precompile
    device:  python3 bench/epilogue_probe.py --out $OUT [--runs 15]
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

KINDS = ("matmul", "mmrelu", "mmbias", "mmgelu", "mmbiasgelu", "mmadd")
SHAPES = ((16384, 3072, 768), (16384, 1024, 256), (16384, 768, 3072))


def variants(info, sms: int = 132):
    """(kind, dims, Region, standalone fused variant, persistent variant) (build only)."""
    from calibrate_device import pipe_region

    from kitsune_dse.validate.lower import Region, fusion_groups
    from kitsune_dse.validate.microbench import case_model
    from kitsune_dse.validate.runtime import PipelineVariant, StandaloneVariant, Tensors
    out = []
    for dims in SHAPES:
        for kind in KINDS:
            g, region = case_model(kind, "fp16", dims)
            reg = Region(g, {**region, "strategy": "fusion", "kernels": [[o.name for o in g.ops]]})
            t = Tensors(reg)
            fused = StandaloneVariant("fused", reg, t, info, fusion_groups(reg), graph=True, prefix="ep")
            g2, pregion = pipe_region(kind, dims, sms)
            preg = Region(g2, pregion)
            pers = PipelineVariant("plan", preg, Tensors(preg), info, pregion, 1.0)
            out.append((kind, dims, reg, fused, preg, pers))
    return out


def measure(runs: int, log=print) -> list[dict]:
    """Every case in both runtimes, each checked once against the reference (device)."""
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
        for kind, dims, reg, fused, preg, pers in variants(info):
            row = {"kind": kind, "dims": list(dims)}
            for name, r, v in (("fused", reg, fused), ("persistent", preg, pers)):
                try:
                    v.prepare()
                    chk = check_variant(v, r, v.tensors, input_roles(r), stream, 1)
                    t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flush, poison_every=False)
                    row[f"{name}_s"], row[f"{name}_correct"] = t.median_s, chk["correct"]
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_error"] = f"{type(e).__name__}: {e}"
                v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
            rows.append(row)
            log(f"  epilogue {kind} {'x'.join(map(str, dims))}: fused {row.get('fused_s', 0) * 1e6:.1f} us, "
                f"persistent {row.get('persistent_s', 0) * 1e6:.1f} us")
    return rows


def precompile() -> None:
    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    srcs = list(dict.fromkeys(v.build() for *_, f, _, p in variants(info) for v in (f, p)))
    for s in srcs:
        print(compile_one(s, "sm_90", ROOT / "bench/.cubin_cache")[:200], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--precompile", action="store_true")
    a = ap.parse_args()
    if a.precompile:
        precompile()
        return
    from kitsune_dse.validate.runtime import gpu_info
    _, env = gpu_info()
    rows = measure(a.runs, lambda m: None)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "epilogue_probe.json").write_text(json.dumps(
        {"env": env, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": a.runs,
         "command": " ".join(["python3"] + sys.argv), "rows": rows}, indent=1))
    print(f"{'kind':12s} {'m x n x k':>16s} {'fused us':>9s} {'persistent us':>14s}")
    for r in rows:
        f = r.get("fused_s")
        p = r.get("persistent_s")
        print(f"{r['kind']:12s} {'x'.join(map(str, r['dims'])):>16s} {f * 1e6 if f else float('nan'):9.1f} "
              f"{p * 1e6 if p else float('nan'):14.1f} {'' if r.get('fused_correct', 1) and r.get('persistent_correct', 1) else 'WRONG'}")


if __name__ == "__main__":
    main()
