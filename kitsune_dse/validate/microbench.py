"""Microbenchmarks of the tile kernels on their own: GEMM TFLOP/s (against cuBLAS through CuPy)
and the bandwidth of the elementwise and row kernels. Each case is a one-op synthetic model run
through the same code path as the harness (codegen -> standalone kernel), checked for
correctness on fresh inputs, and timed cold (L2 flushed) with CUDA events."""
from __future__ import annotations

from kitsune_dse.graph.yaml_model import model_from_dict
from kitsune_dse.validate.lower import Region

# (name, dtype, op kind, sizes) -- GEMM sizes are M, N, K; others rows, cols
CASES = [
    ("gemm", "fp16", "matmul", (4096, 4096, 4096)),
    ("gemm", "fp16", "matmul", (8192, 8192, 8192)),
    ("gemm 128x128x32/4", "fp16", "matmul", (8192, 8192, 8192), {"bn": 128, "bk": 32, "stages": 4}),
    ("gemm 128x256x64/3", "fp16", "matmul", (8192, 8192, 8192), {"bn": 256, "bk": 64, "stages": 3}),
    ("gemm", "bf16", "matmul", (8192, 8192, 8192)),
    ("gemm", "fp16", "matmul", (2048, 6144, 12288)),
    ("gemm-skinny", "fp16", "matmul", (64, 12288, 12288)),
    ("add", "fp16", "add", (8192, 8192)),
    ("gelu", "fp16", "gelu", (8192, 8192)),
    ("softmax", "fp16", "softmax", (32768, 2048)),
    ("softmax", "fp16", "softmax", (8192, 8192)),
    ("layernorm", "fp16", "layernorm", (16384, 4096)),
    ("rmsnorm", "fp16", "rmsnorm", (16384, 4096)),
    ("layernorm", "fp16", "layernorm", (4096, 12288)),
    ("rmsnorm", "fp16", "rmsnorm", (4096, 8192)),
]


