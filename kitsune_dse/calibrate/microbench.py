"""GPU microbenchmarks for `calibrate` (CuPy, imported lazily).

Each benchmark returns plain numbers; fitting is in fit.py and needs no GPU, so it is tested in
CI on recorded measurements. Every spin in a kernel here has a %globaltimer timeout.
"""
from __future__ import annotations

import statistics
import time

KERNELS = r"""
extern "C" __global__ void stream_read(const int4* __restrict__ src, size_t n_vec, int iters,
                                       unsigned long long* sink) {
    extern __shared__ int pad[];            // dynamic smem forces one CTA per SM
    int4 acc = make_int4(0, 0, 0, 0);
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (int it = 0; it < iters; ++it) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += 4 * stride) {
            int4 v0 = __ldcg(src + i);
            int4 v1 = (i + stride < n_vec) ? __ldcg(src + i + stride) : make_int4(0,0,0,0);
            int4 v2 = (i + 2 * stride < n_vec) ? __ldcg(src + i + 2 * stride) : make_int4(0,0,0,0);
            int4 v3 = (i + 3 * stride < n_vec) ? __ldcg(src + i + 3 * stride) : make_int4(0,0,0,0);
            acc.x ^= v0.x ^ v1.y ^ v2.z ^ v3.w;
        }
    }
    if (acc.x == 0x12345678) sink[0] = acc.x + pad[0];
}

extern "C" __global__ void fma_loop(float* out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f;
    for (int i = 0; i < iters; ++i) {
        c0 = fmaf(a, b, c0); c1 = fmaf(a, b, c1); c2 = fmaf(a, b, c2); c3 = fmaf(a, b, c3);
        c0 = fmaf(a, b, c0); c1 = fmaf(a, b, c1); c2 = fmaf(a, b, c2); c3 = fmaf(a, b, c3);
    }
    if (c0 + c1 + c2 + c3 == 1234.5f) out[0] = c0;
}

extern "C" __global__ void empty_kernel(int* p) { if (p == nullptr && threadIdx.x == 12345) p[0] = 1; }

__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
// two CTAs on different SMs bounce a flag `rounds` times; error[0] set on timeout
extern "C" __global__ void ping_pong(unsigned* flags, int rounds, unsigned long long* out,
                                     unsigned* error, unsigned long long timeout_ns) {
    extern __shared__ int pad[];
    if (threadIdx.x != 0) return;
    unsigned me = blockIdx.x, other = 1 - blockIdx.x;
    unsigned long long t0 = gtimer();
    for (int r = 0; r < rounds; ++r) {
        if (me == 0) {
            st_release(&flags[1], 2 * r + 1);
            while (ld_acquire(&flags[0]) != 2u * r + 2) {
                if (gtimer() - t0 > timeout_ns) { atomicExch(error, 1u); return; }
            }
        } else {
            while (ld_acquire(&flags[1]) != 2u * r + 1) {
                if (gtimer() - t0 > timeout_ns) { atomicExch(error, 1u); return; }
            }
            st_release(&flags[0], 2 * r + 2);
        }
    }
    if (me == 0) out[0] = gtimer() - t0;
    (void)other; (void)pad;
}
"""


