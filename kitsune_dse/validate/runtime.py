"""Running generated kernels with CuPy: device facts, compilation, buffers and the variants.

Variants of one region (each `prepare()`d once, then `pre()` + `run(stream)` per measurement):
  plan         the plan's own strategy: the persistent pipeline kernel for a pipeline region,
               else its kernel groups launched eagerly
  bsp-eager    one kernel per op (the same tile functions), eager launches
  bsp-graph    the same kernels captured once in a CUDA graph and replayed
  fusion       one kernel per plan "kernels" group (epilogue fusion), eager
  fusion-graph the same, as a CUDA graph
  cublas       cuBLAS (cublasGemmStridedBatchedEx, through ctypes on CuPy's handle) for each
               matmul, this harness's kernels for the rest, eager
  cublas-graph the same calls captured once in a CUDA graph and replayed
A tilesync or concurrent region's plan runs its kernels with programmatic dependent launches and
tile hand-offs through flag counters (TilesyncVariant, tilesync.py), as a CUDA graph.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kitsune_dse.errors import KitsuneError
from kitsune_dse.validate import codegen
from kitsune_dse.validate.lower import (TRACE_ARRAYS, TRACE_END_MAX, TRACE_END_MIN, TRACE_START_MAX,
                                        TRACE_START_MIN, Group, PipelineLayout, Region, bsp_groups,
                                        cublas_plan, fusion_groups, layout_pipeline)
from kitsune_dse.validate.plan import DeviceInfo
from kitsune_dse.validate.reference import storage_dtype
from kitsune_dse.validate.tilesync import SYNC_BUF, plan_sync

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
POISON = 0xFFFF      # a NaN in fp16 and in bf16


class PipelineError(KitsuneError):
    """The persistent kernel reported a timeout (deadlock) or a placement problem."""


def _cp():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise KitsuneError("the validation harness needs CuPy and an NVIDIA GPU "
                           "(pip install cupy-cuda12x or cupy-cuda13x)") from e
    return cupy


# -- device -------------------------------------------------------------------------------------------
def gpu_info() -> tuple[DeviceInfo, dict]:
    cp = _cp()
    try:
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
    except Exception as e:  # noqa: BLE001 - CUDARuntimeError and friends
        raise KitsuneError(f"no usable NVIDIA GPU for validation ({type(e).__name__}: {e})") from None
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    cc = dev.compute_capability
    attrs = dev.attributes
    info = DeviceInfo(name=name, arch=f"sm_{cc}", sm_count=int(props["multiProcessorCount"]),
                      smem_per_sm=int(attrs.get("MaxSharedMemoryPerMultiprocessor", 233472)),
                      smem_per_block_optin=int(attrs.get("MaxSharedMemoryPerBlockOptin", 232448)),
                      l2_bytes=int(props.get("l2CacheSize", 50 * 2**20)))
    extra = {"gpu": name, "arch": info.arch, "sm_count": info.sm_count,
             "driver": cp.cuda.runtime.driverGetVersion(), "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
             "cupy": cp.__version__, "l2_bytes": info.l2_bytes}
    extra.update(smi_clocks())
    return info, extra


def smi_clocks() -> dict:
    """Clocks and driver as nvidia-smi reads them (read only; settings are never changed)."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,driver_version,"
                              "power.draw,temperature.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        sm, smax, mem, drv, pw, temp = [x.strip() for x in out.split(",")]
        return {"sm_clock_mhz": sm, "max_sm_clock_mhz": smax, "mem_clock_mhz": mem, "driver_version": drv,
                "power_w": pw, "temp_c": temp}
    except Exception:  # noqa: BLE001 - informational only
        return {}


# -- compilation ------------------------------------------------------------------------------------------
def expand_includes(src: str, seen: set | None = None) -> str:
    """Inline `#include "x.cuh"` from the kernels folder (once each), so NVRTC needs no -I and
    CuPy's cache key covers the headers."""
    seen = set() if seen is None else seen

    def sub(m):
        name = m.group(1)
        if name in seen:
            return ""
        seen.add(name)
        text = (KERNEL_DIR / name).read_text().replace("#pragma once", "")
        return f"// ---- {name}\n" + expand_includes(text, seen)
    return re.sub(r'^#include "([^"]+\.cuh)"\s*$', sub, src, flags=re.M)


def source_key(src: str, arch: str) -> str:
    import hashlib
    return hashlib.sha256((arch + "\n" + expand_includes(src)).encode()).hexdigest()[:24]


