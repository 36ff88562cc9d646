"""DRAM microbenchmark of persistent pipelines (issue 6): which bytes a pipeline moves beyond its
compulsory traffic, measured with ncu on probe plans that are NOT the validation suite's
workloads (other sizes of the zoo's models), each built to isolate one mechanism:

  free-*     a GEMM stage alone on S SMs: how many row-blocks share a weight fetch through L2
  fed-*      a weightless stage feeding a GEMM stage: the queue-fed GEMM's weight re-reads
  held-*     a GEMM stage held back by a slow weightless consumer: the throttled GEMM's re-reads
  pair-*     the two GEMM stages of an MLP over a queue-depth sweep
  wb-*       ring and K-split write-back: slots (and fp32 partials) written back to DRAM when
             other traffic evicts them before the next generation overwrites them

    here:    python bench/dram_probe.py --prepare && python bench/dram_probe.py --precompile
             (--only PROBES with --prepare: re-plan those probes, keep the others' plans)
    device:  python3 bench/dram_probe.py --ncu --out $OUT      # -> dram_probe_ncu.csv
             (--only wb-nerf,wbn: those probes; KDSE_RING_ALLOC=arena: rings in one allocation)
             python3 bench/dram_probe.py --run --out $OUT      # -> dram_probe_run.csv (latency)
    here:    python bench/dram_probe.py --report DIR            # model beside each measurement
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

from validate_suite import _pipe, kd, ncu_process  # noqa: E402

PROBES_DIR = ROOT / "bench/dram_probe"
SPEC = ROOT / "hw_specs/h100-sxm.calibrated.yaml"
RESULTS = ROOT / "results/validation/h100/dram_probe"

# (model, sizes): none of them a suite workload's
GPT_4K = ("gpt3-mlp", {"tokens": 4096, "hidden": 4096})          # W1, W2: 134 MB each, 32 row-blocks
GPT_SMALL = ("gpt3-mlp", {"tokens": 8192, "hidden": 1024})       # W: 8 MB each (resident), 64 rbs
LNR_8K = ("ln-residual-gemm", {"tokens": 4096, "hidden": 8192})  # W: 134 MB each
NERF_HALF = ("nerf-mlp", {"rays": 2048})                          # 131k points, 256 wide
TINY_64K = ("gpt3-mlp", {"tokens": 65536, "hidden": 512})        # W: 2 MB each, 512 rbs
TINY_16K = ("gpt3-mlp", {"tokens": 16384, "hidden": 512})        # W: 2 MB each, 128 rbs
MID_32K = ("gpt3-mlp", {"tokens": 32768, "hidden": 1024})        # W: 8.4 MB each, 256 rbs
PAIR = [["fc1", "gelu"], ["fc2", "residual"]]
WS_64 = ("gpt3-mlp", {"tokens": 64, "hidden": 8192})              # W: 537 MB each, one row-block
CHAIN12 = str(ROOT / "bench/probe_models/mlp-chain12.yaml")   # 12 x (GEMM + ReLU), 131k rows
CHAIN12_OPS = [f"{k}{i}" for i in range(1, 13) for k in ("fc", "relu")]

NERF4 = [["fc1", "relu1", "fc2", "relu2", "fc3", "relu3"],
         ["fc4", "relu4", "fc5", "relu5", "skip_concat"],
         ["fc6", "relu6", "fc7", "relu7", "fc8", "relu8"],
         ["sigma_fc", "sigma_relu", "feature_fc", "dir_concat", "view_fc", "view_relu", "rgb_fc", "rgb_sigmoid"]]


def _bsp(ops):
    return {"strategy": "bsp", "ops": list(ops)}


def _fused(ops):
    return {"strategy": "fusion", "ops": list(ops)}


def _one(ops, sms, rows=128):
    return _pipe([list(ops)], [sms], rows, [], [])


# name -> (model, regions): the probed region is the pipeline one; the rest run as bsp
PROBES = {
    "free-fc2-s132": (GPT_4K, [_bsp(["fc1", "gelu"]), _one(["fc2", "residual"], 132)]),
    "free-fc2-s66": (GPT_4K, [_bsp(["fc1", "gelu"]), _one(["fc2", "residual"], 66)]),
    "free-fc2-s33": (GPT_4K, [_bsp(["fc1", "gelu"]), _one(["fc2", "residual"], 33)]),
    "free-fc1-s132": (GPT_4K, [_one(["fc1", "gelu"], 132), _bsp(["fc2", "residual"])]),
    "fed-fc2-d2": (GPT_4K, [_bsp(["fc1"]), _pipe([["gelu"], ["fc2", "residual"]], [12, 120], 128, [2], ["row"])]),
    "fed-fc2-d4": (GPT_4K, [_bsp(["fc1"]), _pipe([["gelu"], ["fc2", "residual"]], [12, 120], 128, [4], ["row"])]),
    "fed-fc2-d6": (GPT_4K, [_bsp(["fc1"]), _pipe([["gelu"], ["fc2", "residual"]], [12, 120], 128, [6], ["row"])]),
    "held-fc2-d2": (GPT_4K, [_bsp(["fc1", "gelu"]), _pipe([["fc2"], ["residual"]], [130, 2], 128, [2], ["row"])]),
    "held-fc2-d8": (GPT_4K, [_bsp(["fc1", "gelu"]), _pipe([["fc2"], ["residual"]], [130, 2], 128, [8], ["row"])]),
    "held-fc2-s1-d2": (GPT_4K, [_bsp(["fc1", "gelu"]), _pipe([["fc2"], ["residual"]], [131, 1], 128, [2], ["row"])]),
    "pair-d2-splitk": (GPT_4K, [_pipe([["fc1", "gelu"], ["fc2", "residual"]], [66, 66], 128, [2], ["split_k"])]),
    "pair-d4-splitk": (GPT_4K, [_pipe([["fc1", "gelu"], ["fc2", "residual"]], [66, 66], 128, [4], ["split_k"])]),
    "pair-d6-splitk": (GPT_4K, [_pipe([["fc1", "gelu"], ["fc2", "residual"]], [66, 66], 128, [6], ["split_k"])]),
    "pair-d4-row": (GPT_4K, [_pipe([["fc1", "gelu"], ["fc2", "residual"]], [66, 66], 128, [4], ["row"])]),
    "wb-lnr-d8": (LNR_8K, [_pipe([["ln1", "gemm1", "residual1"], ["ln2", "gemm2", "residual2"]],
                                 [66, 66], 128, [8], ["row"])]),
    "wb-gpt-small-d8-splitk": (GPT_SMALL, [_pipe([["fc1", "gelu"], ["fc2", "residual"]], [88, 44], 128, [8],
                                                 ["split_k"])]),
    "wb-gpt-small-d8-row": (GPT_SMALL, [_pipe([["fc1", "gelu"], ["fc2", "residual"]], [88, 44], 128, [8], ["row"])]),
    "wb-gpt-small-p1": (GPT_SMALL, [_one(["fc1", "gelu", "fc2", "residual"], 132, 1024)]),
    "wb-nerf-p4-d2-splitk": (NERF_HALF, [_pipe(NERF4, [30, 36, 36, 30], 2048, [2, 2, 2], ["split_k"] * 3)]),
    "wb-nerf-p4-d4-row": (NERF_HALF, [_pipe(NERF4, [33, 33, 33, 33], 1024, [4, 4, 4], ["row"] * 3)]),
    "wb-nerf-p1": (NERF_HALF, [_one([o for s in NERF4 for o in s], 132, 2048)]),
    # write-back with every weight resident: ring footprint, generations, K-split partials
    "wbr-tiny-d2-row": (TINY_64K, [_pipe(PAIR, [66, 66], 128, [2], ["row"])]),
    "wbr-tiny-d8-row": (TINY_64K, [_pipe(PAIR, [66, 66], 128, [8], ["row"])]),
    "wbr-tiny-d32-row": (TINY_64K, [_pipe(PAIR, [66, 66], 128, [32], ["row"])]),
    "wbr-tiny-d48-row": (TINY_64K, [_pipe(PAIR, [66, 66], 128, [48], ["row"])]),
    "wbr-tiny-d8-splitk": (TINY_64K, [_pipe(PAIR, [66, 66], 128, [8], ["split_k"])]),
    "wbr-tiny16k-d8-row": (TINY_16K, [_pipe(PAIR, [66, 66], 128, [8], ["row"])]),
    "wbr-tiny-p1-r256": (TINY_64K, [_one([o for s in PAIR for o in s], 132, 256)]),
    "wbr-tiny-p1-r1024": (TINY_64K, [_one([o for s in PAIR for o in s], 132, 1024)]),
    "wbr-tiny-p1-r4096": (TINY_64K, [_one([o for s in PAIR for o in s], 132, 4096)]),
    "wbr-mid-d2-row": (MID_32K, [_pipe(PAIR, [66, 66], 128, [2], ["row"])]),
    "wbr-mid-d8-row": (MID_32K, [_pipe(PAIR, [66, 66], 128, [8], ["row"])]),
    "wbr-nerf-p1-r256": (NERF_HALF, [_one([o for s in NERF4 for o in s], 132, 256)]),
    "wbr-nerf-p1-r512": (NERF_HALF, [_one([o for s in NERF4 for o in s], 132, 512)]),
    # NeRF's inner rings: their width (slot size), depth (plan tile rows) and generations
    "wbn-w128-p1-r2048": (("nerf-mlp", {"rays": 2048, "width": 128, "view_width": 64}),
                          [_one([o for s in NERF4 for o in s], 132, 2048)]),
    "wbn-w512-p1-r2048": (("nerf-mlp", {"rays": 2048, "width": 512, "view_width": 256}),
                          [_one([o for s in NERF4 for o in s], 132, 2048)]),
    "wbn-w256-p1-r1024": (NERF_HALF, [_one([o for s in NERF4 for o in s], 132, 1024)]),
    "wbn-w256-p1-r4096": (NERF_HALF, [_one([o for s in NERF4 for o in s], 132, 4096)]),
    "wbn-w256-p1-r2048-rays1024": (("nerf-mlp", {"rays": 1024}), [_one([o for s in NERF4 for o in s], 132, 2048)]),
    # one inner ring of the same footprints (the tiny MLP in one stage)
    "wbn-tiny-p1-r2048": (TINY_64K, [_one([o for s in PAIR for o in s], 132, 2048)]),
    "wbn-tiny-w2048-p1-r2048": (("gpt3-mlp", {"tokens": 65536, "hidden": 256, "ffn": 2048}),
                                [_one([o for s in PAIR for o in s], 132, 2048)]),
    # fourteenth session: which of NeRF's features makes its small inner rings write back. The
    # same ring structure (12 GEMM steps in one stage, 11 inner rings of 256 columns) without
    # NeRF's concats and heads, with a narrow head, and NeRF with 128-byte aligned encodings
    "wbx-chain12-p1-r2048": ((CHAIN12, {}), [_one(CHAIN12_OPS, 132, 2048)]),
    "wbx-chain12-o8-p1-r2048": ((CHAIN12, {"out": 8}), [_one(CHAIN12_OPS, 132, 2048)]),
    "wbx-chain12-o8-p1-r256": ((CHAIN12, {"out": 8}), [_one(CHAIN12_OPS, 132, 256)]),
    "wbx-nerf-a64-p1-r2048": (("nerf-mlp", {"rays": 2048, "xyz_enc": 64, "dir_enc": 64}),
                              [_one([o for s in NERF4 for o in s], 132, 2048)]),
    # fourteenth session: two weight-streaming GEMM stages beside each other (gpt3 t64's
    # explorer-5 measured 1,158 us against 1,048: its consumer's tail). fc1 | fc2 through a
    # split_k queue at several SM splits, and each GEMM alone on the same SM counts
    **{f"ws-pair-s{a}-{b}": (WS_64, [_pipe(PAIR, [a, b], 64, [1], ["split_k"], slabs=16)])
       for a, b in ((66, 66), (88, 44), (44, 88), (99, 33))},
    "ws-row-s66-66": (WS_64, [_pipe(PAIR, [66, 66], 64, [1], ["row"])]),   # one after the other
    **{f"ws-fc1-s{a}": (WS_64, [_one(PAIR[0], a, 64), _bsp(PAIR[1])]) for a in (44, 66, 88, 99)},
    **{f"ws-fc2-s{b}": (WS_64, [_bsp(PAIR[0]), _one(PAIR[1], b, 64)]) for b in (33, 44, 66, 88)},
}
# standalone GEMM grids (fc1 alone, bsp): which operand tiles later waves re-read (cost.gemm_l2)
GEMM_SHAPES = [(4096, 8192, 8192), (8192, 8192, 4096), (2048, 16384, 8192), (4096, 4096, 16384),
               (16384, 4096, 4096), (1024, 32768, 4096), (8192, 2048, 8192), (3072, 12288, 6144),
               (8192, 8192, 8192), (2048, 4096, 4096), (16384, 16384, 2048), (6144, 6144, 6144),
               # thirteenth session: K at fixed M x N, M at fixed N x K, strides off powers of two
               (4096, 4096, 2048), (4096, 4096, 4096), (4096, 4096, 8192), (4096, 4096, 12288),
               (4096, 4096, 24576), (2048, 8192, 4096), (2048, 8192, 16384), (2048, 4096, 8192),
               (8192, 4096, 8192), (16384, 4096, 8192), (4096, 4224, 8192), (4096, 4096, 8256),
               (1024, 8192, 24576), (12288, 1024, 12288),
               # one row-block or one column tile shared by every CTA of a wave (decode-like)
               (64, 24576, 8192), (64, 32768, 16384), (64, 65536, 4096), (128, 32768, 8192),
               (256, 16384, 16384), (32768, 128, 8192), (65536, 256, 4096), (16384, 512, 16384)]
for _m, _n, _k in GEMM_SHAPES:
    PROBES[f"gemm-{_m}x{_n}x{_k}"] = (("gpt3-mlp", {"tokens": _m, "hidden": _k, "ffn": _n}),
                                      [_bsp(["fc1"]), _bsp(["gelu", "fc2", "residual"])])


# fifteenth session: two stages whose weights (13-52 MB each) neither stay in L2 nor stream past
# it (between the resident wbr-* and the 134 MB wb-lnr/free-* weights): how much of a weight pass
# L2 still holds (cost.l2_residency.streamed_weight_hit). ln-residual-gemm at 4096 tokens, other
# hidden sizes than the suite's 4096
LNR_STAGES = [["ln1", "gemm1", "residual1"], ["ln2", "gemm2", "residual2"]]
for _h in (2560, 3072, 3584, 4608, 5120):
    PROBES[f"wsh-lnr{_h}-d8-row"] = (("ln-residual-gemm", {"tokens": 4096, "hidden": _h}),
                                    [_pipe(LNR_STAGES, [66, 66], 128, [8], ["row"])])
for _h, _t in ((3840, 4096), (4352, 4096), (4096, 2048), (4096, 8192)):   # near the suite's 4096 x 4096
    PROBES[f"wsh-lnr{_h}-t{_t}-d8-row"] = (("ln-residual-gemm", {"tokens": _t, "hidden": _h}),
                                          [_pipe(LNR_STAGES, [66, 66], 128, [8], ["row"])])
for _h in (3072, 4608):
    PROBES[f"wsh-lnr{_h}-r256-d4-row"] = (("ln-residual-gemm", {"tokens": 4096, "hidden": _h}),
                                         [_pipe(LNR_STAGES, [44, 88], 256, [4], ["row"])])

# fifteenth session: what a kernel finds in L2 of what the kernel before it read or wrote. The
# same MLP cut into one, two and four kernel-per-op (plan) or fused (fusion) kernels, each range
# from a flushed L2: a later kernel's reads are the difference of two ranges. Sizes are none of
# the suite's: a GEMM's output smaller than L2 behind a weight-streaming GEMM (gptm, t1k), a
# 100 MB intermediate with a 25 MB input re-read by the residual (bertm), an MLP that fits L2
# (small: dlrm's eager kernels wrote back 3.4 MB where its fused ones wrote 0.1)
SEQ_FAMILIES = {"gptm": {"tokens": 2048, "hidden": 8192, "ffn": 4096},
                "bertm": {"tokens": 12288, "hidden": 1024, "ffn": 4096},
                "t1k": {"tokens": 1024, "hidden": 12288, "ffn": 6144},
                "small": {"tokens": 2048, "hidden": 512, "ffn": 2048}}    # 27 MB in all: fits L2
SEQ_VARIANTS = ["plan", "cublas"]
PROBED = {}
for _f, _sizes in SEQ_FAMILIES.items():
    PROBES[f"seq-{_f}-1"] = (("gpt3-mlp", _sizes), [_bsp(["fc1"]), _bsp(["gelu", "fc2", "residual"])])
    PROBES[f"seq-{_f}-2"] = (("gpt3-mlp", _sizes), [_bsp(["fc1", "gelu"]), _bsp(["fc2", "residual"])])
    PROBES[f"seq-{_f}-2b"] = PROBES[f"seq-{_f}-2"]
    PROBED[f"seq-{_f}-2b"] = 1          # fc2 + residual from a flushed L2
    PROBES[f"seq-{_f}-4"] = (("gpt3-mlp", _sizes), [_bsp(["fc1", "gelu", "fc2", "residual"])])
    PROBES[f"seq-{_f}-3"] = (("gpt3-mlp", _sizes), [_bsp(["fc1", "gelu"]), _bsp(["fc2"]), _bsp(["residual"])])
    PROBED[f"seq-{_f}-3"] = 1           # fc2 alone from a flushed L2
    PROBES[f"seq-{_f}-4f"] = (("gpt3-mlp", _sizes), [_fused(["fc1", "gelu", "fc2", "residual"])])
# diagnostic only, never fitted: the suite's own gpt3 t2048 and bert shapes cut the same way
# (their kernel-per-op baselines read 28 and 18 MB beyond their fused ones where the position
# model says 74 and 126)
DIAG_FAMILIES = {"t2k": {"tokens": 2048, "tp": 8}, "bert": {"tokens": 16384, "hidden": 768}}
for _f, _sizes in DIAG_FAMILIES.items():
    for _x, _regions in (("1", [_bsp(["fc1"]), _bsp(["gelu", "fc2", "residual"])]),
                         ("2", [_bsp(["fc1", "gelu"]), _bsp(["fc2", "residual"])]),
                         ("3", [_bsp(["fc1", "gelu"]), _bsp(["fc2"]), _bsp(["residual"])]),
                         ("4", [_bsp(["fc1", "gelu", "fc2", "residual"])])):
        PROBES[f"diag-{_f}-{_x}"] = (("gpt3-mlp", _sizes), _regions)
    PROBES[f"diag-{_f}-4f"] = (("gpt3-mlp", _sizes), [_fused(["fc1", "gelu", "fc2", "residual"])])
    PROBES[f"diag-{_f}-2b"] = PROBES[f"diag-{_f}-2"]
    PROBED[f"diag-{_f}-2b"] = 1
    PROBED[f"diag-{_f}-3"] = 1
# LLaMA's gated MLP, kernel per op: x read by two GEMMs and the residual, two products multiplied
LLAMA_1K = ("llama2-7b-mlp", {"tokens": 1024})
LLAMA_OPS = ["gate_proj", "up_proj", "silu", "gate_mul", "down_proj", "residual"]
for _i in (1, 2, 4, 6):
    PROBES[f"seq-llm-{_i}"] = (LLAMA_1K, [_bsp(LLAMA_OPS[:_i])] + ([_bsp(LLAMA_OPS[_i:])] if _i < 6 else []))


def probed_region(regions, name: str = "") -> int:
    """The region a probe measures: its pipeline, else its first (or the one PROBED names)."""
    if name in PROBED:
        return PROBED[name]
    return next((i for i, r in enumerate(regions) if r["strategy"] == "pipeline"), 0)


# every pipeline probe is fitted: NeRF's many small rings (wb-nerf, wbr-nerf, wbn-w) wrote back
# where the footprint without the kernel's local memory said none; with its spilled frames
# (bench/frame_probe.py) they follow the same logistic as the one-ring probes
def _probe_medians(csvs: list[Path], keep, columns: dict[str, str]) -> list[dict]:
    """Each probe whose name `keep` accepts, with its graph and pipeline choice and, per key of
    `columns`, the median over the CSVs given of that CSV column."""
    import statistics

    import pandas as pd

    from kitsune_dse.graph import load_model
    from kitsune_dse.report.plan import choice_from_region
    d = pd.concat([pd.read_csv(c) for c in csvs])
    out = []
    for name, grp in d.groupby("probe", sort=True):
        if not keep(name):
            continue
        (model, sizes), regions = PROBES[name]
        rd = next(r for r in regions if r["strategy"] == "pipeline")
        out.append({"name": name, "graph": load_model(model, sizes), "choice": choice_from_region(rd),
                    **{k: statistics.median(grp[col]) for k, col in columns.items()}})
    return out


def fit_probes(csvs: list[Path]) -> list[dict]:
    """The measured probes (median over the CSVs given) as calibrate.fit_dram wants them."""
    return _probe_medians(csvs, lambda n: n in PROBES and not n.startswith(("gemm-", "seq-", "diag-")),
                          {"read_bytes": "measured_dram_read_bytes", "write_bytes": "measured_dram_write_bytes"})


WEIGHT_STREAM_CSVS = "results/validation/h100/dram_probe/weight_stream/dram_probe_run_*.csv"


def weight_stream_rows(csvs: list[Path]) -> list[dict]:
    """The slab-fed weight-streaming pairs (ws-pair-*), median latency over the run CSVs given,
    as calibrate.fit.fit_concurrent_stream wants them."""
    return _probe_medians(csvs, lambda n: n.startswith("ws-pair-"), {"time_s": "measured_latency_s"})


SEQ_CSVS = "results/validation/h100/dram_probe/seq/dram_probe_ncu_*.csv"


def sequence_rows(csvs: list[Path]) -> list[dict]:
    """The kernel sequences (seq-*, not the diagnostic diag-*) as the harness ran them (variant
    plan), median over the CSVs given, as calibrate.fit_dram.fit_dirty_residue wants them."""
    import pandas as pd

    from kitsune_dse.graph import load_model
    d = pd.concat([pd.read_csv(c) for c in csvs])
    d = d[d["probe"].str.startswith("seq-") & (d["variant"] == "plan")]
    out = []
    for name, grp in d.groupby("probe", sort=True):
        (model, sizes), regions = PROBES[name]
        plan = json.loads((PROBES_DIR / f"{name}.json").read_text())
        region = plan["regions"][probed_region(regions, name)]
        out.append({"name": name, "graph": load_model(model, sizes), "ops": region["ops"],
                    "kernels": region["kernels"], "read_bytes": float(grp["measured_dram_read_bytes"].median()),
                    "write_bytes": float(grp["measured_dram_write_bytes"].median())})
    return out


GEMM_CSVS = "results/validation/h100/dram_probe/gemm/dram_probe_ncu_*.csv"


def _gemm_read_medians(csvs: list[Path], variant: str) -> dict[str, float]:
    """Each standalone GEMM grid's (gemm-*) measured DRAM read bytes as `variant` ran it, median
    over the CSVs given."""
    import pandas as pd
    d = pd.concat([pd.read_csv(c) for c in csvs])
    d = d[d["probe"].str.startswith("gemm-") & (d.get("variant", "plan") == variant)]
    return {name: float(grp["measured_dram_read_bytes"].median()) for name, grp in d.groupby("probe", sort=True)}


def gemm_grid_rows(csvs: list[Path]) -> list[dict]:
    """The harness's standalone GEMM grids (variant plan) as calibrate.fit_dram.fit_grid_reuse
    wants them."""
    out = []
    for name, read in _gemm_read_medians(csvs, "plan").items():
        m, n, k = (int(v) for v in name[len("gemm-"):].split("x"))
        out.append({"m": m, "n": n, "k": k, "read_bytes": read})
    return out


def library_grid_rows(csvs: list[Path]) -> list[dict]:
    """The same grids as cuBLAS runs them (variant cublas: the product, then the bias kernel) as
    calibrate.fit_dram.fit_library_read_grid wants them."""
    from kitsune_dse.graph import load_model
    out = []
    for name, read in _gemm_read_medians(csvs, "cublas").items():
        (model, sizes), regions = PROBES[name]
        out.append({"name": name, "graph": load_model(model, sizes), "ops": regions[0]["ops"],
                    "read_bytes": read})
    return out


def prepare() -> None:
    import shutil
    import tempfile

    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    spec = load_spec(str(SPEC))
    only = [x for x in os.environ.get("KDSE_PROBE_ONLY", "").split(",") if x]
    manifest = []
    if only:    # the selected probes only: the others' plans and manifest rows stay as they are
        manifest = [m for m in json.loads((PROBES_DIR / "manifest.json").read_text())
                    if not any(x in m["probe"] for x in only)]
    else:
        if PROBES_DIR.exists():
            shutil.rmtree(PROBES_DIR)
        PROBES_DIR.mkdir(parents=True)
    bases = {}
    for name, ((model, sizes), regions) in PROBES.items():
        if only and not any(x in name for x in only):
            continue
        key = (model, json.dumps(sizes, sort_keys=True))
        if key not in bases:
            with tempfile.TemporaryDirectory() as td:
                sets = [x for k, v in sizes.items() for x in ("--set", f"{k}={v}")]
                kd("explore", model, "--hw", str(SPEC.relative_to(ROOT)), *sets, "--out", td)
                bases[key] = json.loads((Path(td) / "plan.json").read_text())
        base = bases[key]
        graph = load_model(model, sizes)
        hp = {"schema": base["schema"], "model": base["model"], "hw": base["hw"], "objective": "probe",
              "regions": [dict(r, id=j) for j, r in enumerate(json.loads(json.dumps(regions)))]}
        new = evaluate_plan(hp, graph, spec, where=name)
        new["model"] = base["model"]
        f = PROBES_DIR / f"{name}.json"
        f.write_text(json.dumps(new, indent=1))
        r = new["regions"][probed_region(regions, name)]
        p = r["predicted"]
        pl = r.get("pipeline") or {}
        manifest.append({"probe": name, "file": str(f.relative_to(ROOT)), "region": r["id"],
                         "predicted_latency_s": p["latency_s"],
                         "predicted_dram_read_bytes": p["dram_read_bytes"],
                         "predicted_dram_write_bytes": p["dram_write_bytes"],
                         "weight_reread_bytes": pl.get("weight_reread_bytes"),
                         "queue_write_back_bytes": pl.get("queue_write_back_bytes")})
        print(f"{name}: {p['latency_s'] * 1e6:.0f} us, read {p['dram_read_bytes'] / 1e6:.1f} MB, "
              f"write {p['dram_write_bytes'] / 1e6:.1f} MB")
    (PROBES_DIR / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _regions():
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.plan import load_plan
    only = [x for x in os.environ.get("KDSE_PROBE_ONLY", "").split(",") if x]
    for m in json.loads((PROBES_DIR / "manifest.json").read_text()):
        if only and not any(x in m["probe"] for x in only):
            continue
        plan = load_plan(ROOT / m["file"])
        graph = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        yield m, plan, graph, plan["regions"][m["region"]]


def precompile() -> None:
    import concurrent.futures as cf

    from precompile import compile_one

    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.plan import DeviceInfo
    from kitsune_dse.validate.runtime import Tensors, make_variants
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    srcs = []
    for m, _, graph, region in _regions():
        reg = Region(graph, region)
        which = SEQ_VARIANTS[:1] if m["probe"].startswith(("seq-", "diag-")) else ["plan"]
        srcs += [v.build() for v in make_variants(reg, region, Tensors(reg), info, which=which)]
    out = ROOT / "bench/.cubin_cache"
    out.mkdir(parents=True, exist_ok=True)
    with cf.ThreadPoolExecutor(8) as ex:
        for r in ex.map(lambda s: compile_one(s, "sm_90", out), list(dict.fromkeys(srcs))):
            if "FAILED" in r or "spill" in r:
                print(r[:600], flush=True)


def ncu_child(order_path: str) -> None:
    import cupy as cp

    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.measure import L2Flusher
    from kitsune_dse.validate.ncu import profile_region
    from kitsune_dse.validate.runtime import gpu_info
    info, _ = gpu_info()
    stream = cp.cuda.Stream(non_blocking=True)
    flush = L2Flusher()
    order = []
    stream.__enter__()
    for m, _, graph, region in _regions():
        def on_range(v, m=m):
            order.append([m["probe"], v.name])
            Path(order_path).write_text(json.dumps(order))
        # a standalone GEMM grid also as cuBLAS runs it (the cublas baselines' reads)
        variants = (["plan", "cublas"] if m["probe"].startswith("gemm-") else
                    SEQ_VARIANTS if m["probe"].startswith(("seq-", "diag-")) else ["plan"])
        profile_region(Region(graph, region), region, info, variants, stream, flush, on_range)


def ncu(out: Path, budget_s: float) -> None:
    from kitsune_dse.validate.harness import env_summary
    out.mkdir(parents=True, exist_ok=True)
    env = env_summary()
    order, log = out / "dram_probe_order.json", out / "dram_probe_ncu_raw.csv"
    t0 = time.time()
    names, res = ncu_process([str(Path(__file__).resolve()), "--ncu-child", str(order)], log, order, budget_s)
    by = {m["probe"]: m for m in json.loads((PROBES_DIR / "manifest.json").read_text())}
    rows = []
    for (name, variant), r in zip(names, res):
        rows.append({**by[name], "variant": variant, "measured_dram_read_bytes": r.get("dram__bytes_read.sum", float("nan")),
                     "measured_dram_write_bytes": r.get("dram__bytes_write.sum", float("nan")),
                     **{k: v for k, v in r.items() if not k.startswith("dram__")},
                     "gpu": env.get("gpu"), "driver": env.get("driver"), "date": env.get("date"),
                     "command": "python3 bench/dram_probe.py --ncu (ncu --clock-control none "
                                "--replay-mode range --metrics dram__bytes_read.sum,dram__bytes_write.sum)"})
    import pandas as pd
    pd.DataFrame(rows).to_csv(out / "dram_probe_ncu.csv", index=False)
    print(f"ncu: {len(rows)} probes in {time.time() - t0:.0f} s")


def run(out: Path, runs: int) -> None:
    """Each probe's pipeline region timed by the harness (an unseen-plan check of the latency
    model as well: none of these plans is in the suite)."""
    import pandas as pd

    from kitsune_dse.validate.harness import validate_plan
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    only = [x for x in os.environ.get("KDSE_PROBE_ONLY", "").split(",") if x]
    for m in json.loads((PROBES_DIR / "manifest.json").read_text()):
        if only and not any(x in m["probe"] for x in only):
            continue
        plan = json.loads((ROOT / m["file"]).read_text())
        plan["regions"] = [r for r in plan["regions"] if r["id"] == m["region"]]
        try:
            rs = validate_plan(plan, runs=runs, warmup=2, checks=1, variants=["plan"], warm=False)
        except Exception as e:  # noqa: BLE001
            rs = [{"error": f"{type(e).__name__}: {e}"}]
        for r in rs:
            rows.append({"probe": m["probe"], **{k: r.get(k) for k in (
                "predicted_latency_s", "measured_latency_s", "p10_latency_s", "p90_latency_s",
                "correct", "error", "placement", "gpu", "driver", "date")}})
            lat = r.get("measured_latency_s")
            print(f"{m['probe']}: {lat and lat * 1e6 or 0:.0f} us (pred {m['predicted_latency_s'] * 1e6:.0f}) "
                  f"{'ok' if r.get('correct') else r.get('error')}", flush=True)
        pd.DataFrame(rows).to_csv(out / "dram_probe_run.csv", index=False)


def report(src: Path) -> None:
    """The measured CSV beside the model's current prediction of each probe (a GEMM grid's cublas
    row: the region priced as the cublas baseline, with the cuBLAS spec)."""
    import pandas as pd

    from kitsune_dse.cost.region import Region as CRegion
    from kitsune_dse.cost.strategies import LaunchChoice, library_bsp
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    spec = load_spec(str(SPEC))
    cspec = load_spec(str(ROOT / "hw_specs/h100-sxm-cublas.calibrated.yaml"))
    d = pd.read_csv(src / "dram_probe_ncu.csv" if src.is_dir() else src)
    if "variant" not in d:
        d["variant"] = "plan"
    cur = {}
    for name, ((model, sizes), regions) in PROBES.items():
        f = PROBES_DIR / f"{name}.json"
        if not f.exists():
            continue
        plan = json.loads(f.read_text())
        graph = load_model(model, sizes)
        new = evaluate_plan({k: v for k, v in plan.items() if k != "predicted"}, graph, spec, where=name)
        r = new["regions"][probed_region(regions, name)]
        cur[name, "plan"] = (r["predicted"]["dram_read_bytes"], r["predicted"]["dram_write_bytes"])
        if name.startswith(("gemm-", "seq-", "diag-")):
            e = library_bsp(CRegion.of(graph, r["ops"]), spec, LaunchChoice("eager"), library_spec=cspec)
            cur[name, "cublas"] = (e.dram_read_bytes, e.dram_write_bytes)
    print(f"{'probe':34s} {'meas R':>8s} {'pred R':>8s} {'err':>6s} {'meas W':>8s} {'pred W':>8s} {'err':>6s}  (MB)")
    for _, r in d.iterrows():
        v = r["variant"] if isinstance(r["variant"], str) else "plan"
        pr, pw = cur.get((r["probe"], v), (r["predicted_dram_read_bytes"], r["predicted_dram_write_bytes"]))
        mr, mw = r["measured_dram_read_bytes"], r["measured_dram_write_bytes"]
        label = r["probe"] + ("" if v == "plan" else f" [{v}]")
        print(f"{label:34s} {mr / 1e6:8.1f} {pr / 1e6:8.1f} {100 * (pr / mr - 1):+5.0f}% "
              f"{mw / 1e6:8.1f} {pw / 1e6:8.1f} {100 * (pw / mw - 1):+5.0f}%")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prepare", action="store_true")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--ncu-child", default="")
    ap.add_argument("--ncu-budget-s", type=float, default=300.0)
    ap.add_argument("--report", default="")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench/out")))
    ap.add_argument("--only", default="", help="comma-separated substrings of the probes to run "
                    "(--ncu, --run)")
    a = ap.parse_args()
    if a.only:
        os.environ["KDSE_PROBE_ONLY"] = a.only      # (the ncu child inherits it)
    if a.prepare:
        prepare()
    if a.precompile:
        precompile()
    if a.run:
        run(Path(a.out), a.runs)
    if a.ncu:
        ncu(Path(a.out), a.ncu_budget_s)
    if a.ncu_child:
        ncu_child(a.ncu_child)
    if a.report:
        report(Path(a.report))


if __name__ == "__main__":
    main()
