"""Reference results in fp32 (CuPy) and the error metrics; random inputs of sensible scale.

The reference evaluates the region's ops in order on fp32 copies of the inputs, without rounding
intermediates, with the same function forms as the kernels (tanh GeLU, biased variance).
"""
from __future__ import annotations

import math

from kitsune_dse.errors import KitsuneError
from kitsune_dse.validate.lower import Region

TOLERANCE = {"fp16": 1e-2, "bf16": 2e-2}   # relative Frobenius error, for REF_DEPTH roundings
# the roundings of an MLP block (GEMM, activation, GEMM, residual add): deeper paths round more
# often, and independent rounding errors add in quadrature (the error of n roundings grows as
# sqrt(n) u: Higham's probabilistic bound), so the tolerance grows as sqrt(depth / REF_DEPTH).
# NeRF's eleven layers reached 7.3e-3 in 1,212 checks of its baselines, once 1.66e-2.
REF_DEPTH = 4
# ops whose output is exact given its inputs' values (no rounding on the path)
EXACT_KINDS = frozenset({"relu", "neg", "abs", "identity", "cast", "max", "min", "concat", "reshape",
                         "flatten", "transpose", "slice", "split", "gather"})


def rounding_depth(reg: Region, t: str) -> int:
    """Ops that round their result on the longest path from the region's inputs to tensor t."""
    g = reg.graph
    ops = set(reg.all_ops)
    depth: dict[str, int] = {}
    for op in g.ops:                    # the graph keeps its ops in a topological order
        if op.name not in ops:
            continue
        d = max((depth.get(i, 0) for i in op.inputs), default=0) + (0 if op.kind in EXACT_KINDS else 1)
        for o in op.outputs:
            depth[o] = d
    return depth.get(t, depth.get(reg.root(t), 0))


def tolerance(dtype: str, depth: int = REF_DEPTH) -> float:
    """The relative Frobenius error a result `depth` roundings deep may have."""
    return TOLERANCE[dtype] * math.sqrt(max(1.0, depth / REF_DEPTH))


def _cp():
    import cupy
    return cupy


def storage_dtype(dtype: str):
    cp = _cp()
    return cp.float16 if dtype == "fp16" else cp.uint16


def to_f32(a, dtype: str):
    cp = _cp()
    if dtype == "fp16":
        return a.astype(cp.float32)
    return (a.astype(cp.uint32) << 16).view(cp.float32)


def from_f32(x, dtype: str):
    cp = _cp()
    if dtype == "fp16":
        return x.astype(cp.float16)
    b = x.astype(cp.float32).view(cp.uint32)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(cp.uint16)


def to_logical(reg: Region, t: str, a):
    """The graph's (logical) 2-D or 1-D view of a physically padded tensor (a copy if padded)."""
    cp = _cp()
    if not reg.padded(t):
        return a
    x = a if a.ndim == 2 else a.reshape(1, -1)
    if t in reg.rseg:
        x = cp.concatenate([x[ps:ps + w] for _, w, ps in reg.rseg[t]], axis=0)
    if t in reg.cseg:
        x = cp.concatenate([x[:, ps:ps + w] for _, w, ps in reg.cseg[t]], axis=1)
    return x if a.ndim == 2 else x.reshape(-1)


def fill_physical(reg: Region, t: str, phys, logical) -> None:
    """Write logical values into a padded tensor's storage, zeros in every pad."""
    if not reg.padded(t):
        phys[...] = logical.reshape(phys.shape)
        return
    phys.fill(0)
    p = phys if phys.ndim == 2 else phys.reshape(1, -1)
    lg = logical if logical.ndim == 2 else logical.reshape(1, -1)
    rsegs = reg.rseg.get(t) or [(0, lg.shape[0], 0)]
    csegs = reg.cseg.get(t) or [(0, lg.shape[1], 0)]
    for rl, rw, rp in rsegs:
        for cl, cw, cpos in csegs:
            p[rp:rp + rw, cpos:cpos + cw] = lg[rl:rl + rw, cl:cl + cw]


def logical_shape(reg: Region, t: str):
    shape = reg.graph.tensors[t].shape
    return (int(shape[0]),) if len(shape) == 1 else reg.lshape2(t)


def input_roles(reg: Region) -> dict[str, tuple[str, float]]:
    """tensor -> (role, scale): weights N(0,1)/sqrt(K), biases 0.1 N, gamma 1 + 0.1 N, beta 0.1 N,
    activations N(0,1)."""
    roles: dict[str, tuple[str, float]] = {}
    for name in reg.ops:
        op = reg.graph.op(name)
        ins = [reg.root(t) for t in op.inputs]
        if op.kind in ("matmul", "gemm"):
            roles[ins[1]] = ("weight", 1.0 / math.sqrt(op.info.gemm.k))
            if len(ins) > 2:
                roles[ins[2]] = ("bias", 0.1)
        elif op.kind in ("layernorm", "rmsnorm"):
            if len(ins) > 1:
                roles[ins[1]] = ("gamma", 0.1)
            if len(ins) > 2:
                roles[ins[2]] = ("beta", 0.1)
    return {t: roles.get(t, ("act", 1.0)) for t in reg.inputs}