def cache_dirs() -> list[Path]:
    import os
    return [Path(p) for p in os.environ.get("KDSE_CUBIN_CACHE", "").split(os.pathsep) if p]


# modules this process loaded as nvcc cubins and compiled with NVRTC: the same source runs
# differently (on an H100, NVRTC 13.2's persistent pipelines 5-17% slower than nvcc 13.0's cubins,
# results/validation/h100/compiler), and the shipped calibrated specs describe the cubins
MODULES_BY_COMPILER = {"nvcc cubin": 0, "NVRTC": 0}


def kernel_compiler_note() -> str | None:
    """A warning when this process compiled kernels with NVRTC (None when every module was a
    precompiled cubin)."""
    n = MODULES_BY_COMPILER["NVRTC"]
    if not n:
        return None
    return (f"{n} kernel module(s) compiled here by NVRTC: the shipped calibrated specs describe "
            f"nvcc-compiled cubins, and on an H100 NVRTC's persistent pipelines ran 5-17% slower "
            f"(results/validation/h100/compiler). For a like-for-like comparison, precompile with "
            f"bench/precompile.py and set KDSE_CUBIN_CACHE, or calibrate this machine the same way")


def compile_module(src: str, arch: str):
    """A CuPy RawModule of the source: a cubin precompiled by nvcc (bench/precompile.py) when one
    with the same source and arch is in $KDSE_CUBIN_CACHE, else compiled by NVRTC."""
    cp = _cp()
    key = source_key(src, arch)
    for d in cache_dirs():
        p = d / f"{key}.cubin"
        if p.exists():
            MODULES_BY_COMPILER["nvcc cubin"] += 1
            return cp.RawModule(path=str(p))
    MODULES_BY_COMPILER["NVRTC"] += 1
    opts = ["-std=c++17", f"-arch={arch}"]
    try:
        path = cp.cuda.get_cuda_path()
        if path:
            opts.append(f"-I{path}/include")
    except Exception:  # noqa: BLE001
        pass
    mod = cp.RawModule(code=expand_includes(src), options=tuple(opts))
    try:
        mod.compile()
    except Exception as e:
        raise KitsuneError(f"kernel compilation failed: {e}") from e
    return mod


def kernel_resources(fn) -> dict:
    return {"num_regs": int(fn.num_regs), "local_bytes": int(fn.local_size_bytes),
            "static_smem": int(fn.shared_size_bytes)}


# -- buffers --------------------------------------------------------------------------------------------
class Tensors:
    """Device arrays of a region by root tensor name (2-D [rows, cols], or 1-D for vectors)."""

    def __init__(self, reg: Region):
        self.reg = reg
        self.arrays: dict[str, object] = {}

    def shape_of(self, t: str):
        if t in self.reg.extra_shapes:
            return self.reg.extra_shapes[t]
        shape = self.reg.graph.tensors[t].shape
        return (self.reg.shape2(t)[1],) if len(shape) == 1 else self.reg.shape2(t)

    def get(self, t: str):
        if t not in self.arrays:
            cp = _cp()
            self.arrays[t] = cp.empty(self.shape_of(t), dtype=storage_dtype(self.reg.dtype))
        return self.arrays[t]


