"""Checks that turn declared tensors and ops into a valid Graph, or one clear error.

Validation is separate from the loaders: YAML and ONNX front-ends produce plain declarations and
this module checks them (known kinds and dtypes, each tensor produced once, shapes by each
kind's rule, acyclicity) and fixes a stable topological order.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping

from kitsune_dse.errors import KitsuneError, closest
from kitsune_dse.graph.ir import DTYPE_BYTES, STORE_ALIGN_ELEMS, Graph, Op, OpClass, Tensor
from kitsune_dse.graph.ops import KINDS, ShapeError, apply_rule


def _check_tensor(t: Tensor, where: str) -> None:
    if t.dtype not in DTYPE_BYTES:
        raise KitsuneError(f"tensor {t.name!r}: unknown dtype {t.dtype!r}"
                           f"{closest(t.dtype, DTYPE_BYTES)}", where=where)
    if not t.shape or any((not isinstance(d, int)) or d <= 0 for d in t.shape):
        raise KitsuneError(f"tensor {t.name!r}: shape {list(t.shape)} must be a non-empty list of "
                           f"positive integers", where=where)


def _find_cycle(ops: list[Op], producer: Mapping[str, int]) -> list[str]:
    succ: dict[int, list[int]] = {i: [] for i in range(len(ops))}
    for i, op in enumerate(ops):
        for t in op.inputs:
            if t in producer:
                succ[producer[t]].append(i)
    color = [0] * len(ops)
    stack_path: list[int] = []

    def dfs(u):
        color[u] = 1
        stack_path.append(u)
        for v in succ[u]:
            if color[v] == 1:
                return stack_path[stack_path.index(v):] + [v]
            if color[v] == 0:
                c = dfs(v)
                if c:
                    return c
        stack_path.pop()
        color[u] = 2
        return None

    for s in range(len(ops)):
        if color[s] == 0:
            c = dfs(s)
            if c:
                return [ops[i].name for i in c]
    return []


def build_graph(*, name, tensors, ops, inputs, weights, outputs=None, source="<memory>",
                meta=None) -> Graph:
    where = source
    declared = dict(tensors)
    for t in declared.values():
        _check_tensor(t, where)
    sources = list(inputs) + list(weights)
    for tname in sources:
        if tname not in declared:
            raise KitsuneError(f"input/weight {tname!r} has no declared shape", where=where)
    names_seen: set[str] = set()
    producer: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.name in names_seen:
            raise KitsuneError(f"op {op.name!r}: name used twice", where=where)
        names_seen.add(op.name)
        if op.kind not in KINDS:
            raise KitsuneError(f"op {op.name!r}: unknown op kind {op.kind!r}"
                               f"{closest(op.kind, KINDS)}", where=where)
        if not op.outputs:
            raise KitsuneError(f"op {op.name!r}: names no outputs", where=where)
        for t in op.outputs:
            if t in producer:
                raise KitsuneError(f"op {op.name!r}: tensor {t!r} is already produced by op "
                                   f"{ops[producer[t]].name!r}", where=where)
            if t in sources:
                raise KitsuneError(f"op {op.name!r}: writes {t!r}, which is a graph input or "
                                   f"weight", where=where)
            producer[t] = i
    known = set(sources) | set(producer)
    for op in ops:
        for t in op.inputs:
            if t not in known:
                raise KitsuneError(f"op {op.name!r}: input {t!r} is neither a graph input, a "
                                   f"weight nor produced by an op{closest(t, known)}", where=where)
    # stable topological order: Kahn's algorithm, ties broken by declaration order
    indeg = [0] * len(ops)
    succ: dict[int, set[int]] = {i: set() for i in range(len(ops))}
    for i, op in enumerate(ops):
        for t in set(op.inputs):
            if t in producer:
                j = producer[t]
                if i not in succ[j]:
                    succ[j].add(i)
                    indeg[i] += 1
    heap = [i for i in range(len(ops)) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        u = heapq.heappop(heap)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, v)
    if len(order) != len(ops):
        cyc = _find_cycle(list(ops), producer)
        raise KitsuneError("the graph has a cycle: " + " -> ".join(cyc), where=where)
    # shapes in topological order
    all_tensors: dict[str, Tensor] = {t: declared[t] for t in sources}
    built: list[Op] = []
    for i in order:
        op = ops[i]
        ins = [all_tensors[t] for t in op.inputs]
        try:
            outs, info = apply_rule(op.kind, ins, op.attrs, list(op.outputs))
        except ShapeError as e:
            detail = ", ".join(f"{t.name} {list(t.shape)} {t.dtype}" for t in ins)
            raise KitsuneError(f"op {op.name!r} ({op.kind}): {e} [inputs: {detail}]",
                               where=where) from None
        for t in outs:
            if t.name in declared and (declared[t.name].shape != t.shape):
                raise KitsuneError(f"op {op.name!r}: output {t.name!r} is declared with shape "
                                   f"{list(declared[t.name].shape)} but {op.kind} gives "
                                   f"{list(t.shape)}", where=where)
            all_tensors[t.name] = t
        built.append(Op(op.name, op.kind, tuple(op.inputs), tuple(op.outputs),
                        op.attrs, info))
    consumed = {t for op in ops for t in op.inputs}
    if outputs:
        for t in outputs:
            if t not in producer:
                raise KitsuneError(f"output {t!r} is not produced by any op{closest(t, producer)}",
                                   where=where)
        outs = list(outputs)
    else:
        outs = [t for op in built for t in op.outputs if t not in consumed]
    for tname in inputs:
        if tname not in consumed:
            raise KitsuneError(f"input {tname!r} is not used by any op", where=where)
    if not built:
        raise KitsuneError("the graph has no ops", where=where)
    stored = stored_layout(all_tensors, built)
    if stored:
        built = [_with_stored_bytes(op, all_tensors, stored) for op in built]
    return Graph(name=name, tensors=all_tensors, ops=built, inputs=list(inputs), weights=list(weights),
                 outputs=outs, source=source, meta=meta, stored=stored)


def _row_major_op(op: Op) -> bool:
    """Ops the runtime lays out as (rows, columns) of the last dimension (validate/lower.py):
    element-wise, row reductions, views, a last-axis concat and a matrix product (a
    convolution's weight is no such matrix)."""
    c = op.info.op_class
    if c in (OpClass.ELEMENTWISE, OpClass.ROW_REDUCTION, OpClass.VIEW):
        return True
    return op.kind in ("matmul", "gemm", "bmm", "concat")


def stored_layout(tensors, ops) -> dict[str, int]:
    """Stored bytes of each tensor whose last dimension is not a multiple of STORE_ALIGN_ELEMS
    and that only row-major ops touch: the runtime pads such a dimension (NeRF's density
    column, 262144 x 1, is 4 MB as stored)."""
    touched: dict[str, bool] = {}
    for op in ops:
        ok = _row_major_op(op)
        for t in (*op.inputs, *op.outputs):
            touched[t] = touched.get(t, True) and ok
    out = {}
    for t, ok in touched.items():
        x = tensors[t]
        if ok and x.shape and x.shape[-1] % STORE_ALIGN_ELEMS:
            out[t] = x.padded_nbytes
    return out


def _with_stored_bytes(op: Op, tensors, stored) -> Op:
    """The op with its bytes of padded tensors scaled to their stored size."""
    def scale(m):
        return {t: (round(b * stored[t] / tensors[t].nbytes) if t in stored and tensors[t].nbytes else b)
                for t, b in m.items()}
    info = dataclasses.replace(op.info, read_bytes=scale(op.info.read_bytes),
                               write_bytes=scale(op.info.write_bytes))
    return dataclasses.replace(op, info=info)