def first_call_host_s(cp, stream, call, reps: int = 50) -> float:
    """Host time of `call()` (issuing on `stream`) right after the host waited for the GPU, as
    a timed run's first call comes (validate.measure): after a fill, a 256 MiB L2-flush memset,
    the wait and the start event. The median (upper middle) of `reps`."""
    poison = cp.empty((1024,), dtype=cp.uint16)
    flush = cp.empty((256 * 2**20,), dtype=cp.uint8)
    ev = cp.cuda.Event()
    xs = []
    for _ in range(reps):
        poison.fill(0x7E00)
        cp.cuda.runtime.memsetAsync(flush.data.ptr, 0, flush.nbytes, stream.ptr)
        stream.synchronize()
        ev.record(stream)
        t = time.perf_counter()
        call()
        xs.append(time.perf_counter() - t)
    stream.synchronize()
    return sorted(xs)[len(xs) // 2]


class Bench:
    def __init__(self):
        import cupy as cp
        self.cp = cp
        dev = cp.cuda.Device()
        self.props = cp.cuda.runtime.getDeviceProperties(dev.id)
        self.sm_count = int(self.props["multiProcessorCount"])
        cc = f"{self.props['major']}{self.props['minor']}"
        self.mod = cp.RawModule(code=KERNELS, options=(f"--gpu-architecture=sm_{cc}", "-std=c++17"))
        self.smem_one_cta = int(self.props.get("sharedMemPerMultiprocessor", 228 * 1024) * 0.55)
        for name in ("stream_read", "ping_pong"):
            f = self.mod.get_function(name)
            f.max_dynamic_shared_size_bytes = self.smem_one_cta

    def _time(self, fn, runs: int = 7, warmup: int = 2) -> float:
        cp = self.cp
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(runs):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        return statistics.median(ts)

    def read_bandwidth(self, sms: int, nbytes: int, iters: int = 1) -> float:
        """Bytes/s streaming `nbytes` (iters times) with one 1024-thread CTA on each of `sms` SMs."""
        cp = self.cp
        key = (nbytes,)
        if getattr(self, "_buf_key", None) != key:     # one buffer per size, reused across SM counts
            self._buf = None
            self._buf = cp.ones(nbytes // 16 * 4, dtype=cp.int32)
            self._buf_key = key
        buf = self._buf
        sink = cp.zeros(1, dtype=cp.uint64)
        f = self.mod.get_function("stream_read")
        n_vec = buf.size // 4

        def run():
            f((sms,), (1024,), (buf, cp.uint64(n_vec), cp.int32(iters), sink),
              shared_mem=self.smem_one_cta)
        t = self._time(run)
        return n_vec * 16 * iters / t

    def l2_residency(self, sizes_mib=(4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56),
                     runs: int = 5) -> list[dict]:
        """How much of a tensor stays in L2 for the next kernel: per size, the time to read it on
        every SM right after a 256 MiB flush (cold: from DRAM), right after a kernel wrote it
        (written) and right after a kernel read it (reread), and the time of an L2-hot read
        (the fourth read of four back to back). hit = (cold - t) / (cold - hot), clipped to
        [0, 1]: the share of its bytes the next kernel finds in L2."""
        cp = self.cp
        flush = cp.empty(256 * 2**20 // 4, dtype=cp.int32)
        f = self.mod.get_function("stream_read")
        sink = cp.zeros(1, dtype=cp.uint64)
        S = self.sm_count
        out = []
        for mib in sizes_mib:
            buf = cp.ones(mib * 2**20 // 4, dtype=cp.int32)
            n_vec = buf.size // 4

            def read(iters=1):
                f((S,), (1024,), (buf, cp.uint64(n_vec), cp.int32(iters), sink), shared_mem=self.smem_one_cta)

            def timed(before) -> float:
                ts = []
                for r in range(runs + 1):
                    flush.fill(r)
                    before()
                    a, b = cp.cuda.Event(), cp.cuda.Event()
                    a.record()
                    read()
                    b.record()
                    b.synchronize()
                    if r:
                        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
                return statistics.median(ts)
            cold = timed(lambda: None)
            written = timed(lambda: buf.fill(1))
            reread = timed(read)
            hot = self._time(lambda: read(4), runs=runs) / 4
            span = max(cold - hot, 1e-12)
            out.append({"bytes": mib * 2**20, "cold_s": cold, "written_s": written, "reread_s": reread,
                        "hot_s": hot, "hit_written": min(1.0, max(0.0, (cold - written) / span)),
                        "hit_reread": min(1.0, max(0.0, (cold - reread) / span))})
            del buf
        return out

    def fp32_rate(self) -> float:
        cp = self.cp
        f = self.mod.get_function("fma_loop")
        out = cp.zeros(1, dtype=cp.float32)
        iters = 4096
        blocks, threads = self.sm_count * 8, 256

        def run():
            f((blocks,), (threads,), (out, cp.int32(iters)))
        t = self._time(run)
        return blocks * threads * iters * 8 * 2 / t

    def gemm_rate(self, n: int, dtype="float16") -> float:
        cp = self.cp
        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dtype)
        b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dtype)
        t = self._time(lambda: a @ b, runs=9)
        return 2.0 * n ** 3 / t

    def launch_overheads(self, n: int = 2000) -> dict:
        cp = self.cp
        f = self.mod.get_function("empty_kernel")
        arg = cp.zeros(1, dtype=cp.int32)
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            for _ in range(50):
                f((1,), (32,), (arg,))
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                f((1,), (32,), (arg,))
            host = (time.perf_counter() - t0) / n
            stream.synchronize()
            eager_total = time.perf_counter() - t0
            first = first_call_host_s(cp, stream, lambda: f((1,), (32,), (arg,)))
            stream.begin_capture()
            for _ in range(n):
                f((1,), (32,), (arg,))
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            graph.launch(stream)
            b.record(stream)
            b.synchronize()
            per_node = cp.cuda.get_elapsed_time(a, b) * 1e-3 / n
        return {"launch_overhead_s": host, "eager_per_kernel_s": eager_total / n,
                "graph_launch_overhead_s": per_node, "launch_first_s": first}

    def handoff_latency(self, rounds: int = 2000) -> float:
        """One-way flag hand-off between two SMs (half the measured round trip)."""
        cp = self.cp
        f = self.mod.get_function("ping_pong")
        flags = cp.zeros(64, dtype=cp.uint32)
        out = cp.zeros(1, dtype=cp.uint64)
        err = cp.zeros(1, dtype=cp.uint32)
        f((2,), (32,), (flags, cp.int32(rounds), out, err, cp.uint64(2_000_000_000)),
          shared_mem=self.smem_one_cta)
        cp.cuda.runtime.deviceSynchronize()
        if int(err[0]):
            raise RuntimeError("ping-pong timed out: the two CTAs were not co-resident")
        return float(out[0]) * 1e-9 / rounds / 2

    def device_info(self) -> dict:
        cp = self.cp
        p = self.props
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        clock = float(p.get("clockRate", 0) or 0) * 1e3
        if not clock:   # CUDA 13 dropped cudaDeviceProp.clockRate: ask the driver attribute
            try:
                clock = float(cp.cuda.runtime.deviceGetAttribute(13, cp.cuda.Device().id)) * 1e3
            except Exception:  # noqa: BLE001
                clock = 0.0
        return {"device": name, "sm_count": self.sm_count,
                "sm_clock_Hz": clock,
                "l2_bytes": int(p.get("l2CacheSize", 0)),
                "driver": cp.cuda.runtime.driverGetVersion(),
                "runtime": cp.cuda.runtime.runtimeGetVersion(), "cupy": cp.__version__,
                "compute_capability": f"{p['major']}.{p['minor']}"}


def run_all(progress=None) -> dict:
    """Every microbenchmark; returns the raw measurements (SI units)."""
    b = Bench()
    S = b.sm_count
    sm_points = sorted({1, 2, 4, 8, 16, 24, 33, 48, 66, 99, S} & set(range(1, S + 1)))
    steps = len(sm_points) * 2 + 6
    done = [0]

    def tick(what):
        done[0] += 1
        if progress:
            progress(done[0], steps, what)

    m = {"device": b.device_info(), "hbm_read": [], "l2_read": []}
    big = 2 * 2**30
    for s in sm_points:
        m["hbm_read"].append((s, b.read_bandwidth(s, big)))
        tick("HBM bandwidth vs SMs")
    small = 16 * 2**20
    for s in sm_points:
        m["l2_read"].append((s, b.read_bandwidth(s, small, iters=20)))
        tick("L2 bandwidth vs SMs")
    m["fp32_flop_per_s"] = b.fp32_rate()
    tick("SIMT FP32 rate")
    m["gemm_fp16"] = [(n, b.gemm_rate(n)) for n in (2048, 4096, 8192)]
    tick("cuBLAS fp16 GEMM")
    try:   # CuPy may lack bfloat16 (or its matmul): the fp16 rates are what the fit uses
        m["gemm_bf16"] = [(n, b.gemm_rate(n, "bfloat16")) for n in (4096, 8192)] if _has_bf16(b) else []
    except Exception as e:  # noqa: BLE001
        m["gemm_bf16"] = []
        m["gemm_bf16_error"] = f"{type(e).__name__}: {e}"
    tick("cuBLAS bf16 GEMM")
    m["launch"] = b.launch_overheads()
    tick("launch overhead")
    m["sync_latency_s"] = b.handoff_latency()
    tick("flag hand-off latency")
    m["l2_residency"] = b.l2_residency()
    tick("L2 residency vs size")
    return m


def _has_bf16(b) -> bool:
    try:
        b.cp.zeros(1, dtype="bfloat16")
        return True
    except TypeError:
        return False