def random_tensor(shape, role: str, scale: float, dtype: str):
    cp = _cp()
    x = cp.random.standard_normal(shape, dtype=cp.float32) * scale
    if role == "gamma":
        x += 1.0
    return from_f32(x, dtype)


def _gelu(x):
    cp = _cp()
    return 0.5 * x * (1.0 + cp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def reference(reg: Region, inputs: dict) -> dict:
    """fp32 values of every tensor the region produces (by root name), as 2-D or 1-D arrays."""
    cp = _cp()
    g = reg.graph
    env = {t: to_f32(to_logical(reg, t, a), reg.dtype) for t, a in inputs.items()}

    def val(t):
        return env[reg.root(t)]

    for name in reg.all_ops:
        op = g.op(name)
        out = reg.root(op.outputs[0])
        if name not in reg.ops:
            continue
        k = op.kind
        rows, cols = reg.lshape2(out)
        args = [val(t) for t in op.inputs]
        if k in ("matmul", "gemm", "bmm") and op.info.gemm.batch > 1:
            gd = op.info.gemm
            a = args[0].reshape(gd.batch, gd.m, gd.k)
            b = args[1].reshape(gd.batch, gd.n, gd.k).transpose(0, 2, 1) if op.attrs.get("trans_b") \
                else args[1].reshape(gd.batch, gd.k, gd.n)
            r = cp.matmul(a, b).reshape(rows, cols)
        elif k == "concat":
            r = cp.concatenate([x.reshape(rows, -1) for x in args], axis=1)
        elif k in ("matmul", "gemm", "bmm"):
            a = args[0].reshape(-1, args[0].shape[-1])
            b = args[1].T if op.attrs.get("trans_b") else args[1]
            r = a @ b
            if len(args) > 2:
                b = args[2]
                r = r + (b.reshape(r.shape) if b.size == r.size else b.reshape(-1))
        elif k in ("layernorm", "rmsnorm"):
            x = args[0].reshape(rows, cols)
            eps = float(op.attrs.get("eps", op.attrs.get("epsilon", 1e-6 if k == "rmsnorm" else 1e-5)))
            if k == "layernorm":
                mu = x.mean(axis=1, keepdims=True)
                var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
                r = (x - mu) / cp.sqrt(var + eps)
            else:
                r = x / cp.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
            if len(args) > 1:
                r = r * args[1].reshape(-1)
            if len(args) > 2:
                r = r + args[2].reshape(-1)
        elif k == "softmax":
            x = args[0].reshape(rows, cols)
            e = cp.exp(x - x.max(axis=1, keepdims=True))
            r = e / e.sum(axis=1, keepdims=True)
        else:
            def full(x):
                if x.size == rows * cols:
                    return x.reshape(rows, cols)
                return x.reshape(-1)[None, :] if x.size == cols else x
            xs = [full(x) for x in args]
            un = {"relu": lambda x: cp.maximum(x, 0), "gelu": _gelu, "silu": lambda x: x / (1 + cp.exp(-x)),
                  "sigmoid": lambda x: 1 / (1 + cp.exp(-x)), "tanh": cp.tanh, "exp": cp.exp,
                  "neg": lambda x: -x, "abs": cp.abs, "sqrt": cp.sqrt, "reciprocal": lambda x: 1 / x,
                  "identity": lambda x: x, "cast": lambda x: x,
                  "scale": lambda x: x * float(op.attrs.get("factor", 1.0))}
            bi = {"add": cp.add, "sub": cp.subtract, "mul": cp.multiply, "div": cp.divide,
                  "max": cp.maximum, "min": cp.minimum, "pow": cp.power}
            if k in un:
                r = un[k](xs[0])
            elif k in bi:
                r = bi[k](xs[0], xs[1])
            elif k == "erf":
                import cupyx.scipy.special as sp
                r = sp.erf(xs[0])
            else:
                raise KitsuneError(f"reference: op kind {k!r} is not implemented")
        env[out] = r.reshape(rows, cols).astype(cp.float32)
    return env


def compare(out, ref, dtype: str, depth: int = REF_DEPTH) -> dict:
    """Relative Frobenius error, max error relative to max |ref|, NaN count, pass/fail (against
    tolerance(dtype, depth): depth, the roundings on the output's longest path)."""
    cp = _cp()
    o = to_f32(out, dtype).reshape(ref.shape)
    nan = int(cp.count_nonzero(~cp.isfinite(o)))
    if nan:
        return {"rel_err": math.inf, "max_rel_err": math.inf, "nonfinite": nan, "correct": False}
    d = o - ref
    nref = float(cp.linalg.norm(ref.ravel()))
    rel = float(cp.linalg.norm(d.ravel())) / max(nref, 1e-30)
    mx = float(cp.abs(d).max()) / max(float(cp.abs(ref).max()), 1e-30)
    return {"rel_err": rel, "max_rel_err": mx, "nonfinite": 0, "correct": rel <= tolerance(dtype, depth)}
