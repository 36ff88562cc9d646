"""DSE speed and scaling: candidates + solve (explore's search work) on synthetic graphs of
10 to 5,000 ops and on every zoo model.

    python bench/dse_speed.py [--sizes 10 100 1000 5000] [--hw h100-sxm] [--no-zoo]
                              [--time-limit 60] [--csv results/dse_speed.csv]

Synthetic graphs:
  chain    transformer-like layers in a chain: layernorm, Q/K/V projections, scores (Q K^T),
           softmax, P V, output projection, residual add, layernorm, MLP (fc1, gelu, fc2),
           residual add (14 ops per layer; branches and joins inside each layer);
  branchy  blocks of 4 parallel branches (GEMM + GELU) joined by a chain of adds and a
           layernorm (12 ops per block).
Each case runs in its own subprocess. Each row: ops, atoms, candidates, build and solve wall
time, total, CPU time (this process and its search workers: less sensitive to other load on
the machine than wall time), peak RSS (ru_maxrss of that subprocess or of its largest worker), peak Python heap
(tracemalloc, only with --heap: tracing slows Python several times, so timings are taken
without it), solver status and gap, plan latency, plan regions, where the plan came from and
the SM booleans that went into CP-SAT. The scaling
exponent is the slope of a least-squares fit of log(total time) against log(ops) per family.
Targets (2-core machine): every zoo model < 2 s; 1,000 ops < 10 s with gap <= 1%;
5,000 ops < 60 s; peak memory < 2 GB.
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kitsune_dse.graph import list_models, load_model  # noqa: E402
from kitsune_dse.graph.ir import Graph, Op, Tensor  # noqa: E402
from kitsune_dse.hw.spec import load_spec  # noqa: E402
from kitsune_dse.search import build_candidates, solve  # noqa: E402


def _finish(name, tensors, ops, inputs, weights, n_ops) -> Graph:
    ops = ops[:n_ops]
    return Graph.build(name=name, tensors={t.name: t for t in tensors},
                       ops=[Op(*o) for o in ops], inputs=inputs, weights=weights)


def transformer_chain(n_ops: int, tokens: int = 2048, d: int = 1024, ffn: int = 4096,
                      dtype: str = "fp16") -> Graph:
    """Transformer-like layers in a chain, cut to exactly n_ops ops."""
    T = [Tensor("x0", (tokens, d), dtype)]
    ops, weights = [], []
    x = "x0"
    layer = 0
    while len(ops) < n_ops:
        p = f"l{layer}_"

        def w(name, shape):
            T.append(Tensor(p + name, shape, dtype))
            weights.append(p + name)
            return p + name
        g1, b1, g2, b2 = w("g1", (d,)), w("b1", (d,)), w("g2", (d,)), w("b2", (d,))
        wq, wk, wv, wo = (w(n, (d, d)) for n in ("wq", "wk", "wv", "wo"))
        w1, w2 = w("w1", (d, ffn)), w("w2", (ffn, d))
        ops += [
            (p + "ln1", "layernorm", (x, g1, b1), (p + "h1",), {}),
            (p + "q", "matmul", (p + "h1", wq), (p + "q",), {}),
            (p + "k", "matmul", (p + "h1", wk), (p + "k",), {}),
            (p + "v", "matmul", (p + "h1", wv), (p + "v",), {}),
            (p + "scores", "matmul", (p + "q", p + "k"), (p + "s",), {"trans_b": True}),
            (p + "softmax", "softmax", (p + "s",), (p + "pr",), {}),
            (p + "pv", "matmul", (p + "pr", p + "v"), (p + "o",), {}),
            (p + "proj", "matmul", (p + "o", wo), (p + "a",), {}),
            (p + "res1", "add", (p + "a", x), (p + "r1",), {}),
            (p + "ln2", "layernorm", (p + "r1", g2, b2), (p + "h2",), {}),
            (p + "fc1", "matmul", (p + "h2", w1), (p + "f1",), {}),
            (p + "gelu", "gelu", (p + "f1",), (p + "f1a",), {}),
            (p + "fc2", "matmul", (p + "f1a", w2), (p + "f2",), {}),
            (p + "res2", "add", (p + "f2", p + "r1"), (p + f"x{layer + 1}",), {}),
        ]
        x = p + f"x{layer + 1}"
        layer += 1
    return _finish(f"chain-{n_ops}", T, ops, ["x0"], weights, n_ops)


def branchy_dag(n_ops: int, tokens: int = 4096, d: int = 512, branches: int = 4,
                dtype: str = "fp16") -> Graph:
    """Blocks of parallel GEMM+GELU branches joined by adds and a layernorm."""
    T = [Tensor("x0", (tokens, d), dtype)]
    ops, weights = [], []
    x = "x0"
    blk = 0
    while len(ops) < n_ops:
        p = f"b{blk}_"
        outs = []
        for i in range(branches):
            T.append(Tensor(f"{p}w{i}", (d, d), dtype))
            weights.append(f"{p}w{i}")
            ops.append((f"{p}mm{i}", "matmul", (x, f"{p}w{i}"), (f"{p}m{i}",), {}))
            ops.append((f"{p}act{i}", "gelu", (f"{p}m{i}",), (f"{p}a{i}",), {}))
            outs.append(f"{p}a{i}")
        acc = outs[0]
        for i in range(1, branches):
            ops.append((f"{p}add{i}", "add", (acc, outs[i]), (f"{p}s{i}",), {}))
            acc = f"{p}s{i}"
        ops.append((f"{p}ln", "layernorm", (acc,), (f"x{blk + 1}",), {}))
        x = f"x{blk + 1}"
        blk += 1
    return _finish(f"branchy-{n_ops}", T, ops, ["x0"], weights, n_ops)


FAMILIES = {"chain": transformer_chain, "branchy": branchy_dag}


def run_one(name: str, graph: Graph, spec, time_limit: float, heap: bool = False) -> dict:
    """Time candidates + solve in this process (run in a fresh subprocess per case, so that
    ru_maxrss is this case's peak). heap=True also traces the Python heap (slower)."""
    gc.collect()
    if heap:
        tracemalloc.start()
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    c0 = time.process_time() + ch.ru_utime + ch.ru_stime
    t0 = time.perf_counter()
    cands = build_candidates(graph, spec)
    t1 = time.perf_counter()
    res = solve(cands, time_limit_s=time_limit)
    t2 = time.perf_counter()
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() + ch.ru_utime + ch.ru_stime - c0
    peak = tracemalloc.get_traced_memory()[1] if heap else float("nan")
    if heap:
        tracemalloc.stop()
    return {"graph": name, "ops": len(graph.ops), "atoms": len(cands.atoms),
            "candidates": len(cands.candidates), "build_s": round(t1 - t0, 3),
            "solve_s": round(t2 - t1, 3), "total_s": round(t2 - t0, 3), "cpu_s": round(cpu, 3),
            "peak_heap_MB": round(peak / 2**20, 1),
            "max_rss_MB": round(max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                    resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
                                / 1024, 1),
            "status": res.status, "gap": round(res.gap, 5),
            "latency_us": round(res.latency_s * 1e6, 2), "regions": len(res.chosen),
            "source": res.source, "sm_booleans": res.stats.get("sm_booleans", 0)}


def run_case(case: str, hw: str, time_limit: float, heap: bool) -> dict:
    """One case in a subprocess: 'chain:1000', 'branchy:100' or 'zoo:gpt3-mlp'."""
    cmd = [sys.executable, __file__, "--one", case, "--hw", hw, "--time-limit", str(time_limit)]
    if heap:
        cmd.append("--heap")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def graph_of(case: str) -> tuple[str, Graph]:
    kind, arg = case.split(":", 1)
    if kind == "zoo":
        return arg, load_model(arg)
    return f"{kind}-{arg}", FAMILIES[kind](int(arg))


def fit_exponent(rows: list[dict]) -> float:
    pts = [(math.log(r["ops"]), math.log(max(r["total_s"], 1e-4))) for r in rows]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else float("nan")


COLS = ["graph", "ops", "atoms", "candidates", "build_s", "solve_s", "total_s", "cpu_s",
        "peak_heap_MB",
        "max_rss_MB", "status", "gap", "latency_us", "regions", "source", "sm_booleans"]


def print_table(rows: list[dict]) -> None:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLS}
    print("  ".join(c.rjust(widths[c]) for c in COLS))
    for r in rows:
        print("  ".join(str(r[c]).rjust(widths[c]) for c in COLS), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10, 100, 1000, 5000])
    ap.add_argument("--families", nargs="*", default=list(FAMILIES))
    ap.add_argument("--hw", default="h100-sxm")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--no-zoo", action="store_true")
    ap.add_argument("--heap", action="store_true", help="also trace the Python heap (slower)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        name, graph = graph_of(a.one)
        print(json.dumps(run_one(name, graph, load_spec(a.hw), a.time_limit, a.heap)))
        return 0
    cases = [f"{fam}:{n}" for fam in a.families for n in a.sizes]
    if not a.no_zoo:
        cases += [f"zoo:{m}" for m in sorted(list_models())]
    rows = []
    for i, case in enumerate(cases):
        r = run_case(case, a.hw, a.time_limit, a.heap)
        rows.append(r)
        line = "  ".join(str(r[c]).rjust(max(len(c), len(str(r[c])))) for c in COLS)
        if i == 0:
            print("  ".join(c.rjust(max(len(c), len(str(r[c])))) for c in COLS))
        print(line, flush=True)
    print()
    print_table(rows)
    for fam in a.families:
        fr = [r for r in rows if r["graph"].startswith(fam + "-")]
        big = [r for r in fr if r["ops"] >= 100]
        print(f"scaling exponent ({fam}, log-log fit of total time vs ops): "
              f"{fit_exponent(fr):.2f} over all sizes, {fit_exponent(big):.2f} from 100 ops")
    zoo = [r for r in rows if not any(r["graph"].startswith(f + "-") for f in FAMILIES)]
    if zoo:
        slow = max(zoo, key=lambda r: r["total_s"])
        print(f"zoo: slowest {slow['graph']} {slow['total_s']:.2f} s")
    print(f"peak RSS {max(r['max_rss_MB'] for r in rows):.0f} MB")
    if a.csv:
        Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, COLS)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