def case_model(kind: str, dtype: str, dims):
    if kind == "chain":     # (rows, width, layers): GEMMs one after another, each [width, width]
        m, width, layers = dims
        ops, prev = [], "a"
        for i in range(layers):
            ops.append({"name": f"mm{i}", "kind": "matmul", "inputs": [prev, f"w{i}"], "outputs": [f"c{i}"]})
            prev = f"c{i}"
        d = {"name": f"chain{m}x{width}x{layers}", "dtype": dtype, "inputs": {"a": [m, width]},
             "weights": {f"w{i}": [width, width] for i in range(layers)}, "ops": ops}
        g = model_from_dict(d, "<microbench>")
        return g, {"id": 0, "strategy": "bsp", "ops": [o.name for o in g.ops]}
    if kind == "ewchain":   # (rows, cols, kernels): one elementwise kernel after another
        r, c, n = dims
        ops, prev = [], "x"
        for i in range(n):
            ops.append({"name": f"r{i}", "kind": "relu", "inputs": [prev], "outputs": [f"y{i}"]})
            prev = f"y{i}"
        d = {"name": f"ewchain{r}x{c}x{n}", "dtype": dtype, "inputs": {"x": [r, c]}, "weights": {},
             "ops": ops}
        g = model_from_dict(d, "<microbench>")
        return g, {"id": 0, "strategy": "bsp", "ops": [o.name for o in g.ops]}
    if kind == "matmul":
        m, n, k = dims
        d = {"name": f"mm{m}x{n}x{k}", "dtype": dtype, "inputs": {"a": [m, k]}, "weights": {"b": [k, n]},
             "ops": [{"name": "mm", "kind": "matmul", "inputs": ["a", "b"], "outputs": ["c"]}]}
    elif kind in ("mmrelu", "mmgelu", "mmsilu", "mmsoftmax"):
        # (m, n, k): a GEMM, then an activation of its output (two ops: one or two stages)
        m, n, k = dims
        d = {"name": f"{kind}{m}x{n}x{k}", "dtype": dtype, "inputs": {"a": [m, k]}, "weights": {"b": [k, n]},
             "ops": [{"name": "mm", "kind": "matmul", "inputs": ["a", "b"], "outputs": ["c"]},
                     {"name": "act", "kind": kind[2:], "inputs": ["c"], "outputs": ["out"]}]}
    elif kind in ("mmbias", "mmbiasgelu"):  # (m, n, k): a GEMM with a bias vector over N and a
        # ReLU (mmbias) or a GELU (mmbiasgelu: an MLP's first layer)
        m, n, k = dims
        d = {"name": f"{kind}{m}x{n}x{k}", "dtype": dtype, "inputs": {"a": [m, k]},
             "weights": {"b": [k, n], "bias": [n]},
             "ops": [{"name": "mm", "kind": "matmul", "inputs": ["a", "b", "bias"], "outputs": ["c"]},
                     {"name": "act", "kind": "gelu" if kind == "mmbiasgelu" else "relu", "inputs": ["c"],
                      "outputs": ["out"]}]}
    elif kind == "mmadd":   # (m, n, k): a GEMM whose epilogue adds a residual [m, n] input
        m, n, k = dims
        d = {"name": f"mmadd{m}x{n}x{k}", "dtype": dtype, "inputs": {"a": [m, k], "r": [m, n]},
             "weights": {"b": [k, n]},
             "ops": [{"name": "mm", "kind": "matmul", "inputs": ["a", "b"], "outputs": ["c"]},
                     {"name": "res", "kind": "add", "inputs": ["c", "r"], "outputs": ["out"]}]}
    elif kind == "concat":  # (rows, c1, c2): two inputs side by side along the last axis
        r, c1, c2 = dims
        d = {"name": f"concat{r}x{c1}x{c2}", "dtype": dtype, "inputs": {"x": [r, c1], "y": [r, c2]},
             "weights": {}, "ops": [{"name": "op", "kind": "concat", "inputs": ["x", "y"], "outputs": ["out"],
                                     "attrs": {"axis": -1}}]}
    else:
        r, c = dims
        ins = {"x": [r, c]}
        w = {}
        args = ["x"]
        if kind == "add":
            ins["y"] = [r, c]
            args = ["x", "y"]
        elif kind == "layernorm":
            w = {"g": [c], "b": [c]}
            args = ["x", "g", "b"]
        elif kind == "rmsnorm":
            w = {"g": [c]}
            args = ["x", "g"]
        d = {"name": f"{kind}{r}x{c}", "dtype": dtype, "inputs": ins, "weights": w,
             "ops": [{"name": "op", "kind": kind, "inputs": args, "outputs": ["out"]}]}
    g = model_from_dict(d, "<microbench>")
    region = {"id": 0, "strategy": "bsp", "ops": [o.name for o in g.ops]}
    return g, region


def pipe_case_region(kind: str, dims, sms, rows: int = 128, depth: int = 8, dtype: str = "fp16"):
    """A microbenchmark case as a pipeline region (the calibration's persistent kernel cases):
    one stage of every op on `sms` SMs, or (sms a list, one per op) a stage per op, each handing
    its output to the next through a ring of `depth` plan tiles. Returns (graph, region dict)."""
    g, region = case_model(kind, dtype, dims)
    ops = list(region["ops"])
    tile = {"rows": rows, "cols": 128}
    if isinstance(sms, (tuple, list)):
        if len(sms) != len(ops):
            raise ValueError(f"{kind}: {len(sms)} stage SM counts for {len(ops)} ops")
        stages = [{"id": j, "ops": [o], "sms": s, "ctas": s, "tile": dict(tile)} for j, (o, s) in enumerate(zip(ops, sms))]
        queues = [{"producer": j, "consumer": j + 1, "tensors": list(g.op(ops[j]).outputs), "depth": depth,
                   "mode": "row"} for j in range(len(ops) - 1)]
    else:
        stages = [{"id": 0, "ops": ops, "sms": sms, "ctas": sms, "tile": tile}]
        queues = []
    return g, {"id": 0, "strategy": "pipeline", "ops": ops, "stages": stages, "queues": queues}


