"""The graph IR: immutable Tensor, Op and Graph.

A Graph is a validated DAG with a stable topological order. Every op carries an OpInfo computed
once at construction by its kind's rule (kitsune_dse.graph.ops): output shapes, FLOPs, bytes read
and written per operand, the compute unit, and the tile dependency pattern towards each input.

Tiles: the cost models and the harness stream a tensor by *row-blocks* of its flattened rows
(`rows = prod(shape[:-1])`, the token / pixel / edge dimension). The dependency pattern says what
a consumer's row-block i needs of an input:
  elementwise  row-block i of the input (same rows);
  row          row-block i including every column of it (softmax, layernorm, GEMM over K);
  halo         row-blocks around i (a convolution window);
  gather       rows chosen by data (embedding lookup, scatter, routing): the whole input;
  full         the whole input regardless of i (a GEMM's B operand, attention's K and V).
Only the first three can be streamed between pipeline stages tile by tile.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kitsune_dse.errors import KitsuneError

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({
    "fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
})
# the validation runtime stores a tensor's last dimension padded to a multiple of 8 elements
# (validate/lower.py: 16-byte vectors of fp16), so its kernels move the padding too
STORE_ALIGN_ELEMS = 8
FLOAT_DTYPES = frozenset({"fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"})


class DepPattern(str, enum.Enum):
    ELEMENTWISE = "elementwise"
    ROW = "row"
    HALO = "halo"
    GATHER = "gather"
    FULL = "full"

    @property
    def streamable(self) -> bool:
        return self in (DepPattern.ELEMENTWISE, DepPattern.ROW, DepPattern.HALO)


class OpClass(str, enum.Enum):
    """What an op does to the machine; drives fusion legality and compute-unit choice."""
    GEMM = "gemm"              # tensor-core matrix product (matmul, conv as implicit GEMM)
    ELEMENTWISE = "elementwise"
    ROW_REDUCTION = "row_reduction"  # softmax, layernorm, rmsnorm, reduce over the last axis
    REDUCTION = "reduction"    # reduce over other axes
    GATHER = "gather"          # embedding lookup, routing dispatch
    SCATTER = "scatter"        # scatter-add
    COPY = "copy"              # concat, split, transpose that moves data
    VIEW = "view"              # reshape, free transpose, identity: no kernel, no bytes


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def padded_cols(self) -> int:
        """The last dimension padded to a multiple of STORE_ALIGN_ELEMS (1 for a scalar)."""
        return -(-self.shape[-1] // STORE_ALIGN_ELEMS) * STORE_ALIGN_ELEMS if self.shape else 1

    @property
    def padded_nbytes(self) -> int:
        """Bytes with the last dimension padded to a multiple of STORE_ALIGN_ELEMS."""
        if not self.shape:
            return self.nbytes
        return math.prod(self.shape[:-1]) * self.padded_cols * DTYPE_BYTES[self.dtype]

    @property
    def rows(self) -> int:
        """Flattened leading dimensions: the streaming dimension of row-block tiles."""
        return math.prod(self.shape[:-1]) if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return (self.shape[-1] if self.shape else 1) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class GemmDims:
    batch: int
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class OpInfo:
    """Cost-relevant facts of one op, fixed by its kind's rule and its tensors' shapes."""
    op_class: OpClass
    flops: float
    read_bytes: Mapping[str, int]      # per input tensor: bytes this op must read
    write_bytes: Mapping[str, int]     # per output tensor: bytes this op must write
    patterns: Mapping[str, DepPattern]  # per input tensor
    unit: str                           # "tensor", "simt" or "none"
    gemm: GemmDims | None = None
    is_view: bool = False
    transcendentals: float = 0.0        # special-function evaluations (tanh, exp, erf), which
                                        # the hardware spec prices in FLOP-equivalents

    @property
    def bytes_read(self) -> int:
        return sum(self.read_bytes.values())

    @property
    def bytes_written(self) -> int:
        return sum(self.write_bytes.values())

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte of compulsory traffic."""
        b = self.bytes_read + self.bytes_written
        return self.flops / b if b else 0.0


