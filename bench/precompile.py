"""Precompile, with nvcc on this machine, every kernel module that bench/gpu_validate.py and the GPU
tests will build, so that device time is not spent in NVRTC. The runtime loads a cubin from
$KDSE_CUBIN_CACHE when its key (sha256 of arch + expanded source) matches, else compiles itself.

    python bench/precompile.py [--out bench/.cubin_cache] [--arch sm_90] [--sms 132]
Prints ptxas register/spill lines per module (the resource report costs no device time).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kitsune_dse.graph import load_model  # noqa: E402
from kitsune_dse.validate.harness import resolve_model_ref  # noqa: E402
from kitsune_dse.validate.lower import Region  # noqa: E402
from kitsune_dse.validate.microbench import case_variants  # noqa: E402
from kitsune_dse.validate.plan import DeviceInfo, check_target, load_plan  # noqa: E402
from kitsune_dse.validate.lower import fusion_groups  # noqa: E402
from kitsune_dse.validate.runtime import (PipelineVariant, Tensors, TilesyncVariant,  # noqa: E402
                                          expand_includes, make_variants, source_key)


BENCH_VARIANTS = ["plan", "plan-1team", "bsp-eager", "bsp-graph", "fusion", "fusion-graph", "cublas"]


def plan_sources(plan: dict, info: DeviceInfo, deadlock: bool = True) -> list[str]:
    plan, _ = check_target(plan, info, retarget=True)
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    out = []
    for region in plan["regions"]:
        reg = Region(graph, region)
        t = Tensors(reg)
        for v in make_variants(reg, region, t, info, which=BENCH_VARIANTS):
            out.append(v.build())
        if deadlock and region["strategy"] == "pipeline":
            out.append(PipelineVariant("plan", reg, t, info, region, 0.05, plant_deadlock=True).build())
        if deadlock and region["strategy"] == "tilesync":
            out.append(TilesyncVariant("plan", reg, t, info, fusion_groups(reg), "tilesync", graph=False,
                                       timeout_s=0.05, plant_deadlock=True).build())
    return out


def all_sources(info: DeviceInfo) -> list[str]:
    srcs = []
    for p in sorted(glob.glob(str(ROOT / "tests/data/plans/*.json"))) + \
            sorted(glob.glob(str(ROOT / "tests/data/plans/explorer/*.json"))):
        srcs += plan_sources(load_plan(p), info)
    for _, _, _, vs in case_variants(info):
        srcs += [v.build() for v in vs]
    spec = importlib.util.spec_from_file_location("tvg", ROOT / "tests/test_validate_gpu.py")
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for plan in mod.gpu_test_plans() + mod.tilesync_test_plans():
            srcs += plan_sources(plan, info)
    except Exception as e:  # noqa: BLE001
        print("gpu test plans skipped:", e)
    return srcs


def compile_one(src: str, arch: str, out: Path) -> str:
    key = source_key(src, arch)
    dst = out / f"{key}.cubin"
    if dst.exists():
        return f"{key}: cached"
    with tempfile.TemporaryDirectory() as td:
        cu = Path(td) / f"{key}.cu"
        cu.write_text(expand_includes(src))
        p = subprocess.run(["nvcc", f"-arch={arch}", "-std=c++17", "-cubin", "--resource-usage",
                            "-o", str(dst), str(cu)], capture_output=True, text=True)
    if p.returncode != 0:
        return f"{key}: FAILED\n{p.stderr[-3000:]}"
    err = p.stderr.splitlines()
    names = [ln.split("'")[1] for ln in err if "Compiling entry function" in ln]
    regs = [ln.split("Used ")[1].split(",")[0] for ln in err if "registers" in ln]
    spills = [ln.strip() for ln in err if "spill stores" in ln]
    return f"{key}: " + ", ".join(
        f"{n} {r}" + ("" if s.startswith("0 bytes stack frame, 0 bytes spill stores") else f" [{s}]")
        for n, r, s in zip(names, regs, spills))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/.cubin_cache"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("-j", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch=a.arch, sm_count=a.sms)
    srcs = list(dict.fromkeys(all_sources(info)))
    print(f"{len(srcs)} modules")
    keep = {source_key(s, a.arch) for s in srcs}
    with cf.ThreadPoolExecutor(a.j) as ex:
        for r in ex.map(lambda s: compile_one(s, a.arch, out), srcs):
            print(r, flush=True)
    for f in out.glob("*.cubin"):
        if f.stem not in keep:
            f.unlink()


if __name__ == "__main__":
    main()