def _ring_buffers(want, mode: str) -> dict:
    """The pipeline's on-chip buffers: one allocation each ("separate"), or views of one arena,
    packed on 256-byte boundaries ("arena") or each start moved on by another 1 KiB + 128 B
    ("arena-skew"), to tell an address-mapping cause of ring write-back from a footprint one."""
    cp = _cp()
    if mode == "separate":
        return {n: cp.empty(shape, dtype=dt) for n, shape, dt in want}
    if mode not in ("arena", "arena-skew"):
        raise ValueError(f"KDSE_RING_ALLOC={mode!r}: separate, arena or arena-skew")
    offs, at = [], 0
    for i, (_, shape, dt) in enumerate(want):
        at = -(-at // 256) * 256 + (i * 1152 if mode == "arena-skew" else 0)
        offs.append(at)
        at += int(np.prod(shape)) * np.dtype(dt).itemsize
    arena = cp.empty((max(at, 1),), dtype=cp.uint8)
    return {n: arena[o:o + int(np.prod(shape)) * np.dtype(dt).itemsize].view(dt).reshape(shape)
            for (n, shape, dt), o in zip(want, offs)}


def pointer_table(names: list[str], resolve) -> object:
    cp = _cp()
    ptrs = np.array([int(resolve(n).data.ptr) for n in names], dtype=np.uint64)
    return cp.asarray(ptrs)


# -- variants ---------------------------------------------------------------------------------------------
@dataclass
class Variant:
    name: str
    reg: Region
    tensors: Tensors
    info: DeviceInfo
    notes: list[str] = field(default_factory=list)
    launches_per_run: int = 0
    resources: dict = field(default_factory=dict)

    def prepare(self):
        raise NotImplementedError

    def outputs(self) -> dict:
        return {t: self.tensors.get(t) for t in self.reg.outputs}

    def pre(self, poison: bool = True):
        if poison:
            for a in self.outputs().values():
                a.view(_cp().uint16).fill(POISON)

    def run(self, stream):
        raise NotImplementedError

    def after(self):
        """Checks after a run (the pipeline's error word)."""


_CUBLAS = None
_ONE, _ZERO = np.array(1.0, np.float32), np.array(0.0, np.float32)


def _libcublas():
    """libcublas, called through ctypes on the handle CuPy made: CuPy's bindings set the
    handle's stream on every call and refuse to while a stream captures, yet cuBLAS itself can
    be captured (CUDA 12.2+ allocates its workspace stream-ordered)."""
    global _CUBLAS
    if _CUBLAS is None:
        import ctypes.util

        from cupy_backends.cuda.libs import cublas  # noqa: F401  loads the library CuPy uses
        path = next((ln.split()[-1] for ln in open("/proc/self/maps") if "/libcublas.so" in ln), None)
        lib = ctypes.CDLL(path or ctypes.util.find_library("cublas"))
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        lib.cublasGemmStridedBatchedEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32,
                                                   i32, i64, vp, vp, i32, i32, i64, i32, i32, i32]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasGetStream_v2.argtypes = [vp, ctypes.POINTER(vp)]
        lib.cublasSetPointerMode_v2.argtypes = [vp, i32]
        lib.cublasGetPointerMode_v2.argtypes = [vp, ctypes.POINTER(i32)]
        _CUBLAS = lib
    return _CUBLAS


def _check_cublas(status: int, what: str) -> None:
    if status != 0:
        raise KitsuneError(f"cuBLAS {what} returned status {status}")


def cublas_strided_batched(A, B, C, grp: Group) -> None:
    """C[b] = A[b] @ B[b] (B[b]^T when grp.tb) for every batch b with one
    cublasGemmStridedBatchedEx call, fp32 accumulation (row-major operands are column-major
    transposes: C^T = B^T A^T), on the current stream; capturable."""
    cp = _cp()
    lib = _libcublas()
    h = ctypes.c_void_p(cp.cuda.device.get_cublas_handle())
    m, n, k, nb = grp.mper, grp.cols, grp.k, grp.batch
    dt = 2 if A.dtype == cp.float16 else 14          # CUDA_R_16F / CUDA_R_16BF
    stream = cp.cuda.get_current_stream().ptr
    cur = ctypes.c_void_p()
    _check_cublas(lib.cublasGetStream_v2(h, ctypes.byref(cur)), "getStream")
    if (cur.value or 0) != stream:
        _check_cublas(lib.cublasSetStream_v2(h, ctypes.c_void_p(stream)), "setStream")
    mode = ctypes.c_int()
    _check_cublas(lib.cublasGetPointerMode_v2(h, ctypes.byref(mode)), "getPointerMode")
    if mode.value != 0:          # alpha and beta are host scalars (a graph captures their values)
        _check_cublas(lib.cublasSetPointerMode_v2(h, 0), "setPointerMode")
    status = lib.cublasGemmStridedBatchedEx(
        h, 1 if grp.tb else 0, 0, n, m, k,                                 # CUBLAS_OP_T / CUBLAS_OP_N
        _ONE.ctypes.data, B.data.ptr, dt, k if grp.tb else n, n * k,
        A.data.ptr, dt, k, m * k, _ZERO.ctypes.data, C.data.ptr, dt, n, m * n, nb,
        68, 99)                                                            # COMPUTE_32F, DEFAULT_TENSOR_OP
    if mode.value != 0:
        lib.cublasSetPointerMode_v2(h, mode.value)
    _check_cublas(status, "gemmStridedBatchedEx")


