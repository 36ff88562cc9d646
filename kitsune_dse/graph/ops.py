"""Op kinds: shape rules, FLOPs, bytes and tile dependency patterns.

Each kind is a rule `(input tensors, attrs) -> (output (shape, dtype) list, cost facts)`. A rule
raises ShapeError with a short reason; kitsune_dse.graph.validate adds the node's name and file.

Views and copies: `reshape`, `flatten`, `identity`, a `split` along the leading axis and a
`transpose` that only moves size-1 axes are free views (no kernel, no bytes). `concat`, any other
`split` and `transpose`, and `cast` are copies that read and write their tensors.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kitsune_dse.graph.ir import (DTYPE_BYTES, FLOAT_DTYPES, DepPattern, GemmDims, OpClass,
                                  OpInfo, Tensor)

E, R, H, G, F = (DepPattern.ELEMENTWISE, DepPattern.ROW, DepPattern.HALO, DepPattern.GATHER,
                 DepPattern.FULL)
TENSOR_CORE_DTYPES = frozenset({"fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "tf32"})

# FLOPs per output element of the elementwise kinds (a tanh-form GELU is ~8 FLOPs plus a tanh;
# a SiLU's or sigmoid's IEEE division is a ~16-instruction sequence: one-stage GEMM probes, a
# SiLU epilogue 39.7 us over a ReLU's where a GELU's is 32.5, 16384 x 3072 x 768 on 132 SMs).
UNARY_FLOPS = {"relu": 1, "gelu": 8, "silu": 20, "sigmoid": 20, "tanh": 4, "exp": 2, "scale": 1,
               "sqrt": 1, "neg": 1, "erf": 4, "abs": 1, "reciprocal": 1, "cast": 0}
# special-function evaluations per output element beside those FLOPs (a GELU's tanh or erf, a
# SiLU's or sigmoid's exp): the spec prices each (transcendental_flops), measured on the GPU
UNARY_TRANSCENDENTALS = {"gelu": 1, "silu": 1, "sigmoid": 1, "tanh": 1, "exp": 1, "erf": 1}
BINARY_FLOPS = {"add": 1, "sub": 1, "mul": 1, "div": 1, "pow": 2, "max": 1, "min": 1}


class ShapeError(ValueError):
    pass


Shape = tuple[int, ...]


@dataclass(frozen=True)
class Facts:
    """What a rule returns besides output shapes; bytes default to whole tensors."""
    op_class: OpClass
    flops: float
    patterns: tuple[DepPattern, ...]
    unit: str = "simt"
    gemm: GemmDims | None = None
    read_bytes: tuple[int, ...] | None = None
    write_bytes: tuple[int, ...] | None = None
    is_view: bool = False
    transcendentals: float = 0.0


Rule = Callable[[list[Tensor], Mapping], tuple[list[tuple[Shape, str]], Facts]]


@dataclass(frozen=True)
class OpKind:
    name: str
    arity: tuple[int, int]
    rule: Rule
    doc: str


KINDS: dict[str, OpKind] = {}


def _kind(names, arity, doc):
    def deco(fn):
        for n in (names if isinstance(names, tuple) else (names,)):
            KINDS[n] = OpKind(n, arity, fn, doc)
        return fn
    return deco


def _axis(axis: int, ndim: int) -> int:
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < ndim:
        raise ShapeError(f"axis {axis} is out of range for a rank-{ndim} tensor")
    return a


def broadcast(*shapes: Shape) -> Shape:
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        dims = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0} - {1}
        if len(dims) > 1:
            raise ShapeError("shapes " + " and ".join(str(list(s)) for s in shapes)
                             + " do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _rows(shape: Shape) -> int:
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


def _same_rows_pattern(inp: Shape, out: Shape) -> DepPattern:
    """A broadcast operand that varies along the rows streams with them; one that is constant
    along the rows (a bias, a scale vector) is needed whole by every tile."""
    padded = (1,) * (len(out) - len(inp)) + tuple(inp)
    return E if _rows(padded) == _rows(out) and _rows(out) > 1 else (E if padded == tuple(out) else F)


def _float_dtype(ts: list[Tensor]) -> str:
    fl = [t.dtype for t in ts if t.dtype in FLOAT_DTYPES]
    if not fl:
        return ts[0].dtype
    if len(set(fl)) > 1:
        raise ShapeError("operands have different float dtypes " + ", ".join(sorted(set(fl)))
                         + " (insert a cast)")
    return fl[0]


# -- matrix products -----------------------------------------------------------------------------
@_kind(("matmul", "bmm", "gemm"), (2, 3),
       "A @ B (+ bias); attrs trans_a, trans_b, out_dtype; batch dimensions broadcast")
def _matmul(ins, attrs):
    a, b = ins[0], ins[1]
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(f"matmul needs rank >= 2 operands, got {list(a.shape)} and {list(b.shape)}")
    m, k = (a.shape[-1], a.shape[-2]) if attrs.get("trans_a") else (a.shape[-2], a.shape[-1])
    k2, n = (b.shape[-1], b.shape[-2]) if attrs.get("trans_b") else (b.shape[-2], b.shape[-1])
    if k != k2:
        raise ShapeError(f"inner dimensions differ: A {list(a.shape)} has K={k}, "
                         f"B {list(b.shape)} has K={k2}")
    batch_shape = broadcast(a.shape[:-2], b.shape[:-2]) if (a.shape[:-2] or b.shape[:-2]) else ()
    out_shape = tuple(batch_shape) + (m, n)
    dtype = _float_dtype([a, b])
    out_dtype = str(attrs.get("out_dtype", dtype))
    batch = math.prod(batch_shape)
    flops = 2.0 * batch * m * n * k
    pats = [F if attrs.get("trans_a") else R, F]
    if len(ins) == 3:
        if broadcast(ins[2].shape, out_shape) != out_shape:
            raise ShapeError(f"bias {ins[2].name} {list(ins[2].shape)} does not broadcast to the "
                             f"output {list(out_shape)}")
        flops += batch * m * n
        pats.append(_same_rows_pattern(ins[2].shape, out_shape))
    unit = "tensor" if dtype in TENSOR_CORE_DTYPES or attrs.get("allow_tf32") else "simt"
    return [(out_shape, out_dtype)], Facts(OpClass.GEMM, flops, tuple(pats), unit,
                                           GemmDims(batch, m, n, k))


@_kind("conv2d", (2, 3), "2-D convolution as implicit GEMM; attrs strides, pads, dilations, "
       "group, layout (NHWC default, or NCHW); weight [K, C/group, R, S]")
def _conv2d(ins, attrs):
    x, w = ins[0], ins[1]
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"conv2d needs rank-4 input and weight, got {list(x.shape)}, {list(w.shape)}")
    layout = str(attrs.get("layout", "NHWC"))
    if layout == "NHWC":
        n, h, wd, c = x.shape
    elif layout == "NCHW":
        n, c, h, wd = x.shape
    else:
        raise ShapeError(f"layout {layout!r} is not NHWC or NCHW")
    k, cg, r, s = w.shape
    g = int(attrs.get("group", 1))
    if c % g or cg * g != c:
        raise ShapeError(f"weight {list(w.shape)} expects {cg * g} input channels "
                         f"(group {g}), input has {c}")
    sh, sw = attrs.get("strides", (1, 1))
    dh, dw = attrs.get("dilations", (1, 1))
    pads = list(attrs.get("pads", (0, 0, 0, 0)))
    if len(pads) == 2:
        pads = pads * 2
    p = (h + pads[0] + pads[2] - dh * (r - 1) - 1) // sh + 1
    q = (wd + pads[1] + pads[3] - dw * (s - 1) - 1) // sw + 1
    if p <= 0 or q <= 0:
        raise ShapeError(f"kernel {r}x{s} does not fit input {h}x{wd}")
    out = (n, p, q, k) if layout == "NHWC" else (n, k, p, q)
    dtype = _float_dtype([x, w])
    if k % g:
        raise ShapeError(f"output channels {k} are not divisible by group {g}")
    gd = GemmDims(batch=g, m=n * p * q, n=k // g, k=cg * r * s)
    flops = 2.0 * gd.batch * gd.m * gd.n * gd.k
    # a pixel's output needs every input channel of its window: a 1x1 conv reduces over the
    # row like a GEMM's A operand; a larger window also needs neighbouring rows (halo)
    pats = [H if (r > 1 or s > 1) else R, F]
    if len(ins) == 3:
        if ins[2].shape != (k,):
            raise ShapeError(f"bias {ins[2].name} has shape {list(ins[2].shape)}, expected [{k}]")
        flops += n * p * q * k
        pats.append(F)
    unit = "tensor" if dtype in TENSOR_CORE_DTYPES else "simt"
    return [(out, dtype)], Facts(OpClass.GEMM, flops, tuple(pats), unit, gd)


# -- elementwise ---------------------------------------------------------------------------------
@_kind(tuple(UNARY_FLOPS), (1, 1), "elementwise unary op (scale: attr factor; cast: attr dtype)")
def _unary(ins, attrs, _kind_name=None):
    x = ins[0]
    dtype = str(attrs.get("dtype", x.dtype)) if attrs["__kind__"] == "cast" else x.dtype
    if dtype not in DTYPE_BYTES:
        raise ShapeError(f"unknown dtype {dtype!r}")
    per = UNARY_FLOPS[attrs["__kind__"]]
    return [(x.shape, dtype)], Facts(OpClass.ELEMENTWISE, per * x.numel, (E,),
                                     transcendentals=UNARY_TRANSCENDENTALS.get(attrs["__kind__"], 0) * x.numel)


@_kind(tuple(BINARY_FLOPS), (2, 2), "elementwise binary op with NumPy broadcasting")
def _binary(ins, attrs):
    out = broadcast(*(t.shape for t in ins))
    dtype = _float_dtype(list(ins))
    per = BINARY_FLOPS[attrs["__kind__"]]
    pats = tuple(_same_rows_pattern(t.shape, out) for t in ins)
    return [(out, dtype)], Facts(OpClass.ELEMENTWISE, per * math.prod(out), pats)


@_kind("batchnorm", (5, 5), "inference batch norm (x, scale, bias, mean, var) over channel "
       "axis attr axis (default -1, i.e. NHWC; ONNX NCHW uses 1)")
def _batchnorm(ins, attrs):
    x = ins[0]
    ax = _axis(int(attrs.get("axis", -1)), len(x.shape))
    for p in ins[1:]:
        if p.shape != (x.shape[ax],):
            raise ShapeError(f"parameter {p.name} has shape {list(p.shape)}, "
                             f"expected [{x.shape[ax]}]")
    return [(x.shape, x.dtype)], Facts(OpClass.ELEMENTWISE, 2.0 * x.numel, (E, F, F, F, F))


# -- row-wise and reductions ---------------------------------------------------------------------
@_kind("softmax", (1, 1), "softmax over attr axis (default -1)")
def _softmax(ins, attrs):
    x = ins[0]
    last = _axis(int(attrs.get("axis", -1)), len(x.shape)) == len(x.shape) - 1
    return [(x.shape, x.dtype)], Facts(OpClass.ROW_REDUCTION if last else OpClass.REDUCTION,
                                       5.0 * x.numel, (R if last else F,))


def _norm(ins, attrs, per_elem, n_params):
    x = ins[0]
    for p in ins[1:]:
        if p.shape != (x.shape[-1],):
            raise ShapeError(f"parameter {p.name} has shape {list(p.shape)}, "
                             f"expected [{x.shape[-1]}]")
    return [(x.shape, x.dtype)], Facts(OpClass.ROW_REDUCTION, per_elem * x.numel,
                                       (R,) + (F,) * (len(ins) - 1))


@_kind("layernorm", (1, 3), "layer norm over the last axis, optional gamma and beta")
def _layernorm(ins, attrs):
    return _norm(ins, attrs, 8.0, 2)


@_kind("rmsnorm", (1, 2), "RMS norm over the last axis, optional gamma")
def _rmsnorm(ins, attrs):
    return _norm(ins, attrs, 4.0, 1)


@_kind(("reduce_sum", "reduce_mean", "reduce_max"), (1, 1),
       "reduction over attr axes (default [-1]); attr keepdims (default false)")
def _reduce(ins, attrs):
    x = ins[0]
    axes = sorted({_axis(int(a), len(x.shape)) for a in attrs.get("axes", [-1])})
    keep = bool(attrs.get("keepdims", False))
    out = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keep or i not in axes)
    last_only = axes == [len(x.shape) - 1]
    return [(out or (1,), x.dtype)], Facts(OpClass.ROW_REDUCTION if last_only else OpClass.REDUCTION,
                                           float(x.numel), (R if last_only else F,))


@_kind("topk", (1, 1), "top-k over the last axis (attr k): values and int64 indices")
def _topk(ins, attrs):
    x = ins[0]
    k = int(attrs.get("k", 1))
    if not 0 < k <= x.shape[-1]:
        raise ShapeError(f"k={k} is not in 1..{x.shape[-1]}")
    out = x.shape[:-1] + (k,)
    return [(out, x.dtype), (out, "int64")], Facts(OpClass.ROW_REDUCTION, float(x.numel * k), (R,))


# -- data movement -------------------------------------------------------------------------------
@_kind(("gather", "embedding"), (2, 2), "rows of a table picked by integer indices (axis 0): "
       "out = indices.shape + table.shape[1:]; reads only the rows it picks")
def _gather(ins, attrs):
    table, idx = ins
    if idx.dtype not in ("int64", "int32"):
        raise ShapeError(f"indices {idx.name} must be int32 or int64, got {idx.dtype}")
    if int(attrs.get("axis", 0)) != 0:
        raise ShapeError("gather is supported along axis 0 only")
    out = tuple(idx.shape) + tuple(table.shape[1:])
    row = math.prod(table.shape[1:]) * DTYPE_BYTES[table.dtype]
    read_table = min(table.nbytes, idx.numel * row)
    return [(out, table.dtype)], Facts(OpClass.GATHER, 0.0, (G, E),
                                       read_bytes=(read_table, idx.nbytes))


@_kind("scatter_add", (2, 3), "scatter-add of updates rows into rows picked by indices: "
       "(indices, updates) with attr rows, or (data, indices, updates)")
def _scatter_add(ins, attrs):
    if len(ins) == 2:
        idx, upd = ins
        if "rows" not in attrs:
            raise ShapeError("scatter_add with two inputs needs attr rows (the output row count)")
        out = (int(attrs["rows"]),) + tuple(upd.shape[len(idx.shape):])
        pats = (G, G)
    else:
        data, idx, upd = ins
        out = data.shape
        pats = (E, G, G)
    if idx.dtype not in ("int64", "int32"):
        raise ShapeError(f"indices {idx.name} must be int32 or int64, got {idx.dtype}")
    if tuple(upd.shape[:len(idx.shape)]) != tuple(idx.shape) or tuple(upd.shape[len(idx.shape):]) != tuple(out[1:]):
        raise ShapeError(f"updates {list(upd.shape)} do not match indices {list(idx.shape)} "
                         f"and output rows of shape {list(out[1:])}")
    return [(tuple(out), upd.dtype)], Facts(OpClass.SCATTER, float(upd.numel), pats)


@_kind("concat", (1, 64), "concatenation along attr axis (a copy)")
def _concat(ins, attrs):
    nd = len(ins[0].shape)
    ax = _axis(int(attrs.get("axis", -1)), nd)
    for t in ins[1:]:
        if len(t.shape) != nd or any(a != b for i, (a, b) in enumerate(zip(t.shape, ins[0].shape))
                                     if i != ax):
            raise ShapeError(f"{t.name} {list(t.shape)} does not match {ins[0].name} "
                             f"{list(ins[0].shape)} off axis {ax}")
    out = list(ins[0].shape)
    out[ax] = sum(t.shape[ax] for t in ins)
    pat = E if ax == nd - 1 else F
    return [(tuple(out), _float_dtype(list(ins)))], Facts(OpClass.COPY, 0.0, (pat,) * len(ins))


@_kind("split", (1, 1), "split along attr axis into attr sizes; a free view along axis 0, "
       "else a copy")
def _split(ins, attrs):
    x = ins[0]
    ax = _axis(int(attrs.get("axis", -1)), len(x.shape))
    sizes = [int(s) for s in attrs.get("sizes", [])]
    if not sizes or sum(sizes) != x.shape[ax] or min(sizes) <= 0:
        raise ShapeError(f"sizes {sizes} do not add up to dimension {x.shape[ax]} of axis {ax}")
    outs = []
    for s in sizes:
        sh = list(x.shape)
        sh[ax] = s
        outs.append((tuple(sh), x.dtype))
    view = ax == 0 or math.prod(x.shape[:ax]) == 1
    return outs, Facts(OpClass.VIEW if view else OpClass.COPY, 0.0, (E,), unit="none" if view else "simt",
                       is_view=view, read_bytes=(0,) if view else None,
                       write_bytes=(0,) * len(sizes) if view else None)


@_kind(("reshape", "flatten", "identity"), (1, 1), "free views: reshape (attr shape, one -1 "
       "allowed), flatten (attr axis, default 1), identity")
def _view(ins, attrs):
    x = ins[0]
    kind = attrs["__kind__"]
    if kind == "identity":
        out = x.shape
    elif kind == "flatten":
        ax = int(attrs.get("axis", 1))
        out = (math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))
    else:
        tgt = [int(d) for d in attrs.get("shape", [])]
        if tgt.count(-1) > 1 or any(d == 0 or d < -1 for d in tgt) or not tgt:
            raise ShapeError(f"bad target shape {tgt}")
        known = math.prod(d for d in tgt if d != -1)
        if -1 in tgt:
            if x.numel % known:
                raise ShapeError(f"cannot reshape {list(x.shape)} to {tgt}")
            tgt[tgt.index(-1)] = x.numel // known
        if math.prod(tgt) != x.numel:
            raise ShapeError(f"cannot reshape {list(x.shape)} ({x.numel} elements) to {tgt}")
        out = tuple(tgt)
    return [(tuple(out), x.dtype)], Facts(OpClass.VIEW, 0.0, (E,), unit="none", is_view=True,
                                          read_bytes=(0,), write_bytes=(0,))


@_kind("transpose", (1, 1), "axis permutation attr perm: a free view when it moves only size-1 "
       "axes, else a copy")
def _transpose(ins, attrs):
    x = ins[0]
    perm = [int(p) for p in attrs.get("perm", list(reversed(range(len(x.shape)))))]
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"perm {perm} is not a permutation of {len(x.shape)} axes")
    out = tuple(x.shape[p] for p in perm)
    moved = [p for p in perm if x.shape[p] != 1]
    view = moved == sorted(moved)
    if view:
        return [(out, x.dtype)], Facts(OpClass.VIEW, 0.0, (E,), unit="none", is_view=True,
                                       read_bytes=(0,), write_bytes=(0,))
    return [(out, x.dtype)], Facts(OpClass.COPY, 0.0, (F,))


def apply_rule(kind: str, ins: list[Tensor], attrs: Mapping, out_names: list[str]):
    """Run a kind's rule; returns (output tensors, OpInfo). Raises ShapeError."""
    k = KINDS[kind]
    lo, hi = k.arity
    if not lo <= len(ins) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise ShapeError(f"{kind} takes {want} inputs, got {len(ins)}")
    outs, facts = k.rule(ins, {**attrs, "__kind__": kind})
    if out_names and len(out_names) != len(outs):
        raise ShapeError(f"{kind} produces {len(outs)} outputs, {len(out_names)} named")
    out_tensors = [Tensor(n, tuple(int(d) for d in s), dt) for n, (s, dt) in zip(out_names, outs)]
    for t in out_tensors:
        if any(d <= 0 for d in t.shape):
            raise ShapeError(f"output {t.name} would have shape {list(t.shape)}")
    reads = facts.read_bytes or tuple(t.nbytes for t in ins)
    writes = facts.write_bytes or tuple(t.nbytes for t in out_tensors)
    read_map: dict[str, int] = {}
    pat_map: dict[str, DepPattern] = {}
    order = [DepPattern.ELEMENTWISE, DepPattern.ROW, DepPattern.HALO, DepPattern.GATHER, DepPattern.FULL]
    for t, b, p in zip(ins, reads, facts.patterns + (facts.patterns[-1],) * len(ins)):
        # the same tensor twice (x * x) is read once; the stricter pattern wins
        read_map[t.name] = max(read_map.get(t.name, 0), b)
        pat_map[t.name] = max(pat_map.get(t.name, p), p, key=order.index)
    info = OpInfo(op_class=facts.op_class, flops=float(facts.flops), read_bytes=read_map,
                  write_bytes={t.name: b for t, b in zip(out_tensors, writes)}, patterns=pat_map,
                  unit=facts.unit, gemm=facts.gemm, is_view=facts.is_view,
                  transcendentals=float(facts.transcendentals))
    return out_tensors, info
