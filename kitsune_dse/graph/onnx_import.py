"""The ONNX front-end: an ONNX model file -> a validated Graph.

Only shapes and dtypes matter to the cost models, so the file is read with
`onnx.load(path, load_external_data=False)` and weights are never read: an initializer's dims and
data type are enough, even when its external data file is absent. Values are read only for the
small constants that decide shapes (Reshape's target, Split's sizes, reduction axes, ...), and
for the constant sub-graphs an exporter writes for shape arithmetic (Shape -> Gather -> Concat ->
Reshape), which are folded away with ONNX's reference evaluator instead of becoming ops.

Steps: parse; give every symbolic input dimension its value from `overrides` (`--set batch=8`);
run ONNX shape inference (strict off, used only to cross-check our own shapes); walk the nodes in
topological order, folding constant nodes and mapping each other node to IR op kinds (a few map to
several ops, e.g. a 1-D MatMul operand is reshaped to 2-D around a matmul); and hand the
declarations to build_graph, which computes every shape again by the IR's rules.

IR conventions the mapping follows:
  * the IR has no rank-0 tensors: an ONNX scalar (a constant 0.5, a scalar input) is shape [1];
  * Conv is `conv2d` with layout NCHW (a 1-D Conv is a conv2d over a height of 1);
  * BatchNormalization is `batchnorm` with axis 1;
  * ScatterElements scatters single elements: it maps to `scatter_add` over the flattened
    tensors (same bytes and FLOPs); reduction 'none' (overwrite) is costed as an add.
"""
from __future__ import annotations

import copy
import heapq
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kitsune_dse.errors import KitsuneError, closest
from kitsune_dse.graph.ir import Graph, Op, Tensor
from kitsune_dse.graph.ops import ShapeError, apply_rule

# ONNX TensorProto data type names -> IR dtypes. The FNUZ float8 variants differ from the FN/plain
# ones only in how bit patterns decode, not in size, so they share the IR dtype.
ONNX_DTYPES: Mapping[str, str] = {
    "FLOAT": "fp32", "FLOAT16": "fp16", "BFLOAT16": "bf16", "DOUBLE": "fp64",
    "INT64": "int64", "INT32": "int32", "INT16": "int16", "INT8": "int8", "UINT8": "uint8",
    "BOOL": "bool", "FLOAT8E4M3FN": "fp8_e4m3", "FLOAT8E4M3FNUZ": "fp8_e4m3",
    "FLOAT8E5M2": "fp8_e5m2", "FLOAT8E5M2FNUZ": "fp8_e5m2",
}

UNARY = {"Relu": "relu", "Gelu": "gelu", "Erf": "erf", "Sigmoid": "sigmoid", "Tanh": "tanh",
         "Sqrt": "sqrt", "Exp": "exp", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal",
         "Identity": "identity"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "max",
          "Min": "min", "Sum": "add"}
# Ops with no IR kind of their own, costed as a kind that reads and writes the same tensors with
# a similar FLOP count (a note in the graph's meta says so). Clip's min/max scalars are dropped.
APPROX_UNARY = {"LeakyRelu": "relu", "Clip": "relu", "HardSigmoid": "sigmoid",
                "HardSwish": "silu", "Elu": "exp", "Selu": "exp", "Celu": "exp",
                "Softplus": "exp", "Log": "exp"}
REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max"}

FOLD_INPUT_LIMIT = 1 << 16      # constants up to this many elements are folded with their values
FOLD_OUTPUT_LIMIT = 1 << 22     # folded results larger than this keep their shape only
NEVER_FOLD = ("Random", "Multinomial", "Bernoulli", "If", "Loop", "Scan")


@dataclass
class _Const:
    """A tensor known before run time: an initializer, a Constant node's value, a folded result."""
    shape: tuple[int, ...]
    elem: int                                   # ONNX TensorProto data type
    proto: object = None                        # TensorProto to read the value from, lazily
    array: np.ndarray | None = None
    missing: str | None = None                  # why the value cannot be read
    base_dir: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def value(self) -> np.ndarray:
        if self.array is None:
            from onnx import external_data_helper, numpy_helper
            t = self.proto
            if external_data_helper.uses_external_data(t):
                t = copy.deepcopy(t)
                external_data_helper.load_external_data_for_tensor(t, self.base_dir)
            self.array = numpy_helper.to_array(t)
        return self.array


@dataclass
class _Node:
    index: int
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    proto: object = None

    @property
    def label(self) -> str:
        return f"node {self.name!r} (op type {self.op_type})"


def _attr_values(node) -> dict:
    from onnx import helper
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        out[a.name] = v
    return out


def _dtype_name(elem: int) -> str:
    from onnx import TensorProto
    try:
        return TensorProto.DataType.Name(elem)
    except ValueError:
        return f"#{elem}"


