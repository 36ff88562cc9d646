"""The YAML model format (documented in models/README.md).

    name: gpt3-mlp
    description: one line
    source: where the shapes come from
    dtype: fp16                      # default dtype of every tensor
    sizes: {tokens: 2048, hidden: 12288}   # symbolic sizes with defaults; --set tokens=64
    inputs:  {x: [tokens, hidden]}   # or {x: {shape: [...], dtype: int64}}
    weights: {w1: [hidden, 4*hidden]}
    ops:
      - {name: fc1, kind: matmul, inputs: [x, w1], outputs: [h]}
      - {name: act, kind: gelu, inputs: [h], outputs: [a]}
    outputs: [y]                     # optional: default every produced tensor nobody consumes

Dimensions and attribute values may be integer expressions over sizes (`4*hidden`,
`hidden // heads`, `seq + 1`).
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from pathlib import Path

from kitsune_dse.errors import KitsuneError, closest
from kitsune_dse.graph.ir import Graph, Op, Tensor
from kitsune_dse.yamlio import read_yaml

TOP_FIELDS = {"name", "description", "source", "dtype", "sizes", "inputs", "weights", "ops",
              "outputs", "notes"}
OP_FIELDS = {"name", "kind", "inputs", "outputs", "attrs"}
def _exact_div(a: int, b: int) -> int:
    # `/` must divide exactly: `hidden / heads` with a size that does not divide is a mistake
    # (e.g. --set tp=5 on 96 heads), not something to round silently; `//` floors on purpose.
    if b == 0 or a % b:
        raise ZeroDivisionError(f"{a} / {b} is not a whole number (use // to round down)")
    return a // b


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Div: _exact_div, ast.Mod: operator.mod,
           ast.Pow: operator.pow}


def eval_size(expr: object, sizes: Mapping[str, int], where: str) -> object:
    """Evaluate an integer expression over named sizes; non-strings pass through."""
    if isinstance(expr, bool) or not isinstance(expr, str):
        if isinstance(expr, list):
            return [eval_size(e, sizes, where) for e in expr]
        return expr
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return expr  # a plain string attribute (e.g. layout: NHWC)

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in sizes:
                raise KitsuneError(f"{where}: unknown size {node.id!r}{closest(node.id, sizes)}")
            return sizes[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            try:
                return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
            except ZeroDivisionError as e:
                raise KitsuneError(f"{where}: {expr!r}: {e}") from None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise KitsuneError(f"{where}: {expr!r} is not an integer expression over sizes")

    if isinstance(tree.body, ast.Name) and tree.body.id not in sizes:
        return expr  # a bare word that is not a size: a string attribute
    return ev(tree)


def apply_overrides(defaults: Mapping[str, int], overrides: Mapping[str, int], where: str,
                    ) -> dict[str, int]:
    sizes = dict(defaults)
    for k, v in overrides.items():
        if k not in sizes:
            raise KitsuneError(f"--set {k}={v}: the model has no size {k!r}{closest(k, sizes)}; "
                               f"its sizes are {', '.join(sorted(sizes)) or 'none'}", where=where)
        if not isinstance(v, int) or v <= 0:
            raise KitsuneError(f"--set {k}={v}: a size must be a positive integer", where=where)
        sizes[k] = v
    return sizes


def _tensor_decl(name, decl, default_dtype, sizes, where) -> Tensor:
    if isinstance(decl, list):
        shape, dtype = decl, default_dtype
    elif isinstance(decl, dict):
        extra = set(decl) - {"shape", "dtype"}
        if extra:
            raise KitsuneError(f"tensor {name!r}: unknown field {sorted(extra)[0]!r} "
                               f"(a tensor has shape and dtype)", where=where)
        if "shape" not in decl:
            raise KitsuneError(f"tensor {name!r}: missing required field 'shape'", where=where)
        shape, dtype = decl["shape"], decl.get("dtype", default_dtype)
    else:
        raise KitsuneError(f"tensor {name!r}: expected a shape list or {{shape, dtype}}",
                           where=where)
    if not isinstance(shape, list):
        raise KitsuneError(f"tensor {name!r}: shape must be a list", where=where)
    dims = []
    for d in shape:
        v = eval_size(d, sizes, f"{where}: tensor {name!r}")
        if not isinstance(v, int) or isinstance(v, bool):
            raise KitsuneError(f"tensor {name!r}: dimension {d!r} is not an integer or a size "
                               f"name{closest(str(d), sizes)}", where=where)
        dims.append(v)
    return Tensor(str(name), tuple(dims), str(dtype))


def model_from_dict(data: object, where: str, overrides: Mapping[str, int] | None = None) -> Graph:
    if not isinstance(data, dict):
        raise KitsuneError("a model must be a YAML mapping with name, inputs, weights and ops",
                           where=where)
    unknown = set(data) - TOP_FIELDS
    if unknown:
        u = sorted(unknown)[0]
        raise KitsuneError(f"unknown field {u!r}{closest(u, TOP_FIELDS)}", where=where)
    for req in ("name", "ops"):
        if req not in data:
            raise KitsuneError(f"missing required field {req!r}", where=where)
    raw_sizes = data.get("sizes") or {}
    if not isinstance(raw_sizes, dict):
        raise KitsuneError("field 'sizes' must be a mapping of name: integer", where=where)
    defaults: dict[str, int] = {}
    for k, v in raw_sizes.items():
        val = eval_size(v, defaults, f"{where}: size {k!r}")
        if not isinstance(val, int) or val <= 0:
            raise KitsuneError(f"size {k!r}: default {v!r} is not a positive integer", where=where)
        defaults[str(k)] = val
    sizes = apply_overrides(defaults, overrides or {}, where)
    # derived sizes written as expressions see the overridden values
    for k, v in raw_sizes.items():
        if isinstance(v, str) and k not in (overrides or {}):
            sizes[str(k)] = eval_size(v, sizes, f"{where}: size {k!r}")
    dtype = str(data.get("dtype", "fp16"))
    tensors: dict[str, Tensor] = {}
    for section in ("inputs", "weights"):
        sec = data.get(section) or {}
        if not isinstance(sec, dict):
            raise KitsuneError(f"field {section!r} must be a mapping of tensor name: shape",
                               where=where)
        for name, decl in sec.items():
            if name in tensors:
                raise KitsuneError(f"tensor {name!r} is declared twice", where=where)
            tensors[str(name)] = _tensor_decl(name, decl, dtype, sizes, where)
    raw_ops = data["ops"]
    if not isinstance(raw_ops, list) or not raw_ops:
        raise KitsuneError("field 'ops' must be a non-empty list", where=where)
    ops: list[Op] = []
    for i, o in enumerate(raw_ops):
        if not isinstance(o, dict):
            raise KitsuneError(f"ops[{i}]: expected a mapping with name, kind, inputs, outputs",
                               where=where)
        label = f"op {o.get('name', f'#{i}')!r}"
        bad = set(o) - OP_FIELDS
        if bad:
            b = sorted(bad)[0]
            raise KitsuneError(f"{label}: unknown field {b!r}{closest(b, OP_FIELDS)}", where=where)
        for req in ("name", "kind", "inputs", "outputs"):
            if req not in o:
                raise KitsuneError(f"{label}: missing required field {req!r}", where=where)
        ins, outs = o["inputs"], o["outputs"]
        if isinstance(outs, str):
            outs = [outs]
        if not isinstance(ins, list) or not isinstance(outs, list):
            raise KitsuneError(f"{label}: inputs and outputs must be lists of tensor names",
                               where=where)
        attrs = {str(k): eval_size(v, sizes, f"{where}: {label} attr {k!r}")
                 for k, v in (o.get("attrs") or {}).items()}
        ops.append(Op(str(o["name"]), str(o["kind"]), tuple(map(str, ins)), tuple(map(str, outs)),
                      attrs))
    outputs = data.get("outputs")
    meta = {"description": data.get("description", ""), "source": data.get("source", ""),
            "sizes": sizes}
    return Graph.build(name=str(data["name"]), tensors=tensors, ops=ops,
                       inputs=list((data.get("inputs") or {}).keys()),
                       weights=list((data.get("weights") or {}).keys()),
                       outputs=outputs, source=where, meta=meta)


def load_yaml_model(path: Path, overrides: Mapping[str, int] | None = None) -> Graph:
    return model_from_dict(read_yaml(path), str(path), overrides)