class StandaloneVariant(Variant):
    """One kernel per group, eager or as a CUDA graph."""

    def __init__(self, name, reg, tensors, info, groups: list[Group], graph: bool = False,
                 prefix: str | None = None, cublas_steps=None, graph_per_kernel: bool = False):
        super().__init__(name, reg, tensors, info)
        self.groups = groups
        self.graph_mode = graph or graph_per_kernel
        self.host_issued = not self.graph_mode    # the host issues each kernel as the run goes
        # each kernel its own CUDA graph, launched one after another from Python: what a plan
        # of one-kernel regions does end to end (calibration of the cost of a region boundary)
        self.graph_per_kernel = graph_per_kernel
        self.graphs = None
        self.prefix = prefix or name.replace("-", "_")
        self.cublas_steps = cublas_steps
        self.graph = None
        self.private: dict[str, object] = {}

    def build(self):
        """Pure Python: the module source, its launches and pointer-table names (no CuPy)."""
        bt = codegen.BufTable()
        groups = self.groups if self.cublas_steps is None else [g for k, g in self.cublas_steps if k == "group"]
        self._groups = groups
        self.source, self._launches, self._ws = codegen.standalone_source(
            self.reg, groups, bt, self.info.sm_count, self.prefix)
        self._names = bt.names
        return self.source

    def prepare(self):
        cp = _cp()
        self.build()
        src, launches, ws, groups = self.source, self._launches, self._ws, self._groups
        for w, nbytes in ws.items():
            self.private[w] = cp.empty((nbytes // 4,), dtype=cp.float32)
        self.table = pointer_table(self._names, lambda n: self.private[n] if n in self.private else self.tensors.get(n))
        mod = compile_module(src, self.info.arch) if launches else None
        self.calls = []
        by_group: dict[str, list] = {}
        for ln in launches:
            fn = mod.get_function(ln.kernel)
            if ln.smem > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = ln.smem
            self.resources[ln.kernel] = kernel_resources(fn)
            by_group.setdefault(ln.group, []).append((fn, ln))
        if self.cublas_steps is None:
            for g in groups:
                self.calls += [("k", x) for x in by_group.get(g.name, [])]
        else:
            for kind, obj in self.cublas_steps:
                if kind == "cublas":
                    a, b, out, grp = obj
                    A, B, C = self.tensors.get(a), self.tensors.get(b), self.tensors.get(out)
                    A = A.reshape(-1, grp.k)
                    if grp.batch == 1:   # one product: the batch's rows are all of A's
                        C = C.reshape(-1, grp.cols)
                        if C.shape[0] != A.shape[0] or B.size != grp.k * grp.cols:
                            raise KitsuneError(f"cublas: {a} {A.shape} x {b} {B.shape} -> {out} {C.shape}")
                        grp = dataclasses.replace(grp, mper=A.shape[0])
                    # cuBLAS's own call (cublasGemmStridedBatchedEx) for every product, which a
                    # CUDA graph can capture: CuPy's matmul spent 37-52 us of host time a call,
                    # this call 27-39 in the next process on the same machine
                    # (bench/eager_probe.py; the cublas variant is host bound on small models);
                    # CuPy's batched matmul is ~12x slower still
                    self.calls.append(("bmm", (A, B, C, grp)))
                else:
                    self.calls += [("k", x) for x in by_group.get(obj.name, [])]
        self.launches_per_run = len(self.calls)

    def _launch_all(self):
        for call in self.calls:
            self._issue(call)

    def _issue(self, call):
        kind, obj = call
        if kind == "k":
            fn, ln = obj
            fn(ln.grid, (ln.block,), (self.table,), shared_mem=ln.smem)
        else:
            cublas_strided_batched(*obj)

    def kernel_times(self, stream, flush=None, runs: int = 5) -> list[tuple[str, float]]:
        """Per group (an op, or a fusion group), the median device time between CUDA events
        recorded around its launches, in eager order on cold L2: (ops joined by '+', seconds).
        The GPU is held behind the flush and more memsets until the host has issued every
        launch and event, so each step is the kernel and the device's gap between dependent
        launches, not the host's issue (up to 20 us a launch with its event on the lent
        machines, which made dlrm's tiny kernels read 3-8x their time)."""
        cp = _cp()
        hold = math.ceil(len(self.calls) * 40e-6 / 90e-6)     # ~90 us a 256 MiB memset
        names = []
        for kind, obj in self.calls:
            names.append(obj[1].group if kind == "k" else "mm")
        group_ops = {g.name: "+".join(g.ops) for g in self._groups}
        samples = []
        for _ in range(runs):
            self.pre(False)
            if flush is not None:
                for _ in range(hold):
                    flush(stream)
            ev = [cp.cuda.Event() for _ in range(len(self.calls) + 1)]
            with stream:
                ev[0].record(stream)
                for i, call in enumerate(self.calls):
                    self._issue(call)
                    ev[i + 1].record(stream)
            ev[-1].synchronize()
            samples.append([cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) * 1e-3 for i in range(len(self.calls))])
        med = np.median(np.asarray(samples), axis=0)
        out: list[tuple[str, float]] = []
        for n, t in zip(names, med):
            label = group_ops.get(n, n)
            if out and out[-1][0] == label:      # a split-K GEMM's reduce joins its GEMM
                out[-1] = (label, out[-1][1] + float(t))
            else:
                out.append((label, float(t)))
        return out

    def run(self, stream):
        if not self.graph_mode:
            with stream:
                self._launch_all()
            return
        if self.graph_per_kernel:
            if self.graphs is None:
                self.graphs = []
                with stream:
                    for call in self.calls:
                        stream.begin_capture()
                        try:
                            self._issue(call)
                        finally:
                            self.graphs.append(stream.end_capture())
            for g in self.graphs:
                g.launch(stream)
            return
        if self.graph is None:
            with stream:
                stream.begin_capture()
                try:
                    self._launch_all()
                finally:
                    self.graph = stream.end_capture()
        self.graph.launch(stream)


# -- programmatic dependent launch (cuLaunchKernelEx through ctypes: CuPy has no launch attributes)
class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6     # CUlaunchAttributeID (cuda.h)
_libcuda = None


def launch_programmatic(fn, grid, block: int, smem: int, arg_ptr: int, stream_ptr: int,
                        programmatic: bool) -> None:
    """Launch `fn(void* const* bufs)`; programmatic: its CTAs may start once every CTA of the
    stream's previous kernel has executed griddepcontrol.launch_dependents (or exited)."""
    global _libcuda
    if _libcuda is None:
        try:
            _libcuda = ctypes.CDLL("libcuda.so.1")
            _libcuda.cuLaunchKernelEx.restype = ctypes.c_int
        except (OSError, AttributeError) as e:
            raise PipelineError(f"tilesync needs cuLaunchKernelEx (CUDA driver >= 12.0): {e}") from e
    g = tuple(grid) + (1,) * (3 - len(grid))
    attr = _LaunchAttr(id=_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    cfg = _LaunchConfig(g[0], g[1], g[2], block, 1, 1, smem, ctypes.c_void_p(stream_ptr),
                        ctypes.pointer(attr) if programmatic else None, 1 if programmatic else 0)
    arg = ctypes.c_uint64(arg_ptr)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), ctypes.c_void_p))
    rc = _libcuda.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fn.kernel.ptr), params, None)
    if rc != 0:
        raise PipelineError(f"cuLaunchKernelEx failed with CUresult {rc} (kernel grid {g}, {smem} B smem)")


