"""Execution strategies (kitsune_dse.cost.strategies): bsp (graph and eager launches), fusion,
tilesync and concurrent, with hand-computed figures on the test spec (helpers_graphs.H100):
graph node 0.8 us, eager launch 6 us of host time per kernel, 1.5 us gap between dependent
eager kernels, 0.56 us flag hand-off, HBM B(s) = ((38e9 s)^-3 + (2.9145e12)^-3)^(-1/3).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_graphs import (examples, H100, H100_STEP, MiB, build, chain_graph, full_dep_graph, gather_graph,
                            gemm_graph, hbm_curve, mlp_graph, scale_flops, scale_sms, spec,
                            two_gemms_graph)
from kitsune_dse.cost.region import kernel_variants
from kitsune_dse.cost.region import Region, kernel_works
from kitsune_dse.cost.roofline import kernel_time
from kitsune_dse.cost.strategies import (LaunchChoice, bsp, concurrent, fusion, fusion_groups,
                                         launch_timeline, levels, split_sms, tilesync)
from kitsune_dse.graph import load_model
from kitsune_dse.graph.ir import Tensor

G = 0.8e-6          # graph_launch_overhead_s


# -- launch timelines ----------------------------------------------------------------------------
def test_graph_launch_adds_one_node_gap_per_kernel():
    lat, over = launch_timeline([1e-6, 2e-6, 3e-6], H100, "graph")
    assert lat == pytest.approx(6e-6 + 3 * 0.8e-6) and over == pytest.approx(3 * 0.8e-6)
    assert launch_timeline([], H100, "graph") == (0.0, 0.0)


def test_eager_launch_short_kernels_wait_for_the_host():
    # issue at 6, 12, 18 us; 1 us kernels finish long before the next issue: end = 18 + 1
    lat, over = launch_timeline([1e-6, 1e-6, 1e-6], H100, "eager")
    assert lat == pytest.approx(19e-6) and over == pytest.approx(19e-6 - 3e-6)


def test_eager_launch_long_kernels_pay_the_first_launch_and_the_gaps():
    # k0 6..106, k1 max(106+1.5, 12)=107.5..207.5, k2 209..309 us
    lat, over = launch_timeline([100e-6] * 3, H100, "eager")
    assert lat == pytest.approx(6e-6 + 300e-6 + 2 * 1.5e-6)
    assert over == pytest.approx(9e-6)
    with pytest.raises(ValueError):
        launch_timeline([1e-6], H100, "bogus")


# an 8192 x 4096 fp16 elementwise kernel: 2048 tiles of 64 KiB (32 KiB in, 32 KiB out), 2 CTAs
# per SM: 7 full waves of 264, then 200 tiles streaming on 100 SMs
LAST_WAVE = 200 * 65536 * (1 / hbm_curve(100) - 1 / hbm_curve(132))


def test_bsp_graph_and_eager_by_hand():
    # relu, relu over [8192, 4096] fp16: each kernel reads 64 MiB and writes 64 MiB (t1 spills)
    g = chain_graph(8192, 4096, ("relu", "relu"))
    t = 2 * 8192 * 4096 * 2 / hbm_curve(132)                 # 48.885 us per kernel
    t += LAST_WAVE                                           # + 0.32 us
    e = bsp(Region.of(g), H100)
    assert e.latency_s == pytest.approx(2 * t + 2 * 0.8e-6, rel=1e-9)
    assert e.kernel_launches == 2
    assert e.breakdown["launch_s"] == pytest.approx(2 * 0.8e-6)
    eager = bsp(Region.of(g), H100, LaunchChoice("eager"))
    assert eager.latency_s == pytest.approx(6e-6 + t + 1.5e-6 + t, rel=1e-9)
    assert eager.dram_bytes == e.dram_bytes


def test_bsp_eager_tiny_kernels_are_launch_bound():
    g = chain_graph(64, 64, ("relu", "relu", "relu"))
    e = bsp(Region.of(g), H100, LaunchChoice("eager"))
    last = e.breakdown["kernels"][-1]["latency_s"]
    assert last < 1e-6
    assert e.latency_s == pytest.approx(3 * 6e-6 + last, rel=1e-9)
    assert e.latency_s > bsp(Region.of(g), H100).latency_s


# -- fusion --------------------------------------------------------------------------------------
def test_gpt3_mlp_fusion_groups():
    assert fusion_groups(Region.of(load_model("gpt3-mlp"))) == [("fc1", "gelu"),
                                                                ("fc2", "residual")]
    assert fusion_groups(Region.of(mlp_graph(64, 256, 1024))) == [("fc1", "gelu"),
                                                                  ("fc2", "residual")]


def test_gpt3_mlp_fusion_estimate_by_kernels():
    g = mlp_graph(2048, 12288, 49152)
    r = Region.of(g)
    e = fusion(r, H100)
    works = kernel_works(r, [("fc1", "gelu"), ("fc2", "residual")], H100)
    expected = sum(kernel_time(w, H100, 132) for w in works) + 2 * 0.8e-6
    assert e.latency_s == pytest.approx(expected, rel=1e-12)
    assert e.kernel_launches == 2
    # the GEMMs dominate: within 3 % of 2 * (2*2048*12288*49152) FLOP at 989.4e12 * 0.76
    flops = 2 * (2 * 2048 * 12288 * 49152)
    assert e.latency_s == pytest.approx(flops / (989.4e12 * 0.76), rel=0.03)


def test_softmax_after_a_wide_gemm_is_not_fused():
    # N = 512 > 256: no CTA owns whole rows of the GEMM output
    assert fusion_groups(Region.of(gemm_graph(1024, 512, 1024, epilogue="softmax"))) == [
        ("mm",), ("epi",)]
    assert fusion_groups(Region.of(gemm_graph(1024, 4096, 1024, epilogue="layernorm"))) == [
        ("mm",), ("epi",)]
    # N = 256 fits one CTA tile: the softmax is stitched into the epilogue
    assert fusion_groups(Region.of(gemm_graph(1024, 256, 1024, epilogue="softmax"))) == [
        ("mm", "epi")]


def test_fusion_rules_prologue_gemm_pairs_and_gathers():
    t = [Tensor("x", (1024, 1024), "fp16"), Tensor("w", (1024, 1024), "fp16")]
    g = build("pro", t, [("r", "relu", ("x",), ("a",)), ("mm", "matmul", ("a", "w"), ("y",))],
              ["x"], ["w"])
    assert fusion_groups(Region.of(g)) == [("r", "mm")]                    # prologue
    assert fusion_groups(Region.of(full_dep_graph(512, 512, 512))) == [("g1",), ("g2",)]
    assert fusion_groups(Region.of(gather_graph(1000, 256, 64))) == [("act",), ("look",)]
    assert fusion_groups(Region.of(chain_graph(64, 64, ("relu", "gelu", "softmax", "exp")))) == [
        ("op0", "op1", "op2", "op3")]


def test_fusion_beats_bsp_on_an_elementwise_chain():
    # three 64 MiB elementwise ops: BSP moves 2 x 64 MiB per kernel, fusion 2 x 64 MiB in all
    g = chain_graph(8192, 4096, ("relu", "gelu", "scale"))
    b, f = bsp(Region.of(g), H100), fusion(Region.of(g), H100)
    assert f.dram_bytes == 2 * 64 * MiB and b.dram_bytes == 6 * 64 * MiB
    # the fused kernel's 6144 tiles: 23 waves of 264, then 72 on 36 SMs
    tail = 72 * (2 * 64 * MiB / 6144) * (1 / hbm_curve(36) - 1 / hbm_curve(132))
    assert f.latency_s == pytest.approx(2 * 64 * MiB / hbm_curve(132) + tail + 0.8e-6, rel=1e-6)


# -- tilesync ------------------------------------------------------------------------------------
# H0: no per-tile hand-off cost, so the overlap logic is checked alone (hand-offs: further below)
H0 = spec(tile_signal_s=0.0, tile_wait_s=0.0)

def _gg(m, n1, n2, k):
    t = [Tensor("x", (m, k), "fp16"), Tensor("w1", (k, n1), "fp16"),
         Tensor("w2", (n1, n2), "fp16")]
    return build("gg", t, [("g1", "matmul", ("x", "w1"), ("h",)),
                           ("g2", "matmul", ("h", "w2"), ("y",))], ["x"], ["w1", "w2"])


def test_tilesync_overlap_by_hand():
    # g1: [128,384] @ [384,256] and g2: [128,256] @ [256,256], fp16, 64x64 tiles: 8 tiles each,
    # one partial wave on 132 SMs (fill 8/132). Both are memory-bound on the 8 SMs they use:
    # x, w1 read; h stays in L2 for g2 (the region's bytes fit it: nothing evicts h)
    t0 = (128 * 384 * 2 + 384 * 256 * 2) / hbm_curve(8)
    t1 = (256 * 256 * 2 + 128 * 256 * 2) / hbm_curve(8)          # w2 read, y written
    r = Region.of(_gg(128, 256, 256, 384))
    e = tilesync(r, H0)
    assert [k["latency_s"] for k in e.breakdown["kernels"]] == pytest.approx([t0, t1])
    # g1's 8 tiles run in one wave on 8 SMs, so its fluid time (tiles spread evenly) is its
    # time: nothing of g1 is left to overlap; tile sync only trades the launch gap (0.8 us) for
    # one semaphore wait per consumer wave (ceil(8/132) = 1 wave x 0.56 us)
    gain = 0.8e-6 - 1 * 0.56e-6
    assert e.breakdown["overlap_saved_s"] == pytest.approx([gain])
    assert e.latency_s == pytest.approx(0.8e-6 + (t0 + 0.56e-6) + t1, rel=1e-9)
    assert e.latency_s < fusion(r, H0).latency_s


def test_tilesync_removes_the_last_wave_tail_by_hand():
    # g1: [4096,4096] @ [4096,4352] fp16, compute-bound. The roofline picks the CTA tile; take
    # the picked tile count T and time t0: the fluid time is t0 * T / (ceil(T/132) * 132) when
    # g1 is compute-bound, and tile sync charges that instead of t0
    r = Region.of(_gg(4096, 4096 + 256, 4096, 4096))
    e = tilesync(r, H0)
    k0, k1 = e.breakdown["kernels"]
    T, t0, t1 = k0["tiles"], k0["latency_s"], k1["latency_s"]
    fluid = t0 * T / (math.ceil(T / 132) * 132)
    sem = 0.56e-6                         # the first consumer wave waits on one hand-off
    assert T % 132 != 0 and fluid < t0
    # tile sync may also re-pick g1's tile for overlap: never worse than this tile's cost
    assert e.latency_s <= (0.8e-6 + min(fluid + sem, t0 + 0.8e-6) + t1) * (1 + 1e-9)
    assert e.latency_s < fusion(r, H0).latency_s - (t0 - fluid) / 2


def test_tilesync_last_kernel_loses_its_tail_by_its_producers_stagger_by_hand():
    # two compute-bound GEMMs of many waves (tiles not a multiple of 132): the consumer's CTAs
    # start as the producer's last tiles end, spread over one producer tile time, so of its own
    # wave tail (its time over its fluid time) it loses that share of one of its tile times
    from kitsune_dse.cost.roofline import busiest_sm_tiles
    from kitsune_dse.cost.strategies import _fluid_time
    # one tile per kernel (the harness's rule), so the kernels' own times are the ones tiled
    H0 = spec(tile_signal_s=0.0, tile_wait_s=0.0, gemm_heuristic="harness",
              gemm_tile_shapes=[(128, 128), (64, 128)])
    r = Region.of(_gg(4096, 4096 + 256, 4096 + 384, 4096))
    w0, w1 = kernel_works(r, [("g1",), ("g2",)], H0)
    t0, t1 = kernel_time(w0, H0, 132), kernel_time(w1, H0, 132)
    f0, f1 = _fluid_time(w0, H0, 132), _fluid_time(w1, H0, 132)
    tau0, tau1 = t0 / float(busiest_sm_tiles(w0, 132)), t1 / float(busiest_sm_tiles(w1, 132))
    share = min(1.0, tau0 / tau1)
    assert 0 < share and f1 < t1
    gap, sem = 0.8e-6, 0.56e-6
    expect = gap + min(f0 + sem, t0 + gap) + (t1 - share * (t1 - f1))
    assert tilesync(r, H0).latency_s == pytest.approx(expect, rel=1e-9)
    # a producer of short tiles (a row op) staggers the GEMM after it by far less than a tile
    t = [Tensor("x", (8192, 4096), "fp16"), Tensor("w", (4096, 4096 + 256), "fp16")]
    rs = Region.of(build("sg", t, [("sm", "softmax", ("x",), ("p",)), ("mm", "matmul", ("p", "w"), ("y",))],
                         ["x"], ["w"]))
    ws = kernel_works(rs, fusion_groups(rs), H0)
    assert len(ws) == 2 and not ws[0].tile_shape
    ta, tb = kernel_time(ws[0], H0, 132), kernel_time(ws[1], H0, 132)
    sh = min(1.0, (ta / float(busiest_sm_tiles(ws[0], 132))) / (tb / float(busiest_sm_tiles(ws[1], 132))))
    assert sh < 0.25
    fb = _fluid_time(ws[1], H0, 132)
    assert tilesync(rs, H0).breakdown["kernels"][1]["latency_s"] == pytest.approx(tb)
    assert fusion(rs, H0).latency_s - tilesync(rs, H0).latency_s < (tb - fb) * 0.25 + gap + 1e-9


def test_tilesync_independent_kernels_overlap_like_a_stream_by_hand():
    # two GEMMs that both read x and nothing of each other: under tilesync the second one's
    # CTAs start on the SMs the first one's last wave leaves idle (programmatic launch), with no
    # flag to wait for: the first costs its fluid time, the second loses the first's stagger
    # share of its own tail, as a streaming pair but without the semaphore wait
    from kitsune_dse.cost.roofline import busiest_sm_tiles
    from kitsune_dse.cost.strategies import _fluid_time
    H0 = spec(tile_signal_s=0.0, tile_wait_s=0.0, gemm_heuristic="harness",
              gemm_tile_shapes=[(128, 128), (64, 128)])
    t = [Tensor("x", (4096, 4096), "fp16"), Tensor("w1", (4096, 4096 + 256), "fp16"),
         Tensor("w2", (4096, 4096 + 384), "fp16")]
    r = Region.of(build("ind", t, [("g1", "matmul", ("x", "w1"), ("h1",)),
                                   ("g2", "matmul", ("x", "w2"), ("h2",))], ["x"], ["w1", "w2"]))
    w0, w1 = kernel_works(r, [("g1",), ("g2",)], H0)
    t0, t1 = kernel_time(w0, H0, 132), kernel_time(w1, H0, 132)
    f0, f1 = _fluid_time(w0, H0, 132), _fluid_time(w1, H0, 132)
    tau0, tau1 = t0 / float(busiest_sm_tiles(w0, 132)), t1 / float(busiest_sm_tiles(w1, 132))
    share = min(1.0, tau0 / tau1)
    assert f0 < t0 and f1 < t1
    gap = 0.8e-6
    expect = gap + min(f0, t0 + gap) + (t1 - share * (t1 - f1))
    e = tilesync(r, H0)
    assert e.latency_s == pytest.approx(expect, rel=1e-9)
    assert e.breakdown["overlap_saved_s"] == pytest.approx([t0 + gap - min(f0, t0 + gap)])
    assert e.latency_s < fusion(r, H0).latency_s


@pytest.mark.parametrize("graph", [full_dep_graph(2048, 2048, 2048),
                                   gather_graph(50000, 1024, 4096),
                                   full_dep_graph(128, 64, 4096)],
                         ids=["full-gemm-B", "gather", "full-small"])
def test_tilesync_equals_fusion_when_tiles_cannot_stream(graph):
    r = Region.of(graph)
    t, f = tilesync(r, H0), fusion(r, H0)
    assert t.breakdown["overlap_saved_s"] == [-0.8e-6] * (len(f.breakdown["groups"]) - 1)
    assert t.latency_s == pytest.approx(f.latency_s, rel=1e-12)
    assert t.dram_bytes == f.dram_bytes


@pytest.mark.parametrize("graph", [mlp_graph(16, 4096, 16384), mlp_graph(2048, 4096, 16384),
                                   _gg(128, 256, 256, 384), chain_graph(8192, 4096, ("relu",)),
                                   gemm_graph(8192, 512, 1024, epilogue="softmax")],
                         ids=["mlp-decode", "mlp-prefill", "tiny-gemms", "relu", "gemm-softmax"])
def test_tilesync_is_never_below_the_dram_floor_nor_above_fusion(graph):
    r = Region.of(graph)
    t = tilesync(r, H0)
    floor = t.dram_bytes / hbm_curve(132) + 0.8e-6
    assert t.latency_s >= floor * (1 - 1e-12)
    assert t.latency_s <= fusion(r, H0).latency_s * (1 + 1e-12)


# -- split_sms (pipelines share SMs among stages) on small tables ------------------------------
INF = math.inf


def test_split_sms_by_hand():
    a = np.array([INF, 8, 4, 8 / 3, 2])
    b = np.array([INF, 4, 2, 4 / 3, 1])
    # splits of 4 SMs: (1,3) -> 8, (2,2) -> 4, (3,1) -> 4: T = 4; smallest shares reaching it
    assert split_sms([a, b], 4) == (4.0, [2, 1])
    six = np.array([INF, 6, 3, 2, 1.5, 1.2, 1.0])
    # step 1: (3,3) -> 2; (4,2) -> 3 ...: T = 2
    assert split_sms([six, six], 6) == (2.0, [3, 3])
    # step 2 (SMs in 2s): (2,4) -> 3, (4,2) -> 3, (2,2) -> 3: T = 3
    assert split_sms([six, six], 6, step=2) == (3.0, [2, 2])


def test_split_sms_does_not_assume_convex_tables():
    # tables[i][s] for s = 0..total: a kernel that is only fast on 4 SMs, and a flat one
    needs_four = np.array([INF, 10, 10, 10, 1, 1])
    flat = np.array([INF, 2, 2, 2, 2, 2])
    assert split_sms([needs_four, flat], 5) == (2.0, [4, 1])
    assert split_sms([needs_four[:5], flat[:5]], 4) == (10.0, [1, 1])
    assert split_sms([flat[:3]] * 3, 2) == (INF, [])


@settings(max_examples=examples(80), deadline=None)
@given(k=st.integers(1, 3), total=st.integers(1, 9), step=st.sampled_from([1, 2, 3]),
       data=st.data())
def test_split_sms_matches_brute_force(k, total, step, data):
    tabs = [np.array([INF] + data.draw(st.lists(st.floats(0.1, 100), min_size=total,
                                                max_size=total))) for _ in range(k)]
    allowed = range(step, total + 1, step)
    best = min((max(t[s] for t, s in zip(tabs, split))
                for split in itertools.product(allowed, repeat=k) if sum(split) <= total),
               default=INF)
    T, split = split_sms(tabs, total, step)
    assert T == pytest.approx(best)
    if split:
        assert sum(split) <= total and all(s % step == 0 for s in split)
        assert max(t[s] for t, s in zip(tabs, split)) <= T * (1 + 1e-12)


# -- concurrent ----------------------------------------------------------------------------------
def _best_alone(r, w, sp):
    return min(kernel_variants(r, (w.name,), sp, w), key=lambda v: kernel_time(v, sp, sp.sm_count))


def test_concurrent_runs_gemms_whose_ctas_fit_the_chip_side_by_side():
    # two small GEMMs (K = 512: no split-K) whose CTAs are all resident at once: each kernel
    # on a share of the SMs in proportion to its CTAs (66 each)
    r = Region.of(two_gemms_graph(256, 512, 512, 512))
    assert levels(r) == [["g1", "g2"]]
    e = concurrent(r, H0)
    assert e.breakdown["sm_shares"] == [{"g1": 66, "g2": 66}]
    works = kernel_works(r, [("g1",), ("g2",)], H0)
    t = max(kernel_time(_best_alone(r, w, H0), H0, 66) for w in works)
    # both read x and write their outputs through one DRAM: their bytes at the chip's bandwidth
    floor = sum(w.dram_bytes - w.grid_reread_bytes for w in works) / H0.hbm_bandwidth_from(132)
    fixed = H0.tilesync_fixed_s + H0.launch_latency_cost_s + H0.kernel_fixed_s + H0.graph_launch_overhead_s
    assert e.latency_s == pytest.approx(max(t, floor) + fixed, rel=1e-9)
    assert e.latency_s < bsp(r, H0).latency_s


def test_concurrent_gemms_larger_than_the_chip_overlap_only_the_first_ones_tail():
    # 256 tiles each: the second kernel's CTAs take the SMs the first one's last wave leaves
    # idle; the first costs its fluid time, the second its time on all SMs (no SM split: the
    # grids never take one)
    from kitsune_dse.cost.strategies import _fluid_time
    r = Region.of(two_gemms_graph(2048, 2048, 2048, 4096))
    e = concurrent(r, H0)
    assert e.breakdown["sm_shares"] == [{"g1": 132, "g2": 132}]
    w1, w2 = kernel_works(r, [("g1",), ("g2",)], H0)
    v1, v2 = _best_alone(r, w1, H0), _best_alone(r, w2, H0)
    fill = min(_fluid_time(v1, H0, 132), kernel_time(v1, H0, 132)) + kernel_time(v2, H0, 132)
    fixed = H0.tilesync_fixed_s + H0.launch_latency_cost_s + H0.kernel_fixed_s + H0.graph_launch_overhead_s
    serial = kernel_time(v1, H0, 132) + kernel_time(v2, H0, 132) + H0.graph_launch_overhead_s + H0.kernel_fixed_s
    assert e.latency_s == pytest.approx(min(fill, serial) + fixed, rel=1e-9)
    assert e.latency_s <= bsp(r, H0).latency_s * (1 + 1e-12)


def test_concurrent_shares_follow_the_kernels_ctas():
    # the bigger GEMM's grid takes the bigger share, in proportion to its CTAs
    r = Region.of(two_gemms_graph(256, 128, 512, 512))
    (sh,) = concurrent(r, H0).breakdown["sm_shares"]
    works = kernel_works(r, [("g1",), ("g2",)], H0)
    fp = [(v := _best_alone(r, w, H0)).tiles / v.ctas_per_sm for w in works]
    assert sum(fp) <= 132
    assert [sh["g1"], sh["g2"]] == [int(132 * f / sum(fp)) for f in fp]
    assert sh["g2"] > 2 * sh["g1"]


def test_concurrent_on_a_chain_is_bsp():
    r = Region.of(mlp_graph(512, 4096, 16384))
    assert [len(lv) for lv in levels(r)] == [1, 1, 1, 1]
    # one kernel per level, back to back: bsp's launches, each kernel on the CTA tile / split-K
    # best for it on all SMs (as tilesync's kernels), so never slower than bsp
    c, b = concurrent(r, H0).latency_s, bsp(r, H0).latency_s
    assert c <= b * (1 + 1e-12) and c >= 0.95 * b


def test_concurrent_is_never_slower_than_running_the_level_back_to_back():
    r = Region.of(two_gemms_graph(2048, 1024, 3072, 4096))
    assert concurrent(r, H0).latency_s <= bsp(r, H0).latency_s * (1 + 1e-12)


def test_concurrent_never_slows_down_with_one_more_sm():
    # same per-SM speed, one more SM: x[1024,4096] @ w1[4096,64] beside x @ w2[4096,1024]
    r = Region.of(two_gemms_graph(1024, 64, 1024, 4096))
    assert concurrent(r, scale_sms(H100, 128)).latency_s <= \
        concurrent(r, scale_sms(H100, 127)).latency_s * (1 + 1e-9)


def test_tilesync_is_not_slower_on_a_gpu_with_twice_the_flops():
    # softmax+relu over x [64, 1024] fp32 (16 tiles, 2 CTAs/SM: fill 16/62 on 31 SMs) streams
    # into a 4-tile GEMM that is compute-bound at 1x and memory-bound at 2x FLOP/s
    t = [Tensor("x", (64, 1024), "fp32")] + [Tensor(f"w{i}", (1024, 64), "fp32") for i in (1, 3, 4)]
    g = build("flip", t, [("r0", "softmax", ("x",), ("t0",)),
                          ("mm1", "matmul", ("t0", "w1"), ("t1",)),
                          ("u2", "relu", ("t0",), ("t2",)), ("mm3", "matmul", ("x", "w3"), ("t3",)),
                          ("mm4", "matmul", ("x", "w4"), ("t4",))], ["x"], ["w1", "w3", "w4"])
    base = spec(sm_count=31, tensor_peak_flop_per_s={"fp16": 232.36e12},
                simt_peak_flop_per_s={"fp32": 12.029e12, "fp16": 24.058e12},
                hbm_bandwidth_Bps=0.5e12, hbm_per_sm_bandwidth_Bps=10e9, l2_bytes=4 * MiB,
                graph_launch_overhead_s=1.55e-6, sync_latency_s=0.1e-6,
                efficiency={"hbm_saturation_exponent": 2.0})
    r = Region.of(g)
    assert tilesync(r, scale_flops(base, 2.0)).latency_s <= tilesync(r, base).latency_s


def test_every_strategy_returns_a_checked_estimate():
    r = Region.of(mlp_graph(256, 1024, 4096))
    for f in (bsp, fusion, tilesync, concurrent):
        e = f(r, H100)
        assert e.check() is e
        assert e.flops == pytest.approx(r.flops)
        assert 0 <= e.sm_busy_fraction <= 1


def test_tilesync_never_slows_down_with_one_more_sm():
    # x [4096, 256] @ w0 [256, 256] -> t0 @ w1 [256, 1024], fp16, H100 per-SM rates
    t = [Tensor("x", (4096, 256), "fp16"), Tensor("w0", (256, 256), "fp16"),
         Tensor("w1", (256, 1024), "fp16")]
    g = build("gg", t, [("mm0", "matmul", ("x", "w0"), ("t0",)),
                        ("mm1", "matmul", ("t0", "w1"), ("t1",))], ["x"], ["w0", "w1"])
    r = Region.of(g)
    assert tilesync(r, scale_sms(H100, 129)).latency_s <= \
        tilesync(r, scale_sms(H100, 128)).latency_s * (1 + 1e-9)


# -- hand-offs of tilesync and concurrent (per tile on the busiest SM, as the harness's probes) --
def test_tilesync_pays_per_tile_hand_offs_by_hand():
    # the one-wave pair of test_tilesync_overlap_by_hand: g1 counts its tiles (a consumer reads
    # its rows), g2 checks a flag before each tile; one tile each on the busiest SM
    hs = spec(tile_signal_s=0.3e-6, tile_wait_s=0.2e-6, tilesync_fixed_s=1e-6)
    r = Region.of(_gg(128, 256, 256, 384))
    t0 = (128 * 384 * 2 + 384 * 256 * 2) / hbm_curve(8)
    t1 = (256 * 256 * 2 + 128 * 256 * 2) / hbm_curve(8)
    e = tilesync(r, hs)
    assert e.latency_s == pytest.approx(0.8e-6 + 1e-6 + (t0 + 0.56e-6 + 0.3e-6) + (t1 + 0.2e-6), rel=1e-9)
    # with the default costs (sync_latency_s each) the pair is slower than fusion: the
    # explorer must not pick tilesync for a chain of one-wave kernels
    assert tilesync(r, H100).latency_s > fusion(r, H100).latency_s


def test_a_producer_sharing_its_sms_pays_the_shared_signal_cost_by_hand():
    # a softmax (two CTAs per SM in the model) feeding a GEMM counts its tiles at
    # tile_signal_shared_s: its SM's other CTA works while one drains its stores; a GEMM
    # producer (one CTA per SM) pays tile_signal_s
    from kitsune_dse.cost.roofline import busiest_sm_tiles
    from kitsune_dse.cost.strategies import _handoff_s
    t = [Tensor("x", (65536, 1024), "fp16"), Tensor("w", (1024, 128), "fp16")]
    g = build("smx", t, [("sm", "softmax", ("x",), ("p",)), ("mm", "matmul", ("p", "w"), ("y",))],
              ["x"], ["w"])
    hs = spec(tile_signal_s=0.3e-6, tile_signal_shared_s=0.05e-6, tile_wait_s=0.2e-6)
    soft, gemm = kernel_works(Region.of(g), [("sm",), ("mm",)], hs)
    assert soft.ctas_per_sm == 2 and gemm.ctas_per_sm == 1
    assert _handoff_s(soft, hs, 132, False, True) == pytest.approx(busiest_sm_tiles(soft, 132) * 0.05e-6)
    assert _handoff_s(gemm, hs, 132, False, True) == pytest.approx(busiest_sm_tiles(gemm, 132) * 0.3e-6)
    assert _handoff_s(soft, hs, 132, True, True) == pytest.approx(busiest_sm_tiles(soft, 132) * 0.25e-6)
    # an uncalibrated spec charges the shared producer the full signal
    assert _handoff_s(soft, spec(tile_signal_s=0.3e-6, tile_wait_s=0.0), 132, False, True) == \
        pytest.approx(busiest_sm_tiles(soft, 132) * 0.3e-6)


def test_one_wave_producer_keeps_its_time_and_ramp():
    from kitsune_dse.cost.strategies import _fluid_time
    hs = spec(gemm_ramp_s=5e-6)
    w = kernel_works(Region.of(_gg(128, 256, 256, 384)), [("g1",)], hs)[0]
    assert _fluid_time(w, hs, 132) == pytest.approx(kernel_time(w, hs, 132))
    big = kernel_works(Region.of(_gg(4096, 4352, 4096, 4096)), [("g1",)], hs)[0]
    t, p = kernel_time(big, hs, 132, parts=True)
    assert p["ramp_s"] == 5e-6
    T = big.tiles
    # its tiles spread over all SMs, saving what its math share of the kernel saves (spreading a
    # stream-bound kernel's tiles does not shorten its stream)
    spread = max(p["compute_s"] * T / (math.ceil(T / 132) * 132), p["dram_s"], p["l2_s"]) + 5e-6
    share = p["compute_s"] / (p["compute_s"] + (p["read_s"] or p["dram_s"]))
    assert _fluid_time(big, hs, 132) == pytest.approx(t - (t - spread) * share)
    assert spread < _fluid_time(big, hs, 132) < t


def test_concurrent_charges_hand_offs_between_dependent_levels_only():
    hs = spec(tile_signal_s=0.3e-6, tile_wait_s=0.2e-6, tilesync_fixed_s=1e-6)
    from kitsune_dse.cost.strategies import _handoffs
    t = [Tensor("x", (2048, 1024), "fp16"), Tensor("w1", (1024, 1024), "fp16"),
         Tensor("w2", (1024, 1024), "fp16"), Tensor("w3", (1024, 1024), "fp16")]
    g = build("fork", t, [("a", "matmul", ("x", "w1"), ("ya",)), ("b", "matmul", ("x", "w2"), ("yb",)),
                          ("c", "matmul", ("ya", "w3"), ("yc",))], ["x"], ["w1", "w2", "w3"])
    r = Region.of(g)
    # a and b are independent (b has no consumer); c waits for a
    assert _handoffs(r, [("a",), ("b",), ("c",)]) == [(False, True), (False, False), (True, False)]
    base = concurrent(r, H0).latency_s
    assert concurrent(r, hs).latency_s > base + 1e-6 + 0.2e-6 - 1e-12


def test_handoffs_follow_views():
    from kitsune_dse.cost.strategies import _handoffs
    t = [Tensor("x", (256, 512), "fp16"), Tensor("w", (512, 512), "fp16")]
    g = build("v", t, [("a", "relu", ("x",), ("h",)), ("r", "reshape", ("h",), ("hv",), {"shape": [256, 512]}),
                       ("mm", "matmul", ("hv", "w"), ("y",))], ["x"], ["w"])
    assert _handoffs(Region.of(g), [("a",), ("mm",)]) == [(False, True), (True, False)]


def test_a_graph_pays_its_launch_latency_once_and_back_to_back_regions_hide_it():
    from kitsune_dse.cost.region import compose_sequential
    g = chain_graph(4096, 4096, ("relu", "gelu"))
    r = Region.of(g)
    sp = H100.model_copy(update={"launch_latency_s": 3e-6})
    a, b = bsp(r, H100), bsp(r, sp)
    assert b.latency_s == pytest.approx(a.latency_s + 3e-6, rel=1e-12)
    two = compose_sequential(g, sp, [(r.ops, b), (r.ops, b)])
    assert two.latency_s == pytest.approx(2 * b.latency_s - 3e-6, rel=1e-12)
    # a region boundary costs region_gap_s (the next launch from the host): three regions
    gap = sp.model_copy(update={"region_gap_s": 1.4e-6})
    three = compose_sequential(g, gap, [(r.ops, b)] * 3)
    assert three.latency_s == pytest.approx(3 * b.latency_s - 2 * (3e-6 - 1.4e-6), rel=1e-12)
    assert gap.region_overlap_s == pytest.approx(1.6e-6)


def test_the_committed_spec_prices_region_boundaries_from_the_graph_chains():
    from kitsune_dse.hw import load_spec
    sp = load_spec("h100-sxm.calibrated")
    cal = sp.calibration.model_extra or {}
    chain, graphs = cal.get("kernel_chain_fit"), cal.get("kernel_chain_graphs_fit")
    assert chain and graphs
    assert sp.region_gap_s == pytest.approx(graphs["per_kernel_s"] - chain["per_kernel_s"], rel=1e-9)
    assert 0.0 < sp.region_gap_s < sp.launch_latency_cost_s


# -- eager launches and the library baseline ------------------------------------------------------
def test_eager_kernel_ends_by_hand():
    from kitsune_dse.cost.strategies import kernel_ends, launch_timeline
    sp = spec(launch_overhead_s=5e-6, kernel_gap_s=2e-6)
    # a long kernel lets the host get ahead: the next two start a gap after the last one ends;
    # the host issues the 4th at 20 us, after the 3rd has ended (5 + 30 + 2 + 1 + 2 + 1 = 41 us)
    times = [30e-6, 1e-6, 1e-6]
    assert kernel_ends(times, sp) == pytest.approx([35e-6, 38e-6, 41e-6])
    # tiny kernels wait for the host: one every launch_overhead_s
    assert kernel_ends([1e-6] * 3, sp) == pytest.approx([6e-6, 11e-6, 16e-6])
    assert launch_timeline(times, sp, "eager")[0] == pytest.approx(41e-6)
    # the run's first launch, right after the host waited for the GPU, costs 9 us: all later by 4
    first = spec(launch_overhead_s=5e-6, kernel_gap_s=2e-6, launch_first_s=9e-6)
    assert kernel_ends([1e-6] * 3, first) == pytest.approx([10e-6, 15e-6, 20e-6])
    assert kernel_ends(times, first) == pytest.approx([39e-6, 42e-6, 45e-6])
    e = bsp(Region.of(mlp_graph(256, 1024, 4096)), H100, LaunchChoice("eager"))
    steps = [k["eager_step_s"] for k in e.breakdown["kernels"]]
    assert sum(steps) == pytest.approx(e.latency_s, rel=1e-12)
    assert all(s >= k["latency_s"] for s, k in zip(steps, e.breakdown["kernels"]))
    # with the host ahead, a step is the kernel and the device's gap, whatever the host costs
    assert all(k["device_step_s"] == pytest.approx(k["latency_s"] + H100.kernel_gap_s)
               for k in e.breakdown["kernels"])
    assert "eager_step_s" not in bsp(Region.of(mlp_graph(256, 1024, 4096)), H100).breakdown["kernels"][0]


def test_library_bsp_adds_each_bias_in_a_kernel_of_its_own():
    from kitsune_dse.cost.strategies import library_bsp
    from kitsune_dse.graph.transform import unfused_bias
    g = mlp_graph(1024, 1024, 4096)
    u = unfused_bias(g)
    assert [o.name for o in u.ops] == ["fc1", "fc1_bias", "gelu", "fc2", "fc2_bias", "residual"]
    assert u.op("fc1").inputs == ("x", "w1") and u.op("fc1_bias").inputs == ("h_raw", "b1")
    assert u.op("fc1_bias").outputs == ("h",) and u.outputs == g.outputs
    assert unfused_bias(u) is u
    r = Region.of(g)
    lib, own = library_bsp(r, H100_STEP), bsp(r, H100_STEP)
    assert lib.kernel_launches == own.kernel_launches + 2
    # the bias kernels read the raw products (h_raw from L2: 8 MiB fits; o_raw likewise) and
    # write h and o again: h_raw's write reaches DRAM (the region's 48 distinct MiB from fc1 on
    # do not fit the L2), o_raw's does not (fc2 on: 24 MiB)
    h = 1024 * 4096 * 2
    assert lib.dram_write_bytes == pytest.approx(own.dram_write_bytes + h)
    assert lib.latency_s > own.latency_s


def test_library_bsp_prices_only_the_gemms_with_the_library_spec():
    """The cublas baselines run cuBLAS for the products and this tool's kernels for the rest:
    a slower library changes the GEMM kernels' times and nothing else."""
    from kitsune_dse.cost.strategies import LaunchChoice, library_bsp
    r = Region.of(mlp_graph(1024, 1024, 4096))
    slow = H100.model_copy(update={"name": "slow-library", "efficiency": H100.efficiency.model_copy(
        update={"tensor_core": H100.efficiency.tensor_core / 2})})
    base, lib = library_bsp(r, H100), library_bsp(r, H100, library_spec=slow)
    kb, kl = base.breakdown["kernels"], lib.breakdown["kernels"]
    assert [k["kernel"] for k in kb] == [k["kernel"] for k in kl]
    for a, b in zip(kb, kl):
        if a["kernel"] in ("fc1", "fc2"):
            assert b["latency_s"] > a["latency_s"]
        else:
            assert b["latency_s"] == a["latency_s"]
    assert lib.breakdown["library"] == "slow-library"
    # in a graph the launches are the tool's: the same overhead either way
    g0 = library_bsp(r, H100, LaunchChoice("graph"))
    g1 = library_bsp(r, H100, LaunchChoice("graph"), library_spec=slow)
    assert g1.breakdown["launch_s"] == pytest.approx(g0.breakdown["launch_s"])
    assert g1.latency_s - g0.latency_s == pytest.approx(
        sum(b["latency_s"] - a["latency_s"] for a, b in zip(kb, kl)))
