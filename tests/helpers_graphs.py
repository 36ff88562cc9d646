"""Small graph builders, a fixed test GPU spec and hypothesis strategies for the cost-model tests.

The test spec `H100` is written out here (not loaded from hw_specs/) so that the hand-computed
figures in the tests do not move when the shipped spec files are recalibrated. Its numbers are
the H100 SXM datasheet/FACTS figures:

    132 SMs, fp16 tensor peak 989.4 TFLOP/s x 0.76, fp32 SIMT 66.9 TFLOP/s x 0.76,
    HBM 3.35 TB/s x 0.87 saturating with 38 GB/s per SM (p = 3), L2 50 MiB (75 % usable),
    L2 7.4 TB/s x 0.95 with 80 GB/s per SM, launch 6 us eager, 0.8 us per CUDA-graph node,
    1.5 us gap between dependent eager kernels, 0.56 us one-way flag hand-off.
"""
from __future__ import annotations

import math
import os

from hypothesis import strategies as st

from kitsune_dse.graph.ir import Graph, Op, Tensor
from kitsune_dse.hw.spec import Efficiency, HwSpec

MiB = 1024 * 1024

H100 = HwSpec(
    name="test-h100", full_name="H100-like spec for the cost-model tests", arch="sm_90",
    sm_count=132, sm_clock_Hz=1.98e9,
    tensor_peak_flop_per_s={"fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12},
    simt_peak_flop_per_s={"fp32": 66.9e12, "fp16": 133.8e12},
    hbm_bytes=80e9, hbm_bandwidth_Bps=3.35e12, hbm_per_sm_bandwidth_Bps=38e9,
    l2_bytes=50 * MiB, l2_bandwidth_Bps=7.4e12, l2_per_sm_bandwidth_Bps=80e9,
    smem_per_sm_bytes=228 * 1024, smem_per_cta_max_bytes=227 * 1024, registers_per_sm=65536,
    max_ctas_per_sm=32, max_threads_per_sm=2048,
    launch_overhead_s=6e-6, graph_launch_overhead_s=0.8e-6, kernel_gap_s=1.5e-6,
    sync_latency_s=0.56e-6, sm_granularity=8,
    # ring write-back (queues' and inner rings') all but a step at 30 MiB of L2 footprint (a
    # logistic 0.5 MiB wide), so that hand computations read none below it and all above; the
    # logistic's own tests widen it
    efficiency=Efficiency(tensor_core=0.76, simt=0.76, hbm=0.87, l2=0.95,
                          l2_usable_fraction=0.75, hbm_saturation_exponent=3.0,
                          l2_writeback_center=0.6, l2_writeback_width=0.01,
                          l2_inner_writeback_center=0.6, l2_inner_writeback_width=0.01),
)
L2_USABLE = 50 * MiB * 0.75          # 39,321,600 bytes = 37.5 MiB
# the same with the write-back step beyond the usable L2 (40 MiB, 15 KiB wide): a kernel
# sequence's intermediates that fit stay in L2 entirely, for the hand computations of reuse
H100_STEP = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(
    update={"l2_writeback_center": 0.8, "l2_writeback_width": 0.0003,
            "l2_inner_writeback_center": 0.8, "l2_inner_writeback_width": 0.0003})})


def spec(**update) -> HwSpec:
    """The test spec with some fields replaced (`efficiency=` takes a dict of its fields)."""
    eff = update.pop("efficiency", None)
    s = H100.model_copy(update=update)
    if eff:
        s = s.model_copy(update={"efficiency": H100.efficiency.model_copy(update=eff)})
    return s


def hbm_curve(sms: float, per_sm=38e9, peak=3.35e12 * 0.87, p=3.0) -> float:
    """B(s) = ((s*b_sm)^-p + B_max^-p)^(-1/p), written out for the hand-computed tests."""
    return ((sms * per_sm) ** -p + peak ** -p) ** (-1.0 / p)


# -- graph builders ------------------------------------------------------------------------------
def build(name, tensors, ops, inputs, weights, outputs=None) -> Graph:
    return Graph.build(name=name, tensors={t.name: t for t in tensors},
                       ops=[Op(*o) if isinstance(o, tuple) else o for o in ops],
                       inputs=inputs, weights=weights, outputs=outputs)


def chain_graph(rows: int, cols: int, kinds=("relu", "relu"), dtype="fp16") -> Graph:
    """x -> kinds[0] -> t1 -> kinds[1] -> ... -> y, every tensor [rows, cols]."""
    names = ["x"] + [f"t{i + 1}" for i in range(len(kinds) - 1)] + ["y"]
    ops = [(f"op{i}", k, (names[i],), (names[i + 1],)) for i, k in enumerate(kinds)]
    return build("chain", [Tensor("x", (rows, cols), dtype)], ops, ["x"], [])


