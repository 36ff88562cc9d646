"""Kitsune spatial pipelines (kitsune_dse.cost.pipeline): plan checks, queue spill, weight
re-reads, and closed forms, by hand on the test spec (helpers_graphs.H100: usable L2 37.5 MiB,
graph node 0.8 us, hand-off 0.56 us, HBM B(s) = ((38e9 s)^-3 + (2.9145e12)^-3)^(-1/3)).
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings, strategies as st
import pytest
from kitsune_dse.cost.roofline import split_k_partials_bytes
from dataclasses import replace

from helpers_graphs import (H100, L2_USABLE, MiB, build, chain_graph, full_dep_graph,
                            gather_graph, hbm_curve, mlp_graph)
from kitsune_dse.cost.l2_residency import first_stage_free_row_blocks
from kitsune_dse.cost.compare import balance_sms
from kitsune_dse.cost.queues import simulate
from kitsune_dse.cost.region import Region, kernel_works
from kitsune_dse.cost.roofline import kernel_time
from kitsune_dse.cost.strategies import bsp, fusion, split_sms
from kitsune_dse.cost.pipeline import (PipelineChoice, pipeline, plan_stages, stage_time_table,
                                       stage_works)
from kitsune_dse.errors import InfeasibleError
from kitsune_dse.graph.ir import Tensor

MLP_STAGES = (("fc1", "gelu"), ("fc2", "residual"))


def ffn_graph(tokens, hidden, ffn, out=None, dtype="fp16"):
    """x -> fc1 (w1 [hidden, ffn]) -> gelu -> fc2 (w2 [ffn, out]) -> y; no biases, no residual."""
    out = out or hidden
    t = [Tensor("x", (tokens, hidden), dtype), Tensor("w1", (hidden, ffn), dtype),
         Tensor("w2", (ffn, out), dtype)]
    return build("ffn", t, [("fc1", "matmul", ("x", "w1"), ("h",)),
                            ("gelu", "gelu", ("h",), ("a",)),
                            ("fc2", "matmul", ("a", "w2"), ("y",))], ["x"], ["w1", "w2"])


# -- plan_stages: infeasible choices name the stage and the resource ----------------------------
@pytest.fixture(scope="module")
def mlp_region():
    return Region.of(mlp_graph(256, 1024, 4096))


@pytest.mark.parametrize("choice, match", [
    (PipelineChoice(MLP_STAGES, (100, 40)), r"stages use 140 SMs \(100/40\) but test-h100 has 132"),
    (PipelineChoice(MLP_STAGES[::-1], (60, 60)), r"stage 0 \(fc2\) needs 'a' from later stage 1"),
    (PipelineChoice((("fc1", "gelu"), ("fc2",)), (60, 60)), r"missing \['residual'\]"),
    (PipelineChoice((("fc1", "gelu"), ("fc2", "residual", "gelu")), (60, 60)),
     r"in two stages \['gelu'\]"),
    (PipelineChoice((("fc1", "gelu"), ("fc2", "residual", "zz")), (60, 60)),
     r"not in region \['zz'\]"),
    (PipelineChoice(MLP_STAGES, (60,)), r"2 stages but 1 SM counts"),
    (PipelineChoice(MLP_STAGES, (60, 0)), r"stage 1 \(fc2\+residual\) has 0 SMs"),
    (PipelineChoice(MLP_STAGES, (60, 60), depths=(0,)), r"depths >= 1"),
    (PipelineChoice(MLP_STAGES, (60, 60), tile_rows=0), r"tile_rows must be >= 1"),
    (PipelineChoice(MLP_STAGES, (60, 60), modes=("diag",)), r"queue 0: mode 'diag'"),
    (PipelineChoice((("fc1",), ("gelu", "fc2", "residual")), (60, 60), modes=("split_k",)),
     r"split_k needs stage 1 to start with a GEMM"),
    (PipelineChoice((), ()), r"at least one stage"),
], ids=["sm-sum", "order", "missing", "duplicate", "foreign", "sm-len", "zero-sms", "depth",
        "tile-rows", "mode", "split-k", "empty"])
def test_plan_stages_rejects_infeasible_choices(mlp_region, choice, match):
    with pytest.raises(InfeasibleError, match=match):
        plan_stages(mlp_region, H100, choice)
    with pytest.raises(InfeasibleError):
        pipeline(mlp_region, H100, choice)


@pytest.mark.parametrize("graph, stages, tensor, pattern", [
    (full_dep_graph(512, 512, 512), (("g1",), ("g2",)), "a", "full"),
    (gather_graph(1000, 256, 64), (("act",), ("look",)), "t", "gather"),
])
def test_a_full_or_gather_dependency_cannot_cross_a_queue(graph, stages, tensor, pattern):
    with pytest.raises(InfeasibleError, match=rf"stage 1 \(\w+\) needs all of '{tensor}' from "
                                              rf"stage 0 \(a {pattern} dependency\)"):
        plan_stages(Region.of(graph), H100, PipelineChoice(stages, (60, 60)))
    # one stage holding both ops is fine
    plan_stages(Region.of(graph), H100, PipelineChoice((stages[0] + stages[1],), (132,)))


def test_plan_of_the_mlp(mlp_region):
    p = plan_stages(mlp_region, H100, PipelineChoice(MLP_STAGES, (66, 66), 64))
    assert p.stream_rows == 256 and p.row_blocks == 256 // 64
    assert p.queue_tensors == (("a",),)
    assert p.slot_bytes == (256 * 4096 * 2 / 4,)                       # a / N
    assert p.stage_weights == (1024 * 4096 * 2 + 4096 * 2, 4096 * 1024 * 2 + 1024 * 2)
    assert p.stage_outputs == (0.0, 256 * 1024 * 2)
    assert p.choice.depths == (2,) and p.choice.modes == ("row",)
    # split-K queue: fc2 reduces over K = 4096 in ceil(4096 / 512) = 8 slabs
    p = plan_stages(mlp_region, H100, PipelineChoice(MLP_STAGES, (66, 66), 64, (2,), ("split_k",)))
    assert p.slabs == 8


# -- closed forms --------------------------------------------------------------------------------
@pytest.mark.parametrize("tile_rows", [2048, 4096])
def test_one_stage_equals_the_fused_kernel_on_all_sms(tile_rows):
    # fc1 + gelu of an MLP as one stage: the fused kernel's work run as one persistent step on
    # 132 SMs + a node. The runtime walks 2048 / 128 = 16 row-blocks of 128 output tiles whatever
    # the plan's tile rows; w1 (128 MiB) does not fit L2, and its 264 workers (two teams per SM)
    # hold 264 / 128 row-blocks at once, which share each weight fetch: 16 / 2.0625 passes
    g = mlp_graph(2048, 4096, 16384)
    r = Region.of(g, ["fc1", "gelu"])
    e = pipeline(r, H100, PipelineChoice((("fc1", "gelu"),), (132,), tile_rows))
    (w,) = kernel_works(r, [("fc1", "gelu")], H100)
    W = 4096 * 16384 * 2 + 16384 * 2                   # w1 and its bias
    # (the standalone kernel streams w1 once per group of 8 row-blocks of its tile; the
    # persistent step's passes are its weight_pass_bytes below)
    passes = -(-(2048 // w.tile_shape[0]) // 8)
    assert w.dram_read_bytes == pytest.approx(2048 * 4096 * 2 + passes * 4096 * 16384 * 2 + 16384 * 2)
    # a lone stage runs free: its rounds share 1 + 0.8 x (264 / 128 - 1) row-blocks' fetches
    # (efficiency.l2_weight_share), and L2 still holds exp(-W / 50 MiB) of a pass again
    hit = math.exp(-W / (50 * MiB))
    w = replace(w, tiles=16 * 128, tile_shape=(128, 128), split_k=1, ctas_per_sm=2, persistent=True,
                dram_read_bytes=2048 * 4096 * 2 + W,
                l2_bytes=w.l2_bytes - split_k_partials_bytes(1, 2048, 16384, w.split_k),
                weight_pass_bytes=W, rbs=16, items_per_rb=128, rbs_at_once_max=16, free_rbs=16,
                weight_share=0.8, weight_l2_hit=hit)
    assert e.latency_s == pytest.approx(kernel_time(w, H100, 132) + 0.8e-6, rel=1e-12)
    shared = 1 + 0.8 * (264 / 128 - 1)
    assert e.breakdown["weight_reread_bytes"] == pytest.approx(W * (1 - hit) * (16 / shared - 1), rel=1e-12)
    assert e.dram_read_bytes == pytest.approx(w.dram_read_bytes + e.breakdown["weight_reread_bytes"])
    assert e.dram_write_bytes == w.dram_write_bytes


def test_one_stage_of_a_large_elementwise_chain_equals_the_fused_kernel():
    g = chain_graph(8192, 4096, ("relu", "gelu"))
    r = Region.of(g)
    e = pipeline(r, H100, PipelineChoice((("op0", "op1"),), (132,), 8192))
    assert e.latency_s == pytest.approx(2 * 64 * MiB / hbm_curve(132) + 0.8e-6, rel=1e-9)


def test_one_stage_of_a_small_elementwise_op_equals_the_fused_kernel():
    g = chain_graph(256, 4096, ("relu",))                    # 2 MiB in, 2 MiB out, 64 tiles
    r = Region.of(g)
    e = pipeline(r, H100, PipelineChoice((("op0",),), (132,), 256))
    # the runtime hands consecutive items to the two teams of one SM: its 64 items stream from
    # 32 SMs, where the standalone grid spreads 64 CTAs over 64 SMs
    assert e.latency_s == pytest.approx(4 * MiB / hbm_curve(32) + 0.8e-6, rel=1e-9)
    assert e.latency_s > fusion(r, H100).latency_s


def test_two_memory_bound_stages_by_hand():
    # relu | gelu over [2048, 4096] fp16 (16 MiB), 256-row tiles: N = 8 units of 2 MiB.
    # Stage 0 reads 2 MiB of x per unit from DRAM and writes its slot in L2; stage 1 reads
    # the slot from L2 and writes 2 MiB of y. On 16 SMs each: t = 2 MiB / B(16) per unit.
    # (two slots: 4 MiB of ring and a quarter of the 32 MiB stream per ring cycle stay below the
    # 30 MiB at which the tests' L2 writes slots back)
    r = Region.of(chain_graph(2048, 4096, ("relu", "gelu")))
    e = pipeline(r, H100, PipelineChoice((("op0",), ("op1",)), (16, 16), 256, (2,)))
    t = 2 * MiB / hbm_curve(16)                                        # 3.4597 us
    assert e.breakdown["stage_tile_s"] == pytest.approx([t, t])
    assert e.breakdown["slot_bytes"] == [2 * MiB] and e.breakdown["queue_tensors"] == [["t1"]]
    # equal stages: sum(t) + sync + (N-1) max(t); then one graph node
    assert e.latency_s == pytest.approx(2 * t + 0.56e-6 + 7 * t + 0.8e-6, rel=1e-9)
    # each stage's last unit leaves: the last stage at the makespan, the first a hand-off and
    # a unit time before it (what the harness's per-stage end times are compared with)
    ends = e.breakdown["stage_end_s"]
    assert ends[1] == pytest.approx(e.latency_s - 0.8e-6, rel=1e-9)
    assert ends[0] == pytest.approx(ends[1] - t - 0.56e-6, rel=1e-9)
    assert e.dram_read_bytes == 16 * MiB and e.dram_write_bytes == 16 * MiB
    assert e.kernel_launches == 1 and e.l2_bytes == 2 * 2 * MiB
    # on 66 + 66 SMs the stages together would pull 2 x B(66) > B(132): the chip's DRAM binds.
    # Eight slots (16 MiB) and the whole 32 MiB stream in one ring cycle exceed 0.6 of the L2:
    # every slot is written back too
    e = pipeline(r, H100, PipelineChoice((("op0",), ("op1",)), (66, 66), 256, (8,)))
    assert e.breakdown["queue_write_back_bytes"] == 16 * MiB
    assert e.latency_s == pytest.approx(48 * MiB / hbm_curve(132) + 0.8e-6, rel=1e-9)
    assert e.breakdown["makespan_s"] <= e.breakdown["dram_bound_s"]


def test_pipeline_latency_is_the_queue_model_of_its_stage_times():
    g = mlp_graph(2048, 2048, 8192)
    r = Region.of(g)
    ch = PipelineChoice(MLP_STAGES, (80, 52), 128, (3,))
    e = pipeline(r, H100, ch)
    t = np.array(e.breakdown["stage_tile_s"])
    c = np.array(e.breakdown["stage_servers"])
    # each stage works on c units at once, each for c * t (its throughput stays 1 / t)
    sim = simulate(np.repeat((c * t)[:, None], 16, axis=1), [3], 0.56e-6, servers=c)
    assert e.breakdown["makespan_s"] == pytest.approx(sim.makespan_s)
    assert e.latency_s == pytest.approx(max(sim.makespan_s, e.breakdown["dram_bound_s"]) + 0.8e-6)
    # deep enough queue with one server per stage: sum(t) + sync + (N - 1) max(t)
    # (a deeper ring also lets each stage work on more row-blocks at once: its own stage times)
    e4 = pipeline(r, H100, PipelineChoice(MLP_STAGES, (80, 52), 128, (16,)))
    t4 = np.array(e4.breakdown["stage_tile_s"])
    c4 = np.array(e4.breakdown["stage_servers"])
    if (c4 == 1).all():
        assert e4.breakdown["makespan_s"] == pytest.approx(sum(t4) + 0.56e-6 + 15 * max(t4), rel=1e-9)
    else:   # the first unit's trip takes each stage's latency c * t; the rest at the period
        assert e4.breakdown["makespan_s"] >= sum(c4 * t4) + 0.56e-6 + (16 - max(c4)) * max(t4) * (1 - 1e-9)
    assert max(t4) <= max(t) * (1 + 1e-12)
    assert e4.breakdown["makespan_s"] >= 16 * max(t4) * (1 - 1e-12)


# -- queue spill ---------------------------------------------------------------------------------
def test_queue_spills_when_depth_times_slot_exceeds_usable_l2():
    # relu | relu over [8192, 8192] fp16 (128 MiB), 1024-row tiles: N = 8 slots of 16 MiB
    r = Region.of(chain_graph(8192, 8192, ("relu", "relu")))
    a = 8192 * 8192 * 2
    ok = pipeline(r, H100, PipelineChoice((("op0",), ("op1",)), (66, 66), 1024, (2,)))
    assert ok.breakdown["queue_bytes"] == 2 * 16 * MiB <= L2_USABLE
    assert ok.breakdown["queue_spill_bytes"] == 0
    # but while its 32 MiB of slots turn over once, 2 of the 8 units stream 64 MiB of x and y
    # through the 50 MiB L2: LRU evicts each dirty slot before it is reused, so t1 is written
    # back (128 MiB more writes); stage 1 still reads it from L2
    assert (ok.dram_read_bytes, ok.dram_write_bytes) == (a, 2 * a)
    assert ok.breakdown["queue_write_back_bytes"] == a
    sp = pipeline(r, H100, PipelineChoice((("op0",), ("op1",)), (66, 66), 1024, (4,)))
    frac = (4 * 16 * MiB - 37.5 * MiB) / (4 * 16 * MiB)               # 0.4140625 of the ring
    assert sp.breakdown["queue_bytes"] == 64 * MiB
    assert sp.breakdown["queue_spill_bytes"] == pytest.approx(frac * 16 * MiB * 8 * 2)
    # the spilled share of t1 is written by stage 0 and read back by stage 1; the rest is
    # written back as well
    assert sp.dram_read_bytes == pytest.approx(a + frac * a)
    assert sp.dram_write_bytes == pytest.approx(2 * a)
    assert sp.dram_bytes - ok.dram_bytes == pytest.approx(frac * a)
    assert sp.l2_bytes == L2_USABLE
    assert sp.latency_s >= ok.latency_s


def test_a_ring_deeper_than_the_stream_spills_no_more_than_one_of_n_slots():
    r = Region.of(chain_graph(8192, 8192, ("relu", "relu")))    # N = 8 tiles of 16 MiB
    n_slots = pipeline(r, H100, PipelineChoice((("op0",), ("op1",)), (66, 66), 1024, (8,)))
    deeper = pipeline(r, H100, PipelineChoice((("op0",), ("op1",)), (66, 66), 1024, (32,)))
    assert deeper.breakdown["queue_spill_bytes"] == n_slots.breakdown["queue_spill_bytes"]


# -- weights -------------------------------------------------------------------------------------
def test_weights_are_reread_per_row_block_when_they_do_not_fit_l2():
    # w1, w2 = 4096 x 16384 fp16 = 128 MiB each; 256-row tiles of 4096 rows: N = 16 units, run
    # as 32 row-blocks of 128. Stage 0 (128 tiles per row-block, 132 workers) holds 132 / 128
    # row-blocks at once, which share a weight fetch (1 + 0.8 x 4 / 128 of them) while it runs
    # free: with GELU in its epilogue it is no faster than stage 1 on as many SMs, and its
    # 2-unit ring holds 4 row-blocks, twice a round: never held back, free for all 32.
    # Stage 1 gets its row-blocks one at a time from the queue: every one reads w2. Of every
    # pass again, L2 holds exp(-256 MiB / 50 MiB)
    g = ffn_graph(4096, 4096, 16384)
    r = Region.of(g)
    ch = PipelineChoice((("fc1", "gelu"), ("fc2",)), (66, 66), 256, (2,))
    e = pipeline(r, H100, ch)
    x = y = 4096 * 4096 * 2
    w = 4096 * 16384 * 2
    miss = 1 - math.exp(-2 * w / (50 * MiB))
    shared = 1 + 0.8 * (132 / 128 - 1)
    reread = w * miss * (32 / shared - 1) + w * miss * (32 - 1)
    assert e.breakdown["weights_resident"] == [False, False]
    assert e.breakdown["queue_bytes"] == 2 * 4096 * 16384 * 2 / 16          # 16 MiB, no spill
    assert e.breakdown["weight_reread_bytes"] == pytest.approx(reread, rel=1e-12)
    assert e.dram_read_bytes == pytest.approx(x + 2 * w + reread, rel=1e-12)
    # the streaming weights evict every slot of `a` (128 MiB) before it is overwritten
    a = 4096 * 16384 * 2
    assert e.breakdown["queue_write_back_bytes"] == a
    assert e.dram_write_bytes == y + a
    # the excess over the compulsory reads is exactly the re-read weights
    cr, cw = r.compulsory_bytes()
    assert e.dram_read_bytes - e.breakdown["weight_reread_bytes"] == pytest.approx(cr, rel=1e-12)
    assert cr <= bsp(r, H100).dram_read_bytes
    # one plan tile of 4096 rows still runs as 32 row-blocks: the weights stream again (stage 1
    # now holds 132 / 32 row-blocks); its 128 MiB slot of `a` spills (half of the spilled bytes
    # are the reads back)
    # (stage 0 runs free for 2 x 32 row-blocks: all of them; stage 1 is fed one at a time)
    one = pipeline(r, H100, PipelineChoice((("fc1", "gelu"), ("fc2",)), (66, 66), 4096, (1,)))
    assert one.breakdown["weight_reread_bytes"] == pytest.approx(
        w * miss * (32 / shared - 1) + w * miss * (32 - 1), rel=1e-12)
    assert one.breakdown["queue_spill_bytes"] == pytest.approx(
        (128 * MiB - 37.5 * MiB) / (128 * MiB) * 2 * 128 * MiB)
    assert one.dram_read_bytes == pytest.approx(
        cr + one.breakdown["queue_spill_bytes"] / 2 + one.breakdown["weight_reread_bytes"])
    # stage 0 on 88 SMs outruns stage 1 on 44: it fills its ring, then stage 1 paces it, free
    # for two rings' worth (8 row-blocks) with 176 / 128 row-blocks a round
    fast = pipeline(r, H100, PipelineChoice((("fc1", "gelu"), ("fc2",)), (88, 44), 256, (2,)))
    shared88 = 1 + 0.8 * (176 / 128 - 1)
    assert fast.breakdown["weight_reread_bytes"] == pytest.approx(
        w * miss * (8 / shared88 + 24 - 1) + w * miss * (32 - 1), rel=1e-12)


def test_first_stage_free_row_blocks_by_hand():
    # no faster than its consumers, a ring of two rounds: all row-blocks
    assert first_stage_free_row_blocks(64, 8, 1.0, 2.06) == 64
    assert first_stage_free_row_blocks(64, 8, 1.5, 4.0) == 64
    # a round too large for half its ring, or a faster first stage: two rings' worth
    assert first_stage_free_row_blocks(64, 8, 3.2, 8.1) == 16
    assert first_stage_free_row_blocks(64, 2, 1.0, 2.06) == 4
    assert first_stage_free_row_blocks(64, 8, 0.3, 1.0) == 16
    assert first_stage_free_row_blocks(12, 8, 0.3, 1.0) == 12


def test_a_stage_whose_weights_fit_keeps_them_and_the_other_rereads():
    # w1 1024 x 1024 (2 MiB) fits beside the 1 MiB queue; w2 1024 x 32768 (64 MiB) does not
    g = ffn_graph(4096, 1024, 1024, out=32768)
    r = Region.of(g)
    e = pipeline(r, H100, PipelineChoice((("fc1", "gelu"), ("fc2",)), (32, 100), 256, (2,)))
    assert e.breakdown["queue_bytes"] == 2 * 4096 * 1024 * 2 / 16
    assert e.breakdown["weights_resident"] == [True, False]
    # stage 1: 32 row-blocks of 256 tiles on 200 workers (fewer than one row-block at once), of
    # which L2 holds exp(-64 / 50) again between passes
    w2 = 1024 * 32768 * 2
    reread = w2 * (1 - math.exp(-w2 / (50 * MiB))) * 31
    assert e.breakdown["weight_reread_bytes"] == pytest.approx(reread, rel=1e-12)
    # w2's stream evicts the slots and w1 (write-back fraction 1): w1 is read again 32 times x
    # 0.37 x its 2 / 50 share of the L2
    w1 = 1024 * 1024 * 2
    evicted = 0.37 * w1 * (w1 / (50 * MiB)) * 32
    assert e.breakdown["resident_weight_reread_bytes"] == pytest.approx(evicted, rel=1e-12)
    cr, _ = r.compulsory_bytes()
    assert e.dram_read_bytes == pytest.approx(cr + reread + evicted, rel=1e-12)


def test_resident_weights_make_the_pipeline_move_no_more_dram_than_bsp():
    g = ffn_graph(2048, 1024, 4096)              # 8 MiB weights each, 16 MiB intermediate
    r = Region.of(g)
    a, w = 2048 * 4096 * 2, 2 * 8 * MiB
    # L2 footprint: slots (2 of tile_rows x 4096 x 2, at most the 16 MiB of `a`), both weights
    # and the 8 MiB stream of x and y over a ring cycle of 2 tiles' row-blocks
    for tile_rows, foot in ((128, 2 * MiB + w + 8 * MiB * 2 / 16), (512, 8 * MiB + w + 8 * MiB * 8 / 16),
                            (2048, 16 * MiB + w + 8 * MiB)):
        e = pipeline(r, H100, PipelineChoice((("fc1", "gelu"), ("fc2",)), (66, 66), tile_rows))
        assert e.breakdown["weight_reread_bytes"] == 0
        assert all(e.breakdown["weights_resident"])
        f = 1 / (1 + math.exp(-(foot - 30 * MiB) / (0.5 * MiB)))   # the tests' step at 30 MiB
        assert e.breakdown["queue_write_back_bytes"] == pytest.approx(f * a, rel=1e-12)
        evicted = f * 0.37 * w * (w / (50 * MiB)) * 16
        assert e.breakdown["resident_weight_reread_bytes"] == pytest.approx(evicted, rel=1e-12)
        assert e.dram_bytes == pytest.approx(sum(r.compulsory_bytes()) + f * a + evicted, rel=1e-12)
        # what bsp does not move is the resident weights L2 evicts beside the slots
        assert e.dram_bytes - evicted <= bsp(r, H100).dram_bytes


def test_a_region_input_read_by_two_stages_is_read_from_dram_once():
    r = Region.of(mlp_graph(256, 1024, 4096))
    for tile_rows in (64, 256):
        e = pipeline(r, H100, PipelineChoice(MLP_STAGES, (66, 66), tile_rows))
        assert e.breakdown["weight_reread_bytes"] == 0
        assert e.dram_read_bytes == pytest.approx(r.compulsory_bytes()[0], rel=1e-9)
        # (less what L2 sends back beside the slots: a trace, the footprint far below the step)
        extra = e.breakdown["resident_weight_reread_bytes"] + e.breakdown["queue_write_back_bytes"]
        assert extra < 1e-6 * e.dram_bytes
        assert e.dram_bytes - extra <= bsp(r, H100).dram_bytes


# -- SM tables and balance -----------------------------------------------------------------------
def test_stage_time_table_and_balance():
    r = Region.of(mlp_graph(1024, 2048, 8192))
    plan = plan_stages(r, H100, PipelineChoice(MLP_STAGES, (66, 66), 128))
    tab = stage_time_table(r, H100, plan)
    assert tab.shape == (2, 133) and np.all(np.isinf(tab[:, 0]))
    works, _ = stage_works(r, H100, plan)
    for j, ws in enumerate(works):
        for s in (1, 17, 66, 132):
            # each record covers w.inflight row-blocks worked on together: time per row-block
            assert tab[j, s] == pytest.approx(sum(kernel_time(w, H100, s) / w.inflight for w in ws)
                                              + (len(ws) - 1) * 0.56e-6)
    assert np.all(np.diff(tab[:, 1:], axis=1) <= 1e-15)
    ch = balance_sms(r, H100, PipelineChoice(MLP_STAGES, (1, 1), 128))
    T, split = split_sms([tab[0], tab[1]], 132)
    # balance starts from split_sms's fewest SMs meeting the bottleneck, then hands out the rest
    # where the closed-form makespan drops: never a slower bottleneck than that start
    assert sum(split) <= sum(ch.sms) <= 132
    assert max(tab[0, ch.sms[0]], tab[1, ch.sms[1]]) <= T * (1 + 1e-12)


def test_pipeline_estimates_are_checked_and_consistent():
    r = Region.of(mlp_graph(512, 1024, 4096))
    for modes in (("row",), ("split_k",)):
        e = pipeline(r, H100, PipelineChoice(MLP_STAGES, (40, 92), 64, (2,), modes))
        assert e.check() is e
        assert e.breakdown["slabs"] == (8 if modes == ("split_k",) else 1)
        assert 0 <= e.sm_busy_fraction <= 1 and e.flops == pytest.approx(r.flops)
        assert e.latency_s >= e.breakdown["dram_bound_s"] + 0.8e-6 - 1e-15
        assert all(s >= 0 for s in e.breakdown["stall_s"])
        assert all(o <= 2 * e.breakdown["slabs"] + 1e-9 for o in e.breakdown["queue_max_occupancy"])


def test_reported_spill_equals_the_spill_traffic_charged():
    # a (128 MiB) goes from op0 to op1 and, across queue 1 as well, to op2; b from op1 to op2.
    # 1024-row tiles: N = 8, slots 16 MiB (queue 0: a) and 32 MiB (queue 1: a, b), depth 2:
    # 96 MiB of queues, (96 - 37.5) / 96 of them spill
    g = build("skip", [Tensor("x", (8192, 8192), "fp16")],
              [("op0", "relu", ("x",), ("a",)), ("op1", "relu", ("a",), ("b",)),
               ("op2", "add", ("a", "b"), ("y",))], ["x"], [])
    r = Region.of(g)
    e = pipeline(r, H100, PipelineChoice((("op0",), ("op1",), ("op2",)), (44, 44, 44), 1024,
                                         (2, 2)))
    assert e.breakdown["queue_bytes"] == 96 * MiB
    cr, cw = r.compulsory_bytes()
    assert e.breakdown["weight_reread_bytes"] == 0
    assert e.dram_bytes - cr - cw == pytest.approx(e.breakdown["queue_spill_bytes"]
                                                   + e.breakdown["queue_write_back_bytes"])


def _three_gemms_on_x():
    t = [Tensor("x", (256, 4096), "fp32")] + [Tensor(f"w{i}", (4096, 64), "fp32") for i in range(3)]
    return build("three", t, [(f"mm{i}", "matmul", ("x", f"w{i}"), (f"t{i}",)) for i in range(3)],
                 ["x"], ["w0", "w1", "w2"])


_SMALL_GPU = dict(sm_count=64, tensor_peak_flop_per_s={"fp16": 479.7e12},
                  simt_peak_flop_per_s={"fp32": 97.31e12, "fp16": 194.6e12},
                  hbm_bandwidth_Bps=0.5e12, hbm_per_sm_bandwidth_Bps=15.03e9, l2_bytes=4 * MiB,
                  graph_launch_overhead_s=2.8e-6, sync_latency_s=0.1e-6,
                  efficiency={"hbm_saturation_exponent": 4.0})


def test_balanced_sms_are_no_worse_than_an_even_split():
    from helpers_graphs import scale_flops, spec
    r = Region.of(_three_gemms_on_x())
    hw = scale_flops(spec(**_SMALL_GPU), 2.0)
    stages = (("mm0",), ("mm1", "mm2"))
    ch = balance_sms(r, hw, PipelineChoice(stages, (1, 1), 128, (2,)))
    even = PipelineChoice(stages, (32, 32), 128, (2,))
    assert pipeline(r, hw, ch).latency_s <= pipeline(r, hw, even).latency_s * (1 + 1e-9)


def test_resident_weights_leave_room_for_the_intra_stage_tiles():
    # usable L2 = 4 MiB * 0.75 = 3 MiB; weights w0 (1 MiB) + w2 (2 MiB) = 3 MiB; N = 4
    t = [Tensor("x", (256, 4096), "fp32"), Tensor("w0", (4096, 64), "fp32"),
         Tensor("w2", (64, 8192), "fp32")]
    g = build("tight", t, [("mm0", "matmul", ("x", "w0"), ("t0",)),
                           ("u1", "relu", ("t0",), ("t1",)),
                           ("mm2", "matmul", ("t0", "w2"), ("t2",))], ["x"], ["w0", "w2"])
    from helpers_graphs import spec
    hw = spec(sm_count=8, hbm_bandwidth_Bps=0.5e12, hbm_per_sm_bandwidth_Bps=10e9, l2_bytes=4 * MiB)
    r = Region.of(g)
    e = pipeline(r, hw, PipelineChoice((("mm0", "u1", "mm2"),), (8,), 64))
    # the stage's per-unit tiles (16 KiB) are reserved first, so the 3 MiB of weights no longer
    # fit beside them and are re-read per row-block; everything else stays in L2: the excess
    # over BSP is exactly the reported weight re-reads
    assert e.breakdown["row_blocks"] == 4
    assert e.breakdown["weights_resident"] == [False]
    assert e.breakdown["weight_reread_bytes"] == pytest.approx(3 * MiB * (4 - 1) * (1 - math.exp(-3 / 4)))
    assert e.dram_bytes - e.breakdown["weight_reread_bytes"] <= bsp(r, hw).dram_bytes


def test_ring_write_back_grows_with_the_l2_footprint():
    """A ring slot's dirty lines go to DRAM when L2 evicts them before the next generation
    overwrites them: a logistic over the footprint of the slots and one ring cycle's stream,
    half of them at 0.6 of the L2 (30 MiB on the tests' H100), width 0.1 (cost.l2_residency,
    measured with ncu)."""
    r = Region.of(chain_graph(8192, 8192, ("relu", "relu")))          # x, a, y: 128 MiB each
    a = 8192 * 8192 * 2
    hw = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={"l2_writeback_width": 0.1})})

    def written(tile_rows, depth):
        return pipeline(r, hw, PipelineChoice((("op0",), ("op1",)), (66, 66), tile_rows,
                                              (depth,))).dram_write_bytes

    def logistic(mib):
        return 1 / (1 + math.exp(-(mib - 30) / 5))
    # 2 slots of 2 MiB; x and y stream 256 MiB x 2 / 64 row-blocks per cycle: 12 MiB
    assert written(128, 2) == pytest.approx(a + logistic(12) * a, rel=1e-12)
    # 4 slots: 8 MiB + 256 MiB x 4 / 64 = 24 MiB
    assert written(128, 4) == pytest.approx(a + logistic(24) * a, rel=1e-12)
    # 2 slots of 16 MiB and 64 MiB of stream: 96 MiB, all but a trace of the slots
    assert written(1024, 2) == pytest.approx(a + logistic(96) * a, rel=1e-12)
    assert written(128, 2) < written(128, 4) < written(1024, 2)


def test_weight_streaming_stages_share_one_dram():
    # gpt3's MLP at 64 tokens: two GEMMs that each stream 1.2 GB of weights. Split over 66 + 66
    # SMs they cannot stream faster together than each does alone on all 132 SMs (measured on
    # the H100: 1,159 us for the pipeline, 542 us for fc1 alone on 132 SMs)
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    H100 = load_spec("h100-sxm.calibrated")      # noqa: N806 - the persistent GEMM's fitted stream
    g = load_model("gpt3-mlp", {"tokens": 64})
    r = Region.of(g)
    names = [o.name for o in g.ops]
    cut = names.index("fc2")
    stages = (tuple(names[:cut]), tuple(names[cut:]))
    e = pipeline(r, H100, PipelineChoice(stages, (66, 66), 64, (1,), ("split_k",)))
    alone = [pipeline(Region.of(g, list(st)), H100, PipelineChoice((st,), (132,), 64)) for st in stages]
    launch = H100.persistent_launch_cost_s
    # fc1 streams as it does alone on every SM, fc2 at no more than the datasheet bandwidth
    assert e.latency_s - launch >= (alone[0].latency_s - launch
                                    + alone[1].dram_bytes / H100.hbm_bandwidth_Bps) * (1 - 1e-9)
    # and never below every byte at the chip's streaming bandwidth
    assert e.breakdown["dram_bound_s"] >= e.dram_bytes / H100.hbm_bandwidth_from(132) * (1 - 1e-12)


def test_a_stage_fuses_gemms_on_one_input_as_the_runtime_does():
    # llama's gate and up projections read the same x with weights of one shape: the runtime
    # runs them as one dual-B step (both products' column tiles as its items), and so must the
    # model (it ran them as two dependent steps: +73% on the H100)
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.lower import Region as LRegion
    from kitsune_dse.validate.lower import layout_pipeline
    g = load_model("llama2-7b-mlp", {})
    names = [o.name for o in g.ops]
    cut = names.index("down_proj")
    stages = (tuple(names[:cut]), tuple(names[cut:]))
    ch = PipelineChoice(stages, (88, 44), 128, (8,))
    r = Region.of(g)
    works, _ = stage_works(r, H100, plan_stages(r, H100, ch))
    assert len(works[0]) == 1
    assert set(works[0][0].name.split("+")) == set(stages[0])
    # 2048 rows of 128 in 16 units: 11008 / 128 = 86 column tiles per product, two products
    assert works[0][0].tiles == 2 * 86 * works[0][0].inflight
    plan = {"id": 0, "strategy": "pipeline", "ops": names, "kernels": [list(s) for s in stages],
            "stages": [{"id": j, "ops": list(s), "sms": n, "ctas": n, "tile": {"rows": 128}}
                       for j, (s, n) in enumerate(zip(stages, (88, 44)))],
            "queues": [{"producer": 0, "consumer": 1, "tensors": ["inter"], "depth": 8, "mode": "row"}]}
    lay = layout_pipeline(LRegion(g, plan), plan)
    assert [st.stage for st in lay.steps].count(0) == 1 and lay.steps[0].items == 2 * 86


def test_a_split_k_consumer_polls_once_per_runtime_slab():
    # gpt3-mlp at 64 tokens, fc2's K = 49152 fed in 16 plan slabs: each plan unit of a tile
    # covers 49152 / 16 = 3072 rows of K, i.e. 24 runtime slabs of 128 columns (one flag each)
    from kitsune_dse.cost.pipeline import plan_stages, stage_works
    from kitsune_dse.graph import load_model
    g = load_model("gpt3-mlp", {"tokens": 64})
    names = [o.name for o in g.ops]
    cut = names.index("fc2")
    choice = PipelineChoice((tuple(names[:cut]), tuple(names[cut:])), (66, 66), 64, (32,), ("split_k",))
    r = Region.of(g)
    plan = plan_stages(r, H100, choice)
    works, _ = stage_works(r, H100, plan)
    assert plan.slabs == 16
    assert works[0][0].slab_polls == 0.0
    assert works[1][0].slab_polls == pytest.approx(49152 / (128 * 16))
    # the polls slow the consumer, never the producer
    quiet = H100.model_copy(update={"sync_latency_s": 1e-12})
    assert pipeline(r, H100, choice).latency_s >= pipeline(r, quiet, choice).latency_s


# -- weight-streaming stages fed slab by slab (decode) -------------------------------------------
def _flow(need, alone, rate, share, modes=("split_k",), row_blocks=1):
    from types import SimpleNamespace

    from kitsune_dse.cost.pipeline import _weight_stream_flow
    from kitsune_dse.cost.roofline import KernelWork
    hw = H100.model_copy(update={"concurrent_stream_Bps": rate, "efficiency": H100.efficiency.model_copy(
        update={"producer_stream_share": share})})
    works = [[KernelWork(f"s{j}", "fp16", dram_read_bytes=b)] for j, b in enumerate(need)]
    plan = SimpleNamespace(row_blocks=row_blocks, choice=SimpleNamespace(modes=tuple(modes)))
    return _weight_stream_flow(works, plan, hw, np.asarray(alone))


def test_two_weight_streams_share_the_dram_by_hand():
    # 1 GB each, 500 us alone (2 TB/s each); 3 TB/s together, the producer keeps 0.8 of its
    # rate: 1.6 TB/s until it ends at 625 us, the consumer 1.4 TB/s meanwhile (0.875 GB), then
    # its last 0.125 GB alone at 2 TB/s: 62.5 us more
    assert _flow([1e9, 1e9], [500e-6, 500e-6], 3e12, 0.8) == pytest.approx(687.5e-6, rel=1e-12)
    # the producer takes what the chip gives first: 2.5 TB/s together leaves the consumer 0.9
    assert _flow([1e9, 1e9], [500e-6, 500e-6], 2.5e12, 0.8) == pytest.approx(
        625e-6 + (1e9 - 0.9e12 * 625e-6) / 2e12, rel=1e-12)
    # not modelled: no rate, several row-blocks, a row-mode queue, streams that fit the chip
    assert _flow([1e9, 1e9], [500e-6, 500e-6], None, 0.8) is None
    assert _flow([1e9, 1e9], [500e-6, 500e-6], 3e12, 0.8, row_blocks=4) is None
    assert _flow([1e9, 1e9], [500e-6, 500e-6], 3e12, 0.8, modes=("row",)) is None
    assert _flow([1e9, 1e9], [500e-6, 500e-6], 5e12, 0.8) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e6, 1e10), min_size=2, max_size=4), st.data(), st.floats(0.5e12, 4e12),
       st.floats(1.01, 3.0), st.floats(0.3, 1.0))
def test_more_concurrent_bandwidth_never_slows_weight_streams(need, data, rate, more, share):
    alone = data.draw(st.lists(st.floats(1e-5, 1e-2), min_size=len(need), max_size=len(need)))
    a, b = _flow(need, alone, rate, share), _flow(need, alone, rate * more, share)
    own = np.asarray(need) / np.asarray(alone)
    if a is not None and b is not None:
        assert b <= a * (1 + 1e-9)
        # no stream ends before it would alone
        assert b >= max(alone) * (1 - 1e-9)
    if a is not None:
        assert own.sum() > rate


def test_the_concurrent_stream_fit_recovers_a_synthetic_truth():
    from kitsune_dse.calibrate.fit import fit_concurrent_stream
    from kitsune_dse.graph import load_model
    hw = load_spec_calibrated()
    truth = hw.model_copy(update={"concurrent_stream_Bps": 2.2e12, "efficiency": hw.efficiency.model_copy(
        update={"producer_stream_share": 0.85})})
    g = load_model("gpt3-mlp", {"tokens": 64, "hidden": 8192})      # bench/dram_probe.py ws-pair-*
    r = Region.of(g)
    probes = []
    for a, b in ((66, 66), (88, 44), (44, 88), (99, 33)):
        ch = PipelineChoice((("fc1", "gelu"), ("fc2", "residual")), (a, b), 64, (16,), ("split_k",))
        probes.append({"name": f"{a}-{b}", "graph": g, "choice": ch, "time_s": pipeline(r, truth, ch).latency_s})
    fit = fit_concurrent_stream(hw, probes)
    assert fit["rms_rel_error"] < 1e-3 < fit["rms_rel_error_before"]
    assert fit["concurrent_stream_Bps"] == pytest.approx(2.2e12, rel=0.05)
    assert fit["producer_stream_share"] == pytest.approx(0.85, abs=0.05)


def load_spec_calibrated():
    from kitsune_dse.hw import load_spec
    return load_spec("h100-sxm.calibrated").model_copy(update={"concurrent_stream_Bps": None})


@pytest.mark.parametrize("model, stages, sms", [
    ("nerf-mlp", [["fc1", "relu1", "fc2", "relu2", "fc3", "relu3"], ["fc4", "relu4", "fc5", "relu5", "skip_concat"],
                  ["fc6", "relu6", "fc7", "relu7", "fc8", "relu8"],
                  ["sigma_fc", "sigma_relu", "feature_fc", "dir_concat", "view_fc", "view_relu", "rgb_fc",
                   "rgb_sigmoid"]], [30, 36, 36, 30]),
    ("ln-residual-gemm", [["ln1", "gemm1", "residual1"], ["ln2", "gemm2", "residual2"]], [66, 66])])
def test_steps_evicted_writes_add_up_to_the_queue_write_back(model, stages, sms):
    """Each step's evicted ring writes are its share of the region's queue write-back, and
    part of its DRAM writes (the region's DRAM totals still carry them)."""
    from kitsune_dse.cost.pipeline import stage_works
    from kitsune_dse.graph import load_model
    from kitsune_dse.hw import load_spec
    g = load_model(f"models/{model}.yaml", {})
    hw = load_spec("h100-sxm.calibrated")
    ops = tuple(o for st in stages for o in st)
    plan = plan_stages(Region.of(g, ops), hw, PipelineChoice(tuple(map(tuple, stages)), tuple(sms), 128))
    works, tot = stage_works(Region.of(g, ops), hw, plan)
    units = plan.row_blocks * plan.slabs
    evicted = sum(w.evicted_write_bytes * units / w.inflight for st in works for w in st)
    assert tot["queue_write_back_bytes"] > 0
    assert evicted == pytest.approx(tot["queue_write_back_bytes"], rel=1e-9)
    for st in works:
        for w in st:
            assert 0.0 <= w.evicted_write_bytes <= w.dram_write_bytes * (1 + 1e-12)


def test_inner_ring_slots_of_a_narrow_tensor_are_its_stored_columns():
    # the runtime sizes a stage's inner ring by the tensor as stored (validate/lower.py uses its
    # padded columns): NeRF's density column, 1 wide, takes 8 columns a row in a slot
    from kitsune_dse.cost.pipeline import INTRA_RING_BYTES, _intra_slots
    from kitsune_dse.graph import load_model
    g = load_model("nerf-mlp")
    n, slot = _intra_slots(g, ("sigma_fc",), 128, 64, 2048)
    assert slot == 128 * 8 * 2
    assert n == min(2048, max(2, min(64, INTRA_RING_BYTES // slot)))
    n, slot = _intra_slots(g, ("fc8", "relu8"), 128, 64, 2048)
    assert slot == 128 * 256 * 2


def test_the_launch_ramp_inside_the_span_moves_stage_ends_not_the_latency():
    # persistent_launch_outside_s splits the kernel's fixed cost: what falls outside the
    # workers' span, and a ramp inside it before every stage's end (the harness measures stage
    # ends from the first worker's start). The region's latency does not change.
    r = Region.of(chain_graph(2048, 4096, ("relu", "gelu")))
    c = PipelineChoice((("op0",), ("op1",)), (66, 66), 256, (2,))
    sp = H100.model_copy(update={"persistent_launch_s": 7e-6})
    split = sp.model_copy(update={"persistent_launch_outside_s": 3e-6})
    assert sp.persistent_ramp_s == 0.0 and split.persistent_ramp_s == pytest.approx(4e-6, rel=1e-12)
    # an outside part larger than the whole leaves no ramp (never a negative one)
    assert sp.model_copy(update={"persistent_launch_outside_s": 9e-6}).persistent_ramp_s == 0.0
    a, b = pipeline(r, sp, c), pipeline(r, split, c)
    assert b.latency_s == a.latency_s
    assert b.breakdown["stage_end_s"] == pytest.approx([x + 4e-6 for x in a.breakdown["stage_end_s"]], rel=1e-12)
    # the last stage ends one outside part before the region's end (events around the kernel)
    assert b.breakdown["stage_end_s"][-1] <= b.latency_s - 3e-6 + 1e-15


def test_one_team_per_sm_where_every_step_fits_its_stage_and_its_own_lone_share():
    # ffn 512 x 1024 -> 1024 -> 1024 in 128-row blocks: 4 row-blocks of 8 column tiles per GEMM,
    # 32 items over the stream. On 66 SMs every item has an SM of its own: the harness runs one
    # team per SM (validate.lower.solo_team_fits), and a lone item runs at persistent_solo_team
    # of the two-team rate; on 16 SMs two items share an SM and both teams work.
    from kitsune_dse.cost.roofline import busiest_sm_tiles, lone_share
    r = Region.of(ffn_graph(512, 1024, 1024))
    fits, crowded = (PipelineChoice((("fc1", "gelu", "fc2"),), (s,), 128) for s in (66, 16))
    lone = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(
        update={"persistent_lone_team": 0.7})})
    solo = lone.model_copy(update={"efficiency": lone.efficiency.model_copy(
        update={"persistent_solo_team": 0.95})})
    assert pipeline(r, lone, fits).breakdown["teams_per_sm"] == 1
    assert pipeline(r, lone, crowded).breakdown["teams_per_sm"] == 2
    # no solo share: the lone one (the same number, bit for bit)
    same = lone.model_copy(update={"efficiency": lone.efficiency.model_copy(
        update={"persistent_solo_team": 0.7})})
    assert pipeline(r, same, fits).latency_s == pipeline(r, lone, fits).latency_s
    assert pipeline(r, solo, fits).latency_s < pipeline(r, lone, fits).latency_s
    assert pipeline(r, solo, crowded).latency_s == pipeline(r, lone, crowded).latency_s
    works, _ = stage_works(r, solo, plan_stages(r, solo, fits))
    gemm = next(w for w in works[0] if w.tile_shape)
    assert gemm.solo_team and lone_share(gemm, solo) == 0.95
    assert lone_share(gemm.but(solo_team=False), solo) == 0.7
    # one item on its SM: 1 / share tile times of the two-team rate
    assert busiest_sm_tiles(gemm.but(tiles=40), 66, lone_share(gemm, solo)) == pytest.approx(1 / 0.95)
    # the search's table: one team where the stage allows it at that SM count (32 items)
    t_lone = stage_time_table(r, lone, plan_stages(r, lone, fits))[0]
    t_solo = stage_time_table(r, solo, plan_stages(r, solo, fits))[0]
    assert (t_solo[1:32] == t_lone[1:32]).all()
    assert (t_solo[32:] < t_lone[32:]).all()
    # and the search's table agrees with the exact pricing at the plan's own SM count
    assert t_solo[66] == pytest.approx(pipeline(r, solo, fits).breakdown["stage_tile_s"][0], rel=1e-9)