def _frozen(d: Mapping | None) -> Mapping:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    info: OpInfo | None = field(default=None, compare=False, repr=False)

    def __hash__(self) -> int:
        return hash((self.name, self.kind, self.inputs, self.outputs))


class Graph:
    """An immutable, validated DAG of ops over named tensors.

    Build one with `Graph.build(...)` (which checks everything and raises KitsuneError naming the
    node and what is wrong); the constructor itself is private.
    """

    __slots__ = ("name", "tensors", "ops", "inputs", "weights", "outputs", "source",
                 "_producer", "_consumers", "_index", "_meta", "_stored")

    def __init__(self, *, name, tensors, ops, inputs, weights, outputs, source, meta, stored=None):
        self.name: str = name
        self.tensors: Mapping[str, Tensor] = MappingProxyType(dict(tensors))
        self.ops: tuple[Op, ...] = tuple(ops)
        self.inputs: tuple[str, ...] = tuple(inputs)
        self.weights: frozenset[str] = frozenset(weights)
        self.outputs: tuple[str, ...] = tuple(outputs)
        self.source: str = source
        self._meta = MappingProxyType(dict(meta or {}))
        prod = {t: op.name for op in self.ops for t in op.outputs}
        cons: dict[str, list[str]] = {}
        for op in self.ops:
            for t in dict.fromkeys(op.inputs):
                cons.setdefault(t, []).append(op.name)
        self._producer = MappingProxyType(prod)
        self._consumers = MappingProxyType({k: tuple(v) for k, v in cons.items()})
        self._stored = MappingProxyType(dict(stored or {}))
        self._index = MappingProxyType({op.name: i for i, op in enumerate(self.ops)})

    def __setattr__(self, key, value):
        if hasattr(self, "_index"):
            raise AttributeError("Graph is immutable")
        object.__setattr__(self, key, value)

    # -- construction -----------------------------------------------------------------------
    @staticmethod
    def build(*, name: str, tensors: Mapping[str, Tensor], ops: list[Op], inputs, weights,
              outputs=None, source: str = "<memory>", meta=None) -> "Graph":
        from kitsune_dse.graph.validate import build_graph
        return build_graph(name=name, tensors=tensors, ops=ops, inputs=inputs, weights=weights,
                           outputs=outputs, source=source, meta=meta)

    # -- queries --------------------------------------------------------------------------------
    @property
    def meta(self) -> Mapping:
        return self._meta

    def stored_bytes(self, tensor: str) -> int:
        """The tensor's bytes as the runtime stores it (graph.validate.stored_layout: padded
        where its last dimension is not a multiple of STORE_ALIGN_ELEMS)."""
        return self._stored.get(tensor, self.tensors[tensor].nbytes)

    def stored_cols(self, tensor: str) -> int:
        """The tensor's last dimension as the runtime stores it (see stored_bytes)."""
        x = self.tensors[tensor]
        if tensor in self._stored:
            return x.padded_cols
        return x.shape[-1] if x.shape else 1

    def op(self, name: str) -> Op:
        try:
            return self.ops[self._index[name]]
        except KeyError:
            raise KitsuneError(f"no op named {name!r}", where=self.source) from None

    def index(self, op_name: str) -> int:
        return self._index[op_name]

    def producer(self, tensor: str) -> str | None:
        return self._producer.get(tensor)

    def consumers(self, tensor: str) -> tuple[str, ...]:
        return self._consumers.get(tensor, ())

    def preds(self, op_name: str) -> tuple[str, ...]:
        """Ops producing an input of `op_name`, in topological order."""
        op = self.op(op_name)
        ps = {self._producer[t] for t in op.inputs if t in self._producer}
        return tuple(sorted(ps, key=self._index.__getitem__))

    def succs(self, op_name: str) -> tuple[str, ...]:
        op = self.op(op_name)
        ss = {c for t in op.outputs for c in self.consumers(t)}
        return tuple(sorted(ss, key=self._index.__getitem__))

    def is_intermediate(self, tensor: str) -> bool:
        return tensor in self._producer and tensor not in self.outputs

    @property
    def total_flops(self) -> float:
        return sum(op.info.flops for op in self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.ops)} ops, {len(self.tensors)} tensors)"
