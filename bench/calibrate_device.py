"""Calibration on the device machine: the `calibrate` microbenchmarks plus the validation
harness's own kernels, dumped as raw JSON (the fit runs elsewhere: kitsune_dse.calibrate.fit
imports pydantic, which the device machine lacks).

    here:    python bench/calibrate_device.py --precompile      # cubins into bench/.cubin_cache
    device:  python3 bench/calibrate_device.py --out $OUT [--smoke 'glob,...']
    here:    python bench/calibrate_device.py --fit RAW.json [RAW2.json ...]   # -> hw_specs/h100-sxm*.calibrated.yaml
             (several raws: each measured number is their median, calibrate.fit.merge_raw)

Measurements (SI units) in calibration.raw.json:
  everything of kitsune_dse.calibrate.microbench.run_all(): HBM and L2 read bandwidth against
  SMs used, SIMT FP32 rate, cuBLAS fp16/bf16 GEMM, launch overhead (eager and CUDA graph),
  cross-SM flag hand-off latency;
  tile_gemm_fp16      [(n, FLOP/s)] the harness's standalone GEMM tile kernel (mma.sync, 128x128x64,
                      3 stages, 2 CTAs/SM) on n^3 problems: what bsp/fusion/plan kernels run;
  tile_gemm_shapes    [{m, n, k, tile_flop_per_s, cublas_flop_per_s}] the GEMM shapes of the suite;
  pipe_gemm_fp16_sms  [(sms, FLOP/s)] the persistent pipeline kernel with ONE stage (one GEMM,
                      two 256-thread teams per CTA, one CTA per SM) on `sms` SMs: a pipeline
                      stage's tensor rate against its SM share;
  pipe_ew_sms         [(sms, bytes/s)] the same kernel running an elementwise add (read 2, write 1)
                      on `sms` SMs: a memory-bound stage's bandwidth against its SM share;
  narrow_rows         [{kind, dims, time_s}] standalone fused GEMMs narrower than their tile
                      beside the same GEMM at N = 128 (bench/narrow_probe.py's cases);
  env                 GPU, clocks, driver, CuPy, date.
Every spin in these kernels has a %globaltimer timeout (microbench ping-pong; pipeline waits).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

SQUARES = (1024, 2048, 4096, 8192)
# (m, n, k): the GEMMs of the validation suite (bench/validate_suite.py)
SUITE_SHAPES = [
    (2048, 6144, 12288), (2048, 12288, 6144),        # gpt3-mlp tokens 2048 tp 8
    (64, 49152, 12288), (64, 12288, 49152),          # gpt3-mlp tokens 64
    (2048, 11008, 4096), (2048, 4096, 11008),        # llama2-7b-mlp tokens 2048
    (4096, 4096, 4096),                              # ln-residual-gemm
    (262144, 256, 256),                              # nerf-mlp hidden layers
    (2048, 1024, 1024), (2048, 256, 512),            # dlrm-top-mlp
    (16384, 3072, 768), (16384, 768, 3072),          # bert-base FFN (gpt3-mlp hidden 768)
]
PIPE_SMS = (8, 16, 33, 66, 99, 132)
# the harness kernels these runs measure (calibrate.fit.merge_raw mixes no versions): 8 = a
# persistent step's item offset wraps in every stage (left out where it could not trigger, nvcc
# scheduled the GEMM main loop worse: bench/codegen_probe.py); 7 = a
# tilesync consumer's threads wait on the producer's unit counters in parallel (thread 0 alone
# had waited on them one after the other); 6 = a
# GEMM split along K waits for its output slot only in the team that sums its partials; 5 = a
# GEMM producer waits for its output ring slot just before its epilogue (session 8); 4 = a
# persistent worker visits only the row-blocks that hold its items (session 8); 3 = worker
# c of a stage is team c // ctas of CTA c % ctas, and K is split into ranges of 16 k-tiles or
# more; 2 (session 7) K split only when the tiles fill at most half the SMs; 1 (session 7) the
# old split; 0 before: the two teams of an SM were consecutive workers
HARNESS_VERSION = 8
# how cuBLAS is called (calibrate.fit.cublas_version): 1 = cublasGemmStridedBatchedEx via ctypes
CUBLAS_VERSION = 1
PIPE_GEMM = (4096, 4096, 4096)
PIPE_EW = (8192, 8192)


# (m, n, k): shapes that are not the suite's, where the math and the DRAM stream take about the
# same time or K is short (a few k-tiles per output tile): the standalone GEMM model's weak
# spot (attention's batched products and NeRF's narrow layers are such shapes)
BALANCE_SHAPES = [
    (65536, 128, 1024), (32768, 128, 2048), (131072, 128, 512),     # one column tile, A streamed
    (65536, 1024, 128), (32768, 2048, 128), (16384, 4096, 128),     # K of two k-tiles, C streamed
    (131072, 256, 512), (65536, 512, 512), (131072, 128, 320),      # narrow N; K not a power of two
    (131072, 512, 256), (8192, 8192, 256), (262144, 64, 128), (131072, 128, 280),
]


# K of one k-tile or less (NeRF's first layer, K = 60 padded to 64: -19.5% in the suite) and
# three, against N: measured apart (KDSE_TILE_SHAPES=short_k), not fitted (session 26:
# results/validation/h100/gemm_probe/short_k_2026-11-24/)
SHORT_K_SHAPES = [(262144, 256, 64), (262144, 128, 64), (65536, 1024, 64), (131072, 512, 64),
                  (262144, 256, 32), (262144, 256, 192)]


def tile_cases():
    cases = [("gemm", "fp16", "matmul", (n, n, n)) for n in SQUARES]
    cases += [("gemm", "fp16", "matmul", s) for s in SUITE_SHAPES if s[0] != s[1] or s[1] != s[2]]
    cases += [("gemm", "fp16", "matmul", s) for s in BALANCE_SHAPES]
    if os.environ.get("KDSE_TILE_SHAPES") == "balance":     # those alone (a partial raw)
        cases = [("gemm", "fp16", "matmul", s) for s in BALANCE_SHAPES]
    if os.environ.get("KDSE_TILE_SHAPES") == "short_k":
        cases = [("gemm", "fp16", "matmul", s) for s in BALANCE_SHAPES + SHORT_K_SHAPES]
    return cases


def pipe_region(kind: str, dims, sms, rows: int = 128, depth: int = 8):
    """A microbenchmark case as a pipeline region (validate.microbench.pipe_case_region)."""
    from kitsune_dse.validate.microbench import pipe_case_region
    return pipe_case_region(kind, dims, sms, rows, depth)


# diagnostics of the persistent kernel (one stage): (label, kind, dims, sms, L2 flushed?[, tile
# rows, 128 by default])
PIPE_DIAG = [
    ("fixed cost add 128x1024", "add", (128, 1024), 132, True),
    ("fixed cost add 128x1024", "add", (128, 1024), 8, True),
    ("L2-resident add 2048x2048", "add", (2048, 2048), 8, False),
    ("L2-resident add 2048x2048", "add", (2048, 2048), 33, False),
    ("L2-resident add 2048x2048", "add", (2048, 2048), 132, False),
    ("gemm K sweep", "matmul", (16384, 1024, 256), 132, True),
    ("gemm K sweep", "matmul", (16384, 1024, 1024), 132, True),
    ("gemm K sweep", "matmul", (16384, 1024, 4096), 132, True),
    ("gemm one column tile (pv-like)", "matmul", (65536, 128, 1024), 132, True),
    ("gemm nerf layer", "matmul", (262144, 256, 256), 132, True),
    # single GEMMs of the suite's shapes as one-stage kernels: weights streamed once (64 rows),
    # weights beyond L2 streamed again for every few row-blocks, and on a half-chip SM share
    ("gemm weight stream", "matmul", (64, 49152, 12288), 132, True),
    ("gemm weight stream", "matmul", (64, 49152, 12288), 66, True),
    ("gemm weight stream", "matmul", (64, 12288, 49152), 132, True),
    # the same with the 64-row tiles a 64-row plan tile runs (1.5x the operand loads per FLOP)
    ("gemm weight stream 64-row tiles", "matmul", (64, 49152, 12288), 132, True, 64),
    ("gemm weight stream 64-row tiles", "matmul", (64, 49152, 12288), 66, True, 64),
    ("gemm weight stream 64-row tiles", "matmul", (64, 12288, 49152), 132, True, 64),
    ("gemm weight stream", "matmul", (64, 12288, 49152), 66, True),
    ("gemm weight stream 64-row tiles", "matmul", (64, 12288, 49152), 66, True, 64),
    ("gemm 64-row tiles", "matmul", (4096, 4096, 4096), 132, True, 64),
    ("gemm 64-row tiles", "matmul", (4096, 4096, 4096), 33, True, 64),
    ("gemm weights beyond L2", "matmul", (2048, 6144, 12288), 132, True),
    ("gemm weights beyond L2", "matmul", (2048, 6144, 12288), 66, True),
    ("gemm weights beyond L2", "matmul", (2048, 12288, 6144), 44, True),
    ("gemm weights beyond L2", "matmul", (2048, 11008, 4096), 132, True),
    ("gemm weights beyond L2", "matmul", (2048, 4096, 11008), 88, True),
    ("gemm suite shape", "matmul", (16384, 3072, 768), 132, True),
    ("gemm suite shape", "matmul", (16384, 768, 3072), 66, True),
    ("gemm suite shape", "matmul", (2048, 1024, 1024), 132, True),
    # fewer tiles than SMs: every tile alone on its SM (a team without its SM-mate), against
    # the same tiles two per SM; short K on a quiet chip (the tile's fixed cost unloaded)
    ("gemm lone tiles", "matmul", (1024, 1024, 4096), 132, True),
    ("gemm lone tiles", "matmul", (1024, 1024, 4096), 32, True),
    ("gemm lone tiles", "matmul", (2048, 1024, 2048), 132, True),
    ("gemm quiet chip short K", "matmul", (1024, 1024, 256), 132, True),
    ("gemm quiet chip short K", "matmul", (1024, 1024, 256), 16, True),
    ("gemm quiet chip short K", "matmul", (16384, 1024, 256), 33, True),
    ("gemm quiet chip short K", "matmul", (8192, 1024, 128), 16, True),
    # one column tile of short K (two and four slabs: every item's loads exposed) over the SM
    # count: how the tile's fixed cost rises as the chip fills (gemm_tile_fixed_load_exponent)
    ("gemm one column short K", "matmul", (131072, 128, 128), 33, True),
    ("gemm one column short K", "matmul", (131072, 128, 128), 66, True),
    ("gemm one column short K", "matmul", (131072, 128, 128), 99, True),
    ("gemm one column short K", "matmul", (131072, 128, 128), 132, True),
    ("gemm one column short K", "matmul", (131072, 128, 256), 66, True),
    ("gemm one column short K", "matmul", (131072, 128, 256), 132, True),
    # dependent GEMMs in one stage, every row-block in flight (2048-row plan tiles): each step
    # of a row-block waits for the step before it (the hand-off between a stage's steps)
    ("gemm chain one stage", "chain", (2048, 1024, 1), 132, True, 2048),
    ("gemm chain one stage", "chain", (2048, 1024, 3), 132, True, 2048),
    ("gemm chain one stage", "chain", (2048, 1024, 5), 132, True, 2048),
    ("gemm chain one stage", "chain", (2048, 512, 5), 132, True, 2048),
    ("gemm chain one stage", "chain", (2048, 1024, 3), 66, True, 2048),
    # narrow layers, many row-blocks (NeRF's stages: 256-wide layers, 2 tiles per row-block)
    ("gemm chain one stage", "chain", (65536, 256, 3), 33, True, 1024),
    ("gemm chain one stage", "chain", (65536, 256, 3), 132, True, 128),
    ("gemm chain one stage", "chain", (16384, 512, 3), 66, True, 1024),
    # row ops (two passes over each row by a team's warps) as one-stage kernels
    ("row op", "layernorm", (4096, 4096), 4, True),
    ("row op", "layernorm", (4096, 4096), 16, True),
    ("row op", "layernorm", (4096, 4096), 66, True),
    ("row op", "layernorm", (4096, 4096), 132, True),
    ("row op", "softmax", (8192, 4096), 8, True),
    ("row op", "softmax", (8192, 4096), 68, True),
    ("row op", "softmax", (8192, 4096), 132, True),
    # narrow rows (1024, 2048 columns: attention scores of 1024-2048 keys)
    ("row op", "softmax", (65536, 1024), 68, True),
    ("row op", "softmax", (65536, 1024), 132, True),
    ("row op", "softmax", (32768, 2048), 68, True),
    ("row op", "layernorm", (65536, 1024), 66, True),
    # elementwise steps of one input (a ReLU, a concat: one load per output vector) against
    # the add sweep's two (session 8: NeRF's concat stages ran 2-3x the add-calibrated time)
    ("ew one input", "relu", (8192, 8192), 8, True),
    ("ew one input", "relu", (8192, 8192), 33, True),
    ("ew one input", "relu", (8192, 8192), 132, True),
    ("concat", "concat", (262144, 256, 64), 5, True),
    ("concat", "concat", (262144, 256, 64), 17, True),
    ("concat", "concat", (262144, 256, 64), 66, True),
    ("concat", "concat", (65536, 256, 32), 33, True),
    # two stages through a ring (8 plan tiles deep): what a stage pays for publishing its
    # items and sharing the chip, against the same GEMMs as one-stage kernels above
    ("ring pair", "mmrelu", (16384, 1024, 256), (66, 66), True),
    ("ring pair", "mmrelu", (16384, 1024, 1024), (88, 44), True),
    ("ring pair", "mmrelu", (65536, 256, 256), (66, 66), True),
    ("ring pair", "chain", (16384, 1024, 2), (66, 66), True),
    ("ring pair", "chain", (16384, 1024, 2), (33, 99), True),
    ("ring pair", "chain", (4096, 4096, 2), (66, 66), True),
    # a GEMM feeding a row op through a ring (attention's scores into a softmax), beside the
    # row op alone on the same SMs; GEMMs with a transcendental epilogue (GELU, SiLU) against
    # the same GEMMs above without one
    ("ring pair row", "mmsoftmax", (65536, 1024, 128), (94, 38), True, 128, 32),
    ("ring pair row", "mmsoftmax", (65536, 1024, 128), (66, 66), True, 128, 32),
    ("ring pair row", "mmsoftmax", (32768, 2048, 128), (88, 44), True, 128, 16),
    ("row op alone", "softmax", (65536, 1024), 38, True),
    ("row op alone", "softmax", (65536, 1024), 66, True),
    ("gemm epilogue", "mmgelu", (16384, 3072, 768), 132, True),
    ("gemm epilogue", "mmsilu", (16384, 3072, 768), 132, True),
    ("gemm epilogue", "mmrelu", (16384, 3072, 768), 132, True),
    ("gemm epilogue", "mmgelu", (16384, 1024, 256), 132, True),
    ("gemm epilogue", "mmrelu", (16384, 1024, 256), 132, True),     # its reference (session 9)
    # a GELU after a bias (an MLP's first layer) and its reference, bias + ReLU (session 9)
    ("gemm epilogue", "mmbiasgelu", (16384, 3072, 768), 132, True),
    ("gemm epilogue", "mmbias", (16384, 3072, 768), 132, True),
    ("gemm epilogue", "mmbiasgelu", (16384, 1024, 256), 132, True),
    ("gemm epilogue", "mmbias", (16384, 1024, 256), 132, True),
    # a residual input read in the epilogue (BERT's and ln-residual's second GEMM)
    ("gemm epilogue input", "mmadd", (16384, 768, 3072), 132, True),
    ("gemm epilogue input", "mmadd", (16384, 3072, 768), 132, True),
    ("gemm epilogue input", "mmadd", (4096, 4096, 4096), 132, True),
    ("gemm epilogue input", "mmadd", (16384, 1024, 256), 132, True),
    ("gemm epilogue input", "matmul", (16384, 768, 3072), 132, True),
    # a bias vector in the epilogue (every MLP layer of the suite)
    ("gemm epilogue bias", "mmbias", (16384, 768, 3072), 132, True),
    ("gemm epilogue bias", "mmbias", (2048, 1024, 1024), 60, True),
    ("gemm epilogue bias", "mmbias", (65536, 256, 256), 132, True),
    ("gemm epilogue bias", "mmrelu", (2048, 1024, 1024), 60, True),
    ("gemm epilogue bias", "mmrelu", (65536, 256, 256), 132, True),
    # products narrower than the tile (a head: NeRF's sigma N = 1 and rgb N = 3, DLRM's CTR
    # N = 1, padded to 8): the tile's math runs all its 128 columns, its B loads and epilogue
    # only the valid ones; beside the same shapes a full column tile wide (session 20)
    ("gemm narrow N", "mmbias", (65536, 8, 256), 33, True, 1024),
    ("gemm narrow N", "mmbias", (65536, 128, 256), 33, True, 1024),
    ("gemm narrow N", "mmbias", (65536, 8, 128), 33, True, 1024),
    ("gemm narrow N", "mmbias", (65536, 128, 128), 33, True, 1024),
    ("gemm narrow N", "mmbias", (65536, 64, 256), 33, True, 1024),
    ("gemm narrow N", "mmbias", (131072, 8, 512), 132, True),
    ("gemm narrow N", "mmbias", (131072, 128, 512), 132, True),
    ("gemm narrow N", "matmul", (131072, 8, 256), 66, True),
    ("gemm narrow N", "matmul", (131072, 128, 256), 66, True),
    ("gemm narrow N", "mmbias", (131072, 8, 128), 132, True),
    ("gemm narrow N", "mmbias", (131072, 128, 128), 132, True),
]
STANDALONE_DIAG = [("fixed cost add 128x1024", "fp16", "add", (128, 1024))]


def pipe_variants(info):
    """(label, kind, dims, sms, flush, tile rows, Region, PipelineVariant) of the one-stage pipeline cases
    (build only): the SM sweeps, then the diagnostics."""
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    cases = [("sweep", kind, dims, s, True) for kind, dims in (("matmul", PIPE_GEMM), ("add", PIPE_EW))
             for s in PIPE_SMS] + PIPE_DIAG
    labels = [x for x in os.environ.get("KDSE_PIPE_LABELS", "").split(",") if x]
    if labels:      # KDSE_PIPE_LABELS=label,...: those cases alone (a partial raw)
        cases = [c for c in cases if c[0] in labels]
    out = []
    for label, kind, dims, s, flush, *rest in cases:
        rows = rest[0] if rest else 128
        depth = rest[1] if len(rest) > 1 else 8
        g, region = pipe_region(kind, dims, s, rows, depth)
        reg = Region(g, region)
        out.append((label, kind, dims, s, flush, rows, depth, reg,
                    PipelineVariant("plan", reg, Tensors(reg), info, region, 1.0)))
    return out


def precompile(arch: str = "sm_90", sms: int = 132) -> None:
    import concurrent.futures as cf

    sys.path.insert(0, str(ROOT / "bench"))
    from precompile import compile_one  # noqa: E402

    from kitsune_dse.validate.microbench import case_variants
    from kitsune_dse.validate.plan import DeviceInfo
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch=arch, sm_count=sms)
    srcs = []
    for _, _, _, vs in case_variants(info, cases=tile_cases() + STANDALONE_DIAG):
        srcs += [v.build() for v in vs]
    srcs += [v.build() for *_, v in pipe_variants(info)]
    from kitsune_dse.validate.microbench import chain_variants, kernel_chain_variants, probe_variants
    for _, _, _, vs in probe_variants(info) + chain_variants(info) + kernel_chain_variants(info):
        srcs += [v.build() for v in vs]
    from region_boundary import boundary_variants
    srcs += [v.build() for *_, sides in boundary_variants(info) for _, v in sides]
    from epilogue_probe import variants as epilogue_variants
    srcs += [v.build() for *_, f, _, p in epilogue_variants(info) for v in (f, p)]
    from narrow_probe import variants as narrow_variants
    srcs += [v.build() for *_, v in narrow_variants(info)]
    srcs = list(dict.fromkeys(srcs))
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    with cf.ThreadPoolExecutor(8) as ex:
        for r in ex.map(lambda s: compile_one(s, arch, out), srcs):
            print(r[:300], flush=True)


def measure_tiles(runs: int, log) -> tuple[list, list, list]:
    import cupy as cp

    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.microbench import _run_case, case_variants
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    with stream:
        for case in case_variants(info, cases=tile_cases() + STANDALONE_DIAG):
            rows += _run_case(case, stream, flush, runs, None)
            log(f"  tile {rows[-1].get('shape')}: " + ", ".join(
                f"{r['impl']} {r.get('tflops', 0):.0f} TFLOP/s ok={r.get('correct')}" for r in rows[-2:]
                if r.get('shape') == rows[-1].get('shape')))
    squares, shapes = [], []
    by = {}
    for r in rows:
        if r["kernel"] == "gemm":
            by.setdefault(r["shape"], {})[r["impl"]] = r
    for shape, d in by.items():
        m, n, k = (int(x) for x in shape.split("x"))
        t, c = d.get("tile", {}), d.get("cublas", {})
        ok = bool(t.get("correct"))
        rate = t["flops"] / t["time_s"] if ok and t.get("time_s") else None
        crate = c["flops"] / c["time_s"] if c.get("correct") and c.get("time_s") else None
        if m == n == k and rate:
            squares.append((n, rate))
        shapes.append({"m": m, "n": n, "k": k, "tile_flop_per_s": rate, "cublas_flop_per_s": crate,
                       "tile_time_s": t.get("time_s"), "cublas_time_s": c.get("time_s"),
                       "tile_error": t.get("error"), "cublas_error": c.get("error")})
    return squares, shapes, rows


def measure_probes(runs: int, log, chains: bool | str = False) -> list[dict]:
    """Tilesync hand-off probes: each kernel plain (CUDA graph), counting its tiles, and also
    waiting before each tile (validate.microbench.TILESYNC_PROBES); with `chains`, chains of
    dependent GEMMs as a CUDA graph and under tilesync (TILESYNC_CHAINS)."""
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, time_runs
    from kitsune_dse.validate.microbench import chain_variants, kernel_chain_variants, probe_variants
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    rows = []
    with stream:
        cases = (kernel_chain_variants(info) if chains == "kernels" else
                 chain_variants(info) if chains else probe_variants(info))
        for (name, dtype, kind, dims), _, reg, vs in cases:
            row = {"label": name, "kind": kind, "dims": list(dims)}
            for v in vs:
                try:
                    v.prepare()
                    chk = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
                    t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flush, poison_every=False)
                    row[f"{v.name}_s"] = t.median_s
                    row[f"{v.name}_correct"] = chk["correct"]
                except Exception as e:  # noqa: BLE001
                    row[f"{v.name}_error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            log(f"  probe {kind} {dims}: " + ", ".join(f"{v.name} {row.get(v.name + '_s', 0) * 1e6:.1f} us"
                                                      for v in vs))
            vs[0].tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def measure_pipes(runs: int, log) -> tuple[list, list, list]:
    import cupy as cp

    from kitsune_dse.validate.harness import check_variant
    from kitsune_dse.validate.measure import L2Flusher, outside_span_s, time_runs
    from kitsune_dse.validate.reference import input_roles
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    gemm, ew, rows = [], [], []
    with stream:
        for label, kind, dims, s, fl, tr, depth, reg, v in pipe_variants(info):
            row = {"label": label, "kind": kind, "dims": list(dims), "sms": s, "l2_flushed": fl,
                   **({"tile_rows": tr} if tr != 128 else {}),   # (older runs' rows have none)
                   **({"depth": depth} if isinstance(s, (tuple, list)) else {})}
            try:
                v.prepare()
                chk = check_variant(v, reg, v.tensors, input_roles(reg), stream, 1)
                outside = []    # the launch and exit outside the workers' span, run by run
                t = time_runs(v.run, v.pre, v.after, stream, runs, 2, flush if fl else None, poison_every=False,
                              each=lambda e, v=v: outside.append(outside_span_s(v, e)))
                g = reg.graph
                nbytes = sum(g.tensors[x].nbytes for x in list(g.inputs) + list(g.weights) + list(g.outputs))
                row.update(time_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s, correct=chk["correct"],
                           rel_err=chk["rel_err"], flops=g.total_flops, bytes=nbytes,
                           placement=v.placement, flop_per_s=g.total_flops / t.median_s,
                           bytes_per_s=nbytes / t.median_s)
                if None not in outside:     # (persistent_launch_outside_s)
                    row["outside_s"] = statistics.median(outside)
                if chk["correct"] and label == "sweep":
                    if kind == "matmul":
                        gemm.append((s, g.total_flops / t.median_s))
                    else:
                        ew.append((s, nbytes / t.median_s))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            log(f"  pipe {label} {kind} {dims} on {s} SMs: " + (f"{row['time_s'] * 1e6:.1f} us ok={row['correct']} "
                                                 f"{row['flop_per_s'] / 1e12:.0f} TFLOP/s {row['bytes_per_s'] / 1e9:.0f} GB/s"
                                                 if "time_s" in row else row.get("error", "")))
            v.tensors.arrays.clear()
            cp.get_default_memory_pool().free_all_blocks()
    return gemm, ew, rows


def device(out: Path, runs: int, smoke: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)

    from kitsune_dse.validate.harness import env_summary
    raw: dict = {"env": env_summary(), "harness_version": HARNESS_VERSION, "cublas_version": CUBLAS_VERSION}
    raw_path = out / "calibration.raw.json"

    def dump():
        raw_path.write_text(json.dumps(raw, indent=1, default=str) + "\n")
    log("env " + json.dumps(raw["env"]))

    def phase(error_key: str, what: str, measure) -> None:
        """One measurement group into raw (measure() returns its keys); a failure is recorded
        under error_key and the calibration goes on; the raw file is rewritten after each."""
        try:
            raw.update(measure())
        except Exception:  # noqa: BLE001
            raw[error_key] = traceback.format_exc()
            log(f"{what} FAILED\n" + raw[error_key])
        dump()

    def run_all_phase():
        from kitsune_dse.calibrate.microbench import run_all
        return run_all(lambda i, n, what: log(f"  {i}/{n} {what}"))

    def tiles():
        sq, shapes, rows = measure_tiles(runs, log)
        return {"tile_gemm_fp16": sq, "tile_gemm_shapes": shapes, "tile_rows": rows}

    def pipes():
        g, e, rows = measure_pipes(max(5, runs // 2), log)
        return {"pipe_gemm_fp16_sms": g, "pipe_ew_sms": e, "pipe_rows": rows}

    def probes():
        return {"tilesync_probe_rows": measure_probes(max(5, runs), log),
                "tilesync_chain_rows": measure_probes(max(5, runs), log, chains=True),
                "kernel_chain_rows": measure_probes(max(5, runs), log, chains="kernels")}

    def epilogues():
        from epilogue_probe import measure as measure_epilogues
        return {"epilogue_rows": measure_epilogues(max(5, runs), log)}

    def cublas_calls():
        from cublas_call_probe import probe
        rows = probe(500)
        log("  cuBLAS call host time: " + ", ".join(f"{r['host_s'] * 1e6:.1f} us" for r in rows)
            + "; first after a wait: " + ", ".join(f"{r['first_host_s'] * 1e6:.1f} us" for r in rows))
        return {"cublas_call_rows": rows}

    def boundaries():
        from region_boundary import measure_boundaries
        return {"boundary_rows": measure_boundaries(max(5, runs), log)}

    def narrow():
        from narrow_probe import measure as measure_narrow
        return {"narrow_rows": measure_narrow(max(5, runs))}

    only = [p for p in os.environ.get("KDSE_CAL_PHASES", "").split(",") if p]
    for key, what, fn in (("run_all_error", "run_all", run_all_phase), ("tile_error", "tiles", tiles),
                          ("pipe_error", "pipes", pipes), ("probe_error", "probes", probes),
                          ("epilogue_error", "epilogues", epilogues),
                          ("cublas_call_error", "cuBLAS calls", cublas_calls),
                          ("boundary_error", "boundaries", boundaries), ("narrow_error", "narrow", narrow)):
        if not only or what in only:      # KDSE_CAL_PHASES=tiles,...: a partial raw of those
            phase(key, what, fn)
    raw["elapsed_s"] = time.time() - t0
    dump()
    log(f"calibration done -> {raw_path}")
    summary(raw, log)
    if smoke:
        smoke_plans(out, smoke, log)


def smoke_plans(out: Path, globs: str, log) -> None:
    """Quick correctness + timing of plans (few runs) -> smoke.csv."""
    import glob

    import cupy as cp

    from kitsune_dse.validate.harness import validate_plan, write_csv
    rows = []
    for g in globs.split(","):
        for p in sorted(glob.glob(g)):
            try:
                rows += validate_plan(p, runs=5, warmup=2, checks=2, warm=False,
                                      variants=["plan", "bsp-eager", "bsp-graph", "fusion", "cublas"])
            except Exception as e:  # noqa: BLE001
                rows.append({"plan": Path(p).stem, "region": "-", "variant": "all", "correct": False,
                             "error": f"{type(e).__name__}: {e}"})
            cp.get_default_memory_pool().free_all_blocks()
            for r in rows:
                if r.get("plan") == Path(p).stem:
                    log(f"  smoke {r['plan']} r{r['region']} {r['variant']}: "
                        + (f"{r['measured_latency_s'] * 1e6:.1f} us ok={r['correct']} err={r.get('rel_err')}"
                           if isinstance(r.get("measured_latency_s"), float) else f"ERROR {r.get('error')}"))
    write_csv(rows, out / "smoke.csv")


def summary(raw: dict, log) -> None:
    def tb(x):
        return f"{x / 1e12:.2f}"
    log("HBM read vs SMs (TB/s): " + " ".join(f"{s}:{tb(v)}" for s, v in raw.get("hbm_read", [])))
    log("L2 read vs SMs (TB/s): " + " ".join(f"{s}:{tb(v)}" for s, v in raw.get("l2_read", [])))
    log("cuBLAS fp16: " + " ".join(f"{n}:{v / 1e12:.0f}" for n, v in raw.get("gemm_fp16", [])))
    log("tile fp16: " + " ".join(f"{n}:{v / 1e12:.0f}" for n, v in raw.get("tile_gemm_fp16", [])))
    log("pipe gemm vs SMs (TFLOP/s): " + " ".join(f"{s}:{v / 1e12:.0f}" for s, v in raw.get("pipe_gemm_fp16_sms", [])))
    log("pipe add vs SMs (TB/s): " + " ".join(f"{s}:{tb(v)}" for s, v in raw.get("pipe_ew_sms", [])))
    log(f"launch {raw.get('launch')}; sync {raw.get('sync_latency_s')}; fp32 {raw.get('fp32_flop_per_s')}")


L2_FIT_MIN_SMS = 8


def l2_refit(raw: dict, p: float) -> dict:
    """The spec's l2_bandwidth_from() applies efficiency.hbm_saturation_exponent to the L2 curve
    too, so fit_saturating's own L2 exponent (its lower bound 0.5 on the H100) is not what the
    model evaluates: refit per-SM and max L2 bandwidth with the exponent fixed to the HBM one, on
    the points with >= L2_FIT_MIN_SMS SMs (pipeline stages and whole-GPU kernels)."""
    import numpy as np
    from scipy.optimize import least_squares

    from kitsune_dse.calibrate.fit import saturating
    S = np.array([a for a, _ in raw["l2_read"]], float)
    Y = np.array([b for _, b in raw["l2_read"]], float)
    m = S >= L2_FIT_MIN_SMS
    r = least_squares(lambda x: np.log(saturating(S[m], np.exp(x[0]), np.exp(x[1]), p)) - np.log(Y[m]),
                      np.log([100e9, float(Y.max())]))
    per_sm, bmax = (float(v) for v in np.exp(r.x))
    rel = saturating(S, per_sm, bmax, p) / Y - 1
    return {"per_sm_Bps": per_sm, "max_Bps": bmax, "exponent": p, "min_sms": L2_FIT_MIN_SMS,
            "rms_rel_error": float(np.sqrt(np.mean(rel[m] ** 2))), "max_rel_error": float(np.abs(rel[m]).max()),
            "rms_rel_error_all_points": float(np.sqrt(np.mean(rel ** 2))),
            "rel_error_by_sms": {int(a): round(float(b), 3) for a, b in zip(S, rel)}}


# one-parameter fits on the PIPE_DIAG probes of one label (calibrate.fit): (label, fit function
# name, the spec field it sets, cal key[, the kind of the reference cases it may also take from
# other labels: the same GEMM without the priced cost, measured there])
ONE_PARAMETER_FITS = [
    ("gemm epilogue", "fit_transcendental", "transcendental_flops", "transcendental_fit", ("mmrelu", "mmbias")),
    ("gemm epilogue input", "fit_epilogue_input", "epilogue_input_s", "epilogue_input_fit", ("matmul",)),
    ("gemm epilogue bias", "fit_epilogue_vector", "epilogue_vector_s", "epilogue_vector_fit", ("matmul", "mmbias")),
    ("concat", "fit_concat_stream", "persistent_concat_sm_stream_Bps", "concat_fit"),
    ("ring pair", "fit_ring_handoff", "ring_handoff_s", "ring_handoff_fit"),
    ("ring pair row", "fit_row_load", "persistent_row_load_slowdown", "row_load_fit"),
    ("gemm narrow N", "fit_narrow_tile", "persistent_narrow_tile_saving", "narrow_tile_fit"),
]


def _fit_one_field(raw: dict, label: str, fit_fn: str, field: str, key: str, data: dict, cal: dict,
                   name: str, ref_kinds: tuple[str, ...] = ()) -> None:
    """Fit one spec field on the pipe probes of `label` (if any), into data and cal[key]; the
    probes of `ref_kinds` under other labels come after them (references only)."""
    from kitsune_dse.calibrate import fit as fits
    from kitsune_dse.hw.spec import spec_from_dict
    rows = [r for r in raw.get("pipe_rows", []) if r.get("label") == label and r.get("time_s")]
    if not rows:
        return
    if ref_kinds:
        rows += [r for r in raw.get("pipe_rows", []) if r.get("label") != label and r.get("kind") in ref_kinds
                 and r.get("time_s") and r.get("correct", True)]
    res = getattr(fits, fit_fn)(spec_from_dict(data, name), rows)
    data[field] = res[field]
    # efficiency fields a fit sets beside its own (the concat fit's HBM ceiling)
    data["efficiency"] = {**data["efficiency"], **res.get("efficiency", {})}
    cal[key] = res


def fit(raw_paths: list[Path], base: str = "h100-sxm", outdir: Path = ROOT / "hw_specs") -> None:
    """Here (pydantic): the two calibrated specs from one raw JSON, or from the median of
    several (calibrate.fit.merge_raw: repeated calibrations on the lent machine instances)."""
    import yaml

    from kitsune_dse.calibrate.fit import (calibrated_spec, check_finite, fit_persistent_gemm,
                                           fit_persistent_rows, fit_saturating, fit_standalone_gemm,
                                           fit_step_handoff, fit_tile_handoff, fit_tilesync_chains,
                                           merge_raw, persistent_outside_s)
    from kitsune_dse.hw import load_spec
    from kitsune_dse.hw.spec import spec_from_dict
    raws = [json.loads(p.read_text()) for p in raw_paths]
    raw = merge_raw(raws) if len(raws) > 1 else raws[0]
    check_finite(raw)
    spec = load_spec(base)
    fixed = sorted(r["time_s"] for r in raw.get("pipe_rows", [])
                   if str(r.get("label", "")).startswith("fixed cost") and r.get("time_s"))
    raw_harness = dict(raw)
    if fixed:   # an empty-ish one-stage persistent kernel: its launch, ring set-up and teardown
        # (its row-block's own work included: taking it out through the model, 6.9 -> 4.6 us,
        # moved the same ~2 us into the persistent GEMM fit's per-stage A fill, 3.9 -> 6.0 us,
        # and the suite's e2e 2.6 -> 3.0%: session 26)
        raw_harness["persistent_launch_s"] = fixed[len(fixed) // 2]
    outside = persistent_outside_s(raw)   # calibrate.fit
    if outside is not None:
        raw_harness["persistent_launch_outside_s"] = outside
    # harness: tensor_core from its tile GEMM, HBM curve from its own persistent stage
    harness, res = calibrated_spec(spec, raw_harness, stage_bandwidth=True)
    raw_cublas = {k: v for k, v in raw.items() if k != "tile_gemm_fp16"}
    cublas, _ = calibrated_spec(spec, raw_cublas)        # tensor_core and HBM of cuBLAS-class code
    # a tiny standalone kernel: what it takes beyond its bytes at full bandwidth and the graph
    # node gap is the per-kernel fixed cost (ramp-up, tail)
    tiny = [r for r in raw.get("tile_rows", []) if str(r.get("kernel", "")).startswith("fixed cost")
            and r.get("time_s")]
    fixed_s = {}
    for sp in (harness, cublas):
        if tiny:
            r = tiny[0]
            fixed_s[sp.name] = max(0.0, r["time_s"] - r["bytes"] / sp.hbm_bandwidth_from(sp.sm_count)
                                   - sp.graph_launch_overhead_s)
    # the harness's kernels in a graph: chains of N tiny kernels, T(N) = a + N b, separate the
    # launch latency a (once per graph) from each kernel's marginal cost b; the lone kernel above
    # has both
    chain = None
    if raw.get("kernel_chain_rows"):
        from kitsune_dse.calibrate.fit import fit_kernel_chain
        chain = fit_kernel_chain(raw["kernel_chain_rows"])
        r0 = raw["kernel_chain_rows"][0]
        tiny_bytes = 2 * r0["dims"][0] * r0["dims"][1] * 2          # one relu: read and write fp16
        # a kernel's ramp-up and tail beyond its work and the node gap: the GPU's, whoever wrote
        # the kernel (the cublas variants run cuBLAS's and this harness's kernels in one graph)
        for sp in (harness, cublas):
            fixed_s[sp.name] = max(0.0, chain["per_kernel_s"] - sp.graph_launch_overhead_s
                                   - tiny_bytes / harness.hbm_bandwidth_from(harness.sm_count))
    l2 = l2_refit(raw, harness.efficiency.hbm_saturation_exponent)
    l2_orig = fit_saturating(raw["l2_read"])
    pipe_ew = fit_saturating(raw["pipe_ew_sms"]) if raw.get("pipe_ew_sms") else None
    date = raw.get("env", {}).get("date", "")[:10]
    out = {}
    residue_fit = None
    for sp, name, what in ((harness, f"{base}.calibrated", "the validation harness's own GEMM tile "
                            "(mma.sync 128x128x64): use it for plan, bsp-*, fusion* predictions"),
                           (cublas, f"{base}-cublas.calibrated", "cuBLAS (cublasGemmStridedBatchedEx): "
                            "use it for the GEMMs of the cublas variants")):
        data = sp.model_dump(mode="json")
        if sp.name in fixed_s:
            data["kernel_fixed_s"] = fixed_s[sp.name]
        if chain:
            # the first kernel's wait after the start event: the launch path's, so cuBLAS's
            # lone-GEMM microbenchmarks hold it too (fitted into their ramp before, it was
            # charged to every GEMM of a graph: dlrm's cublas-graph +29%)
            data["launch_latency_s"] = chain["latency_s"]
        if sp is harness and chain:
            data.setdefault("calibration", {})["kernel_chain_fit"] = dict(chain)
            if any(r.get("eager_s") for r in raw["kernel_chain_rows"]):
                # the same chains launched eagerly cost more per kernel than in a graph: the
                # difference is what a dependent eager launch waits beyond a graph node's gap
                eager = fit_kernel_chain(raw["kernel_chain_rows"], key="eager_s")
                data["kernel_gap_s"] = sp.graph_launch_overhead_s + max(
                    0.0, eager["per_kernel_s"] - chain["per_kernel_s"])
                data["calibration"]["kernel_chain_eager_fit"] = dict(eager)
            if any(r.get("graphs_s") for r in raw["kernel_chain_rows"]):
                # one-kernel graphs launched back to back (a plan's regions end to end): what a
                # region boundary costs beyond a node gap inside one graph
                graphs = fit_kernel_chain(raw["kernel_chain_rows"], key="graphs_s")
                data["region_gap_s"] = max(0.0, graphs["per_kernel_s"] - chain["per_kernel_s"])
                data["calibration"]["kernel_chain_graphs_fit"] = dict(graphs)
        if sp is cublas and raw.get("cublas_call_rows"):
            # the cublas variant's GEMMs are cuBLAS calls from Python (bench/cublas_call_probe.py)
            calls = [r["host_s"] for r in raw["cublas_call_rows"] if r.get("host_s")]
            data["library_call_s"] = statistics.median(calls)
            firsts = [r["first_host_s"] for r in raw["cublas_call_rows"] if r.get("first_host_s")]
            if firsts:
                data["library_call_first_s"] = statistics.median(firsts)
            data.setdefault("calibration", {})["library_call_fit"] = {
                "library_call_s": data["library_call_s"], "points": len(calls),
                "library_call_first_s": data.get("library_call_first_s"),
                "host_s_by_shape": {"x".join(map(str, r["shape"])): r["host_s"] for r in raw["cublas_call_rows"]}}
        if sp is harness and raw.get("boundary_rows"):
            # region A then region B against each alone: what a boundary hides, measured
            from kitsune_dse.calibrate.fit import fit_region_boundaries
            bnd = fit_region_boundaries(raw["boundary_rows"])
            data["region_boundary_hidden_s"] = bnd["region_boundary_hidden_s"]
            data.setdefault("calibration", {})["region_boundary_fit"] = bnd
        data["name"] = name
        eff = dict(data["efficiency"])
        data["l2_per_sm_bandwidth_Bps"] = l2["per_sm_Bps"]
        data["l2_bandwidth_Bps"] = max(spec.l2_bandwidth_Bps, l2["max_Bps"])
        eff["l2"] = min(1.0, l2["max_Bps"] / data["l2_bandwidth_Bps"])
        data["efficiency"] = eff
        cal = dict(data["calibration"])
        cal["method"] = ("microbenchmarks only: HBM/L2 read vs SMs (1024-thread CTA per SM, 4 x 16 B "
                         "loads in flight per thread), FP32 FMA loop, GEMM, launch overhead eager and "
                         "in a CUDA graph, flag ping-pong")
        cal["tensor_core_source"] = what
        cal["tensor_core_flop_per_s"] = sp.efficiency.tensor_core * spec.tensor_peak_flop_per_s["fp16"]
        cal["tile_gemm_fp16"] = raw.get("tile_gemm_fp16")
        cal["cublas_gemm_fp16"] = raw.get("gemm_fp16")
        cal["l2_override"] = (f"L2 refit with the HBM exponent {l2['exponent']:.3g} (the exponent "
                              f"l2_bandwidth_from applies) on points >= {l2['min_sms']} SMs; "
                              f"fit_saturating's own fit (exponent {l2_orig['exponent']:.3g}, max "
                              f"{l2_orig['max_Bps'] / 1e12:.3g} TB/s, {l2_orig['per_sm_Bps'] / 1e9:.3g} GB/s per SM) "
                              f"would give {sp.l2_bandwidth_from(sp.sm_count) / 1e12:.3g} TB/s at "
                              f"{sp.sm_count} SMs in the model against "
                              f"{max(b for _, b in raw['l2_read']) / 1e12:.3g} TB/s measured")
        cal["l2_rms_rel_error"] = l2["rms_rel_error"]
        cal["l2_max_rel_error"] = l2["max_rel_error"]
        cal["l2_rms_rel_error_all_points"] = l2["rms_rel_error_all_points"]
        if sp is harness:   # codegen's element-wise grid-stride loop (cost.reuse: what later kernels find)
            data["elementwise_grid_ctas_per_sm"] = 32
        frames_csv = ROOT / "results/validation/h100/frame_probe/frames.csv"
        if sp is harness and frames_csv.exists():
            # the pipeline kernel's local memory per thread (nvcc's report of probe kernels,
            # bench/frame_probe.py): the L2 footprint below counts it
            sys.path.insert(0, str(ROOT / "bench"))
            from frame_probe import frame_rows

            from kitsune_dse.calibrate.fit_dram import FRAME_FIELDS, fit_local_frame
            lf = fit_local_frame(frame_rows(frames_csv))
            data.update({k: lf[k] for k in FRAME_FIELDS})
            cal["local_frame_fit"] = {**lf, "measurements": str(frames_csv.relative_to(ROOT))}
        dram_csvs = sorted((ROOT / "results/validation/h100/dram_probe").glob("dram_probe_ncu_*.csv"))
        if sp is harness and dram_csvs:
            # what pipelines keep in L2 and send back to DRAM, on ncu's bytes of probe pipelines
            # (bench/dram_probe.py); DRAM only, so before the fits whose times read those bytes
            sys.path.insert(0, str(ROOT / "bench"))
            from dram_probe import fit_probes

            from kitsune_dse.calibrate.fit_dram import FIELDS, fit_pipeline_l2
            d = fit_pipeline_l2(spec_from_dict(data, name), fit_probes(dram_csvs))
            data["efficiency"] = {**data["efficiency"], **{k: d[k] for k in FIELDS}}
            cal["pipeline_l2_fit"] = {**d, "measurements": [str(c.relative_to(ROOT)) for c in dram_csvs]}
        sys.path.insert(0, str(ROOT / "bench"))
        from dram_probe import (GEMM_CSVS, SEQ_CSVS, WEIGHT_STREAM_CSVS, gemm_grid_rows, library_grid_rows,
                                sequence_rows, weight_stream_rows)
        gemm_csvs = sorted(ROOT.glob(GEMM_CSVS))
        if gemm_csvs:
            # a standalone GEMM grid's operand reads, on ncu's bytes of GEMM grids that are not
            # the suite's: the harness's waves drifting apart, cuBLAS's own grid; DRAM only, so
            # before the GEMM fits whose times read those bytes
            from kitsune_dse.calibrate.fit_dram import GRID_FIELDS, fit_grid_reuse, fit_library_read_grid
            where = [str(c.relative_to(ROOT)) for c in gemm_csvs]
            if sp is harness:
                gr = fit_grid_reuse(spec_from_dict(data, name), gemm_grid_rows(gemm_csvs))
                data["efficiency"] = {**data["efficiency"], **{k: gr[k] for k in GRID_FIELDS}}
                cal["grid_reuse_fit"] = {**gr, "measurements": where}
            else:
                lg = fit_library_read_grid(spec_from_dict(data, name), library_grid_rows(gemm_csvs))
                data["gemm_read_grids"] = lg["gemm_read_grids"]
                cal["library_read_grid_fit"] = {**lg, "measurements": where}
        seq_csvs = sorted(ROOT.glob(SEQ_CSVS))
        if seq_csvs:
            # what a kernel sequence leaves dirty in L2 when it ends, on ncu's write bytes of
            # sequences that are not the suite's: the same L2 for both specs, fitted with the
            # harness's kernels (the sequences' plan variant) and given to both
            from kitsune_dse.calibrate.fit_dram import RESIDUE_FIELDS, fit_dirty_residue
            if residue_fit is None:
                residue_fit = fit_dirty_residue(spec_from_dict(data, name), sequence_rows(seq_csvs))
                residue_fit["measurements"] = [str(c.relative_to(ROOT)) for c in seq_csvs]
            data["efficiency"] = {**data["efficiency"], **{k: residue_fit[k] for k in RESIDUE_FIELDS}}
            cal["dirty_residue_fit"] = residue_fit
            if sp is harness and dram_csvs:
                # the probes' writes still dirty when each ends are not in ncu's range either:
                # the rings' logistic again, with the residue just fitted (the residue's fit
                # reads the logistic only for the few intermediates its sequences keep)
                from kitsune_dse.calibrate.fit_dram import FIELDS, fit_pipeline_l2
                d = fit_pipeline_l2(spec_from_dict(data, name), fit_probes(dram_csvs))
                data["efficiency"] = {**data["efficiency"], **{k: d[k] for k in FIELDS}}
                cal["pipeline_l2_fit"] = {**d, "measurements": [str(c.relative_to(ROOT)) for c in dram_csvs],
                                          "after": "dirty_residue_fit"}
        if pipe_ew:
            cal["harness_stage_hbm"] = (f"the harness's persistent-kernel elementwise stage (2 x 256 "
                                        f"threads per SM) fits {pipe_ew['per_sm_Bps'] / 1e9:.3g} GB/s per SM, "
                                        f"max {pipe_ew['max_Bps'] / 1e12:.3g} TB/s (exponent "
                                        f"{pipe_ew['exponent']:.3g}): used for the HBM curve of the "
                                        f"harness spec, not of the cublas spec")
        # standalone GEMM kernels: rate, per-tile fixed cost, ramp and operand HBM ceiling fitted
        # through the model itself to single-GEMM microbenchmarks of 15 shapes (the harness's
        # tile offers 128x128, or 64x128 for skinny M; cuBLAS the default tile set)
        key = "tile_time_s" if sp is harness else "cublas_time_s"
        shapes = [{"m": r["m"], "n": r["n"], "k": r["k"], "time_s": r[key]}
                  for r in raw.get("tile_gemm_shapes", []) if r.get(key)]
        if sp is harness:
            data["gemm_tile_shapes"] = [[128, 128], [64, 128]]
            data["gemm_heuristic"] = "harness"          # codegen.choose_gemm_tile's tile and split-K
            data["gemm_k_tile"] = 64                    # its main loop's K slab (codegen GEMM BK)
        if sp is not harness:
            # the balance shapes probe the harness's tile (how its math and read stream overlap,
            # its K slab); cuBLAS picks other kernels there, which its one-kernel model does not
            # follow (rms 3.0 -> 4.5% over the suite's shapes and squares with them): its fit
            # keeps the shapes its baselines run
            shapes = [r for r in shapes if (r["m"], r["n"], r["k"]) not in BALANCE_SHAPES]
        if shapes:
            # the harness's tile: also how its math and read stream overlap (BALANCE_SHAPES,
            # where the two near each other)
            g = fit_standalone_gemm(spec_from_dict(data, name), shapes, read_overlap=sp is harness,
                                    pairs=sp is harness)
            data["efficiency"]["tensor_core"] = g["tensor_core"]
            data["efficiency"]["gemm_hbm"] = g["gemm_hbm"]
            data["efficiency"]["gemm_read_overlap_exponent"] = g["read_overlap_exponent"]
            data["gemm_standalone_tile_fixed_s"] = g["tile_fixed_s"]
            data["gemm_ramp_s"] = g["ramp_s"]
            if sp is harness:   # (cuBLAS's kernels run one CTA per SM: its spec keeps none)
                data["gemm_tail_tiles"] = g["tail_tiles"]
                data["standalone_lone_share"] = g["lone_share"]
            cal["standalone_gemm_fit"] = {k: v for k, v in g.items() if k != "spec"}
            cal["tensor_core_flop_per_s"] = g["tensor_flop_per_s"]
        # persistent GEMM steps: their rate, a fixed cost per output tile and the operand bytes
        # one SM streams per second and the part of it hidden under the math, fitted through the pipeline model
        # on every one-stage GEMM microbenchmark (SM sweep and shape diagnostics)
        gemm_rows = [r for r in raw.get("pipe_rows", []) if r.get("kind") == "matmul" and r.get("time_s")
                     and r.get("label") != "gemm narrow N"]    # (priced apart: fit_narrow_tile)
        if sp is harness and gemm_rows:
            pf = fit_persistent_gemm(spec_from_dict(data, name), gemm_rows)
            data["gemm_tile_fixed_s"] = pf["tile_fixed_s"]
            data["gemm_tile_fixed_idle_s"] = pf["tile_fixed_idle_s"]
            data["gemm_tile_fixed_load_exponent"] = pf["tile_fixed_load_exponent"]
            data["efficiency"]["persistent_lone_team"] = pf["persistent_lone_team"]
            if pf["persistent_solo_team"] is not None:
                data["efficiency"]["persistent_solo_team"] = pf["persistent_solo_team"]
            data["persistent_gemm_sm_stream_Bps"] = pf["sm_stream_Bps"]
            data["persistent_gemm_l2_Bps"] = pf["operand_l2_Bps"]
            data["efficiency"]["persistent_tensor_core"] = pf["persistent_tensor_core"]
            data["efficiency"]["mem_compute_overlap"] = pf["mem_compute_overlap"]
            data["efficiency"]["persistent_gemm_hbm"] = pf["persistent_gemm_hbm"]
            data["efficiency"]["persistent_a_stream_share"] = pf["persistent_a_stream_share"]
            data["persistent_a_stream_fill_s"] = pf["a_stream_fill_s"]
            data["efficiency"]["persistent_feed_exponent"] = pf["persistent_feed_exponent"]
            cal["tile_gemm_fit"] = {k: v for k, v in pf.items() if k != "spec"}
        if sp is harness:   # one spec field each, fitted through the model in this order
            for label, fit_fn, field, key, *ref in ONE_PARAMETER_FITS[:3]:
                _fit_one_field(raw, label, fit_fn, field, key, data, cal, name, *ref)
        if sp is harness and raw.get("epilogue_rows"):
            # the same epilogues in standalone fused kernels (bench/epilogue_probe.py)
            from kitsune_dse.calibrate.fit import fit_standalone_transcendental
            st = fit_standalone_transcendental(spec_from_dict(data, name), raw["epilogue_rows"])
            data["standalone_transcendental_flops"] = st["standalone_transcendental_flops"]
            cal["standalone_transcendental_fit"] = st
            from kitsune_dse.calibrate.fit import fit_standalone_epilogue_input
            se = fit_standalone_epilogue_input(spec_from_dict(data, name), raw["epilogue_rows"])
            data["standalone_epilogue_input_s"] = se["standalone_epilogue_input_s"]
            cal["standalone_epilogue_input_fit"] = se
        rowop_json = ROOT / "results/validation/h100/rowop_probe/rowop_probe.json"
        if sp is harness and rowop_json.exists():
            # a standalone layernorm at half a streaming kernel's occupancy (bench/rowop_probe.py)
            from kitsune_dse.calibrate.fit import fit_standalone_norm
            nf = fit_standalone_norm(spec_from_dict(data, name), json.loads(rowop_json.read_text())["rows"])
            data["standalone_norm_stream_share"] = nf["standalone_norm_stream_share"]
            cal["standalone_norm_fit"] = {**nf, "measurements": str(rowop_json.relative_to(ROOT))}
        narrow_json = ROOT / "results/validation/h100/narrow_probe/narrow_probe.json"
        if sp is harness and (raw.get("narrow_rows") or narrow_json.exists()):
            # standalone GEMM kernels narrower than their tile (bench/narrow_probe.py: this
            # calibration's own phase where it ran one, else the probe's committed run)
            from kitsune_dse.calibrate.fit import fit_standalone_narrow_tile
            rows = raw.get("narrow_rows") or json.loads(narrow_json.read_text())["rows"]
            sn = fit_standalone_narrow_tile(spec_from_dict(data, name), rows)
            data["standalone_narrow_tile_saving"] = sn["standalone_narrow_tile_saving"]
            cal["standalone_narrow_tile_fit"] = {**sn, "measurements": "narrow_rows" if raw.get("narrow_rows")
                                                 else str(narrow_json.relative_to(ROOT))}
        chain_rows = [r for r in raw.get("pipe_rows", []) if r.get("label") == "gemm chain one stage"
                      and r.get("time_s")]
        if sp is harness and chain_rows:
            sf = fit_step_handoff(spec_from_dict(data, name), chain_rows)
            data["step_handoff_s"] = sf["step_handoff_s"]
            cal["step_handoff_fit"] = sf
        row_rows = [r for r in raw.get("pipe_rows", []) if r.get("label") in ("row op", "row op alone") and r.get("time_s")]
        if sp is harness and row_rows:
            rf = fit_persistent_rows(spec_from_dict(data, name), row_rows)
            data["persistent_row_sm_stream_Bps"] = rf["sm_stream_Bps"]
            data["persistent_row_item_fixed_s"] = rf["item_fixed_s"]
            cal["row_op_fit"] = rf
        if sp is harness:
            for label, fit_fn, field, key, *ref in ONE_PARAMETER_FITS[3:]:
                _fit_one_field(raw, label, fit_fn, field, key, data, cal, name, *ref)
        probes = [r for r in raw.get("tilesync_probe_rows", []) if r.get("plain_s") and r.get("both_s")]
        if sp is harness and probes:
            hf = fit_tile_handoff(spec_from_dict(data, name), probes)
            data["tile_signal_s"], data["tile_wait_s"] = hf["tile_signal_s"], hf["tile_wait_s"]
            data["tile_signal_shared_s"] = hf["tile_signal_shared_s"]
            data["tilesync_fixed_s"] = hf["fixed_s"]
            cal["tile_handoff_fit"] = hf
        chains = [r for r in raw.get("tilesync_chain_rows", []) if r.get("graph_s") and r.get("tilesync_s")]
        if sp is harness and chains:
            cf = fit_tilesync_chains(spec_from_dict(data, name), chains)
            data["tilesync_handoff_s"] = cf["tilesync_handoff_s"]
            cal["tilesync_chain_fit"] = cf
        ws_csvs = sorted(ROOT.glob(WEIGHT_STREAM_CSVS))
        if sp is harness and ws_csvs:
            # two weight-streaming stages fed slab by slab share the DRAM (bench/dram_probe.py
            # ws-pair-*): through the pipeline model, after every fit its stage times read
            from kitsune_dse.calibrate.fit import fit_concurrent_stream
            ws = fit_concurrent_stream(spec_from_dict(data, name), weight_stream_rows(ws_csvs))
            data["concurrent_stream_Bps"] = ws["concurrent_stream_Bps"]
            data["efficiency"] = {**data["efficiency"], "producer_stream_share": ws["producer_stream_share"]}
            cal["concurrent_stream_fit"] = {**ws, "measurements": [str(c.relative_to(ROOT)) for c in ws_csvs]}
        data["calibration"] = cal
        new = spec_from_dict(data, name)
        out[name] = new
        text = (f"# Calibrated from {base} on {raw['device'].get('device')} ({date}) by bench/calibrate_device.py\n"
                f"# (microbenchmarks only; raw measurements in {base}.calibrated.raw.json).\n"
                f"# efficiency.tensor_core is {what}.\n"
                f"# L2: refit with the HBM saturation exponent (see calibration.l2_override).\n")
        (outdir / f"{name}.yaml").write_text(text + yaml.safe_dump(new.model_dump(mode="json"), sort_keys=False))
        print(f"wrote {outdir / (name + '.yaml')}: tensor_core {new.efficiency.tensor_core:.3f}, "
              f"hbm {new.hbm_per_sm_bandwidth_Bps / 1e9:.1f} GB/s/SM max {new.hbm_bandwidth_Bps * new.efficiency.hbm / 1e12:.2f} TB/s "
              f"(at 132 SMs {new.hbm_bandwidth_from(132) / 1e12:.2f}), "
              f"l2 {new.l2_per_sm_bandwidth_Bps / 1e9:.1f} GB/s/SM max {new.l2_bandwidth_Bps * new.efficiency.l2 / 1e12:.2f} TB/s "
              f"(at 132 SMs {new.l2_bandwidth_from(132) / 1e12:.2f}), "
              f"sync {new.sync_latency_s * 1e6:.2f} us, launch {new.launch_overhead_s * 1e6:.2f} us, "
              f"graph {new.graph_launch_overhead_s * 1e6:.2f} us, gap {new.kernel_gap_s * 1e6:.2f} us")
    print("hbm fit:", json.dumps({k: res[k] for k in res if k.startswith("hbm")}))
    print("l2 fit_saturating:", json.dumps(l2_orig))
    print("l2 refit:", json.dumps(l2))
    print("harness stage ew fit:", json.dumps(pipe_ew))
    dst = outdir / f"{base}.calibrated.raw.json"
    if len(raw_paths) > 1 or raw_paths[0].resolve() != dst.resolve():
        dst.write_text(json.dumps(raw, indent=1, default=str) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--smoke", default="", help="comma-separated plan globs to check quickly after calibrating")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--fit", nargs="*", default=[], help="raw JSON(s) to fit (here); several: "
                    "their median (calibrate.fit.merge_raw)")
    a = ap.parse_args()
    if a.precompile:
        precompile()
    elif a.fit:
        fit([Path(p) for p in a.fit])
    else:
        device(Path(a.out), a.runs, a.smoke)


if __name__ == "__main__":
    main()
