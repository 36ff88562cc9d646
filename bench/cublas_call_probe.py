"""Host cost of one cuBLAS GEMM call as the validation harness's cublas baseline makes it
(runtime.cublas_strided_batched: CuPy's cuBLAS bindings, launched eagerly): N calls back to
back, host time per call and GPU time per call (events), for a tiny product and dlrm's GEMMs;
and the host time of one call right after the host waited for the GPU (an eager run's first).

    device:  python3 bench/cublas_call_probe.py [--calls 2000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SHAPES = [(128, 128, 128), (2048, 1024, 512), (2048, 256, 512), (2048, 1, 256)]


def probe(calls: int, shapes=SHAPES) -> list[dict]:
    import cupy as cp

    from kitsune_dse.calibrate.microbench import first_call_host_s
    from kitsune_dse.validate.runtime import cublas_strided_batched
    rows = []
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for m, n, k in shapes:
            a = cp.ones((m, k), dtype=cp.float16)
            b = cp.ones((k, n), dtype=cp.float16)
            c = cp.empty((m, n), dtype=cp.float16)
            grp = SimpleNamespace(mper=m, cols=n, k=k, batch=1, tb=False)
            for _ in range(50):
                cublas_strided_batched(a, b, c, grp)
            stream.synchronize()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            t0 = time.perf_counter()
            for _ in range(calls):
                cublas_strided_batched(a, b, c, grp)
            host = (time.perf_counter() - t0) / calls
            e1.record(stream)
            e1.synchronize()
            # one call right after the host waited for the GPU, as a timed run's first
            first = first_call_host_s(cp, stream, lambda: cublas_strided_batched(a, b, c, grp))
            rows.append({"shape": [m, n, k], "host_s": host,
                         "gpu_s": cp.cuda.get_elapsed_time(e0, e1) * 1e-3 / calls,
                         "first_host_s": first})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    for r in probe(a.calls):
        print(f"cuBLAS {'x'.join(map(str, r['shape'])):>14s}: host {r['host_s'] * 1e6:6.2f} us/call, "
              f"GPU {r['gpu_s'] * 1e6:6.2f} us/call, first after a wait {r['first_host_s'] * 1e6:6.2f} us")


if __name__ == "__main__":
    main()
