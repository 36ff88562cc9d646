"""Standalone GEMM kernels narrower than their tile (a head: NeRF's sigma N = 1 and rgb N = 3,
DLRM's CTR N = 1): the harness's fused GEMM kernel (what a bsp or fusion region launches) at
N = 1 to 128 beside the same GEMM a full 128-column tile wide, as a CUDA graph on cold L2. Its
MMAs run every column of the tile; its B loads and epilogue only the valid ones. None is a
suite kernel's shape (the suite's narrow heads have 262,144 or 2,048 rows).

    here:    python bench/narrow_probe.py --precompile
    device:  python3 bench/narrow_probe.py --out $OUT [--runs 15]
    here:    python bench/narrow_probe.py --report DIR      # the model beside each measurement
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

WIDTHS = (1, 3, 8, 32, 64, 128)


def cases() -> list[tuple[str, tuple[int, int, int]]]:
    out = [(kind, (131072, n, k)) for kind in ("mmbias", "matmul") for k in (128, 512) for n in WIDTHS]
    out += [("mmbias", (32768, n, 256)) for n in (1, 8, 128)]
    return out


def short_k_cases() -> list[tuple[str, tuple[int, int, int]]]:
    """GEMMs of one to eight K slabs (of 64) writing a wide output (`--short-k`): nerf's fc1
    (K = 60 padded to 64) is -20% in the model."""
    return [("mmbias", (131072, n, k)) for n in (128, 256) for k in (64, 128, 192, 256, 384, 512)]


def variants(info, which=None):
    from kitsune_dse.validate.lower import Region, fusion_groups
    from kitsune_dse.validate.microbench import case_model
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors
    out = []
    for kind, dims in (which if which is not None else cases()):
        g, region = case_model(kind, "fp16", dims)
        reg = Region(g, {**region, "strategy": "fusion", "kernels": [[o.name for o in g.ops]]})
        out.append((kind, dims, reg, StandaloneVariant("fused", reg, Tensors(reg), info, fusion_groups(reg),
                                                       graph=True, prefix="np")))
    return out


def measure(runs: int, which=None) -> list[dict]:
    from rowop_probe import measure_variants
    return measure_variants(lambda info: variants(info, which), runs)


def report(src: Path) -> None:
    from kitsune_dse.calibrate.fit import fused_time
    from kitsune_dse.hw import load_spec
    spec = load_spec(str(ROOT / "hw_specs/h100-sxm.calibrated.yaml"))
    d = json.loads((src / "narrow_probe.json" if src.is_dir() else src).read_text())
    full = {(r["kind"], r["dims"][0], r["dims"][2]): r["time_s"] for r in d["rows"]
            if r.get("time_s") and r["dims"][1] == 128}
    print(f"{'kind':7s} {'m x n x k':>16s} {'meas us':>8s} {'/N=128':>7s} {'model us':>9s} {'err':>6s}")
    for r in d["rows"]:
        if not r.get("time_s"):
            print(r["kind"], r["dims"], r.get("error"))
            continue
        pred = fused_time(spec, r["kind"], r["dims"])
        ref = full.get((r["kind"], r["dims"][0], r["dims"][2]))
        print(f"{r['kind']:7s} {'x'.join(map(str, r['dims'])):>16s} {r['time_s'] * 1e6:8.1f} "
              f"{r['time_s'] / ref if ref else float('nan'):7.2f} {pred * 1e6:9.1f} {100 * (pred / r['time_s'] - 1):+5.1f}%"
              f"{'' if r.get('correct') else ' WRONG'}")


def precompile() -> None:
    from rowop_probe import precompile_variants
    precompile_variants(variants, lambda info: variants(info, short_k_cases()))


def main() -> None:
    from rowop_probe import probe_parser, save_rows
    ap = probe_parser(__doc__, 15)
    ap.add_argument("--short-k", action="store_true", help="the short-K cases instead (short_k_probe.json)")
    a = ap.parse_args()
    if a.precompile:
        precompile()
        return
    if a.report:
        report(Path(a.report))
        return
    from kitsune_dse.validate.runtime import gpu_info
    _, env = gpu_info()
    rows = measure(a.runs, short_k_cases() if a.short_k else None)
    save_rows(a.out, "short_k_probe.json" if a.short_k else "narrow_probe.json", env, a.runs, rows)


if __name__ == "__main__":
    main()
