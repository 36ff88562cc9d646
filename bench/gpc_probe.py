"""Which GPC each SM belongs to, and which SMs the hardware gives a grid of N one-per-SM CTAs
(issue 6 lead: the persistent GEMM's time per tile depends on how many SMs it runs on, not
monotonically; the runtime's stages take whatever SMs the block scheduler picks).

CUDA does not expose a GPC id. A thread-block cluster's CTAs all run in one GPC, so launching
clusters of 2-16 CTAs (one per SM: more than half an SM's shared memory) many times, with
random spin times so that they land differently, and joining the SMs that shared a cluster
(union-find) gives the GPCs as connected components. Cluster launches go through the driver's
cuLaunchKernelEx (ctypes: CuPy has no cluster launch).

    device:  python3 bench/gpc_probe.py --out $OUT         # -> gpc_probe.json, a table
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

SRC = r"""
extern "C" __global__ void kdse_gpc_probe(unsigned* out, unsigned long long spin_ns) {
    extern __shared__ unsigned char smem[];
    if (threadIdx.x == 0) {
        unsigned s, cid, rank;
        unsigned long long t0, t;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        smem[0] = (unsigned char)s;
        t = t0;
        while (t - t0 < spin_ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        out[3 * blockIdx.x] = s;
        out[3 * blockIdx.x + 1] = cid;
        out[3 * blockIdx.x + 2] = rank;
    }
}
"""
SMEM_BYTES = 150 * 1024      # more than half of an SM's 228 KB: one CTA per SM
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster", ctypes.c_uint * 3)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("numAttrs", ctypes.c_uint)]


class UnionFind:
    def __init__(self):
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)

    def groups(self) -> list[list[int]]:
        out: dict[int, list[int]] = {}
        for x in self.parent:
            out.setdefault(self.find(x), []).append(x)
        return sorted((sorted(g) for g in out.values()), key=lambda g: g[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--launches", type=int, default=60, help="cluster launches per cluster size")
    a = ap.parse_args()
    import cupy as cp
    import numpy as np

    kern = cp.RawKernel(SRC, "kdse_gpc_probe", options=("-std=c++17",))
    kern.max_dynamic_shared_size_bytes = SMEM_BYTES
    fn = kern.kernel.ptr
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    cuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    non_portable = cuda.cuFuncSetAttribute(ctypes.c_void_p(fn), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    rng = np.random.default_rng(0)
    out = cp.zeros(3 * 4 * sms, dtype=cp.uint32)

    def launch(grid: int, cluster: int, spin_ns: int) -> np.ndarray:
        out.fill(0xFFFFFFFF)
        arg_out, arg_spin = ctypes.c_void_p(out.data.ptr), ctypes.c_uint64(spin_ns)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(arg_out), ctypes.addressof(arg_spin))
        attr = _Attr(id=CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        attr.value.cluster[0], attr.value.cluster[1], attr.value.cluster[2] = cluster, 1, 1
        cfg = _Config(grid, 1, 1, 128, 1, 1, SMEM_BYTES, None, ctypes.pointer(attr), 1 if cluster > 1 else 0)
        rc = cuda.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fn), params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx rc {rc} (grid {grid}, cluster {cluster})")
        cp.cuda.Device().synchronize()
        return out[:3 * grid].get().reshape(grid, 3)

    uf = UnionFind()
    seen_sizes = {}
    for cluster in (2, 4, 8, 16):
        ok = 0
        for i in range(a.launches):
            clusters = int(rng.integers(1, 4 * sms // cluster + 1))
            try:
                r = launch(clusters * cluster, cluster, int(rng.integers(2_000, 60_000)))
            except RuntimeError as e:
                print(e)
                break
            ok += 1
            for cid in np.unique(r[:, 1]):
                members = r[r[:, 1] == cid, 0]
                for s in members[1:]:
                    uf.join(int(members[0]), int(s))
        seen_sizes[cluster] = ok
    for s in range(sms):
        uf.find(s)
    gpcs = uf.groups()
    gpc_of = {s: i for i, g in enumerate(gpcs) for s in g}

    # what a plain grid of N one-per-SM CTAs gets (the runtime's stages)
    plain = {}
    for n in (1, 2, 4, 8, 12, 16, 17, 24, 32, 33, 44, 48, 66, 88, 99, 132):
        orders = []
        for rep in range(3):
            r = launch(n, 1, 20_000)
            orders.append([int(x) for x in r[:, 0]])
        per_gpc = [sum(1 for s in orders[0] if gpc_of[s] == g) for g in range(len(gpcs))]
        plain[n] = {"smids": orders, "same_every_time": all(o == orders[0] for o in orders),
                    "ctas_per_gpc": per_gpc}
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "sms": sms,
           "command": " ".join(["python3"] + sys.argv), "non_portable_attr_rc": non_portable,
           "cluster_launches": seen_sizes, "gpcs": gpcs, "plain_grids": plain}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpc_probe.json").write_text(json.dumps(res, indent=1))
    print(f"{len(gpcs)} GPCs, sizes {[len(g) for g in gpcs]}; cluster launches per size {seen_sizes}")
    for i, g in enumerate(gpcs):
        print(f"GPC {i}: {g}")
    print(f"{'CTAs':>5s} {'same':>5s}  CTAs per GPC   first SMs")
    for n, p in plain.items():
        print(f"{n:5d} {str(p['same_every_time']):>5s}  {p['ctas_per_gpc']}  {p['smids'][0][:12]}")


if __name__ == "__main__":
    main()
