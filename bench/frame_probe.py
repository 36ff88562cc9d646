"""How much local memory (register spills) the persistent pipeline kernel needs per thread, from
nvcc's resource report of kernels that are not the validation suite's: one- and two-stage
pipelines over windows of the zoo's models at small sizes (issue 6: NeRF's inner rings were
written back to DRAM at footprints where no other probe's were; its one-stage kernel spills
216 bytes a thread, and ncu counted 461 MB of local stores through L2 beside its 738 MB of
ring traffic, bench/dram_probe.py wbx-*).

    python bench/frame_probe.py [--out results/validation/h100/frame_probe]   # here, nvcc only

Writes frames.csv: one row per kernel (model, sizes, its stages' ops, nvcc's stack frame and
spill stores, and what the cost model sees of each stage: steps, GEMM steps, concatenations,
narrow GEMMs, row ops). calibrate.fit_dram.fit_local_frame fits the spec's frame bytes per step
and per concatenation on it; no GPU time.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

OUT = ROOT / "results/validation/h100/frame_probe"
# (model, sizes): small sizes of the zoo's models and the probes' chain; windows of their ops
MODELS = [("nerf-mlp", {"rays": 64}), ("nerf-mlp", {"rays": 64, "width": 128, "view_width": 64}),
          ("dlrm-top-mlp", {}), ("gpt3-mlp", {"tokens": 1024, "hidden": 1024}),
          ("llama2-7b-mlp", {"tokens": 1024}), ("attention-head", {}),
          ("ln-residual-gemm", {"tokens": 1024, "hidden": 1024}),
          (str(ROOT / "bench/probe_models/mlp-chain12.yaml"), {"rows": 8192}),
          ("bert-base-encoder", {"batch": 1, "seq": 512}), ("vit-b16-block", {"batch": 4})]
WINDOWS_PER_MODEL = 40
SEED = 1


def _pipe(stages, sms, rows, depth):
    from validate_suite import _pipe as pipe
    n = len(stages)
    return pipe(stages, sms, rows, [depth] * (n - 1), ["row"] * (n - 1))


def kernels():
    """(model, sizes, stages, source) of each probe kernel: contiguous windows of a model's
    ops as one stage on 132 SMs, and windows of four ops or more cut in two stages of 66."""
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.plan import DeviceInfo
    from kitsune_dse.validate.runtime import Tensors, make_variants
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    rng = random.Random(SEED)
    out = []
    for name, sizes in MODELS:
        g = load_model(name, sizes)
        ops = [o.name for o in g.ops]
        wins = [(i, j) for i in range(len(ops)) for j in range(i + 1, len(ops) + 1)]
        rng.shuffle(wins)
        for i, j in wins[:WINDOWS_PER_MODEL]:
            splits = [[ops[i:j]]] + ([[ops[i:(i + j) // 2], ops[(i + j) // 2:j]]] if j - i >= 4 else [])
            for stages in splits:
                region = _pipe(stages, [132 // len(stages)] * len(stages), 128, 4)
                try:
                    reg = Region(g, region)
                    src = make_variants(reg, region, Tensors(reg), info, which=["plan"])[0].build()
                except Exception:   # noqa: BLE001 (a window the runtime cannot lower: not a probe)
                    continue
                out.append((name, sizes, stages, src))
    return out


def compile_frame(src: str, arch: str = "sm_90") -> tuple[int, int] | None:
    """(stack frame bytes, spill store bytes) nvcc reports for the kernel, None if it failed."""
    from kitsune_dse.validate.runtime import expand_includes
    with tempfile.TemporaryDirectory() as td:
        cu = Path(td) / "k.cu"
        cu.write_text(expand_includes(src))
        p = subprocess.run(["nvcc", f"-arch={arch}", "-std=c++17", "-cubin", "--resource-usage",
                            "-o", str(Path(td) / "k.cubin"), str(cu)], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    fr = re.search(r"(\d+) bytes stack frame", p.stderr)
    ss = re.search(r"(\d+) bytes spill stores", p.stderr)
    return int(fr.group(1)) if fr else 0, int(ss.group(1)) if ss else 0


def main() -> None:
    from kitsune_dse.cost.pipeline import stage_frame_features
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = load_spec(str(ROOT / "hw_specs/h100-sxm.calibrated.yaml"))
    ks = kernels()
    with cf.ThreadPoolExecutor(14) as ex:
        frames = list(ex.map(lambda k: compile_frame(k[3]), ks))
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    rows = []
    for (name, sizes, stages, _), fr in zip(ks, frames):
        if fr is None:
            continue
        g = load_model(name, sizes)
        feats = [stage_frame_features(g, spec, st) for st in stages]
        rows.append({"model": Path(name).stem, "sizes": json.dumps(sizes, sort_keys=True),
                     "stages": json.dumps(stages), "frame_bytes": fr[0], "spill_store_bytes": fr[1],
                     "stage_features": json.dumps(feats), "arch": "sm_90", "nvcc": nvcc,
                     "command": "python bench/frame_probe.py"})
    tmp = out / "frames.csv.tmp"
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    tmp.replace(out / "frames.csv")
    from kitsune_dse.calibrate.fit_dram import fit_local_frame
    fit = fit_local_frame(frame_rows(out / "frames.csv"))
    print(f"{len(rows)} kernels: {json.dumps({k: v for k, v in fit.items() if k != 'residuals'})}")


def frame_rows(path: Path) -> list[dict]:
    """frames.csv as calibrate.fit_dram.fit_local_frame wants it."""
    with Path(path).open() as f:
        return [{"frame_bytes": float(r["frame_bytes"]), "stages": json.loads(r["stage_features"])}
                for r in csv.DictReader(f)]


if __name__ == "__main__":
    main()