def gemm_graph(m: int, n: int, k: int, dtype="fp16", epilogue: str | None = None) -> Graph:
    """y = x[m,k] @ w[k,n] (then an optional elementwise/row op)."""
    ops = [("mm", "matmul", ("x", "w"), ("h",))]
    if epilogue:
        ops.append(("epi", epilogue, ("h",), ("y",)))
    return build("gemm", [Tensor("x", (m, k), dtype), Tensor("w", (k, n), dtype)], ops,
                 ["x"], ["w"])


def mlp_graph(tokens: int, hidden: int, ffn: int, dtype="fp16") -> Graph:
    """The gpt3-mlp structure: fc1(+b1) -> gelu -> fc2(+b2) -> residual add with x."""
    t = [Tensor("x", (tokens, hidden), dtype), Tensor("w1", (hidden, ffn), dtype),
         Tensor("b1", (ffn,), dtype), Tensor("w2", (ffn, hidden), dtype),
         Tensor("b2", (hidden,), dtype)]
    ops = [("fc1", "matmul", ("x", "w1", "b1"), ("h",)), ("gelu", "gelu", ("h",), ("a",)),
           ("fc2", "matmul", ("a", "w2", "b2"), ("o",)), ("residual", "add", ("o", "x"), ("y",))]
    return build("mlp", t, ops, ["x"], ["w1", "b1", "w2", "b2"], ["y"])


def two_gemms_graph(m: int, n1: int, n2: int, k: int, dtype="fp16") -> Graph:
    """Two independent GEMMs on the same input: y1 = x @ w1, y2 = x @ w2."""
    t = [Tensor("x", (m, k), dtype), Tensor("w1", (k, n1), dtype), Tensor("w2", (k, n2), dtype)]
    ops = [("g1", "matmul", ("x", "w1"), ("y1",)), ("g2", "matmul", ("x", "w2"), ("y2",))]
    return build("two-gemms", t, ops, ["x"], ["w1", "w2"], ["y1", "y2"])


def full_dep_graph(m: int, n: int, k: int, dtype="fp16") -> Graph:
    """a = x @ w (a [k, n]); y = z @ a: the second GEMM needs all of `a` (its B operand)."""
    t = [Tensor("x", (k, m), dtype), Tensor("w", (m, n), dtype), Tensor("z", (m, k), dtype)]
    ops = [("g1", "matmul", ("x", "w"), ("a",)), ("g2", "matmul", ("z", "a"), ("y",))]
    return build("full-dep", t, ops, ["x", "z"], ["w"])


def gather_graph(vocab: int, dim: int, n_idx: int, dtype="fp16") -> Graph:
    """t = relu(table); y = gather(t, idx): the gather needs rows chosen by data."""
    t = [Tensor("table", (vocab, dim), dtype), Tensor("idx", (n_idx,), "int64")]
    ops = [("act", "relu", ("table",), ("t",)), ("look", "gather", ("t", "idx"), ("y",))]
    return build("gather", t, ops, ["table", "idx"], [])


# -- hypothesis strategies ----------------------------------------------------------------------
# KITSUNE_DSE_PROPERTY_SCALE=10 runs every property test with ten times its examples (a longer
# hunt than the default suite can afford)
_SCALE = float(os.environ.get("KITSUNE_DSE_PROPERTY_SCALE", "1"))


def examples(n: int) -> int:
    return max(1, int(n * _SCALE))


# -----------------------------------------------------------------------
ROWS = (64, 256, 1024, 4096, 8192)
WIDTHS = (64, 256, 1024, 4096, 8192)
UNARY = ("relu", "gelu", "scale", "exp")
ROWOPS = ("softmax", "layernorm")


