"""How CuPy's batched matmul runs the attention-head GEMMs against one cuBLAS strided-batched
call (timing only; on the device: python3 bench/cublas_batched_probe.py). Measured 2026-11-22 on
the H100: QK^T 860 us through cupy.matmul vs 69 us through cublasGemmStridedBatchedEx, PV 780 vs
67 us: why the harness's cublas baseline calls cuBLAS directly for batched GEMMs."""
import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas
from cupy.cuda import device

def t(fn, n=20):
    s = cp.cuda.get_current_stream()
    fn(); s.synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(n):
        fn()
    e1.record(); e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) / n * 1e3

bh, L, d = 64, 1024, 128
q = cp.random.rand(bh, L, d).astype(cp.float16)
k = cp.random.rand(bh, L, d).astype(cp.float16)
v = cp.random.rand(bh, L, d).astype(cp.float16)
s = cp.empty((bh, L, L), cp.float16)
o = cp.empty((bh, L, d), cp.float16)
kt = k.transpose(0, 2, 1)
print("qk matmul(out=) transposed view", t(lambda: cp.matmul(q, kt, out=s)))
print("qk matmul no out", t(lambda: cp.matmul(q, kt)))
ktc = cp.ascontiguousarray(kt)
print("qk matmul contiguous B", t(lambda: cp.matmul(q, ktc, out=s)))
print("pv matmul(out=)", t(lambda: cp.matmul(s, v, out=o)))
print("pv matmul no out", t(lambda: cp.matmul(s, v)))
print("2d gemm 4096^3", t(lambda: cp.matmul(cp.empty((4096,4096),cp.float16), cp.empty((4096,4096),cp.float16))))
# strided batched through cuBLAS directly (column-major: C^T = B^T A^T)
h = device.get_cublas_handle()
one = np.array(1.0, np.float32); zero = np.array(0.0, np.float32)
def qk_direct():
    # C[L,L] row-major = Q[L,d] K^T ; column-major view: C^T = K Q^T -> gemm(opA=T on K(d x L col-major), opB=N on Q^T)
    cublas.gemmStridedBatchedEx(h, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, L, L, d,
        one.ctypes.data, k.data.ptr, 2, d, L * d, q.data.ptr, 2, d, L * d,
        zero.ctypes.data, s.data.ptr, 2, L, L * L, bh, 68, 99)
cublas.setPointerMode(h, cublas.CUBLAS_POINTER_MODE_HOST)
try:
    print("qk gemmStridedBatchedEx", t(qk_direct))
except Exception as e:
    print("direct failed", e)
def pv_direct():
    cublas.gemmStridedBatchedEx(h, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, d, L, L,
        one.ctypes.data, v.data.ptr, 2, d, L * d, s.data.ptr, 2, L, L * L,
        zero.ctypes.data, o.data.ptr, 2, d, L * d, bh, 68, 99)
try:
    print("pv gemmStridedBatchedEx", t(pv_direct))
except Exception as e:
    print("direct failed", e)
ref = cp.matmul(q, kt); qk_direct(); print("qk direct max err", float(cp.abs(ref.astype(cp.float32) - s.astype(cp.float32)).max()))
