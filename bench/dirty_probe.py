"""What a kernel pays for the dirty lines L2 holds when it starts: the same standalone kernels
(what a bsp or fusion region launches) timed after three different L2 flushes of 256 MiB,
  write        a store of every byte (the harness's flush is a memset: L2 full of dirty lines);
  read         a load of every byte (L2 full of clean lines: the dirty ones were written back);
  write+idle   the store, then 200 us of one spinning thread (whether L2 cleans itself idle);
  read+busy    the load, then ~450 us of FMAs on every SM (a kernel's power draw before it);
  read+gemm    the load, then two cuBLAS 4096^3 fp16 GEMMs (~400 us of tensor-core load);
and, with --ncu, the DRAM bytes each kernel moves after each flush (ncu, kernel replay of one
pass, caches left as they are). None is a suite kernel's shape except the 4096 x 4096 LayerNorm
(ln-residual-gemm's, as a diagnostic).

    here:    python bench/dirty_probe.py --precompile
    device:  python3 bench/dirty_probe.py --out $OUT [--runs 20]
             ncu --csv --cache-control none --clock-control none --replay-mode kernel \\
                 --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \\
                 python3 bench/dirty_probe.py --ncu > $OUT/dirty_ncu.csv
    here:    python bench/dirty_probe.py --report DIR
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

CASES = [("relu", (8192, 1024)), ("relu", (32768, 1024)), ("add", (8192, 1024)),
         ("layernorm", (4096, 4096)), ("mmbias", (32768, 1, 256)), ("mmbias", (32768, 128, 256)),
         ("mmbias", (131072, 128, 64)), ("mmbias", (8192, 1024, 1024)), ("mmbias", (4096, 4096, 4096)),
         ("mmbias", (8192, 2048, 2048))]
FLUSHES = ("write", "read", "write+idle", "read+busy", "read+gemm")
FLUSH_BYTES = 256 << 20

_SRC = r"""
extern "C" __global__ void kd_flush_write(unsigned int* p, unsigned long long n, unsigned int v) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) p[i] = v;
}
extern "C" __global__ void kd_flush_read(const uint4* p, unsigned long long n, unsigned int* out) {
    unsigned int acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) { uint4 x = p[i]; acc ^= x.x ^ x.y ^ x.z ^ x.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" __global__ void kd_busy(long long cycles, float* out) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f, d = blockIdx.x * 1e-3f;
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
        #pragma unroll 16
        for (int i = 0; i < 64; ++i) { a = fmaf(a, b, c); d = fmaf(d, c, b); }
    }
    if (a + d == 12345.0f) out[0] = a + d;
}
extern "C" __global__ void kd_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { __nanosleep(1000); }
}
"""


def variants(info):
    from kitsune_dse.validate.lower import Region, bsp_groups, fusion_groups
    from kitsune_dse.validate.microbench import case_model
    from kitsune_dse.validate.runtime import StandaloneVariant, Tensors
    out = []
    for kind, dims in CASES:
        g, region = case_model(kind, "fp16", dims)
        if len(dims) == 3:
            reg = Region(g, {**region, "strategy": "fusion", "kernels": [[o.name for o in g.ops]]})
            v = StandaloneVariant("fused", reg, Tensors(reg), info, fusion_groups(reg), graph=True, prefix="dq")
        else:
            reg = Region(g, region)
            v = StandaloneVariant("bsp", reg, Tensors(reg), info, bsp_groups(reg), graph=True, prefix="dq")
        out.append((kind, dims, reg, v))
    return out


class Flushes:
    def __init__(self):
        import cupy as cp
        self.cp = cp
        mod = cp.RawModule(code=_SRC)
        self.write_k, self.read_k, self.spin_k, self.busy_k = (
            mod.get_function(n) for n in ("kd_flush_write", "kd_flush_read", "kd_spin", "kd_busy"))
        self.buf = cp.empty((FLUSH_BYTES // 4,), dtype=cp.uint32)
        self.out = cp.zeros((1,), dtype=cp.uint32)
        self.fout = cp.zeros((1,), dtype=cp.float32)
        self.ga = self.gb = None
        self.n = 0

    def __call__(self, how: str, stream) -> None:
        cp = self.cp
        self.n += 1
        if how.startswith("write"):
            self.write_k((1056,), (512,), (self.buf, cp.uint64(self.buf.size), cp.uint32(self.n)), stream=stream)
        else:
            self.read_k((1056,), (512,), (self.buf, cp.uint64(self.buf.size // 4), self.out), stream=stream)
        if how.endswith("idle"):
            self.spin_k((1,), (32,), (cp.int64(int(200e-6 * 1.98e9)),), stream=stream)
        if how.endswith("gemm"):    # what a chain's first GEMM leaves: tensor-core load, no wait
            if self.ga is None:
                self.ga = cp.ones((4096, 4096), dtype=cp.float16)
                self.gb = cp.ones((4096, 4096), dtype=cp.float16)
            with stream:
                for _ in range(2):
                    cp.matmul(self.ga, self.gb)
        if how.endswith("busy"):    # every SM's FMA pipes for ~450 us, no memory traffic
            self.busy_k((132 * 8,), (256,), (cp.int64(int(450e-6 * 1.98e9)), self.fout), stream=stream)


def measure(runs: int, ncu: bool = False) -> list[dict]:
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = Flushes()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    rows = []
    with stream:
        for kind, dims, reg, v in variants(info):
            try:
                v.prepare()
                chk = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
                for how in FLUSHES:
                    row = {"kind": kind, "dims": list(dims), "flush": how, "correct": chk["correct"]}
                    samples = []
                    for i in range((2 if ncu else runs) + 2):
                        v.pre(False)
                        flush(how, stream)
                        start.record(stream)
                        v.run(stream)
                        end.record(stream)
                        end.synchronize()
                        v.after()
                        if i >= 2:
                            samples.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
                    row["time_s"] = statistics.median(samples)
                    row["p10_s"], row["p90_s"] = (statistics.quantiles(samples, n=10)[0],
                                                  statistics.quantiles(samples, n=10)[-1])
                    rows.append(row)
            except Exception as e:  # noqa: BLE001
                rows.append({"kind": kind, "dims": list(dims), "error": f"{type(e).__name__}: {e}"})
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def model_time(spec, kind: str, dims) -> float:
    from kitsune_dse.cost.region import Region
    from kitsune_dse.cost.strategies import LaunchChoice, bsp, fusion
    from kitsune_dse.validate.microbench import case_model
    g, _ = case_model(kind, "fp16", tuple(dims))
    r = Region.of(g)
    return (fusion(r, spec) if len(dims) == 3 else bsp(r, spec, LaunchChoice("graph"))).latency_s


def report(src: Path) -> None:
    from kitsune_dse.hw import load_spec
    spec = load_spec(str(ROOT / "hw_specs/h100-sxm.calibrated.yaml"))
    d = json.loads((src / "dirty_probe.json" if src.is_dir() else src).read_text())
    by = {}
    for r in d["rows"]:
        if r.get("time_s"):
            by.setdefault((r["kind"], tuple(r["dims"])), {})[r["flush"]] = r["time_s"]
    print(f"{'kind':10s} {'dims':>16s} " + " ".join(f"{f:>11s}" for f in FLUSHES) + f" {'model':>8s}  (us)")
    for (kind, dims), t in by.items():
        print(f"{kind:10s} {'x'.join(map(str, dims)):>16s} "
              + " ".join(f"{t.get(f, float('nan')) * 1e6:11.1f}" for f in FLUSHES)
              + f" {model_time(spec, kind, dims) * 1e6:8.1f}")
    ncu = src / "dirty_ncu.csv" if src.is_dir() else None
    if ncu and ncu.exists():
        import csv
        lines = [x for x in ncu.read_text().splitlines() if x.startswith('"')]
        rows = list(csv.DictReader(lines))
        print("\nncu (per kernel, in launch order; MB):")
        agg = {}
        for r in rows:
            key = (r["ID"], r["Kernel Name"][:40])
            agg.setdefault(key, {})[r["Metric Name"]] = r["Metric Value"].replace(",", "")
        for (i, name), m in agg.items():
            rd = float(m.get("dram__bytes_read.sum", 0))
            wr = float(m.get("dram__bytes_write.sum", 0))
            print(f"{i:>5s} {name:40s} read {rd / 1e6:8.1f} write {wr / 1e6:8.1f} "
                  f"time {float(m.get('gpu__time_duration.sum', 0)) / 1e3:8.1f} us")


def precompile() -> None:
    from rowop_probe import precompile_variants
    precompile_variants(variants)


def main() -> None:
    from rowop_probe import probe_parser, save_rows
    ap = probe_parser(__doc__, 20)
    ap.add_argument("--ncu", action="store_true", help="two runs a case and flush, nothing written")
    a = ap.parse_args()
    if a.precompile:
        precompile()
        return
    if a.report:
        report(Path(a.report))
        return
    from kitsune_dse.validate.runtime import gpu_info
    _, env = gpu_info()
    rows = measure(a.runs, a.ncu)
    if not a.ncu:
        save_rows(a.out, "dirty_probe.json", env, a.runs, rows, label="flush")


if __name__ == "__main__":
    main()