@st.composite
def small_graphs(draw, max_ops: int = 5, allow_fp32: bool = True, chain: bool = False) -> Graph:
    """A random DAG of 1..max_ops ops over [rows, width] activations: GEMMs with fresh weights,
    unary elementwise ops, row reductions and adds of two same-shaped tensors (which give
    branches and joins). Sizes range from tiny to a few times the usable L2. With chain=True
    every op reads only the previous op's output (an add doubles it): no branches."""
    rows = draw(st.sampled_from(ROWS))
    dtype = draw(st.sampled_from(("fp16", "fp32") if allow_fp32 else ("fp16",)))
    w0 = draw(st.sampled_from(WIDTHS))
    tensors = [Tensor("x", (rows, w0), dtype)]
    avail = [("x", w0)]                     # activations: (name, width)
    weights, ops = [], []
    n_ops = draw(st.integers(1, max_ops))
    for i in range(n_ops):
        kind = draw(st.sampled_from(("matmul", "matmul", "unary", "row", "add")))
        src, width = avail[-1] if chain else avail[draw(st.integers(0, len(avail) - 1))]
        out = f"t{i}"
        if kind == "matmul":
            n = draw(st.sampled_from(WIDTHS))
            wname = f"w{i}"
            tensors.append(Tensor(wname, (width, n), dtype))
            weights.append(wname)
            ops.append((f"mm{i}", "matmul", (src, wname), (out,)))
            width = n
        elif kind == "unary":
            ops.append((f"u{i}", draw(st.sampled_from(UNARY)), (src,), (out,)))
        elif kind == "row":
            ops.append((f"r{i}", draw(st.sampled_from(ROWOPS)), (src,), (out,)))
        else:
            same = [a for a in avail if a[1] == width and a[0] != src and not chain]
            other = draw(st.sampled_from(same)) if same else (src, width)
            ops.append((f"add{i}", "add", (src, other[0]), (out,)))
        avail.append((out, width))
    return build("random", tensors, ops, ["x"], weights)


def describe(g: Graph) -> str:
    """A one-line listing of a graph, for hypothesis.note() in failing examples."""
    ts = g.tensors
    return "; ".join(f"{o.name}={o.kind}({', '.join(f'{t}{list(ts[t].shape)}' for t in o.inputs)})"
                     f"->{o.outputs[0]}" for o in g.ops) + f" [{ts[g.inputs[0]].dtype}]"


@st.composite
def spec_variants(draw) -> HwSpec:
    """The test spec with random SM count (per-SM rates kept), bandwidths, L2 size and
    efficiency factors: the spread of shipped GPUs and beyond."""
    sms = draw(st.integers(8, 160))
    f = sms / 132                           # keep per-SM compute when the SM count changes
    tens = draw(st.floats(0.2, 3.0))
    simt = draw(st.floats(0.2, 3.0))
    return spec(sm_count=sms,
                tensor_peak_flop_per_s={k: v * f * tens
                                        for k, v in H100.tensor_peak_flop_per_s.items()},
                simt_peak_flop_per_s={k: v * f * simt
                                      for k, v in H100.simt_peak_flop_per_s.items()},
                hbm_bandwidth_Bps=draw(st.floats(0.5e12, 8e12)),
                hbm_per_sm_bandwidth_Bps=draw(st.floats(10e9, 80e9)),
                l2_bytes=draw(st.sampled_from((4, 6, 40, 50, 72, 126))) * MiB,
                graph_launch_overhead_s=draw(st.floats(0.2e-6, 3e-6)),
                sync_latency_s=draw(st.floats(0.1e-6, 2e-6)),
                efficiency={"hbm_saturation_exponent": draw(st.floats(1.0, 6.0))})


def scale_sms(s: HwSpec, new_sm_count: int) -> HwSpec:
    """The same GPU with more (or fewer) SMs of the same kind: whole-GPU peaks scale with the
    SM count (so the per-SM rate stays), memory bandwidths stay."""
    f = new_sm_count / s.sm_count
    return s.model_copy(update={
        "sm_count": new_sm_count,
        "tensor_peak_flop_per_s": {k: v * f for k, v in s.tensor_peak_flop_per_s.items()},
        "simt_peak_flop_per_s": {k: v * f for k, v in s.simt_peak_flop_per_s.items()}})


def scale_flops(s: HwSpec, f: float) -> HwSpec:
    return s.model_copy(update={
        "tensor_peak_flop_per_s": {k: v * f for k, v in s.tensor_peak_flop_per_s.items()},
        "simt_peak_flop_per_s": {k: v * f for k, v in s.simt_peak_flop_per_s.items()}})


def scale_bandwidth(s: HwSpec, f: float) -> HwSpec:
    return s.model_copy(update={"hbm_bandwidth_Bps": s.hbm_bandwidth_Bps * f})


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["H100", "H100_STEP", "L2_USABLE", "MiB", "spec", "hbm_curve", "build", "chain_graph", "gemm_graph",
           "mlp_graph", "two_gemms_graph", "full_dep_graph", "gather_graph", "small_graphs",
           "spec_variants", "describe", "examples", "scale_sms", "scale_flops", "scale_bandwidth",
           "ceil_div", "math"]
