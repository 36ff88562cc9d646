"""Lowering a plan region to kernels: fusion groups, and the layout of a pipeline (steps, rings,
work items, control-block counters). Pure Python, no CuPy; codegen.py turns this into CUDA C.

A *group* is what one kernel (or one step of the persistent kernel) computes for a tile:
  gemm  one matmul, or two sharing A (NB=2: SwiGLU gate/up), then a chain of elementwise ops on
        the accumulators (bias, activation, residual...) applied in the epilogue;
  row   elementwise ops, one row op (layernorm, rmsnorm, softmax over the last axis), elementwise ops;
  ew    a chain of elementwise ops.
Every value of a chain that is needed outside the group (or is a region output) is stored.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from kitsune_dse.errors import KitsuneError
from kitsune_dse.graph import Graph

UNARY = {
    "relu": "act_relu({x})", "gelu": "act_gelu({x})", "silu": "act_silu({x})",
    "sigmoid": "act_sigmoid({x})", "tanh": "tanhf({x})", "exp": "expf({x})", "neg": "(-{x})",
    "abs": "fabsf({x})", "sqrt": "sqrtf({x})", "reciprocal": "(1.f / {x})", "erf": "erff({x})",
    "scale": "({x} * {factor})", "identity": "{x}",
}
BINARY = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
          "max": "fmaxf({a}, {b})", "min": "fminf({a}, {b})", "pow": "powf({a}, {b})"}
ROW_KINDS = {"layernorm": 0, "rmsnorm": 1, "softmax": 2}
VIEW_KINDS = {"reshape", "flatten", "identity"}
ELEM_DTYPES = {"fp16": "__half", "bf16": "__nv_bfloat16"}

GEMM_BK = 32
THREADS = 256
MAX_VPL = 8             # 16-byte vectors per thread a row tile keeps in registers (64 floats)
TEAMS = 2               # 256-thread teams per CTA of the persistent kernel (codegen.TEAMS)


def row_cfg(cols: int) -> tuple[int, bool, int]:
    """(warps per row, cached in registers, vectors per thread) of a row tile."""
    for wpr in (1, 2, 4, 8):
        vpl = -(-cols // (wpr * 256))
        if vpl <= MAX_VPL:
            return wpr, True, vpl
    return 8, False, 1


def rows_cols(shape) -> tuple[int, int]:
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(math.prod(shape[:-1])), int(shape[-1])


def seg_width(segs) -> int:
    """Physical columns of a segment layout (each segment padded to a multiple of 8)."""
    ls, w, ps = segs[-1]
    return ps + -(-w // 8) * 8


@dataclass
class Arg:
    kind: str          # "val" (a chain value), "acc" (GEMM accumulator b), "full", "vec"
    ref: str | int     # tensor name, or accumulator index


@dataclass
class ChainOp:
    out: str
    expr: str          # format string over {a0}, {a1}
    args: list[Arg]


@dataclass
class Group:
    gid: int
    kind: str                              # gemm | row | ew
    ops: list[str]
    rows: int
    cols: int
    gemms: list[str] = field(default_factory=list)
    gemm_outs: list[str] = field(default_factory=list)   # output tensor of each GEMM
    a: str | None = None                   # GEMM A operand
    weights: list[str] = field(default_factory=list)
    k: int = 0
    row_op: str | None = None
    row_kind: int = -1
    row_in: str | None = None              # the value the row op normalises
    row_out: str | None = None             # the row op's output
    gamma: str | None = None
    beta: str | None = None
    eps: float = 1e-5
    pre: list[ChainOp] = field(default_factory=list)    # before the row op (row groups)
    chain: list[ChainOp] = field(default_factory=list)  # gemm epilogue / ew chain / after row op
    values: dict = field(default_factory=dict)         # tensor -> "pre" | "post" | "acc"
    stores: list[str] = field(default_factory=list)
    final: str = ""
    tile: dict | None = None               # GEMM tile override {bm, bn, bk, stages, splits}
    tb: bool = False                       # GEMM B stored transposed ([N, K] row-major, bmm trans_b)
    batch: int = 1                         # batched GEMM: B changes every `mper` rows of A
    mper: int = 0                          # rows of A (and C) per batch
    bstride: int = 0                       # elements between consecutive batches of B
    cat: list = field(default_factory=list)  # last-axis concat: [(input, physical start, physical width)]

    @property
    def name(self) -> str:
        return f"g{self.gid}"

    @property
    def nb(self) -> int:
        return len(self.gemms)

    def full_inputs(self) -> list[str]:
        seen: dict[str, None] = {t: None for t, _, _ in self.cat}
        if self.row_op and self.values.get(self.row_in) == "ext":
            seen[self.row_in] = None
        for c in self.pre + self.chain:
            for a in c.args:
                if a.kind == "full":
                    seen.setdefault(a.ref, None)
        return list(seen)

    def vec_inputs(self) -> list[str]:
        seen: dict[str, None] = {}
        for c in self.pre + self.chain:
            for a in c.args:
                if a.kind == "vec":
                    seen.setdefault(a.ref, None)
        return list(seen)

    def reads(self) -> list[str]:
        """Every tensor the group reads from memory (A, weights, operands, norm parameters)."""
        out = ([self.a] if self.a else []) + self.weights + self.full_inputs() + self.vec_inputs()
        out += [t for t in (self.gamma, self.beta) if t]
        return list(dict.fromkeys(out))


class Region:
    """A plan region resolved against its graph: ops, view aliases, inputs, outputs."""

    def __init__(self, graph: Graph, region: dict, layouts: "Region | None" = None):
        """`layouts`: take the physical layouts (padding, concat segments) from this Region (the
        whole graph's), so that tensors shared between regions agree on their storage."""
        self.graph = graph
        self.plan = region
        self.rid = region.get("id", 0)
        self.strategy = region["strategy"]
        self.all_ops = list(region["ops"])
        for o in self.all_ops:
            graph.op(o)  # KitsuneError for an unknown name
        self.alias: dict[str, str] = {}
        self.extra_shapes: dict[str, tuple[int, int]] = {}   # harness temporaries (cuBLAS raw products)
        self.ops: list[str] = []
        dtypes = set()
        for name in self.all_ops:
            op = graph.op(name)
            if op.kind in VIEW_KINDS or (op.info is not None and op.info.is_view):
                src = self.root(op.inputs[0])
                self.alias[op.outputs[0]] = src
                continue
            self.ops.append(name)
            for t in list(op.inputs) + list(op.outputs):
                dtypes.add(graph.tensors[t].dtype)
        bad = dtypes - set(ELEM_DTYPES)
        if bad:
            raise KitsuneError(f"region {self.rid}: the harness runs fp16 or bf16 tensors; this region "
                               f"has {', '.join(sorted(bad))}")
        if len(dtypes) > 1:
            raise KitsuneError(f"region {self.rid}: mixed dtypes {sorted(dtypes)} are not supported")
        self.dtype = dtypes.pop() if dtypes else "fp16"
        produced = {self.root(t) for o in self.ops for t in graph.op(o).outputs}
        consumed = [self.root(t) for o in self.ops for t in graph.op(o).inputs]
        self.inputs = list(dict.fromkeys(t for t in consumed if t not in produced))
        outside = set()
        region_ops = set(self.all_ops)
        for t in graph.tensors:
            r = self.root(t)
            if r in produced:
                if t in graph.outputs or any(c not in region_ops for c in graph.consumers(t)) \
                        or not graph.consumers(t):
                    outside.add(r)
        self.outputs = [t for t in dict.fromkeys(self.root(t) for o in self.ops
                                                 for t in graph.op(o).outputs) if t in outside]
        self.weight_like = {self.root(graph.op(o).inputs[1]) for o in self.ops
                            if graph.op(o).kind in ("matmul", "gemm")}
        # physical layouts: a last dimension that is not a multiple of 8 is padded to one (16-byte
        # vectors); a last-axis concat lays out each input at a multiple of 8; a GEMM's B takes
        # its A's layout along K (zero rows in the pads). Only padded tensors get entries.
        self.cseg: dict[str, list[tuple[int, int, int]]] = {}   # (logical start, width, physical start)
        self.rseg: dict[str, list[tuple[int, int, int]]] = {}   # rows of a B operand (K)
        if layouts is not None:
            self.cseg, self.rseg = dict(layouts.cseg), dict(layouts.rseg)
        else:
            self._layouts()

    def root(self, t: str) -> str:
        while t in self.alias:
            t = self.alias[t]
        return t

    def lshape2(self, t: str) -> tuple[int, int]:
        """Logical (rows, cols) of a tensor, as the graph has it."""
        if t in self.extra_shapes:
            return self.extra_shapes[t]
        return rows_cols(self.graph.tensors[t].shape)

    def shape2(self, t: str) -> tuple[int, int]:
        """Physical (rows, cols) as the harness stores it (padded where the layout says)."""
        if t in self.extra_shapes:
            return self.extra_shapes[t]
        r, c = rows_cols(self.graph.tensors[t].shape)
        if t in self.rseg:
            r = seg_width(self.rseg[t])
        if t in self.cseg:
            c = seg_width(self.cseg[t])
        return r, c

    def segments(self, t: str) -> list[tuple[int, int, int]]:
        return self.cseg.get(t) or [(0, self.lshape2(t)[1], 0)]

    def padded(self, t: str) -> bool:
        return t in self.cseg or t in self.rseg

    def _layouts(self) -> None:
        g = self.graph

        def default(t):
            t = self.root(t)
            if t not in self.cseg and t not in self._seen:
                self._seen.add(t)
                c = self.lshape2(t)[1]
                if c % 8:
                    self.cseg[t] = [(0, c, 0)]
        self._seen: set[str] = set()
        for name in self.ops:
            op = g.op(name)
            ins = [self.root(t) for t in op.inputs]
            out = self.root(op.outputs[0])
            for t in ins:
                default(t)
            if op.kind in ("matmul", "gemm", "bmm"):
                a, b = ins[0], ins[1]
                if a in self.cseg:
                    if op.attrs.get("trans_b"):
                        self.cseg[b] = list(self.cseg[a])
                    else:
                        self.rseg[b] = list(self.cseg[a])
                default(out)
                if out in self.cseg and not op.attrs.get("trans_b"):
                    self.cseg[b] = list(self.cseg[out])
                    if len(ins) > 2 and len(g.tensors[ins[2]].shape) == 1:
                        self.cseg[ins[2]] = list(self.cseg[out])
                self._seen.add(out)
            elif op.kind == "concat" and int(op.attrs.get("axis", -1)) in (-1, len(g.tensors[out].shape) - 1):
                segs, lpos, ppos = [], 0, 0
                for t in ins:
                    for ls, w, ps in self.segments(t):
                        segs.append((lpos + ls, w, ppos + ps))
                    lpos += self.lshape2(t)[1]
                    ppos += seg_width(self.segments(t))
                if any(ps != ls for ls, _, ps in segs) or ppos != lpos:
                    self.cseg[out] = segs
                self._seen.add(out)
            else:
                src = next((t for t in ins if self.lshape2(t) == self.lshape2(out)), None)
                if src is not None and src in self.cseg:
                    self.cseg[out] = list(self.cseg[src])
                    self._seen.add(out)
                else:
                    default(out)

    def consumers_in(self, t: str, ops: list[str]) -> list[str]:
        """Ops in `ops` that read tensor t (through views)."""
        return [o for o in ops if any(self.root(i) == t for i in self.graph.op(o).inputs)]


# -- fusion ---------------------------------------------------------------------------------------
def _operand_kind(reg: Region, t: str, rows: int, cols: int) -> str | None:
    shape = reg.graph.tensors[t].shape
    r, c = reg.shape2(t)
    if (r, c) == (rows, cols) and rows_cols(shape)[0] == rows:
        return "full"
    if math.prod(shape) == shape[-1] and c == cols:
        return "vec"
    return None


def _unsupported(reg: Region, name: str, why: str) -> KitsuneError:
    op = reg.graph.op(name)
    return KitsuneError(f"region {reg.rid}: op {name!r} ({op.kind}): {why}")


def _new_group(reg: Region, gid: int, name: str) -> Group:
    g = reg.graph
    op = g.op(name)
    out = reg.root(op.outputs[0])
    rows, cols = reg.shape2(out)
    if op.kind in ("matmul", "gemm", "bmm"):
        if op.attrs.get("trans_a"):
            raise _unsupported(reg, name, "a transposed A operand is not supported by the harness")
        gd = op.info.gemm
        a, w = reg.root(op.inputs[0]), reg.root(op.inputs[1])
        tb = bool(op.attrs.get("trans_b"))
        k = reg.shape2(a)[1]               # physical K (A's padded columns)
        ashape, wshape = g.tensors[a].shape, g.tensors[w].shape
        batch, mper, bstride = 1, 0, 0
        if gd.batch != 1:
            if math.prod(ashape[:-2]) != gd.batch or math.prod(wshape[:-2]) != gd.batch:
                raise _unsupported(reg, name, "batched matmul with broadcast batch dimensions")
            if reg.padded(a) or reg.padded(w) or reg.padded(out):
                raise _unsupported(reg, name, f"batched matmul needs K={gd.k} and N={gd.n} multiples of 8")
            batch, mper, bstride = gd.batch, gd.m, gd.n * gd.k
        elif len(wshape) != 2:
            raise _unsupported(reg, name, "B must be a 2-D matrix (or batched like A)")
        if (reg.shape2(w)[1] if tb else reg.shape2(w)[0]) != k * (1 if batch == 1 or tb else batch):
            raise _unsupported(reg, name, f"B's K layout does not match A's ({reg.shape2(w)} vs K={k})")
        grp = Group(gid, "gemm", [name], rows, cols, gemms=[name], gemm_outs=[out], a=a, weights=[w],
                    k=k, tb=tb, batch=batch, mper=mper, bstride=bstride)
        grp.values[out] = "acc"
        if len(op.inputs) == 3:
            bias = reg.root(op.inputs[2])
            kind = _operand_kind(reg, bias, rows, cols)
            if kind is None:
                raise _unsupported(reg, name, "bias must be a vector over N or a full [M, N] tensor")
            grp.chain.append(ChainOp(out, "({a0} + {a1})", [Arg("acc", 0), Arg(kind, bias)]))
            grp.values[out] = "post"
        grp.final = out
        return grp
    if op.kind == "concat":
        shape = g.tensors[out].shape
        if int(op.attrs.get("axis", -1)) not in (-1, len(shape) - 1):
            raise _unsupported(reg, name, "concat along an axis other than the last")
        grp = Group(gid, "ew", [name], rows, cols)
        pos = 0
        for t in op.inputs:
            t = reg.root(t)
            r, c = reg.shape2(t)
            if r != rows:
                raise _unsupported(reg, name, f"input {t!r} has {r} rows, the output {rows}")
            grp.cat.append((t, pos, c))
            pos += c
        if pos != cols:
            raise _unsupported(reg, name, f"physical widths add up to {pos}, the output has {cols}")
        grp.values[out] = "post"
        grp.final = out
        return grp
    if cols % 8:
        raise _unsupported(reg, name, f"the last dimension ({cols}) must be a multiple of 8")
    if op.kind in ROW_KINDS:
        grp = Group(gid, "row", [], rows, cols)
        x = reg.root(op.inputs[0])
        _add_row_op(reg, grp, name, x, external=True)
        return grp
    grp = Group(gid, "ew", [], rows, cols)
    if not _add_chain_op(reg, grp, name, allow_external_only=True):
        raise _unsupported(reg, name, "not an elementwise op the harness can run "
                           f"(supported: {', '.join(sorted(UNARY) + sorted(BINARY))}, "
                           f"{', '.join(ROW_KINDS)}, matmul)")
    return grp


def _add_row_op(reg: Region, grp: Group, name: str, x: str, external: bool) -> None:
    op = reg.graph.op(name)
    if reg.padded(x):
        raise _unsupported(reg, name, f"a row op over {reg.lshape2(x)[1]} columns (not a multiple of 8)")
    if op.kind == "softmax" and int(op.attrs.get("axis", -1)) not in (-1, len(reg.graph.tensors[op.inputs[0]].shape) - 1):
        raise _unsupported(reg, name, "softmax over an axis other than the last")
    grp.ops.append(name)
    grp.row_op = name
    grp.row_kind = ROW_KINDS[op.kind]
    grp.eps = float(op.attrs.get("eps", op.attrs.get("epsilon", 1e-6 if op.kind == "rmsnorm" else 1e-5)))
    if len(op.inputs) > 1:
        grp.gamma = reg.root(op.inputs[1])
    if len(op.inputs) > 2:
        grp.beta = reg.root(op.inputs[2])
    if external:
        grp.values[x] = "ext"
    grp.row_in = x
    out = reg.root(op.outputs[0])
    grp.row_out = out
    grp.values[out] = "post"
    grp.final = out


def _add_chain_op(reg: Region, grp: Group, name: str, allow_external_only: bool = False) -> bool:
    """Append elementwise op `name` to the group's current chain if legal; True when done."""
    op = reg.graph.op(name)
    out = reg.root(op.outputs[0])
    if op.kind not in UNARY and op.kind not in BINARY and op.kind != "cast":
        return False
    if op.kind == "cast" and op.attrs.get("dtype", reg.graph.tensors[op.inputs[0]].dtype) != reg.dtype:
        return False
    if reg.shape2(out) != (grp.rows, grp.cols):
        return False
    stage = "post"
    args: list[Arg] = []
    any_val = False
    for t in op.inputs:
        t = reg.root(t)
        where = grp.values.get(t)
        if where is not None and where != "ext":
            if where == "acc":
                args.append(Arg("acc", grp.gemm_outs.index(t)))
            elif (where == "post") != (stage == "post"):
                return False     # a value from before the row op is not kept for after it
            else:
                args.append(Arg("val", t))
            any_val = True
        else:
            kind = _operand_kind(reg, t, grp.rows, grp.cols)
            if kind is None:
                return False
            args.append(Arg(kind, t))
    if not any_val and not allow_external_only:
        return False
    if op.kind in UNARY or op.kind == "cast":
        expr = UNARY.get(op.kind, "{x}").replace("{x}", "{a0}")
        if "{factor}" in expr:
            expr = expr.replace("{factor}", repr(float(op.attrs.get("factor", 1.0))) + "f")
    else:
        expr = BINARY[op.kind].replace("{a}", "{a0}").replace("{b}", "{a1}")
    (grp.pre if stage == "pre" else grp.chain).append(ChainOp(out, expr, args))
    grp.values[out] = stage
    grp.ops.append(name)
    grp.final = out
    return True


def _producer(reg: Region, t: str) -> str:
    for o in reg.ops:
        if any(reg.root(x) == t for x in reg.graph.op(o).outputs):
            return o
    raise KeyError(t)


def _try_absorb(reg: Region, grp: Group, name: str) -> bool:
    op = reg.graph.op(name)
    if grp.cat or op.kind == "concat":
        return False
    if op.kind == "bmm":
        return False
    if op.kind in ("matmul", "gemm"):
        if grp.kind != "gemm" or grp.nb != 1 or grp.tb or grp.batch != 1 or grp.chain and any(
                c.out != reg.root(reg.graph.op(grp.gemms[0]).outputs[0]) for c in grp.chain):
            return False
        if op.attrs.get("trans_a") or op.attrs.get("trans_b") or op.info.gemm.batch != 1:
            return False
        a, w = reg.root(op.inputs[0]), reg.root(op.inputs[1])
        out = reg.root(op.outputs[0])
        if a != grp.a or reg.shape2(out) != (grp.rows, grp.cols) or reg.shape2(w) != reg.shape2(grp.weights[0]):
            return False
        grp.gemms.append(name)
        grp.gemm_outs.append(out)
        grp.weights.append(w)
        grp.ops.append(name)
        grp.values[out] = "acc"
        if len(op.inputs) == 3:
            bias = reg.root(op.inputs[2])
            kind = _operand_kind(reg, bias, grp.rows, grp.cols)
            if kind is None:
                return False
            grp.chain.append(ChainOp(out, "({a0} + {a1})", [Arg("acc", 1), Arg(kind, bias)]))
            grp.values[out] = "post"
        return True
    if op.kind in ROW_KINDS:
        if grp.kind != "ew" or grp.row_op:
            return False
        x = reg.root(op.inputs[0])
        if grp.values.get(x) != "post" or reg.shape2(x) != (grp.rows, grp.cols):
            return False
        grp.kind = "row"
        grp.pre, grp.chain = grp.chain, []
        for k, v in list(grp.values.items()):
            if v == "post":
                grp.values[k] = "pre"
        _add_row_op(reg, grp, name, x, external=False)
        return True
    return _add_chain_op(reg, grp, name)


def fuse(reg: Region, groups_of_ops: list[list[str]], start_gid: int = 0) -> list[Group]:
    """Each list of ops becomes as few groups as the patterns allow (greedy, in order)."""
    out: list[Group] = []
    gid = start_gid
    for ops in groups_of_ops:
        cur: Group | None = None
        for name in ops:
            if name not in reg.ops:      # a view: an alias, no kernel
                continue
            if cur is not None and _try_absorb(reg, cur, name):
                continue
            if cur is not None:
                out.append(cur)
            cur = _new_group(reg, gid, name)
            gid += 1
        if cur is not None:
            out.append(cur)
    _set_stores(reg, out)
    return out


def _set_stores(reg: Region, groups: list[Group]) -> None:
    for grp in groups:
        others = [o for g2 in groups if g2 is not grp for o in g2.ops]
        produced = [c.out for c in grp.pre + grp.chain]
        if grp.row_op or grp.cat:
            produced.append(grp.final)
        produced += [reg.root(reg.graph.op(m).outputs[0]) for m in grp.gemms]
        stores = []
        for t in dict.fromkeys(produced):
            if grp.values.get(t) == "ext":
                continue
            if t == grp.final or t in reg.outputs or reg.consumers_in(t, others):
                stores.append(t)
        grp.stores = stores


def bsp_groups(reg: Region) -> list[Group]:
    return fuse(reg, [[o] for o in reg.ops])


def cublas_plan(reg: Region) -> list[tuple[str, object]]:
    """The cuBLAS baseline: ("cublas", (A, B, out)) for each matmul (the raw product; a bias and
    the rest follow as kernels of this harness: ("group", Group))."""
    steps: list[tuple[str, object]] = []
    gid = 0
    for grp in bsp_groups(reg):
        if grp.kind != "gemm":
            grp.gid = gid
            gid += 1
            steps.append(("group", grp))
            continue
        out = grp.gemm_outs[0]
        if not grp.chain:
            steps.append(("cublas", (grp.a, grp.weights[0], out, grp)))
            continue
        raw = out + ":raw"
        reg.extra_shapes[raw] = (grp.rows, grp.cols)
        steps.append(("cublas", (grp.a, grp.weights[0], raw, grp)))
        bias = grp.chain[0].args[1]
        ew = Group(gid, "ew", list(grp.ops), grp.rows, grp.cols,
                   chain=[ChainOp(out, "({a0} + {a1})", [Arg("full", raw), bias])],
                   values={out: "post"}, stores=[out], final=out)
        gid += 1
        steps.append(("group", ew))
    return steps


def fusion_groups(reg: Region) -> list[Group]:
    kernels = reg.plan.get("kernels") or [[o] for o in reg.all_ops]
    covered = {o for k in kernels for o in k}
    rest = [[o] for o in reg.all_ops if o not in covered]
    order = {o: i for i, o in enumerate(reg.all_ops)}
    groups = sorted([list(k) for k in kernels] + rest, key=lambda k: min(order[o] for o in k))
    return fuse(reg, groups)


# -- pipeline layout ----------------------------------------------------------------------------
@dataclass
class Ring:
    rid: int
    tensor: str
    cols: int
    producer: int                                   # step index
    consumers: list[tuple[int, str]] = field(default_factory=list)  # (step, "row" | "split_k")
    depth: int = 2
    direct: bool = False                            # storage is the region output itself
    nslots: int = 0
    slab_w: int = 0
    nslabs: int = 0
    full_off: int = 0
    empty_off: int = 0
    slab_off: int = 0
    buf: int = -1                                   # index in the pointer table
    plan_slot_bytes: int | None = None
    bm: int = 128                                   # rows per slot


@dataclass
class Step:
    sid: int
    group: Group
    stage: int
    items: int                                      # work items per row-block
    bn: int = 128                                   # GEMM tile columns / ew chunk columns
    in_rings: dict = field(default_factory=dict)    # tensor -> ring id
    out_rings: dict = field(default_factory=dict)   # tensor -> ring id
    split_k_ring: int | None = None                 # ring of A consumed per column slab
    n_tiles: int = 0                                # GEMM: column tiles per row-block
    ksplit: int = 1                                 # GEMM: K ranges per column tile (items = n_tiles x ksplit)
    kper: int = 0                                   # GEMM: K per range (a multiple of the slab width)
    fix_off: int = 0                                # control words: per (slot, n-tile) partials done
    ws_slots: int = 0                               # row-blocks of fp32 partials in flight
    chunks: list | None = None                      # ew: its items' column ranges, where not
                                                    # plain bn-wide tiles (_split_concat_chunks)


@dataclass
class StageL:
    sid: int
    ctas: int
    sms: int
    first_cta: int
    steps: list[int]
    predicted_latency_s: float | None = None


# traced pipelines: per (step, row-block), arrays of u64 %globaltimer in this order; the minima
# are stored complemented (atomicMax of ~t), as the control words start at zero
TRACE_END_MAX, TRACE_START_MIN, TRACE_START_MAX, TRACE_END_MIN = range(4)
TRACE_ARRAYS = 4


@dataclass
class PipelineLayout:
    region: Region
    bm: int                                         # rows per row-block (tile rows)
    rows: int                                       # M
    nrb: int
    stages: list[StageL]
    steps: list[Step]
    rings: list[Ring]
    grid: int
    ctrl_words: int
    smid_off: int
    notes: list[str]
    plant_deadlock: bool = False
    teams: int = TEAMS                              # 256-thread workers per CTA
    time_off: int = 0                               # per worker: %globaltimer at start and end (2 x u64)
    trace_off: int = 0                              # per (step, row-block): TRACE_ARRAYS u64 times (its items' first start
                                                    # and last end, ...); 0: off
    clock_off: int = 0                              # traced: per worker, clock64 at start and end (2 x u64); 0: off

    def ring_of(self, tensor: str) -> Ring | None:
        for r in self.rings:
            if r.tensor == tensor:
                return r
        return None


CTRL_HEADER = 8


def ew_chunks(g: Group, bn: int) -> list[tuple[int, int]]:
    """The column ranges [c0, c1) of an elementwise step's items in a row-block: chunks of bn
    columns; a concatenation's chunks never straddle two of its inputs (an item mixing two
    inputs branches per vector: NeRF's [64 | 256] skip concat in 128-column items ran 431 us
    where the same kernel with its inputs swapped, no item mixed, ran 282;
    results/validation/h100/concat_context/)."""
    spans = [(p0, p0 + w) for _, p0, w in g.cat] if g.cat else [(0, g.cols)]
    return [(c, min(hi, c + bn)) for lo, hi in spans for c in range(lo, hi, bn)]


def _split_concat_chunks(steps: list[Step], rings: list[Ring]) -> None:
    """A concat step runs its inputs' own chunks (ew_chunks) where they are as many as its
    plain column tiles (the items the cost model prices: NeRF's concats) and it hands no
    split_k queue over, whose consumers read slab i as columns [i bn, (i + 1) bn)."""
    for st in steps:
        g = st.group
        if g.kind != "ew" or not g.cat:
            continue
        slabs = any(any(m == "split_k" for _, m in rings[r].consumers) for r in st.out_rings.values())
        chunks = ew_chunks(g, st.bn)
        if not slabs and len(chunks) == st.items:
            st.chunks = chunks


def _tile_rows(stage_tiles: list[dict], rows: int, notes: list[str]) -> int:
    want = {int((t or {}).get("rows", 128)) for t in stage_tiles}
    w = min(want) if want else 128
    bm = 64 if (w <= 64 or rows <= 64) else 128
    if want != {bm}:
        notes.append(f"tile rows {sorted(want)} run as row-blocks of {bm} (the GEMM tiles take 64 or 128)")
    return bm


def layout_pipeline(reg: Region, plan_region: dict, plant_deadlock: bool = False,
                    teams: int | None = None, trace: bool = False) -> PipelineLayout:
    """The persistent kernel's layout. teams None: the plan's `pipeline.teams_per_sm` where it
    names one (the count the cost model priced), else TEAMS, or one 256-thread team per CTA
    where no step has more items over all its row-blocks than its stage has CTAs
    (`solo_team_fits`: the second team would only idle, and with 256 threads a thread may hold
    255 registers instead of 128, so ptxas spills nothing; bench/step_trace_probe.py --teams:
    1-10% faster there, up to 43% slower where items outnumber the CTAs; cost.pipeline
    .solo_team_fits is the model's copy of the rule). KDSE_SOLO_TEAM=0: never one team, the
    plan's count and the rule both overridden (for probes)."""
    if teams is None and os.environ.get("KDSE_SOLO_TEAM", "1") == "0":
        teams = TEAMS
    if teams is None:
        teams = _named_teams(reg, plan_region)
    if teams is None:
        lay = _layout_pipeline(reg, plan_region, plant_deadlock, TEAMS, trace)
        return _layout_pipeline(reg, plan_region, plant_deadlock, 1, trace) if solo_team_fits(lay) else lay
    return _layout_pipeline(reg, plan_region, plant_deadlock, teams, trace)


def _named_teams(reg: Region, plan_region: dict) -> int | None:
    """The plan's pipeline.teams_per_sm, checked, or None where it names none."""
    named = (plan_region.get("pipeline") or {}).get("teams_per_sm")
    if named is not None and named not in (1, TEAMS):
        raise KitsuneError(f"region {reg.rid}: pipeline.teams_per_sm is {named!r}; the "
                           f"harness runs 1 or {TEAMS} teams per CTA")
    return None if named is None else int(named)


def solo_team_fits(lay: PipelineLayout) -> bool:
    """Every step's items over all row-blocks fit its stage's CTAs, none split over K (whose
    split count follows the workers: cost.pipeline.runtime_ksplit prices two teams)."""
    return all(st.ksplit == 1 and st.items * lay.nrb <= lay.stages[st.stage].ctas for st in lay.steps)


def _layout_pipeline(reg: Region, plan_region: dict, plant_deadlock: bool, teams: int,
                     trace: bool) -> PipelineLayout:
    notes: list[str] = []
    stages_p = plan_region["stages"]
    kernels = plan_region.get("kernels") or None
    order = {o: i for i, o in enumerate(reg.all_ops)}
    # steps: the plan's kernel groups cut by stage, fused, in topological order
    step_ops: list[tuple[int, list[str]]] = []
    for si, s in enumerate(stages_p):
        sops = sorted(s["ops"], key=order.__getitem__)
        if kernels:
            parts = [[o for o in sorted(k, key=order.__getitem__) if o in sops] for k in kernels]
            parts = [p for p in parts if p]
            covered = {o for p in parts for o in p}
            parts += [[o] for o in sops if o not in covered]
        else:
            parts = [sops]
        for p in parts:
            step_ops.append((si, p))
    step_ops.sort(key=lambda x: min(order[o] for o in x[1]))
    groups: list[Group] = []
    stage_of: list[int] = []
    for si, p in step_ops:
        gs = fuse(reg, [p], start_gid=len(groups))
        groups += gs
        stage_of += [si] * len(gs)
    _set_stores(reg, groups)
    # every step streams the same rows
    rows = None
    for g in groups:
        if rows is None:
            rows = g.rows
        elif g.rows != rows:
            raise KitsuneError(f"region {reg.rid}: a pipeline streams row-blocks of one row count; "
                               f"group {g.ops} has {g.rows} rows, others {rows}")
    tiles = [s.get("tile") or {} for s in stages_p]
    bm = _tile_rows(tiles, rows, notes)
    nrb = -(-rows // bm)
    steps: list[Step] = []
    for i, g in enumerate(groups):
        si = stage_of[i]
        tcols = int((stages_p[si].get("tile") or {}).get("cols", 128))
        if g.kind == "gemm":
            bn = 128 if tcols >= 128 else 64
            if g.nb == 2 and bn > 64 and teams > 1:
                bn = 64      # two accumulators per tile: 64 columns keep a team within 128 registers
            if bn != tcols and "cols" in (stages_p[si].get("tile") or {}):
                notes.append(f"stage {si}: GEMM tile cols {tcols} run as {bn}")
            items = -(-g.cols // bn)
        elif g.kind == "ew":
            bn = max(64, (tcols // 8) * 8)
            items = -(-g.cols // bn)
        else:
            bn = 0
            items = -(-bm // (8 // row_cfg(g.cols)[0]))
        steps.append(Step(i, g, si, items, bn))
    # stages: contiguous blockIdx ranges
    stages: list[StageL] = []
    first = 0
    for si, s in enumerate(stages_p):
        sms, ctas = int(s["sms"]), int(s.get("ctas", s["sms"]))
        if ctas > sms:
            raise KitsuneError(f"region {reg.rid} stage {si}: {ctas} CTAs on {sms} SMs; the harness "
                               f"runs one CTA per SM (ctas <= sms)")
        if ctas < sms:
            notes.append(f"stage {si}: {ctas} CTAs on {sms} SMs (one CTA per SM: {sms - ctas} SMs idle)")
        stages.append(StageL(si, ctas, sms, first, [st.sid for st in steps if st.stage == si],
                             s.get("predicted_latency_s")))
        first += ctas
    for st in stages:
        if not st.steps:
            raise KitsuneError(f"region {reg.rid} stage {st.sid} has no work")
    # rings: every stored tensor read by another step
    queues = plan_region.get("queues") or []
    rings: list[Ring] = []
    for st in steps:
        g = st.group
        if g.kind == "gemm":
            st.n_tiles = st.items
        if g.kind == "gemm" and st.split_k_ring is not None:
            _choose_ksplit(st, rings[st.split_k_ring], stages[st.stage].ctas * teams, notes)
        for t in st.group.stores:
            cons = [s2.sid for s2 in steps if s2 is not st and t in s2.group.reads()]
            if not cons:
                continue
            cols = reg.shape2(t)[1]
            depth, slot_bytes = None, None
            modes = {}
            names = (t, *[k for k, v in reg.alias.items() if reg.root(k) == t])
            for q in queues:
                qt = q.get("tensors") or ([q["tensor"]] if q.get("tensor") else [])
                if any(x in names for x in qt):
                    # the explorer counts queue depth and slot bytes in column slabs of a row-block
                    ptile = stages_p[int(q["producer"])].get("tile") or {}
                    slabs = max(1, int(ptile.get("slabs", 1)))
                    d = max(1, int(q.get("depth", 2)) // slabs)
                    # a plan tile of R rows runs as R / bm harness row-blocks: keep the plan's ring
                    # capacity (depth x R rows), not its slot count
                    d *= max(1, int(ptile.get("rows", bm)) // bm)
                    depth = d if depth is None else max(depth, d)
                    if q.get("slot_bytes") is not None:
                        slot_bytes = float(q["slot_bytes"]) * slabs / max(1, int(ptile.get("rows", bm)) // bm)
                    modes[int(q["consumer"])] = q.get("mode", "row")
            if depth is None:
                # a ring inside a stage (no plan queue): room for the stage's plan tile of R rows
                # (R / bm row-blocks), at least double buffering, so that the stage's workers can
                # spread over row-blocks as the plan's stage spreads over its tile
                ptile = stages_p[st.stage].get("tile") or {}
                depth = max(2, min(int(ptile.get("rows", bm)) // bm,
                                   INTRA_RING_BYTES // max(1, bm * reg.shape2(t)[1] * 2)))
            ring = Ring(len(rings), t, cols, st.sid, depth=depth, bm=bm,
                        direct=t in reg.outputs, plan_slot_bytes=slot_bytes)
            for c in cons:
                cstep = steps[c]
                mode = modes.get(cstep.stage, "row")
                if mode == "split_k":
                    if cstep.group.kind != "gemm" or cstep.group.a != t:
                        notes.append(f"ring {t!r}: split_k applies to a GEMM's A operand; step {c} waits for whole row-blocks")
                        mode = "row"
                    elif st.group.kind == "row":
                        notes.append(f"ring {t!r}: a row-op producer publishes rows, not column slabs; "
                                     f"step {c} waits for whole row-blocks")
                        mode = "row"
                ring.consumers.append((c, mode))
                cstep.in_rings[t] = ring.rid
                if mode == "split_k":
                    cstep.split_k_ring = ring.rid
            st.out_rings[t] = ring.rid
            if ring.direct:
                ring.nslots, ring.depth = nrb, nrb
            else:
                ring.nslots = min(ring.depth, nrb)
            if st.group.kind in ("gemm", "ew") and st.ksplit == 1:
                ring.slab_w = st.bn
                ring.nslabs = st.items
            elif any(m == "split_k" for _, m in ring.consumers):
                notes.append(f"ring {t!r}: its producer splits K, so it publishes whole row-blocks; "
                             f"split_k consumers wait for row-blocks")
                for j, (c, m) in enumerate(ring.consumers):
                    if m == "split_k":
                        ring.consumers[j] = (c, "row")
                        steps[c].split_k_ring = None
            if any(m == "split_k" for _, m in ring.consumers) and ring.slab_w % GEMM_BK:
                raise KitsuneError(f"ring {t!r}: slab width {ring.slab_w} is not a multiple of {GEMM_BK}")
            if ring.plan_slot_bytes and not ring.direct:
                mine = bm * cols * 2
                if abs(ring.plan_slot_bytes - mine) > 0.01 * mine:
                    notes.append(f"ring {t!r}: plan slot {ring.plan_slot_bytes} B, harness slot {mine} B "
                                 f"({bm} rows x {cols} cols)")
            rings.append(ring)
    # control block: header, smid per CTA, then counters
    off = CTRL_HEADER
    smid_off = off
    off += first
    for r in rings:
        r.full_off = off
        off += r.nslots
        r.empty_off = off
        off += r.nslots
        if any(m == "split_k" for _, m in r.consumers):
            r.slab_off = off
            off += r.nslots * r.nslabs
    _split_concat_chunks(steps, rings)
    for st in steps:
        if st.ksplit > 1:
            st.ws_slots = rings[st.split_k_ring].nslots
            st.fix_off = off
            off += st.ws_slots * st.n_tiles
    time_off = (off + 1) // 2 * 2                   # 8-byte aligned
    off = time_off + first * teams * 4
    trace_off = 0
    if trace:                                       # TRACE_ARRAYS u64 per (step, row-block), 8-byte aligned
        trace_off = (off + 1) // 2 * 2
        off = trace_off + 2 * TRACE_ARRAYS * len(steps) * nrb
    clock_off = 0
    if trace:                                       # 2 x u64 per worker (its SM clock: cycles / ns)
        clock_off = off
        off = clock_off + first * teams * 4
    return PipelineLayout(reg, bm, rows, nrb, stages, steps, rings, first, off, smid_off, notes,
                          plant_deadlock, teams, time_off, trace_off, clock_off)


KSPLIT_WS_BYTES = 24 * 2**20
INTRA_RING_BYTES = 8 * 2**20     # cap of a ring between two steps of one stage (no plan queue)     # fp32 partials budget of a K-split consumer (L2-resident)


def ring_rows(ring: Ring) -> int:
    return ring.bm


# The shortest K range worth splitting off. Measured (fourth session, same plans with and
# without the split): ranges of 128-384 made stages 1.1-1.8x slower (nerf 17.5 -> 9.9 ms,
# bert-base FFN 3.3 -> 1.9 ms, dlrm 175 -> 154 us), ranges of 6144-16384 made the gpt3 t64
# weight-streaming stage 8% faster (1269 -> 1171 us): the fix-up sums every range's fp32 partial.
KSPLIT_MIN_RANGE = 1024


def _choose_ksplit(st: Step, ring: Ring, workers: int, notes: list[str]) -> None:
    """A split-K consumer GEMM whose column tiles divide badly among its workers (fewer tiles
    than workers, or a last round nearly empty) splits K into ranges of whole slabs: each range's
    fp32 partial goes to a workspace, and the last range of a tile to finish sums them and
    applies the epilogue. The split minimises rounds x range length (10% gain at least)."""
    g = st.group
    if ring.slab_w <= 0:
        return
    nslabs = -(-g.k // ring.slab_w)
    best, best_t = 1, float(-(-st.n_tiles // workers))
    # the partials of every row-block slot in flight must stay in L2 (measured: 201 MB of
    # partials for 8 slots of gpt3-mlp tokens=2048 went to DRAM and made the pipeline 40% slower)
    per_split = ring.nslots * g.nb * ring_rows(ring) * g.cols * 4
    s_max = max(1, min(32, nslabs, KSPLIT_WS_BYTES // max(1, per_split)))
    for s in range(2, s_max + 1):
        per = -(-nslabs // s)                       # slabs per range
        if per * ring.slab_w < KSPLIT_MIN_RANGE:    # the fix-up would cost more than it saves
            break
        s_eff = -(-nslabs // per)
        t = -(-(st.n_tiles * s_eff) // workers) * per / nslabs   # rounds x range length
        if t < 0.9 * best_t:
            best, best_t = s_eff, t
    if best > 1:
        per = -(-nslabs // best)
        st.ksplit = -(-nslabs // per)
        st.kper = per * ring.slab_w
        st.items = st.n_tiles * st.ksplit
        notes.append(f"step {st.sid} ({'+'.join(g.ops)}): K split in {st.ksplit} ranges of {st.kper} "
                     f"({st.items} items for {workers} workers)")


def releasing_ctas(layout: PipelineLayout, step: Step) -> int:
    """Workers (teams) of the step's stage that own at least one item of a row-block (each
    releases the slot once)."""
    return min(step.items, layout.stages[step.stage].ctas * layout.teams)


def empty_target_per_gen(layout: PipelineLayout, ring: Ring) -> int:
    return sum(releasing_ctas(layout, layout.steps[c]) for c, _ in ring.consumers)
