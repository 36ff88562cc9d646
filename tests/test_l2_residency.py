"""What a pipeline's L2 keeps and sends back to DRAM (cost.l2_residency), by hand, and the fits of
its efficiency fields and of the kernel's local frames (calibrate.fit_dram) recovering a
synthetic truth."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from helpers_graphs import H100, MiB, chain_graph, mlp_graph
from hypothesis import given, settings, strategies as st

from kitsune_dse.cost.l2_residency import (free_row_blocks, local_frame_bytes, streamed_weight_hit,
                                          write_back_fraction)
from kitsune_dse.cost.pipeline import PipelineChoice, pipeline, runtime_ksplit
from kitsune_dse.cost.region import Region
from kitsune_dse.cost.roofline import KernelWork, weight_reread_bytes


def test_which_row_blocks_run_free():
    assert free_row_blocks(0, 1, 32, 2) == 32            # a lone stage: all of them
    assert free_row_blocks(1, 2, 32, 8) == 0             # fed through a queue: none
    assert free_row_blocks(0, 3, 32, 4) == 8             # the first: twice its output ring
    assert free_row_blocks(0, 2, 32, 16) == 32           # ... at most all


def test_write_back_logistic_and_hit_by_hand():
    # 50 MiB of L2, half written back at 0.6 of it (30 MiB), width 0.1 (5 MiB)
    sp = replace_eff(H100, l2_writeback_width=0.1)
    assert write_back_fraction(30 * MiB, sp) == pytest.approx(0.5, rel=1e-12)
    assert write_back_fraction(35 * MiB, sp) == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-12)
    assert write_back_fraction(20 * MiB, sp) == pytest.approx(1 / (1 + math.exp(2)), rel=1e-12)
    assert write_back_fraction(math.inf, sp) == 1.0
    # the tests' own spec: a step at 30 MiB
    assert write_back_fraction(25 * MiB, H100) < 1e-4 and write_back_fraction(35 * MiB, H100) > 1 - 1e-4
    assert streamed_weight_hit(0.0, H100) == 0.0
    assert streamed_weight_hit(100 * MiB, H100) == pytest.approx(math.exp(-2))


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 200), st.floats(0, 200), st.floats(0.2, 1.5), st.floats(0.02, 0.5))
def test_write_back_never_falls_as_the_footprint_grows(a_mib, b_mib, center, width):
    sp = replace_eff(H100, l2_writeback_center=center, l2_writeback_width=width)
    lo, hi = sorted((a_mib, b_mib))
    f_lo, f_hi = write_back_fraction(lo * MiB, sp), write_back_fraction(hi * MiB, sp)
    assert 0.0 <= f_lo <= f_hi <= 1.0


def test_local_frames_by_hand():
    # two stages: 3 steps one of which concatenates, and 2 steps; 10 bytes a step and 30 more a
    # concatenation per thread: 3 x 10 + 30 + 2 x 10 = 80 bytes a thread, 512 threads on 132 SMs
    sp = H100.model_copy(update={"local_frame_step_bytes": 10.0, "local_frame_concat_bytes": 30.0})
    feats = [{"steps": 3, "concat": 1, "gemm": 2}, {"steps": 2, "gemm": 2}]
    assert local_frame_bytes(feats, sp, 512 * 132) == 80 * 512 * 132
    assert local_frame_bytes(feats, H100, 512 * 132) == 0.0      # no frames on an uncalibrated spec


def test_the_l2_footprint_counts_the_kernels_local_frames():
    # NeRF in one stage: 14 steps, 12 GEMMs and two concatenations (skip and view direction), the
    # sigma and rgb heads narrow GEMMs; its frames join the footprint at the spec's share
    from kitsune_dse.cost.pipeline import stage_frame_features
    from kitsune_dse.graph import load_model
    g = load_model("nerf-mlp", {"rays": 64})
    ops = tuple(o.name for o in g.ops)
    f = stage_frame_features(g, H100, ops)
    assert f == {"steps": 14, "gemm": 12, "narrow": 2, "concat": 2, "row": 0}
    sp = H100.model_copy(update={"local_frame_step_bytes": 10.0, "local_frame_concat_bytes": 30.0})
    on = replace_eff(sp, l2_local_frame_share=0.5)
    ch = PipelineChoice((ops,), (132,), 128)
    r = Region.of(g)
    base = pipeline(r, sp, ch).breakdown["l2_footprint_bytes"]
    frames = 0.5 * (14 * 10 + 2 * 30) * 512 * 132
    e = pipeline(r, on, ch)
    assert e.breakdown["l2_footprint_bytes"] == pytest.approx(base + frames, rel=1e-12)
    assert e.breakdown["l2_frame_bytes"] == pytest.approx(frames, rel=1e-12)
    assert pipeline(r, sp, ch).breakdown["l2_frame_bytes"] == 0.0       # no share: none counted


def test_the_frame_fit_recovers_its_bytes():
    from kitsune_dse.calibrate.fit_dram import fit_local_frame
    rows = [{"frame_bytes": 12.0 * s + 40.0 * c, "stages": [{"steps": s - 1, "concat": c}, {"steps": 1}]}
            for s in range(1, 9) for c in range(0, 3)]
    fit = fit_local_frame(rows)
    assert fit["local_frame_step_bytes"] == pytest.approx(12.0, rel=1e-9)
    assert fit["local_frame_concat_bytes"] == pytest.approx(40.0, rel=1e-9)
    assert fit["rms_bytes"] < 1e-9


def test_paced_row_blocks_read_the_weights_each():
    # 16 row-blocks, 48 items each on 132 workers: 2.75 row-blocks a round; 4 run free sharing
    # 1 + 0.5 x 1.75 = 1.875 per fetch, 12 paced; L2 keeps a fifth of each pass again
    w = KernelWork("mm", "fp16", persistent=True, ctas_per_sm=2, weight_pass_bytes=100.0, rbs=16,
                   items_per_rb=48, rbs_at_once_max=16, free_rbs=4, weight_share=0.5, weight_l2_hit=0.2)
    want = 100 * 0.8 * (4 / 1.875 + 12 - 1)
    assert weight_reread_bytes(w, 66) == pytest.approx(want, rel=1e-12)
    assert weight_reread_bytes(w, np.array([66.0]))[0] == pytest.approx(want, rel=1e-12)
    # never fewer passes than one; all free and unshared: one per row-block
    assert weight_reread_bytes(replace(w, free_rbs=16, weight_share=0.0), 66) == pytest.approx(100 * 0.8 * 15)


def test_split_k_partial_sums_written_back_by_hand():
    # 8192 rows of hidden 1024 and ffn 4096 (the dram_probe's wb-gpt-small): fc2's 8 column tiles
    # per row-block on 88 workers split K = 4096 (32 slabs of 128) in 4 ranges of 1024; each
    # range stores a 128 x 1024 fp32 partial per row-block (64 of them) and the last reads all
    r = Region.of(mlp_graph(8192, 1024, 4096))
    e = pipeline(r, H100, PipelineChoice((("fc1", "gelu"), ("fc2", "residual")), (88, 44), 128, (8,),
                                         ("split_k",)))
    ws_split = 8 * 128 * 1024 * 4                        # 8 slots of one plane
    assert runtime_ksplit(8, 88, 4096, 128, ws_split) == 4
    fp = e.breakdown["l2_footprint_bytes"] + 4 * ws_split
    f = write_back_fraction(fp, H100)
    assert f == pytest.approx(1 / (1 + math.exp(-(fp - 30 * MiB) / (0.5 * MiB))), rel=1e-12)
    assert e.breakdown["partial_sum_write_back_bytes"] == pytest.approx(f * 4 * 128 * 1024 * 4 * 64, rel=1e-12)
    # written and read back: both totals carry them
    assert e.dram_write_bytes >= r.compulsory_bytes()[1] + e.breakdown["partial_sum_write_back_bytes"]


def test_l2_footprint_by_hand():
    # relu | relu over [8192, 8192] fp16, 256-row tiles, 4 slots of 4 MiB: 16 MiB of ring and
    # x, y (256 MiB) over a cycle of 8 of the 64 row-blocks
    r = Region.of(chain_graph(8192, 8192, ("relu", "relu")))
    e = pipeline(r, H100, PipelineChoice((("op0",), ("op1",)), (66, 66), 256, (4,)))
    assert e.breakdown["l2_footprint_bytes"] == pytest.approx(16 * MiB + 256 * MiB * 8 / 64)


def test_fit_recovers_a_synthetic_truth():
    from kitsune_dse.calibrate.fit_dram import FIELDS, fit_pipeline_l2, pipeline_dram_bytes
    frames = H100.model_copy(update={"local_frame_step_bytes": 40.0, "local_frame_concat_bytes": 30.0})
    truth = replace_eff(frames, l2_weight_share=0.6, l2_writeback_center=0.5, l2_writeback_width=0.08,
                        l2_resident_reread=0.5, l2_local_frame_share=1.0,
                        l2_inner_writeback_center=0.45, l2_inner_writeback_width=0.12)
    mlp, chain = mlp_graph(4096, 4096, 16384), chain_graph(8192, 8192, ("relu", "relu"))
    small = mlp_graph(8192, 1024, 4096)
    from kitsune_dse.graph import load_model
    nerf = load_model("nerf-mlp", {"rays": 1024})
    nerf_ops = [o.name for o in nerf.ops]
    cases = [(mlp, PipelineChoice((("fc1", "gelu", "fc2", "residual"),), (132,), 128)),
             (mlp, PipelineChoice((("fc2", "residual"),), (132,), 128)),
             (mlp, PipelineChoice((("fc2", "residual"),), (33,), 128))]
    cases += [(chain, PipelineChoice((("op0",), ("op1",)), (66, 66), 128, (d,))) for d in (2, 4, 6, 8, 12)]
    cases += [(small, PipelineChoice((("fc1", "gelu"), ("fc2", "residual")), (66, 66), 128, (d,)))
              for d in (1, 2, 4, 8)]
    # many steps in one stage (NeRF's first 4, 10 and all 25 ops): its frames weigh in the footprint
    cases += [(nerf, PipelineChoice((tuple(nerf_ops[:n]),), (132,), r)) for n in (4, 10, 25) for r in (128, 2048)]
    probes = []
    for i, (g, ch) in enumerate(cases):        # (a region of the graph: the stages' ops)
        rd, wr = pipeline_dram_bytes(truth, g, ch)
        probes.append({"name": f"p{i}", "graph": g, "choice": ch, "read_bytes": rd, "write_bytes": wr})
    fit = fit_pipeline_l2(frames, probes)
    assert fit["rms_log_error"] < 0.005 < fit["rms_log_error_before"]
    want = dict(zip(FIELDS, (0.6, 0.5, 0.08, 0.5, 1.0, 0.45, 0.12)))
    for k in FIELDS:
        assert fit[k] == pytest.approx(want[k], abs=0.05 * max(1.0, want[k])), k


def replace_eff(spec, **eff):
    return spec.model_copy(update={"efficiency": spec.efficiency.model_copy(update=eff)})



def test_a_split_k_consumer_runs_the_runtimes_k_ranges_not_the_slabs():
    # 65536 rows of hidden 512 and ffn 2048: fc2's 4 column tiles per row-block, K = 2048 fed in
    # 4 slabs; on 66 SMs (132 workers) the runtime splits K in 2 ranges of 1024, so a row-block
    # has 8 items of 1024 of K (each a whole tile's fixed cost and a poll per 128-column slab),
    # not 16 slab-tiles of 512
    from kitsune_dse.cost.pipeline import plan_stages, splitk_unit_time, stage_works
    from kitsune_dse.cost.roofline import kernel_time
    r = Region.of(mlp_graph(65536, 512, 2048))
    ch = PipelineChoice((("fc1", "gelu"), ("fc2", "residual")), (66, 66), 128, (8,), ("split_k",))
    plan = plan_stages(r, H100, ch)
    works, tot = stage_works(r, H100, plan)
    sk, (w,) = tot["stage_splitk"][1], works[1]
    assert (sk["n_tiles"], sk["k"], sk["slabs"]) == (4, 2048, 4)
    assert runtime_ksplit(4, 132, 2048, 128, sk["ws_per_split"]) == 2
    assert w.inflight == 32 and w.tiles == 4 * 32             # 8 row-blocks x 4 slabs held at once
    items = w.but(tiles=4 * 32 * 2 // 4, split_k=1, slab_polls=2048 / (128 * 2))
    assert splitk_unit_time([w], sk, H100, 66) == pytest.approx(kernel_time(items, H100, 66) / 32, rel=1e-12)
    # per SM count, as the search's tables take it
    s = np.array([33.0, 66.0])
    assert splitk_unit_time([w], sk, H100, s)[1] == pytest.approx(splitk_unit_time([w], sk, H100, 66), rel=1e-12)


def test_inner_rings_and_queues_on_their_own_logistic():
    # hidden 1024, ffn 4096, 8192 rows: h (64 MiB) is an inner ring when one stage runs the MLP,
    # a queue between two stages otherwise; each logistic is a step at 1% or 200% of the L2, so
    # h is written back whole or not at all, by its own logistic alone
    r = Region.of(mlp_graph(8192, 1024, 4096))
    one = PipelineChoice((("fc1", "gelu", "fc2", "residual"),), (132,), 128)
    two = PipelineChoice((("fc1", "gelu"), ("fc2", "residual")), (66, 66), 128, (4,))
    h_bytes = 8192 * 4096 * 2
    queues_only = replace_eff(H100, l2_writeback_center=0.01, l2_inner_writeback_center=2.0)
    inner_only = replace_eff(H100, l2_writeback_center=2.0, l2_inner_writeback_center=0.01)
    assert pipeline(r, queues_only, two).breakdown["queue_write_back_bytes"] == pytest.approx(h_bytes)
    assert pipeline(r, queues_only, one).breakdown["queue_write_back_bytes"] == 0.0
    assert pipeline(r, inner_only, one).breakdown["queue_write_back_bytes"] == pytest.approx(h_bytes)
    assert pipeline(r, inner_only, two).breakdown["queue_write_back_bytes"] == 0.0


def test_pipeline_dirty_residue_by_hand():
    # relu | relu over [8192, 8192] fp16 (128 MiB each of x, the ring's y and the output z), no
    # write-back: the kernel brings in 128 MiB of reads and 256 MiB of stores; L2 holds the last
    # 25 MiB of them (recent 0.5 x 50 MiB), of which z's share 128 / 384 is still dirty, under
    # the cap of 15 MiB (dirty 0.3 x 50 MiB)
    sp = replace_eff(H100, l2_writeback_center=2.0, l2_recent_fraction=0.5, l2_dirty_fraction=0.3)
    choice = PipelineChoice((("op0",), ("op1",)), (66, 66), 256, (4,))
    e = pipeline(Region.of(chain_graph(8192, 8192, ("relu", "relu"))), sp, choice)
    assert e.dram_write_bytes == pytest.approx(128 * MiB)
    assert e.dram_deferred_write_bytes == pytest.approx(128 * MiB * 25 / 384)
    assert e.dram_bytes_in_run == pytest.approx(256 * MiB - 128 * MiB * 25 / 384)
    # a small one fits the window whole: all of z is dirty, up to the cap
    small = pipeline(Region.of(chain_graph(1024, 1024, ("relu", "relu"))), sp, choice)
    assert small.dram_deferred_write_bytes == pytest.approx(2 * MiB)
    capped = replace_eff(sp, l2_dirty_fraction=0.01)
    assert pipeline(Region.of(chain_graph(1024, 1024, ("relu", "relu"))), capped, choice) \
        .dram_deferred_write_bytes == pytest.approx(0.5 * MiB)


def test_the_drained_ncu_ranges_stay_out_of_the_pipeline_fit(tmp_path):
    """bench/dram_probe.py --ncu with KDSE_PROBE_DRAIN measures each probe twice: the plain range
    (what the fit compares) and `plan+drain` (a read sweep after it evicts what it left dirty);
    the fit's medians take the plain ranges only."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import pandas as pd
    from dram_probe import fit_probes
    rows = [{"probe": "wbr-tiny-d2-row", "variant": "plan", "measured_dram_read_bytes": 70e6,
             "measured_dram_write_bytes": 60e6},
            {"probe": "wbr-tiny-d2-row", "variant": "plan+drain", "measured_dram_read_bytes": 280e6,
             "measured_dram_write_bytes": 75e6},
            {"probe": "ctl-drain", "variant": "drain", "measured_dram_read_bytes": 210e6,
             "measured_dram_write_bytes": 2e6}]
    p = tmp_path / "dram_probe_ncu_x.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    (got,) = fit_probes([p])
    assert got["name"] == "wbr-tiny-d2-row"
    assert got["read_bytes"] == 70e6 and got["write_bytes"] == 60e6