class _Importer:
    def __init__(self, path: Path, overrides: Mapping[str, int]):
        self.path = Path(path)
        self.where = str(path)
        self.overrides = dict(overrides)
        self.ir: dict[str, Tensor] = {}          # every tensor known to the IR so far
        self.inputs: list[str] = []              # graph inputs, in ONNX order
        self.used_inputs: set[str] = set()
        self.weights: list[str] = []
        self.consts: dict[str, _Const] = {}
        self.rank0: set[str] = set()             # ONNX scalars (shape [1] in the IR)
        self.ops: list[Op] = []
        self.op_names: set[str] = set()
        self.names: set[str] = set()             # every tensor name in the model
        self.notes: list[str] = []
        self.sizes: dict[str, int] = {}
        self.opset = 0
        self.model = None
        self._node: _Node | None = None
        self._noted: set[str] = set()
        self.inferred: dict[str, tuple[tuple[int, ...], int]] = {}
        self.consumed: set[str] = set()          # tensor names some node or graph output reads

    # -- errors ---------------------------------------------------------------------------------
    def err(self, msg: str) -> KitsuneError:
        return KitsuneError(msg, where=self.where)

    def node_err(self, msg: str) -> KitsuneError:
        return self.err(f"{self._node.label}: {msg}")

    # -- loading --------------------------------------------------------------------------------
    def load(self):
        import onnx
        from google.protobuf.message import DecodeError
        try:
            model = onnx.load(str(self.path), load_external_data=False)
        except DecodeError as e:
            first = str(e).splitlines()[0] if str(e) else "protobuf decode error"
            raise self.err(f"not an ONNX model: {first}") from None
        except OSError as e:
            raise self.err(f"cannot read the file: {e.strerror or e}") from None
        except (ValueError, RuntimeError) as e:
            first = str(e).splitlines()[0] if str(e) else ""
            raise self.err(f"not an ONNX model: {e.__class__.__name__}: {first}") from None
        if not model.HasField("graph") or (not model.graph.node and not model.graph.input):
            raise self.err("not an ONNX model: the file holds no ONNX graph")
        if model.functions:
            try:
                from onnx import inliner
                model = inliner.inline_local_functions(model)
            except Exception as e:  # noqa: BLE001 - a model-defined function we cannot inline
                raise self.err(f"cannot inline the model's local functions: {e}") from None
        self.model = model
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                self.opset = int(imp.version)
        return model

    def ir_dtype(self, elem: int, what: str) -> str:
        name = _dtype_name(elem)
        if name not in ONNX_DTYPES:
            raise self.err(f"{what} has ONNX dtype {name}, which kitsune-dse does not model; "
                           f"supported: {', '.join(ONNX_DTYPES)}")
        return ONNX_DTYPES[name]

    # -- graph inputs, symbolic dimensions ------------------------------------------------------
    def bind_inputs(self) -> None:
        g = self.model.graph
        inits = {t.name for t in g.initializer}
        symbolic: dict[str, list[str]] = {}     # dim name -> inputs using it
        real_inputs = [vi for vi in g.input if vi.name not in inits]
        for vi in real_inputs:
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is None:
                raise self.err(f"input {vi.name!r} is not a tensor (sequences, maps and optional "
                               f"inputs are not supported)")
            if tt.HasField("shape"):
                for d in tt.shape.dim:
                    if d.HasField("dim_param") and not d.HasField("dim_value"):
                        symbolic.setdefault(d.dim_param, []).append(vi.name)
        for k, v in self.overrides.items():
            if k not in symbolic:
                avail = ", ".join(sorted(symbolic)) if symbolic else None
                raise self.err(f"--set {k}={v}: the model has no symbolic dimension {k!r}"
                               f"{closest(k, symbolic)}; "
                               + (f"its symbolic dimensions are {avail}" if avail
                                  else "it has no symbolic dimensions"))
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise self.err(f"--set {k}={v}: a size must be a positive integer")
        missing = [k for k in symbolic if k not in self.overrides]
        if missing:
            k = missing[0]
            more = (f" (also unset: {', '.join(missing[1:])})" if len(missing) > 1 else "")
            raise self.err(f"input {symbolic[k][0]!r} has symbolic dimension {k!r}; give it a "
                           f"value with --set {k}=VALUE{more}")
        self.sizes = {k: int(self.overrides[k]) for k in symbolic}
        for vi in real_inputs:
            tt = vi.type.tensor_type
            if not tt.HasField("shape"):
                raise self.err(f"input {vi.name!r} has no shape in the model (only its dtype); "
                               f"kitsune-dse needs static shapes")
            dims = []
            for i, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    if d.dim_value <= 0:
                        raise self.err(f"input {vi.name!r} has dimension {i} of size "
                                       f"{d.dim_value}; sizes must be positive")
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    v = self.sizes[d.dim_param]
                    d.Clear()
                    d.dim_value = v               # substituted for shape inference
                    dims.append(v)
                else:
                    raise self.err(f"input {vi.name!r} has dimension {i} with neither a size nor "
                                   f"a name; kitsune-dse needs static shapes")
            dtype = self.ir_dtype(tt.elem_type, f"input {vi.name!r}")
            if not dims:
                self.rank0.add(vi.name)
            self.ir[vi.name] = Tensor(vi.name, tuple(dims) or (1,), dtype)
            self.inputs.append(vi.name)
        base = str(self.path.parent)
        for t in g.initializer:
            self.consts[t.name] = self._const_from_proto(t, base)

    def _const_from_proto(self, t, base_dir: str) -> _Const:
        from onnx import external_data_helper
        c = _Const(tuple(int(d) for d in t.dims), int(t.data_type), proto=t, base_dir=base_dir)
        if external_data_helper.uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            if not loc or not os.path.isfile(os.path.join(base_dir, loc)):
                c.missing = (f"is stored in external data file {loc!r}, which is not present "
                             f"next to the model")
        return c

    # -- shape inference (a cross-check) ---------------------------------------------------------
    def infer(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """Static shapes (and element types) ONNX shape inference finds: a cross-check of ours,
        and the shape of a constant sub-graph whose inputs' values are not present."""
        import onnx
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, check_type=False,
                                                         strict_mode=False, data_prop=True)
        except Exception as e:  # noqa: BLE001 - inference is only a cross-check
            self.notes.append(f"ONNX shape inference failed ({e.__class__.__name__}); shapes "
                              f"come from kitsune-dse's own rules")
            return {}
        out = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(
                    d.HasField("dim_value") for d in tt.shape.dim):
                out[vi.name] = (tuple(int(d.dim_value) for d in tt.shape.dim), int(tt.elem_type))
        return out

    # -- tensors --------------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        n, i = base, 1
        while n in self.names:
            n, i = f"{base}.{i}", i + 1
        self.names.add(n)
        return n

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's ONNX shape (rank 0 allowed)."""
        if name in self.rank0:
            return ()
        if name in self.ir:
            return self.ir[name].shape
        if name in self.consts:
            return self.consts[name].shape
        raise self.node_err(f"input {name!r} is not produced by any node, graph input or "
                            f"initializer")

    def tensor(self, name: str) -> Tensor:
        """The IR tensor for `name`, declaring a constant as a weight on first use."""
        if name in self.ir:
            if name in self.inputs:
                self.used_inputs.add(name)
            return self.ir[name]
        if name in self.consts:
            c = self.consts[name]
            if c.numel == 0:
                raise self.node_err(f"constant {name!r} has a zero-size shape {list(c.shape)}")
            t = Tensor(name, c.shape or (1,), self.ir_dtype(c.elem, f"tensor {name!r}"))
            if not c.shape:
                self.rank0.add(name)
            self.ir[name] = t
            self.weights.append(name)
            return t
        raise self.node_err(f"input {name!r} is not produced by any node, graph input or "
                            f"initializer")

    def const_value(self, name: str, what: str) -> np.ndarray:
        if name not in self.consts:
            raise self.node_err(f"its {what} {name!r} is computed at run time; kitsune-dse needs "
                                f"it to be a constant (an initializer or a Constant node)")
        c = self.consts[name]
        if c.missing:
            raise self.node_err(f"its {what} {name!r} {c.missing}; kitsune-dse needs that "
                                f"constant's value")
        try:
            return c.value()
        except Exception as e:  # noqa: BLE001
            raise self.node_err(f"cannot read the value of its {what} {name!r}: {e}") from None

    def int_list(self, name: str, what: str) -> list[int]:
        return [int(v) for v in np.asarray(self.const_value(name, what)).reshape(-1)]

    # -- emitting IR ops ------------------------------------------------------------------------
    def emit(self, kind: str, inputs: list[str], outputs: list[str], attrs: Mapping | None = None,
             suffix: str = "") -> list[Tensor]:
        base = self._node.name + (f"/{suffix}" if suffix else "")
        name, i = base, 1
        while name in self.op_names:
            name, i = f"{base}.{i}", i + 1
        self.op_names.add(name)
        ins = [self.tensor(t) for t in inputs]
        attrs = dict(attrs or {})
        try:
            outs, _ = apply_rule(kind, ins, attrs, list(outputs))
        except ShapeError as e:
            detail = ", ".join(f"{t.name} {list(t.shape)} {t.dtype}" for t in ins)
            raise self.node_err(f"as {kind}: {e} [inputs: {detail}]") from None
        for t in outs:
            self.ir[t.name] = t
            self.rank0.discard(t.name)
        self.ops.append(Op(name, kind, tuple(inputs), tuple(outputs), attrs))
        return outs

    def reshape(self, src: str, shape: tuple[int, ...], dst: str | None = None,
                suffix: str = "reshape") -> str:
        """A free reshape view of src to `shape` (rank 0 becomes [1] and is remembered)."""
        dst = dst or self.fresh(f"{src}::{suffix}")
        self.emit("reshape", [src], [dst], {"shape": list(shape) or [1]}, suffix=suffix)
        if not shape:
            self.rank0.add(dst)
        return dst

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> Graph:
        model = self.load()
        g = model.graph
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            self.names.add(vi.name)
        for t in g.initializer:
            self.names.add(t.name)
        for n in g.node:
            self.names.update(n.input)
            self.names.update(n.output)
        self.bind_inputs()
        inferred = self.inferred = self.infer()
        nodes = self.sorted_nodes(g)
        self.consumed = {i for n in nodes for i in n.inputs if i} | {o.name for o in g.output}
        for n in nodes:
            self._node = n
            self.convert(n)
        self._node = None
        # graph outputs that no op produces (a constant, a graph input passed through)
        produced = {t for op in self.ops for t in op.outputs}
        outputs = []
        for o in g.output:
            if o.name in produced:
                outputs.append(o.name)
            else:
                what = "a constant" if o.name in self.consts else "a graph input"
                self.notes.append(f"output {o.name!r} is {what}, computed by no op; left out")
        inputs = [i for i in self.inputs if i in self.used_inputs]
        for i in self.inputs:
            if i not in self.used_inputs:
                self.notes.append(f"input {i!r} is used only for shape computations; left out")
        for name, (shp, _) in inferred.items():
            t = self.ir.get(name)
            if t is not None and name in produced and tuple(shp or (1,)) != t.shape:
                self.notes.append(f"tensor {name!r}: ONNX shape inference says {list(shp)}, "
                                  f"kitsune-dse computes {list(t.shape)}")
        used = {t for op in self.ops for t in op.inputs} | produced
        tensors = {k: v for k, v in self.ir.items() if k in used}
        producer = f"{model.producer_name} {model.producer_version}".strip()
        meta = {"description": (model.doc_string or g.doc_string or "").strip().split("\n")[0],
                "source": self.where, "format": "onnx", "onnx_graph": g.name,
                "producer": producer, "opset": self.opset, "sizes": dict(self.sizes),
                "notes": list(self.notes)}
        return Graph.build(name=self.path.stem, tensors=tensors, ops=self.ops, inputs=inputs,
                           weights=[w for w in self.weights if w in used], outputs=outputs or None,
                           source=self.where, meta=meta)

    def sorted_nodes(self, g) -> list[_Node]:
        """Nodes with unique names, in a stable topological order (ONNX requires one, but not
        every exporter keeps it)."""
        nodes: list[_Node] = []
        seen: set[str] = set()
        for i, n in enumerate(g.node):
            op_type = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            base = n.name or f"{n.op_type}_{i}"
            if base in seen:
                base = f"{base}_{i}"
            name, k = base, 1
            while name in seen:
                name, k = f"{base}.{k}", k + 1
            seen.add(name)
            nodes.append(_Node(i, name, op_type, list(n.input), list(n.output),
                               _attr_values(n), n))
        producer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
        indeg = [0] * len(nodes)
        succ: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
        for i, n in enumerate(nodes):
            for p in {producer[t] for t in n.inputs if t in producer}:
                if p != i:
                    succ[p].append(i)
                    indeg[i] += 1
        heap = [i for i in range(len(nodes)) if indeg[i] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            u = heapq.heappop(heap)
            order.append(u)
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(heap, v)
        if len(order) != len(nodes):
            stuck = next(nodes[i].name for i in range(len(nodes)) if i not in set(order))
            raise self.err(f"the ONNX graph has a cycle through node {stuck!r}")
        return [nodes[i] for i in order]

    def convert(self, n: _Node) -> None:
        if n.op_type == "Constant":
            self.constant_node(n)
            return
        if n.op_type in ("Shape", "Size"):
            self.shape_node(n)
            return
        if n.op_type == "ConstantOfShape":
            self.constant_of_shape(n)
            return
        if self.try_fold(n):
            return
        handler = HANDLERS.get(n.op_type)
        if handler is None:
            self.unsupported(n)
        handler(self, n)

    def unsupported(self, n: _Node):
        others = sorted({m.op_type if m.domain in ("", "ai.onnx") else f"{m.domain}.{m.op_type}"
                         for m in self.model.graph.node} - set(SUPPORTED) - {n.op_type})
        also = (f"; other op types in the model outside that list: {', '.join(others)}"
                if others else "")
        raise self.err(f"node {n.name!r} (op type {n.op_type}) is not supported; "
                       f"supported: {', '.join(SUPPORTED)} (and any standard op whose inputs are "
                       f"all constants: it is folded){also}")

    # -- constants and folding ------------------------------------------------------------------
    def constant_node(self, n: _Node) -> None:
        from onnx import TensorProto
        a = n.attrs
        out = n.outputs[0]
        if "value" in a:
            self.consts[out] = self._const_from_proto(a["value"], str(self.path.parent))
            return
        if "sparse_value" in a:
            raise self.node_err("sparse constants are not supported")
        for key, elem, np_dtype in (("value_float", TensorProto.FLOAT, np.float32),
                                    ("value_floats", TensorProto.FLOAT, np.float32),
                                    ("value_int", TensorProto.INT64, np.int64),
                                    ("value_ints", TensorProto.INT64, np.int64)):
            if key in a:
                arr = np.asarray(a[key], dtype=np_dtype)
                self.consts[out] = _Const(tuple(arr.shape), elem, array=arr)
                return
        raise self.node_err(f"a Constant with attributes {sorted(a)} is not supported "
                            f"(string constants have no IR dtype)")

    def shape_node(self, n: _Node) -> None:
        shp = self.shape(n.inputs[0])
        if n.op_type == "Size":
            arr = np.asarray(math.prod(shp), dtype=np.int64)
        else:
            r = len(shp)
            start = int(n.attrs.get("start", 0))
            end = int(n.attrs.get("end", r))
            start = min(max(start + r if start < 0 else start, 0), r)
            end = min(max(end + r if end < 0 else end, 0), r)
            arr = np.asarray(shp[start:end], dtype=np.int64)
        from onnx import TensorProto
        self.consts[n.outputs[0]] = _Const(tuple(arr.shape), TensorProto.INT64, array=arr)

    def constant_of_shape(self, n: _Node) -> None:
        from onnx import TensorProto, numpy_helper
        src, out = n.inputs[0], n.outputs[0]
        if src in self.consts and self.consts[src].missing and out in self.inferred:
            self.consts[out] = _Const(*self.inferred[out], missing=f"is computed from {src!r}, "
                                      f"whose value is not present")
            return
        shp = tuple(self.int_list(src, "shape"))
        v = n.attrs.get("value")
        fill = numpy_helper.to_array(v).reshape(-1) if v is not None else np.zeros(1, np.float32)
        c = _Const(shp, int(v.data_type) if v is not None else TensorProto.FLOAT)
        if math.prod(shp) <= FOLD_OUTPUT_LIMIT:
            c.array = np.full(shp, fill[0], dtype=fill.dtype)
        else:
            c.missing = f"is a ConstantOfShape of {math.prod(shp)} elements, too many to evaluate"
        self.consts[n.outputs[0]] = c

    def fold_too_big(self, n: _Node) -> bool:
        """Ops whose output can be far larger than their inputs: estimate before evaluating."""
        try:
            v = [self.consts[i].value() if i else None for i in n.inputs]
            if n.op_type == "Expand":
                out = np.broadcast_shapes(v[0].shape, tuple(int(d) for d in v[1].reshape(-1)))
                return math.prod(out) > FOLD_OUTPUT_LIMIT
            if n.op_type == "Tile":
                return v[0].size * math.prod(int(r) for r in v[1].reshape(-1)) > FOLD_OUTPUT_LIMIT
            if n.op_type == "Range":
                start, limit, delta = (float(np.asarray(x).reshape(-1)[0]) for x in v[:3])
                return delta == 0 or (limit - start) / delta > FOLD_OUTPUT_LIMIT
        except Exception:  # noqa: BLE001 - let the evaluator report the problem
            return True
        return False

    def try_fold(self, n: _Node) -> bool:
        """A node whose inputs are all small constants is itself a constant (shape arithmetic,
        a scalar computed from scalars): evaluate it. Whether a node folds depends only on
        shapes, never on whether the weights' data is present: when an input's value is missing
        the result keeps the shape ONNX shape inference gives it, and no value."""
        ins = [i for i in n.inputs if i]
        if not ins or "." in n.op_type or any(k in n.op_type for k in NEVER_FOLD):
            return False
        for i in ins:
            c = self.consts.get(i)
            if c is None or c.numel > FOLD_INPUT_LIMIT:
                return False
        outs = [o for o in n.outputs if o]
        missing = next((i for i in ins if self.consts[i].missing), None)
        if missing is not None:
            if not all(o in self.inferred for o in outs):
                return False
            why = self.consts[missing].missing
            why = f"is computed from {missing!r}, which " + (why[3:] if why.startswith("is ")
                                                             else why)
            for o in outs:
                shp, elem = self.inferred[o]
                self.consts[o] = _Const(shp, elem, missing=why)
            return True
        if self.fold_too_big(n):
            if not all(o in self.inferred for o in outs):
                return False
            for o in outs:
                self.consts[o] = _Const(*self.inferred[o], missing="is too large to evaluate")
            return True
        import onnx
        from onnx import helper
        from onnx.reference import ReferenceEvaluator
        try:
            vals = {i: self.consts[i].value() for i in ins}
            g = helper.make_graph(
                [n.proto], "fold",
                [helper.make_tensor_value_info(i, self.consts[i].elem, self.consts[i].shape)
                 for i in dict.fromkeys(ins)],
                [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs])
            m = helper.make_model(g, opset_imports=list(self.model.opset_import),
                                  ir_version=self.model.ir_version)
            res = ReferenceEvaluator(m).run(None, vals)
            consts = {}
            for o, r in zip(outs, res):
                arr = np.asarray(r)
                consts[o] = _Const(tuple(int(d) for d in arr.shape),
                                   helper.np_dtype_to_tensor_dtype(arr.dtype), array=arr)
        except Exception:  # noqa: BLE001 - not foldable: convert the node as an op instead
            return False
        self.consts.update(consts)
        return True

    # -- helpers for handlers ---------------------------------------------------------------------
    def attr_ints(self, n: _Node, attr: str, input_index: int, what: str) -> list[int] | None:
        """An int list given as an attribute (older opsets) or a constant input (newer)."""
        if attr in n.attrs:
            return [int(v) for v in n.attrs[attr]]
        if len(n.inputs) > input_index and n.inputs[input_index]:
            return self.int_list(n.inputs[input_index], what)
        return None

    def note_once(self, key: str, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.notes.append(text)

    def only_first_output(self, n: _Node, what: str) -> None:
        for o in n.outputs[1:]:
            if o and o in self.consumed:
                raise self.node_err(f"its output {o!r} ({what}) is used, which is not supported")

    def axis(self, a: int, rank: int) -> int:
        b = a + rank if a < 0 else a
        if not 0 <= b < max(rank, 1):
            raise self.node_err(f"axis {a} is out of range for a rank-{rank} tensor")
        return b


# -- handlers: one per ONNX op type; each emits IR ops for node n ------------------------------
def _unary(imp: _Importer, n: _Node) -> None:
    imp.emit(UNARY[n.op_type], [n.inputs[0]], [n.outputs[0]])
    if n.inputs[0] in imp.rank0:
        imp.rank0.add(n.outputs[0])


def _approx_unary(imp: _Importer, n: _Node) -> None:
    kind = APPROX_UNARY[n.op_type]
    imp.note_once(n.op_type, f"{n.op_type} has no IR kind; it is costed as {kind}")
    imp.emit(kind, [n.inputs[0]], [n.outputs[0]])
    if n.inputs[0] in imp.rank0:
        imp.rank0.add(n.outputs[0])


def _prelu(imp: _Importer, n: _Node) -> None:
    imp.note_once(n.op_type, "PRelu has no IR kind; it is costed as mul by its slope")
    x, slope = n.inputs[:2]
    sx, ss = imp.shape(x), imp.shape(slope)
    if (len(ss) == 1 and len(sx) > 2 and ss[0] == sx[1] != sx[-1]):
        # opset < 7 PRelu: a per-channel slope [C] applies along axis 1
        slope = imp.reshape(slope, ss + (1,) * (len(sx) - 2), suffix="slope_per_channel")
    imp.emit("mul", [x, slope], [n.outputs[0]])


def _dropout(imp: _Importer, n: _Node) -> None:
    imp.only_first_output(n, "the dropout mask")
    imp.emit("identity", [n.inputs[0]], [n.outputs[0]])


def _binary(imp: _Importer, n: _Node) -> None:
    kind = BINARY[n.op_type]
    ins = [i for i in n.inputs if i]
    if n.op_type == "Pow":
        base, exp = ins
        bt, et = imp.tensor(base), imp.tensor(exp)
        if et.dtype != bt.dtype and exp in imp.consts:
            # Pow allows an exponent of another type; the IR wants one float dtype: the
            # constant exponent is declared in the base's dtype (it is one number)
            alias = imp.fresh(f"{exp}::as_{bt.dtype}")
            imp.ir[alias] = Tensor(alias, et.shape, bt.dtype)
            imp.weights.append(alias)
            ins = [base, alias]
    if len(ins) == 1:
        imp.emit("identity", ins, [n.outputs[0]])
        return
    acc = ins[0]
    for j, nxt in enumerate(ins[1:]):
        last = j == len(ins) - 2
        out = n.outputs[0] if last else imp.fresh(f"{n.outputs[0]}::partial{j}")
        imp.emit(kind, [acc, nxt], [out], suffix="" if j == 0 else f"{kind}{j}")
        acc = out
    if all(i in imp.rank0 for i in ins):
        imp.rank0.add(n.outputs[0])


def _matmul(imp: _Importer, n: _Node) -> None:
    a, b = n.inputs[:2]
    sa, sb = imp.shape(a), imp.shape(b)
    if not sa or not sb:
        raise imp.node_err("MatMul with a scalar operand is not valid ONNX")
    out = n.outputs[0]
    if len(sa) >= 2 and len(sb) >= 2:
        imp.emit("matmul", [a, b], [out])
        return
    # numpy semantics for 1-D operands: [K] @ B is [1, K] @ B without the M dim; A @ [K] is
    # A @ [K, 1] without the N dim. Both are free reshape views around an IR matmul.
    a2 = imp.reshape(a, (1,) + sa, suffix="a_as_matrix") if len(sa) == 1 else a
    b2 = imp.reshape(b, sb + (1,), suffix="b_as_column") if len(sb) == 1 else b
    tmp = imp.fresh(f"{out}::matmul")
    (t,) = imp.emit("matmul", [a2, b2], [tmp])
    shp = list(t.shape)
    if len(sb) == 1:
        shp.pop(-1)
    if len(sa) == 1:
        shp.pop(-2 if len(sb) != 1 else -1)
    imp.reshape(tmp, tuple(shp), dst=out, suffix="drop_vector_dims")


def _gemm(imp: _Importer, n: _Node) -> None:
    a = n.attrs
    attrs: dict = {}
    if int(a.get("transA", 0)):
        attrs["trans_a"] = True
    if int(a.get("transB", 0)):
        attrs["trans_b"] = True
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    if alpha != 1.0:
        attrs["alpha"] = alpha          # an epilogue scalar: no extra op, ignored by the cost
    ins = list(n.inputs[:2])
    if len(n.inputs) > 2 and n.inputs[2] and beta != 0.0:
        ins.append(n.inputs[2])
        if beta != 1.0:
            attrs["beta"] = beta
    imp.emit("gemm", ins, [n.outputs[0]], attrs)


def _same_pads(size: int, k: int, s: int, d: int, upper: bool) -> tuple[int, int]:
    out = -(-size // s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def _conv(imp: _Importer, n: _Node) -> None:
    x, w = n.inputs[:2]
    bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    sx, sw = imp.shape(x), imp.shape(w)
    nd = len(sx) - 2
    if nd not in (1, 2) or len(sw) != len(sx):
        raise imp.node_err(f"only 1-D and 2-D convolutions are supported (input {list(sx)}, "
                           f"weight {list(sw)})")
    a = n.attrs
    strides = list(a.get("strides", [1] * nd))
    dil = list(a.get("dilations", [1] * nd))
    kernel = list(a.get("kernel_shape", sw[2:]))
    auto_pad = str(a.get("auto_pad", "NOTSET"))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pp = [_same_pads(sx[2 + i], kernel[i], strides[i], dil[i], auto_pad == "SAME_UPPER")
              for i in range(nd)]
        pads = [p[0] for p in pp] + [p[1] for p in pp]
    elif auto_pad == "VALID":
        pads = [0] * (2 * nd)
    elif auto_pad == "NOTSET":
        pads = list(a.get("pads", [0] * (2 * nd)))
    else:
        raise imp.node_err(f"auto_pad {auto_pad!r} is not one of NOTSET, SAME_UPPER, "
                           f"SAME_LOWER, VALID")
    attrs = {"layout": "NCHW", "group": int(a.get("group", 1))}
    out = n.outputs[0]
    if nd == 2:
        attrs.update(strides=strides, pads=pads, dilations=dil)
        imp.emit("conv2d", [x, w] + ([bias] if bias else []), [out], attrs)
        return
    # a 1-D convolution is a 2-D one over a height of 1
    x2 = imp.reshape(x, (sx[0], sx[1], 1, sx[2]), suffix="as_2d")
    w2 = imp.reshape(w, (sw[0], sw[1], 1, sw[2]), suffix="weight_as_2d")
    attrs.update(strides=[1, strides[0]], pads=[0, pads[0], 0, pads[1]], dilations=[1, dil[0]])
    tmp = imp.fresh(f"{out}::conv2d")
    (t,) = imp.emit("conv2d", [x2, w2] + ([bias] if bias else []), [tmp], attrs)
    imp.reshape(tmp, (t.shape[0], t.shape[1], t.shape[3]), dst=out, suffix="as_1d")


def _batchnorm(imp: _Importer, n: _Node) -> None:
    imp.only_first_output(n, "training-mode running statistics")
    imp.emit("batchnorm", list(n.inputs[:5]), [n.outputs[0]], {"axis": 1})


def _softmax(imp: _Importer, n: _Node) -> None:
    if n.op_type == "LogSoftmax":
        imp.note_once(n.op_type, "LogSoftmax has no IR kind; it is costed as softmax")
    x, out = n.inputs[0], n.outputs[0]
    shp = imp.shape(x)
    r = len(shp)
    if imp.opset >= 13:
        imp.emit("softmax", [x], [out], {"axis": imp.axis(int(n.attrs.get("axis", -1)), r)})
        return
    # before opset 13 the input is coerced to 2-D [prod(:axis), prod(axis:)]
    ax = imp.axis(int(n.attrs.get("axis", 1)), r)
    if ax == r - 1:
        imp.emit("softmax", [x], [out], {"axis": -1})
        return
    x2 = imp.reshape(x, (math.prod(shp[:ax]), math.prod(shp[ax:])), suffix="as_2d")
    tmp = imp.fresh(f"{out}::softmax")
    imp.emit("softmax", [x2], [tmp], {"axis": -1})
    imp.reshape(tmp, shp, dst=out, suffix="restore")


def _norm(imp: _Importer, n: _Node) -> None:
    kind = "layernorm" if n.op_type == "LayerNormalization" else "rmsnorm"
    imp.only_first_output(n, "saved statistics")
    x, out = n.inputs[0], n.outputs[0]
    shp = imp.shape(x)
    ax = imp.axis(int(n.attrs.get("axis", -1)), len(shp))
    d = math.prod(shp[ax:])
    params = [p for p in n.inputs[1:3 if kind == "layernorm" else 2] if p]
    ps = []
    for p in params:
        ptn = imp.shape(p)
        if math.prod(ptn) != d:
            raise imp.node_err(f"parameter {p!r} has shape {list(ptn)}; only a full-size "
                               f"scale/bias over the normalized dims {list(shp[ax:])} is supported")
        ps.append(p if ptn == (d,) else imp.reshape(p, (d,), suffix="param_as_vector"))
    if ax == len(shp) - 1:
        imp.emit(kind, [x] + ps, [out])
        return
    # normalizing over several trailing dims = normalizing over their flattening
    x2 = imp.reshape(x, (math.prod(shp[:ax]), d), suffix="flatten_normalized")
    tmp = imp.fresh(f"{out}::{kind}")
    imp.emit(kind, [x2] + ps, [tmp])
    imp.reshape(tmp, shp, dst=out, suffix="restore")


def _reduce(imp: _Importer, n: _Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    shp = imp.shape(x)
    if not shp:
        imp.emit("identity", [x], [out])
        imp.rank0.add(out)
        return
    axes = imp.attr_ints(n, "axes", 1, "axes")
    keep = bool(int(n.attrs.get("keepdims", 1)))
    if not axes:
        if int(n.attrs.get("noop_with_empty_axes", 0)):
            imp.emit("identity", [x], [out])
            return
        axes = list(range(len(shp)))
    axes = sorted({imp.axis(a, len(shp)) for a in axes})
    imp.emit(REDUCE.get(n.op_type, "reduce_mean"), [x], [out], {"axes": axes, "keepdims": keep})
    if not keep and len(axes) == len(shp):
        imp.rank0.add(out)


def _global_pool(imp: _Importer, n: _Node) -> None:
    x = n.inputs[0]
    r = len(imp.shape(x))
    kind = "reduce_mean" if n.op_type == "GlobalAveragePool" else "reduce_max"
    imp.emit(kind, [x], [n.outputs[0]], {"axes": list(range(2, r)), "keepdims": True})


def _reshape(imp: _Importer, n: _Node) -> None:
    x, out = n.inputs[0], n.outputs[0]
    if "shape" in n.attrs:                       # opset 1-4
        tgt = [int(v) for v in n.attrs["shape"]]
    else:
        tgt = imp.int_list(n.inputs[1], "target shape")
    shp = imp.shape(x)
    allowzero = int(n.attrs.get("allowzero", 0))
    res = []
    for i, d in enumerate(tgt):
        if d == 0:
            if allowzero:
                raise imp.node_err(f"target shape {tgt} has a zero-size dimension (allowzero=1)")
            if i >= len(shp):
                raise imp.node_err(f"target shape {tgt} copies dimension {i} (0) of a "
                                   f"rank-{len(shp)} input")
            d = shp[i]
        res.append(d)
    if not res:
        imp.reshape(x, (), dst=out)
        return
    imp.emit("reshape", [x], [out], {"shape": res})


def _flatten(imp: _Importer, n: _Node) -> None:
    r = len(imp.shape(n.inputs[0]))
    a = int(n.attrs.get("axis", 1))
    a = a + r if a < 0 else a
    if not 0 <= a <= r:
        raise imp.node_err(f"axis {n.attrs.get('axis')} is out of range for a rank-{r} tensor")
    imp.emit("flatten", [n.inputs[0]], [n.outputs[0]], {"axis": a})


def _squeeze(imp: _Importer, n: _Node) -> None:
    x = n.inputs[0]
    shp = imp.shape(x)
    axes = imp.attr_ints(n, "axes", 1, "axes")
    if n.op_type == "Squeeze":
        ax = ({imp.axis(a, len(shp)) for a in axes} if axes
              else {i for i, d in enumerate(shp) if d == 1})
        for a in ax:
            if shp[a] != 1:
                raise imp.node_err(f"cannot squeeze axis {a} of size {shp[a]}")
        new = tuple(d for i, d in enumerate(shp) if i not in ax)
    else:
        if not axes:
            raise imp.node_err("Unsqueeze needs axes")
        r = len(shp) + len(axes)
        ax = {imp.axis(a, r) for a in axes}
        it = iter(shp)
        new = tuple(1 if i in ax else next(it) for i in range(r))
    imp.reshape(x, new, dst=n.outputs[0])


def _transpose(imp: _Importer, n: _Node) -> None:
    r = len(imp.shape(n.inputs[0]))
    perm = [int(p) for p in n.attrs.get("perm", list(reversed(range(r))))]
    imp.emit("transpose", [n.inputs[0]], [n.outputs[0]], {"perm": perm})


def _concat(imp: _Importer, n: _Node) -> None:
    ins = [i for i in n.inputs if i]
    r = len(imp.shape(ins[0]))
    imp.emit("concat", ins, [n.outputs[0]], {"axis": imp.axis(int(n.attrs["axis"]), r)})


def _split(imp: _Importer, n: _Node) -> None:
    x = n.inputs[0]
    shp = imp.shape(x)
    ax = imp.axis(int(n.attrs.get("axis", 0)), len(shp))
    dim = shp[ax]
    outs = [o if o else imp.fresh(f"{n.name}::unused{j}") for j, o in enumerate(n.outputs)]
    sizes = imp.attr_ints(n, "split", 1, "split sizes")
    if sizes is None:
        if "num_outputs" in n.attrs:
            k = int(n.attrs["num_outputs"])
            chunk = -(-dim // k)
            sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
        else:
            k = len(outs)
            if dim % k:
                raise imp.node_err(f"dimension {dim} of axis {ax} does not split evenly into "
                                   f"{k} outputs")
            sizes = [dim // k] * k
    if len(sizes) != len(outs):
        raise imp.node_err(f"split sizes {sizes} give {len(sizes)} parts for {len(outs)} outputs")
    imp.emit("split", [x], outs, {"axis": ax, "sizes": sizes})


def _gather(imp: _Importer, n: _Node) -> None:
    data, idx = n.inputs[:2]
    ds = imp.shape(data)
    ax = imp.axis(int(n.attrs.get("axis", 0)), len(ds))
    if ax != 0:
        raise imp.node_err(f"Gather along axis {ax} is not supported: kitsune-dse models Gather "
                           f"as an embedding lookup (rows of the table picked by integer indices, "
                           f"axis 0) only")
    out = n.outputs[0]
    if imp.shape(idx) == ():
        # a scalar index drops the axis: gather one row, then view it without the leading 1
        tmp = imp.fresh(f"{out}::row")
        imp.emit("gather", [data, idx], [tmp])
        imp.reshape(tmp, ds[1:], dst=out, suffix="drop_index_dim")
        return
    imp.emit("gather", [data, idx], [out])


def _scatter_reduction(imp: _Importer, n: _Node) -> None:
    red = str(n.attrs.get("reduction", "none"))
    if red not in ("none", "add"):
        raise imp.node_err(f"reduction {red!r} is not supported (only 'add', and 'none', "
                           f"costed as an add)")
    if red == "none":
        imp.notes.append(f"{n.label}: reduction 'none' (overwrite) is costed as scatter_add "
                         f"(same bytes and FLOPs)")


def _scatter_elements(imp: _Importer, n: _Node) -> None:
    _scatter_reduction(imp, n)
    data, idx, upd = n.inputs[:3]
    ds, ish, us = imp.shape(data), imp.shape(idx), imp.shape(upd)
    if ish != us:
        raise imp.node_err(f"indices {list(ish)} and updates {list(us)} must have the same shape")
    out = n.outputs[0]
    if len(ds) == 1:
        imp.emit("scatter_add", [data, idx, upd], [out])
        return
    # ScatterElements scatters single elements: over the flattened tensors it is a 1-D
    # scatter-add of updates.numel elements (free views around it)
    d1 = imp.reshape(data, (math.prod(ds),), suffix="data_flat")
    i1 = imp.reshape(idx, (math.prod(ish),), suffix="indices_flat")
    u1 = imp.reshape(upd, (math.prod(us),), suffix="updates_flat")
    tmp = imp.fresh(f"{out}::flat")
    imp.emit("scatter_add", [d1, i1, u1], [tmp])
    imp.reshape(tmp, ds, dst=out, suffix="restore")


def _scatter_nd(imp: _Importer, n: _Node) -> None:
    _scatter_reduction(imp, n)
    data, idx, upd = n.inputs[:3]
    ish, us = imp.shape(idx), imp.shape(upd)
    if not ish or ish[-1] != 1:
        raise imp.node_err(f"only index tuples of length 1 (row scatter, indices [..., 1]) are "
                           f"supported; indices have shape {list(ish)}")
    lead = ish[:-1]
    i2 = imp.reshape(idx, lead or (1,), suffix="indices_rows")
    u2 = upd if lead else imp.reshape(upd, (1,) + us, suffix="updates_rows")
    imp.emit("scatter_add", [data, i2, u2], [n.outputs[0]])


def _cast(imp: _Importer, n: _Node) -> None:
    if n.op_type == "CastLike":
        dtype = imp.tensor(n.inputs[1]).dtype
    else:
        dtype = imp.ir_dtype(int(n.attrs["to"]), f"{n.label}: target type")
    imp.emit("cast", [n.inputs[0]], [n.outputs[0]], {"dtype": dtype})
    if n.inputs[0] in imp.rank0:
        imp.rank0.add(n.outputs[0])


Handler = Callable[[_Importer, _Node], None]
HANDLERS: dict[str, Handler] = {
    **{k: _unary for k in UNARY}, **{k: _binary for k in BINARY}, **{k: _reduce for k in REDUCE},
    **{k: _approx_unary for k in APPROX_UNARY}, "PRelu": _prelu,
    "Dropout": _dropout, "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv,
    "BatchNormalization": _batchnorm, "Softmax": _softmax, "LogSoftmax": _softmax,
    "LayerNormalization": _norm, "RMSNormalization": _norm,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool,
    "Reshape": _reshape, "Flatten": _flatten, "Squeeze": _squeeze, "Unsqueeze": _squeeze,
    "Transpose": _transpose, "Concat": _concat, "Split": _split, "Gather": _gather,
    "ScatterElements": _scatter_elements, "Scatter": _scatter_elements, "ScatterND": _scatter_nd,
    "Cast": _cast, "CastLike": _cast,
}
SUPPORTED: tuple[str, ...] = tuple(sorted(set(HANDLERS) | {"Constant", "ConstantOfShape", "Shape",
                                                          "Size"}))


def load_onnx_model(path: Path, overrides: Mapping[str, int]) -> Graph:
    """Read an ONNX model's graph (weights' shapes only) as a validated Graph."""
    return _Importer(Path(path), overrides or {}).run()
