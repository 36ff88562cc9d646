"""What a pipeline's L2 keeps and sends back to DRAM (cost.l2_residency), by hand, and the fit of
its four efficiency fields (calibrate.fit_dram) recovering a synthetic truth."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from helpers_graphs import H100, MiB, chain_graph, mlp_graph

from kitsune_dse.cost.l2_residency import free_row_blocks, streamed_weight_hit, write_back_fraction
from kitsune_dse.cost.pipeline import PipelineChoice, pipeline, runtime_ksplit
from kitsune_dse.cost.region import Region
from kitsune_dse.cost.roofline import KernelWork, weight_reread_bytes


def test_which_row_blocks_run_free():
    assert free_row_blocks(0, 1, 32, 2) == 32            # a lone stage: all of them
    assert free_row_blocks(1, 2, 32, 8) == 0             # fed through a queue: none
    assert free_row_blocks(0, 3, 32, 4) == 8             # the first: twice its output ring
    assert free_row_blocks(0, 2, 32, 16) == 32           # ... at most all


def test_write_back_ramp_and_hit_by_hand():
    # H100 of the tests: 50 MiB of L2, ramp from 0.4 to 0.8 of it
    assert write_back_fraction(19 * MiB, H100) == 0.0
    assert write_back_fraction(25 * MiB, H100) == pytest.approx(0.25)
    assert write_back_fraction(41 * MiB, H100) == 1.0
    assert write_back_fraction(math.inf, H100) == 1.0
    assert streamed_weight_hit(0.0, H100) == 0.0
    assert streamed_weight_hit(100 * MiB, H100) == pytest.approx(math.exp(-2))


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
    f = write_back_fraction(e.breakdown["l2_footprint_bytes"] + 4 * ws_split, H100)
    assert f == 1.0
    assert e.breakdown["partial_sum_write_back_bytes"] == pytest.approx(4 * 128 * 1024 * 4 * 64, rel=1e-12)
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
    truth = replace_eff(H100, l2_weight_share=0.6, l2_writeback_onset=0.3, l2_writeback_full=0.7,
                        l2_resident_reread=0.5)
    mlp, chain = mlp_graph(4096, 4096, 16384), chain_graph(8192, 8192, ("relu", "relu"))
    small = mlp_graph(8192, 1024, 4096)
    cases = [(mlp, PipelineChoice((("fc1", "gelu", "fc2", "residual"),), (132,), 128)),
             (mlp, PipelineChoice((("fc2", "residual"),), (132,), 128)),
             (mlp, PipelineChoice((("fc2", "residual"),), (33,), 128))]
    cases += [(chain, PipelineChoice((("op0",), ("op1",)), (66, 66), 128, (d,))) for d in (2, 4, 6, 8, 12)]
    cases += [(small, PipelineChoice((("fc1", "gelu"), ("fc2", "residual")), (66, 66), 128, (d,)))
              for d in (1, 2, 4, 8)]
    probes = []
    for i, (g, ch) in enumerate(cases):        # (a region of the graph: the stages' ops)
        rd, wr = pipeline_dram_bytes(truth, g, ch)
        probes.append({"name": f"p{i}", "graph": g, "choice": ch, "read_bytes": rd, "write_bytes": wr})
    fit = fit_pipeline_l2(H100, probes)
    assert fit["rms_log_error"] < 0.005 < fit["rms_log_error_before"]
    want = dict(zip(FIELDS, (0.6, 0.3, 0.7, 0.5)))
    for k in FIELDS:
        assert fit[k] == pytest.approx(want[k], abs=0.05), k


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
