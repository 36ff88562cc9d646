"""DRAM bytes per variant with Nsight Compute in range-replay mode.

The parent re-runs this module as a child under
  ncu --clock-control none --replay-mode range --metrics dram__bytes_read.sum,dram__bytes_write.sum
The child runs every (region, variant) once between cudaProfilerStart/Stop (after a warm-up and an
L2 flush), so each variant is one range; range replay keeps concurrently running CTAs of the
persistent kernel together (kernel replay would serialise and could hang them). CUDA-graph
variants are left out (same kernels as their eager twins).
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kitsune_dse.errors import KitsuneError

METRICS = "dram__bytes_read.sum,dram__bytes_write.sum"
DEFAULT_TIME_LIMIT_S = 550.0


def ncu_command(log: str) -> list[str]:
    """The ncu command line; KDSE_NCU_EXTRA_METRICS (comma-separated) adds metrics beside the
    DRAM bytes, for diagnostic probes (bench/dram_probe.py keeps them as columns)."""
    exe = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    extra = os.environ.get("KDSE_NCU_EXTRA_METRICS", "").strip(",")
    metrics = METRICS + ("," + extra if extra else "")
    return [exe, "--clock-control", "none", "--replay-mode", "range", "--metrics", metrics, "--csv",
            "--print-units", "base", "--log-file", log]


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ncu's --csv output grouped by result ID, in order: [{metric: value}]."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rd = csv.DictReader(io.StringIO("\n".join(lines)))
    out: dict[str, dict] = {}
    for r in rd:
        rid = r.get("ID", str(len(out)))
        name, val = r.get("Metric Name"), r.get("Metric Value", "")
        if not name:
            continue
        try:
            v = float(val.replace(",", ""))
        except ValueError:
            continue
        out.setdefault(rid, {})[name] = v
    return [out[k] for k in sorted(out, key=lambda x: int(x) if x.isdigit() else 0)]


def ncu_dram_bytes(plan: dict, retarget: bool = False, variants=None, timeout_s: float = 1.0,
                   time_limit_s: float | None = None) -> dict:
    time_limit_s = DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    with tempfile.TemporaryDirectory() as td:
        pf = Path(td) / "plan.json"
        pf.write_text(json.dumps(plan))
        order = Path(td) / "order.json"
        log = str(Path(td) / "ncu.csv")
        cmd = ncu_command(log) + [sys.executable, "-m", "kitsune_dse.validate.ncu", str(pf), str(order),
                                  "1" if retarget else "0", ",".join(variants or [])]
        env = dict(os.environ, KDSE_NCU_CHILD="1")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=time_limit_s, env=env)
        except FileNotFoundError:
            raise KitsuneError("--ncu: Nsight Compute (ncu) is not on the PATH") from None
        except subprocess.TimeoutExpired:
            raise KitsuneError(f"--ncu: the profiling pass took longer than {time_limit_s:.0f} s") from None
        if p.returncode != 0 or not order.exists():
            tail = (p.stdout + p.stderr)[-1500:]
            raise KitsuneError(f"--ncu: ncu failed (exit {p.returncode}): {tail}")
        names = json.loads(order.read_text())
        res = parse_ncu_csv(Path(log).read_text() if Path(log).exists() else p.stdout)
    if len(res) != len(names):
        raise KitsuneError(f"--ncu: {len(res)} profiled ranges for {len(names)} variants")
    return {(n[0], n[1]): (r.get("dram__bytes_read.sum", float("nan")), r.get("dram__bytes_write.sum", float("nan")))
            for n, r in zip(names, res)}


class _Drained:
    """A variant measured with the drain after it: its range's name is the variant's + "+drain"."""

    def __init__(self, v):
        self.name = f"{v.name}+drain"


def profile_region(reg, region: dict, info, variants: list[str], stream, flush, on_range,
                   drain=None) -> None:
    """Inside an ncu child: each variant of one region run once to check it, then once more in
    its own profiler range on a flushed L2; on_range(variant) after each range. Tilesync and
    concurrent kernels run in plain stream order (range replay takes no programmatic launches
    and no stream capture: the same kernels and tiles, so the DRAM bytes are theirs).
    `drain(stream)`: also a second range that runs it right after the variant, a read-only sweep
    that evicts every dirty line the variant left in L2 (its writes less the first range's are
    what the variant left dirty)."""
    import cupy as cp

    from kitsune_dse.validate.harness import _fill_inputs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors, TilesyncVariant, make_variants
    tensors = Tensors(reg)
    _fill_inputs(reg, tensors, input_roles(reg))
    for v in make_variants(reg, region, tensors, info, 1.0, variants):
        if isinstance(v, TilesyncVariant):
            v.programmatic = False
        if isinstance(v, StandaloneVariant):   # stream capture inside a replayed range fails
            v.graph_mode = False
        try:
            v.prepare()
            v.pre(False)
            v.run(stream)
            stream.synchronize()
            v.after()
        except KitsuneError:
            continue
        v.pre(False)
        flush(stream)
        stream.synchronize()
        cp.cuda.runtime.profilerStart()
        v.run(stream)
        stream.synchronize()
        cp.cuda.runtime.profilerStop()
        on_range(v)
        if drain is not None:
            v.pre(False)
            flush(stream)
            stream.synchronize()
            cp.cuda.runtime.profilerStart()
            v.run(stream)
            drain(stream)
            stream.synchronize()
            cp.cuda.runtime.profilerStop()
            on_range(_Drained(v))
    tensors.arrays.clear()
    cp.get_default_memory_pool().free_all_blocks()


def _child(plan_path: str, order_path: str, retarget: bool, variants: list[str]) -> None:
    import cupy as cp

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.plan import check_target
    from kitsune_dse.validate.runtime import gpu_info

    plan = json.loads(Path(plan_path).read_text())
    info, _ = gpu_info()
    plan, _ = check_target(plan, info, retarget)
    graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    order = []
    stream.__enter__()   # fills and launches in one stream order
    want = [v for v in (variants or None) or ["plan", "bsp-eager", "fusion", "cublas"] if not v.endswith("-graph")]
    for ri, region in enumerate(plan["regions"]):
        profile_region(Region(graph, region), region, info, want, stream, flush,
                       lambda v, rid=region.get("id", ri): order.append([rid, v.name]))
    Path(order_path).write_text(json.dumps(order))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], sys.argv[3] == "1", [v for v in sys.argv[4].split(",") if v] if len(sys.argv) > 4 else [])
