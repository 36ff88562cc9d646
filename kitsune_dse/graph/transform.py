"""Graph rewrites that describe how a baseline runs a model (not optimisations)."""
from __future__ import annotations

import functools

from kitsune_dse.graph.ir import Graph, Op, Tensor

BIAS_SUFFIX = "_bias"


@functools.lru_cache(maxsize=64)
def unfused_bias(graph: Graph) -> Graph:
    """The graph with every matmul's bias taken out into an add of its own: a GEMM library's
    plain product writes `<out>_raw`, the op `<name>_bias` adds the bias into `<out>`. The
    other ops, tensors and names are unchanged."""
    if not any(op.kind == "matmul" and len(op.inputs) == 3 for op in graph.ops):
        return graph
    tensors = dict(graph.tensors)
    ops: list[Op] = []
    for op in graph.ops:
        if op.kind != "matmul" or len(op.inputs) != 3:
            ops.append(Op(op.name, op.kind, op.inputs, op.outputs, op.attrs))
            continue
        out = graph.tensors[op.outputs[0]]
        raw = f"{out.name}_raw"
        tensors[raw] = Tensor(raw, out.shape, out.dtype)
        ops.append(Op(op.name, "matmul", op.inputs[:2], (raw,), op.attrs))
        ops.append(Op(op.name + BIAS_SUFFIX, "add", (raw, op.inputs[2]), op.outputs))
    return Graph.build(name=graph.name, tensors=tensors, ops=ops, inputs=graph.inputs,
                       weights=graph.weights, outputs=graph.outputs, source=graph.source,
                       meta=dict(graph._meta))