def level_order(groups: list[Group]) -> list[Group]:
    """Groups sorted (stably) by dependency depth: the kernels of a concurrent level adjacent."""
    depth: dict[str, int] = {}
    writer: dict[str, str] = {}
    for g in groups:
        depth[g.name] = 1 + max((depth[writer[t]] for t in g.reads() if t in writer), default=-1)
        for t in g.stores:
            writer[t] = g.name
    return sorted(groups, key=lambda g: depth[g.name])


class TilesyncVariant(StandaloneVariant):
    """A tilesync region (kernels overlap tile by tile: a consumer tile starts once the rows it
    reads are written, on the SMs the producer's last wave leaves) or a concurrent region
    (independent kernels of a level run side by side; a kernel waits for its producers to
    finish). Programmatic dependent launches with flag hand-offs (tilesync.py), as a CUDA graph."""

    def __init__(self, name, reg, tensors, info, groups: list[Group], strategy: str,
                 graph: bool = True, timeout_s: float = 1.0, plant_deadlock: bool = False,
                 probe: str = "", trace: bool = False):
        super().__init__(name, reg, tensors, info, groups, graph=graph, prefix="ts")
        self.strategy = strategy
        self.plant_deadlock = plant_deadlock
        self.probe = probe
        self.trace = trace          # every CTA records its times and SM (bench/tilesync_probe.py)
        self.programmatic = True    # False: plain stream order (under ncu's range replay)
        self.timeout_ns = int(timeout_s * 1e9)

    def build(self):
        bt = codegen.BufTable()
        tiles = {g.name: codegen.choose_gemm_tile(g, self.info.sm_count) for g in self.groups
                 if g.kind == "gemm"}
        self.sync = plan_sync(self.groups, self.strategy, tiles, self.timeout_ns, self.probe, self.trace)
        if self.plant_deadlock:     # (tests) waiters need one tile more than a producer finishes
            for gs in self.sync.groups.values():
                if gs.waits:
                    gs.waits[0][0].per_unit += 1
                    gs.waits[0][0].total += gs.waits[0][0].units
                    break
        self._groups = self.groups
        self.source, self._launches, self._ws = codegen.standalone_source(
            self.reg, self.groups, bt, self.info.sm_count, self.prefix, sync=self.sync)
        self._ws[SYNC_BUF] = 4 * self.sync.words      # allocated with the workspaces
        self._names = bt.names
        return self.source

    def prepare(self):
        super().prepare()
        self.private[SYNC_BUF] = self.private[SYNC_BUF].view(_cp().uint32)

    def _launch_all(self):
        cp = _cp()
        stream = cp.cuda.get_current_stream()
        flags = self.private[SYNC_BUF]
        cp.cuda.runtime.memsetAsync(flags.data.ptr, 0, flags.nbytes, stream.ptr)
        for i, (_, (fn, ln)) in enumerate(self.calls):
            if self.programmatic:
                launch_programmatic(fn, ln.grid, ln.block, ln.smem, self.table.data.ptr, stream.ptr, i > 0)
            else:
                fn(ln.grid, (ln.block,), (self.table,), shared_mem=ln.smem)

    def kernel_times(self, stream, flush=None, runs: int = 5):
        raise PipelineError("tilesync kernels overlap: there are no per-kernel times")

    def trace_records(self) -> dict:
        """The last run's CTA records of a traced variant: kernel -> uint64 array of rows
        (start, inputs ready, end in ns of %globaltimer, SM id, clock64 at start and end), in
        blockIdx order."""
        if self.sync.trace_off < 0:
            raise PipelineError("this variant was built without trace=True")
        words = self.private[SYNC_BUF][self.sync.trace_off:].get()
        recs = words.view("uint64").reshape(-1, self.sync.TRACE_WORDS // 2)
        return {gs.name: recs[gs.trace_base: gs.trace_base + gs.ctas]
                for gs in sorted(self.sync.groups.values(), key=lambda g: g.index)}

    def after(self):
        c = self.private[SYNC_BUF][:6].get()
        if c[0]:
            raise PipelineError(f"{self.strategy} hand-off timed out: {self.sync.describe(int(c[2]))} "
                                f"(CTA {int(c[1])}, unit {int(c[3]) if int(c[3]) != 0xFFFFFFFF else 'all'}, "
                                f"counter {int(c[5])}, needed {int(c[4])}) after {self.timeout_ns / 1e6:.0f} ms")


class PipelineVariant(Variant):
    """The plan's persistent kernel: one CTA per SM, stages on contiguous blockIdx ranges."""

    def __init__(self, name, reg, tensors, info, plan_region: dict, timeout_s: float = 1.0,
                 plant_deadlock: bool = False, teams: int | None = None, trace: bool = False):
        super().__init__(name, reg, tensors, info)
        self.teams = teams
        self.trace = trace
        self.plan_region = plan_region
        self.timeout_ns = int(timeout_s * 1e9)
        self.plant_deadlock = plant_deadlock
        self.placement: dict = {}

    def build(self):
        """Pure Python: layout and source of the persistent kernel (no CuPy)."""
        lay: PipelineLayout = layout_pipeline(self.reg, self.plan_region, self.plant_deadlock, self.teams, self.trace)
        self.layout = lay
        self.notes = list(dict.fromkeys(self.notes + lay.notes))
        if lay.grid > self.info.sm_count:
            raise PipelineError(f"the pipeline needs {lay.grid} CTAs, one per SM; the device has "
                                f"{self.info.sm_count} SMs")
        bt = codegen.BufTable()
        self.source = codegen.pipeline_source(lay, bt)
        self._names = bt.names
        return self.source

    def prepare(self):
        cp = _cp()
        self.build()
        lay = self.layout
        want = []           # (name, shape, dtype) of the rings and the K-split scratch
        for r in lay.rings:
            if not r.direct:
                want.append(("ring:" + r.tensor, (r.nslots * lay.bm, r.cols), storage_dtype(self.reg.dtype)))
        for st in lay.steps:
            if st.ksplit > 1:   # fp32 partials of the K ranges (L2-resident scratch)
                n = st.ws_slots * st.ksplit * st.group.nb * lay.bm * st.group.cols
                want.append((f"ws:{st.sid}", (n,), np.float32))
        self.rings = _ring_buffers(want, os.environ.get("KDSE_RING_ALLOC", "separate"))
        self.table = pointer_table(self._names, lambda n: self.rings[n] if n in self.rings else self.tensors.get(n))
        self.ctrl = cp.zeros((lay.ctrl_words,), dtype=cp.uint32)
        mod = compile_module(self.source, self.info.arch)
        fn = mod.get_function(codegen.PIPELINE_KERNEL)
        need = codegen.pipeline_smem(lay) * lay.teams
        # force one CTA per SM: more than half of the SM's shared memory per CTA
        dyn = max(need, self.info.smem_per_sm // 2 + 16)
        dyn = (dyn + 15) // 16 * 16
        if dyn > self.info.smem_per_block_optin:
            raise PipelineError(f"the pipeline kernel needs {dyn} B of shared memory per CTA; the "
                                f"device allows {self.info.smem_per_block_optin}")
        fn.max_dynamic_shared_size_bytes = dyn
        self.threads = 256 * lay.teams
        occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, self.threads, dyn)
        self.resources[codegen.PIPELINE_KERNEL] = {**kernel_resources(fn), "dyn_smem": dyn, "occupancy": occ}
        if occ < 1:
            raise PipelineError(f"the pipeline kernel cannot run at all ({fn.num_regs} registers x "
                                f"{self.threads} threads, {dyn} B shared memory)")
        if lay.grid > occ * self.info.sm_count:
            raise PipelineError(f"grid of {lay.grid} CTAs cannot be co-resident ({occ} per SM x "
                                f"{self.info.sm_count} SMs); refusing to run (never shrunk)")
        if occ != 1:
            self.notes.append(f"occupancy {occ} CTAs/SM despite the shared-memory forcing: "
                              f"placement on distinct SMs not guaranteed")
        self.fn, self.dyn = fn, dyn
        self.launches_per_run = 1

    def pre(self, poison: bool = True):
        super().pre(poison)
        if poison:
            for a in self.rings.values():
                a.view(_cp().uint16).fill(POISON)
        self.ctrl.fill(0)

    def run(self, stream):
        with stream:
            self.fn((self.layout.grid,), (self.threads,), (self.table, self.ctrl, np.uint64(self.timeout_ns)),
                    shared_mem=self.dyn)

    def after(self):
        lay = self.layout
        c = self.ctrl.get()
        if c[0]:
            what = {1: "a row-block to be complete (full)", 2: "a free ring slot (empty)",
                    3: "a column slab (split-K)"}.get(int(c[0]), f"code {c[0]}")
            cta, team = divmod(int(c[1]), lay.teams)
            stage = next((s.sid for s in lay.stages if s.first_cta <= cta < s.first_cta + s.ctas), -1)
            ring = lay.rings[int(c[2])].tensor if int(c[2]) < len(lay.rings) else "?"
            raise PipelineError(f"pipeline deadlock: CTA {cta} team {team} (stage {stage}) waited more than "
                                f"{self.timeout_ns / 1e6:.0f} ms for {what} of ring {ring!r} at row-block "
                                f"{int(c[3])} (counter {int(c[5])}, needed {int(c[4])})")
        sm = c[lay.smid_off: lay.smid_off + lay.grid]
        distinct = len(set(int(x) for x in sm))
        per_stage = []
        for s in lay.stages:
            per_stage.append(sorted(set(int(x) for x in sm[s.first_cta: s.first_cta + s.ctas])))
        disjoint = all(not (set(a) & set(b)) for i, a in enumerate(per_stage) for b in per_stage[i + 1:])
        self.placement = {"ctas": lay.grid, "distinct_sms": distinct, "stages_disjoint": disjoint,
                          "sms_per_stage": [len(x) for x in per_stage]}
        ts = c[lay.time_off: lay.time_off + lay.grid * lay.teams * 4].view(np.uint64).reshape(-1, 2)
        if ts.size and int(ts[:, 0].min()) > 0:
            t0 = int(ts[:, 0].min())
            ends, firsts = [], []
            for s in lay.stages:
                w = ts[s.first_cta * lay.teams:(s.first_cta + s.ctas) * lay.teams, 1].astype(np.int64) - t0
                ends.append(round(float(w.max()) / 1e3, 2))
                firsts.append(round(float(w.min()) / 1e3, 2))
            # per stage: when its last worker finished and when its first did (us after the kernel's start)
            self.placement["stage_end_us"] = ends
            self.placement["stage_first_end_us"] = firsts
            # %globaltimer of the first worker's start and the last worker's end (ns): against
            # stamps taken by kernels before and after, the launch and exit outside the span
            self.placement["kernel_begin_ns"] = t0
            self.placement["kernel_end_ns"] = int(ts[:, 1].max())
            if lay.trace_off:   # per step, per row-block: when its items started and ended (us)
                n = len(lay.steps) * lay.nrb
                tr = c[lay.trace_off: lay.trace_off + 2 * TRACE_ARRAYS * n].view(np.uint64)
                tr = tr.reshape(TRACE_ARRAYS, len(lay.steps), lay.nrb)

                def us(a, complemented=False):
                    a = ~a if complemented else a
                    return [[round(float(int(x) - t0) / 1e3, 2) for x in row] for row in a]
                self.placement["step_rb_done_us"] = us(tr[TRACE_END_MAX])
                self.placement["step_rb_first_done_us"] = us(tr[TRACE_END_MIN], True)
                self.placement["step_rb_start_us"] = us(tr[TRACE_START_MIN], True)
                self.placement["step_rb_last_start_us"] = us(tr[TRACE_START_MAX])
                self.placement["step_stage"] = [st.stage for st in lay.steps]
            if lay.clock_off:   # per stage: its workers' SM cycles over their nanoseconds (MHz)
                cs = c[lay.clock_off: lay.clock_off + lay.grid * lay.teams * 4].view(np.uint64).reshape(-1, 2)
                mhz = []
                for s in lay.stages:
                    w = slice(s.first_cta * lay.teams, (s.first_cta + s.ctas) * lay.teams)
                    ns = (ts[w, 1].astype(np.int64) - ts[w, 0].astype(np.int64)).sum()
                    cyc = (cs[w, 1].astype(np.int64) - cs[w, 0].astype(np.int64)).sum()
                    mhz.append(round(float(cyc) / max(1, int(ns)) * 1e3, 1))
                self.placement["stage_mhz"] = mhz
        if distinct != lay.grid:
            raise PipelineError(f"placement: {lay.grid} CTAs ran on only {distinct} distinct SMs")


def make_variants(reg: Region, plan_region: dict, tensors: Tensors, info: DeviceInfo,
                  timeout_s: float = 1.0, which: list[str] | None = None) -> list[Variant]:
    out: list[Variant] = []
    want = set(which) if which else None

    def ok(n):
        return want is None or n in want
    strategy = plan_region["strategy"]
    if ok("plan"):
        if strategy == "pipeline":
            out.append(PipelineVariant("plan", reg, tensors, info, plan_region, timeout_s))
            if want is not None and "plan-1team" in want:
                out.append(PipelineVariant("plan-1team", reg, tensors, info, plan_region, timeout_s, teams=1))
        elif strategy in ("bsp", "fusion"):
            # as the explorer prices them: the region's kernels as one CUDA graph
            groups = bsp_groups(reg) if strategy == "bsp" else fusion_groups(reg)
            out.append(StandaloneVariant("plan", reg, tensors, info, groups, graph=True, prefix="plan"))
        elif strategy == "tilesync":
            out.append(TilesyncVariant("plan", reg, tensors, info, fusion_groups(reg), "tilesync",
                                       timeout_s=timeout_s))
        elif strategy == "concurrent":
            out.append(TilesyncVariant("plan", reg, tensors, info, level_order(bsp_groups(reg)),
                                       "concurrent", timeout_s=timeout_s))
        else:
            v = StandaloneVariant("plan", reg, tensors, info, fusion_groups(reg), prefix="plan")
            v.notes.append(f"strategy {strategy!r} is not implemented by the harness: ran its kernel groups eagerly")
            out.append(v)
    if ok("bsp-eager"):
        out.append(StandaloneVariant("bsp-eager", reg, tensors, info, bsp_groups(reg), prefix="bsp"))
    if ok("bsp-graph"):
        out.append(StandaloneVariant("bsp-graph", reg, tensors, info, bsp_groups(reg), graph=True, prefix="bsp"))
    if ok("fusion"):
        out.append(StandaloneVariant("fusion", reg, tensors, info, fusion_groups(reg), prefix="fus"))
    if ok("fusion-graph"):
        out.append(StandaloneVariant("fusion-graph", reg, tensors, info, fusion_groups(reg), graph=True, prefix="fus"))
    has_gemm = any(reg.graph.op(o).kind in ("matmul", "gemm", "bmm") for o in reg.ops)
    for name, graph in (("cublas", False), ("cublas-graph", True)):
        if ok(name) and has_gemm and reg.dtype == "fp16":
            out.append(StandaloneVariant(name, reg, tensors, info, [], graph=graph, prefix="cub",
                                         cublas_steps=cublas_plan(reg)))
    return out


def wall(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