def case_variants(info, tensors_cls=None, cases=CASES):
    """(case, region, Region, [variants]) for every case (build only; used by precompile too)."""
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors, cublas_plan
    out = []
    for case in cases:
        name, dtype, kind, dims = case[:4]
        g, region = case_model(kind, dtype, dims)
        reg = Region(g, region)
        tensors = (tensors_cls or Tensors)(reg)
        from kitsune_dse.validate.lower import bsp_groups
        groups = bsp_groups(reg)
        if len(case) > 4:
            for grp in groups:
                grp.tile = case[4]
        vs = [StandaloneVariant("tile", reg, tensors, info, groups, prefix="mb")]
        if kind == "matmul" and dtype == "fp16" and len(case) == 4:
            vs.append(StandaloneVariant("cublas", reg, tensors, info, [], prefix="mbc", cublas_steps=cublas_plan(reg)))
        out.append(((name, dtype, kind, dims), region, reg, vs))
    return out


def run_microbench(runs: int = 30, console=None) -> list[dict]:
    import cupy as cp

    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.runtime import gpu_info

    info, extra = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    with stream:
        for case in case_variants(info):
            rows += _run_case(case, stream, flush, runs, console)
    return rows


def _run_case(case, stream, flush, runs, console):
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import time_runs
    from kitsune_dse.validate.reference import input_roles
    rows = []
    (name, dtype, kind, dims), region, reg, vs = case
    g = reg.graph
    flops = g.total_flops
    nbytes = sum(g.tensors[t].nbytes for t in g.inputs) + sum(g.tensors[t].nbytes for t in g.weights) \
        + sum(g.tensors[t].nbytes for t in g.outputs)
    roles = input_roles(reg)
    for v in vs:
        row = {"kernel": name, "impl": v.name, "dtype": dtype, "shape": "x".join(map(str, dims)),
               "flops": flops, "bytes": nbytes}
        try:
            v.prepare()
            chk = check_variant(v, reg, v.tensors, roles, stream, 1)
            t = time_runs(v.run, v.pre, v.after, stream, runs, 3, flush, poison_every=False)
            row.update(time_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s, correct=chk["correct"],
                       rel_err=chk["rel_err"], tflops=flops / t.median_s / 1e12 if flops else 0.0,
                       gbps=nbytes / t.median_s / 1e9, launches=v.launches_per_run,
                       resources=";".join(f"{k}:{r['num_regs']}regs/{r['local_bytes']}B-local"
                                          for k, r in v.resources.items()))
        except Exception as e:  # noqa: BLE001 - report and go on
            row.update(correct=False, error=f"{type(e).__name__}: {e}")
        rows.append(row)
        if console is not None:
            console.print(f"  {name} {dtype} {row['shape']} {v.name}: "
                          + (f"{row['time_s'] * 1e6:.1f} us {row['tflops']:.0f} TFLOP/s {row['gbps']:.0f} GB/s ok={row['correct']} err={row['rel_err']:.1e}"
                             if "time_s" in row else row.get("error", "")))
    vs[0].tensors.arrays.clear()
    cp.get_default_memory_pool().free_all_blocks()
    return rows


# Tile hand-off probes (calibration of tilesync/concurrent): each kernel alone, as a plain kernel
# in a CUDA graph, then as a tilesync kernel that counts its tiles ("signal"), then one that also
# waits for an always-complete counter before each tile ("both"); the differences are what a
# producer's and a consumer's hand-offs cost per tile.
TILESYNC_PROBES = [
    ("probe", "fp16", "matmul", (65536, 256, 256)),
    ("probe", "fp16", "matmul", (262144, 256, 256)),
    ("probe", "fp16", "matmul", (16384, 3072, 768)),
    ("probe", "fp16", "matmul", (4096, 4096, 4096)),
    ("probe", "fp16", "matmul", (2048, 1024, 1024)),
    ("probe", "fp16", "layernorm", (16384, 4096)),
    ("probe", "fp16", "gelu", (8192, 8192)),
    # row and element-wise kernels of other widths and residencies (session 26: attention's
    # 1,024-column softmax paid nothing for its signals where the wide layernorm above paid
    # 0.34 us a tile): which kernels a signal costs, and why
    ("probe", "fp16", "softmax", (65536, 1024)),
    ("probe", "fp16", "softmax", (16384, 4096)),
    ("probe", "fp16", "layernorm", (65536, 1024)),
    ("probe", "fp16", "layernorm", (16384, 2048)),
    ("probe", "fp16", "layernorm", (4096, 4096)),
    ("probe", "fp16", "gelu", (65536, 1024)),
    ("probe", "fp16", "add", (16384, 4096)),
    ("probe", "fp16", "relu", (262144, 256)),
    ("probe", "fp16", "concat", (262144, 256, 60)),     # NeRF's skip connection
    ("probe", "fp16", "concat", (65536, 512, 512)),
]


