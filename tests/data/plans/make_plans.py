"""Writes the hand-made example plans of this folder (schema kitsune-dse/plan/v1).

Until the explorer writes plans, these stand in for it. Their predicted numbers come from a crude
hand roofline below (H100 SXM: 132 SMs, ~600 TFLOP/s fp16 for an mma.sync GEMM, HBM ~38 GB/s per SM
saturating at 2.7 TB/s, 5 us per kernel launch), NOT from kitsune_dse.cost: they exist so that the
harness has something to compare with. Run: python tests/data/plans/make_plans.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from kitsune_dse.graph import load_model  # noqa: E402

SMS = 132
TC = 600e12 / SMS           # FLOP/s per SM (tensor core, mma.sync)
BW = lambda s: min(38e9 * s, 2.7e12)  # noqa: E731
LAUNCH = 5e-6
HW = {"name": "h100-sxm", "arch": "sm_90", "sm_count": SMS, "hash": "hand"}


def op_time(g, names, sms):
    fl = sum(g.op(n).info.flops for n in names)
    by = sum(g.op(n).info.bytes_read + g.op(n).info.bytes_written for n in names)
    return max(fl / (TC * sms), by / BW(sms)), fl, by


def plan(name, ref, sizes, strategy, kernels, stages=None, queues=None, note=""):
    g = load_model(ref if not ref.endswith(".yaml") else str((HERE / ref).resolve()), sizes)
    ops = [o.name for o in g.ops]
    region = {"id": 0, "strategy": strategy, "ops": ops, "kernels": kernels}
    bsp = sum(op_time(g, [o], SMS)[0] + LAUNCH for o in ops)
    fus = sum(op_time(g, k, SMS)[0] + LAUNCH for k in kernels)
    reads = sum(g.tensors[t].nbytes for t in g.inputs) + sum(g.tensors[t].nbytes for t in g.weights)
    writes = sum(g.tensors[t].nbytes for t in g.outputs)
    inter = sum(g.tensors[t].nbytes for o in g.ops for t in o.outputs if t not in g.outputs)
    if strategy == "pipeline":
        st = []
        for i, s in enumerate(stages):
            t, _, _ = op_time(g, s["ops"], s["sms"])
            st.append({"id": i, **s, "ctas": s["sms"], "predicted_latency_s": t})
        rows = g.tensors[g.inputs[0]].rows
        nrb = max(1, -(-rows // stages[0]["tile"]["rows"]))
        lat = max(x["predicted_latency_s"] for x in st) * (1 + (len(st) - 1) / max(nrb, 4)) + LAUNCH
        region.update(stages=st, queues=queues)
        pred = {"latency_s": lat, "dram_read_bytes": reads, "dram_write_bytes": writes, "kernel_launches": 1}
    else:
        pred = {"latency_s": fus, "dram_read_bytes": reads + inter, "dram_write_bytes": writes + inter,
                "kernel_launches": len(kernels)}
    region["predicted"] = pred
    p = {"schema": "kitsune-dse/plan/v1",
         "model": {"name": g.name, "ref": ref, "sizes": dict(g.meta["sizes"]), "hash": "hand"},
         "hw": HW, "regions": [region], "predicted": pred,
         "baselines": {"bsp": {"latency_s": bsp, "dram_read_bytes": reads + inter,
                               "dram_write_bytes": writes + inter, "kernel_launches": len(ops)},
                       "fusion": {"latency_s": fus, "kernel_launches": len(kernels)}},
         "notes": "hand-made example; predictions from a crude hand roofline, not kitsune_dse.cost. " + note}
    (HERE / f"{name}.json").write_text(json.dumps(p, indent=1) + "\n")
    return p


def main():
    t128 = {"rows": 128, "cols": 128}
    plan("gpt3-mlp-t64", "gpt3-mlp", {"tokens": 64, "tp": 1}, "pipeline",
         [["fc1", "gelu"], ["fc2", "residual"]],
         [{"ops": ["fc1", "gelu"], "sms": 88, "tile": t128}, {"ops": ["fc2", "residual"], "sms": 44, "tile": t128}],
         [{"producer": 0, "consumer": 1, "tensors": ["a"], "slot_bytes": 128 * 49152 * 2, "depth": 2, "mode": "split_k"}],
         "One row-block: only the split-K queue lets fc2 start before fc1 ends.")
    plan("gpt3-mlp-t2048-tp8", "gpt3-mlp", {"tokens": 2048, "tp": 8}, "pipeline",
         [["fc1", "gelu"], ["fc2", "residual"]],
         [{"ops": ["fc1", "gelu"], "sms": 66, "tile": t128}, {"ops": ["fc2", "residual"], "sms": 66, "tile": t128}],
         [{"producer": 0, "consumer": 1, "tensors": ["a"], "slot_bytes": 128 * 6144 * 2, "depth": 8, "mode": "row"}])
    plan("gpt3-mlp-t2048-tp8-splitk", "gpt3-mlp", {"tokens": 2048, "tp": 8}, "pipeline",
         [["fc1", "gelu"], ["fc2", "residual"]],
         [{"ops": ["fc1", "gelu"], "sms": 66, "tile": t128}, {"ops": ["fc2", "residual"], "sms": 66, "tile": t128}],
         [{"producer": 0, "consumer": 1, "tensors": ["a"], "slot_bytes": 128 * 6144 * 2, "depth": 8, "mode": "split_k"}],
         "Like gpt3-mlp-t2048-tp8 with a split-K queue: fc2 starts on each column slab of a row-block.")
    plan("llama2-7b-mlp-t512", "llama2-7b-mlp", {"tokens": 512}, "pipeline",
         [["gate_proj", "up_proj", "silu", "gate_mul"], ["down_proj", "residual"]],
         [{"ops": ["gate_proj", "up_proj", "silu", "gate_mul"], "sms": 88, "tile": t128},
          {"ops": ["down_proj", "residual"], "sms": 44, "tile": t128}],
         [{"producer": 0, "consumer": 1, "tensors": ["inter"], "slot_bytes": 128 * 11008 * 2, "depth": 4, "mode": "split_k"}])
    plan("ln-gemm-t2048", "../models/ln-gemm.yaml", {"tokens": 2048}, "pipeline",
         [["resid", "ln"], ["fc", "act"]],
         [{"ops": ["resid", "ln"], "sms": 16, "tile": t128}, {"ops": ["fc", "act"], "sms": 116, "tile": t128}],
         [{"producer": 0, "consumer": 1, "tensors": ["z"], "slot_bytes": 128 * 4096 * 2, "depth": 8, "mode": "row"}])
    plan("ln-gemm-fusion-t2048", "../models/ln-gemm.yaml", {"tokens": 2048}, "fusion",
         [["resid", "ln"], ["fc", "act"]])


if __name__ == "__main__":
    main()