def _case_sets(info, cases, variants):
    """(case, region, Region, variants(reg, tensors, groups)) per case (build only): one
    model per case, its tensors shared by the variants, one kernel per op."""
    from kitsune_dse.validate.lower import bsp_groups
    from kitsune_dse.validate.runtime import Tensors
    out = []
    for name, dtype, kind, dims in cases:
        g, region = case_model(kind, dtype, dims)
        reg = Region(g, region)
        out.append(((name, dtype, kind, dims), region, reg, variants(reg, Tensors(reg), bsp_groups(reg))))
    return out


def probe_variants(info, cases=TILESYNC_PROBES):
    """(case, region, Region, [plain, signal, both]) per probe case (build only)."""
    from kitsune_dse.validate.runtime import StandaloneVariant, TilesyncVariant
    return _case_sets(info, cases, lambda reg, t, groups: [
        StandaloneVariant("plain", reg, t, info, groups, graph=True, prefix="mb"),
        TilesyncVariant("signal", reg, t, info, groups, "tilesync", probe="signal"),
        TilesyncVariant("both", reg, t, info, groups, "tilesync", probe="both")])


# chains of dependent GEMMs: a CUDA graph of their kernels against the same kernels under
# tilesync (programmatic launches, per-row-block flags); one-wave and multi-wave producers
TILESYNC_CHAINS = [
    ("chain", "fp16", "chain", (2048, 1024, 2)),
    ("chain", "fp16", "chain", (2048, 1024, 5)),
    ("chain", "fp16", "chain", (2048, 512, 5)),
    ("chain", "fp16", "chain", (8192, 1024, 3)),
    ("chain", "fp16", "chain", (16384, 2048, 3)),
]


def chain_variants(info, cases=TILESYNC_CHAINS):
    """(case, region, Region, [graph, tilesync]) per chain case (build only)."""
    from kitsune_dse.validate.runtime import StandaloneVariant, TilesyncVariant
    return _case_sets(info, cases, lambda reg, t, groups: [
        StandaloneVariant("graph", reg, t, info, groups, graph=True, prefix="mb"),
        TilesyncVariant("tilesync", reg, t, info, groups, "tilesync")])


# N tiny kernels one after another, as a CUDA graph, eagerly, and as N one-kernel graphs launched
# back to back (a plan's regions end to end): T(N) = a + N b separates the once-per-launch
# latency a from each kernel's (or region's) marginal cost b (a lone event-timed kernel has both)
KERNEL_CHAINS = [("kernel chain", "fp16", "ewchain", (128, 1024, n)) for n in (1, 2, 4, 8, 16)]


def kernel_chain_variants(info, cases=KERNEL_CHAINS):
    """(case, region, Region, [graph, eager, graphs]) per chain length (build only)."""
    from kitsune_dse.validate.runtime import StandaloneVariant
    return _case_sets(info, cases, lambda reg, t, groups: [
        StandaloneVariant("graph", reg, t, info, groups, graph=True, prefix="mb"),
        StandaloneVariant("eager", reg, t, info, groups, prefix="mb"),
        StandaloneVariant("graphs", reg, t, info, groups, prefix="mb", graph_per_kernel=True)])
