"""Roofline with an SM share (kitsune_dse.cost.roofline), checked against hand arithmetic.

Figures use the test spec of helpers_graphs (H100 numbers): tensor fp16 989.4 TFLOP/s x 0.76
over 132 SMs, SIMT fp32 66.9 TFLOP/s x 0.76, HBM B(s) = ((s*38e9)^-3 + (3.35e12*0.87)^-3)^(-1/3),
L2 B2(s) = ((s*80e9)^-3 + (7.4e12*0.95)^-3)^(-1/3), graph launch 0.8 us.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_graphs import H100, MiB, chain_graph, examples, gemm_graph, hbm_curve, spec
from kitsune_dse.cost.region import Region, kernel_works
from kitsune_dse.cost.roofline import (GEMM_TILES, KernelWork, _last_wave_s, best_gemm_tile, gemm_tiles,
                                       kernel_time, split_k_partials_bytes)
from kitsune_dse.cost.strategies import bsp

TENSOR_PER_SM = 989.4e12 * 0.76 / 132       # 5.6966e12 FLOP/s
SIMT_FP32_PER_SM = 66.9e12 * 0.76 / 132


def test_derived_rates_are_the_datasheet_times_efficiency():
    assert H100.tensor_rate_per_sm("fp16") == pytest.approx(989.4e12 * 0.76 / 132)
    assert H100.tensor_rate_per_sm("bf16") == pytest.approx(989.4e12 * 0.76 / 132)
    assert H100.simt_rate_per_sm("fp32") == pytest.approx(66.9e12 * 0.76 / 132)
    # no tensor-core rate for fp32: falls back to SIMT
    assert H100.tensor_rate_per_sm("fp32") == pytest.approx(66.9e12 * 0.76 / 132)
    assert H100.l2_usable_bytes == pytest.approx(50 * MiB * 0.75)


def test_half_precision_simt_math_runs_at_the_fp32_rate():
    # the runtime's kernels convert fp16/bf16 values to float and compute in fp32: a
    # compute-bound element-wise kernel of 1e12 SIMT FLOP on 132 SMs takes 1e12 / 132 tiles'
    # worth at the fp32 rate, whatever the packed fp16 peak (133.8 TFLOP/s) would allow
    w = KernelWork(name="ew", dtype="fp16", simt_flops=1e12, tiles=132)
    assert kernel_time(w, H100, 132) == pytest.approx(1e12 / 132 / SIMT_FP32_PER_SM, rel=1e-9)
    assert kernel_time(w, H100, 132) == pytest.approx(kernel_time(replace(w, dtype="fp32"), H100, 132))
    assert kernel_time(replace(w, dtype="bf16"), H100, 132) == kernel_time(w, H100, 132)


def test_hbm_curve_matches_the_formula_and_the_h100_measurements():
    for s in (1, 4, 16, 33, 66, 99, 132):
        assert H100.hbm_bandwidth_from(s) == pytest.approx(
            ((s * 38e9) ** -3 + (3.35e12 * 0.87) ** -3) ** (-1 / 3))
    # FACTS.md: 16 SMs 0.61 TB/s, 66: 2.07, 132: 2.7 (within 6 %)
    for s, measured in ((16, 0.61e12), (66, 2.07e12), (132, 2.7e12)):
        assert H100.hbm_bandwidth_from(s) == pytest.approx(measured, rel=0.06)
    arr = H100.hbm_bandwidth_from(np.arange(1, 133))
    assert np.all(np.diff(arr) > 0) and arr[-1] < 3.35e12 * 0.87


# -- compute-bound GEMM on all SMs -----------------------------------------------------------
def test_compute_bound_gemm_on_all_sms_equals_flops_over_peak():
    # M = 132*128 rows: with 128x256 tiles, 132 * 8 = 1056 tiles = exactly 8 full waves
    g = gemm_graph(16896, 2048, 4096)
    (w,) = kernel_works(Region.of(g), [("mm",)], H100)
    assert w.tile_shape == (128, 256) and w.tiles == 132 * 8 and w.split_k == 1
    lat, parts = kernel_time(w, H100, 132, parts=True)
    expected = 2 * 16896 * 2048 * 4096 / (989.4e12 * 0.76 / 132 * 132)     # 376.98 us
    assert lat == pytest.approx(expected, rel=1e-9)
    assert parts["waves"] == 8
    # DRAM: x and w as the grid's 4 waves read them (cost.gemm_l2): a wave of 264 CTAs touches
    # all of w and 33 row-blocks of x, 51 MB, beyond the usable L2, so w is read in every wave
    # and the row-blocks of the 3 groups of 8 that straddle a wave boundary twice;
    # y 16896*2048*2 written, all SMs pulling
    from kitsune_dse.cost.gemm_l2 import grid_reads
    a, b = grid_reads(16896, 2048, 4096, 128, 256, 2, 264, H100.l2_usable_bytes)
    assert a == (132 + 3 * 8) * 128 * 4096 * 2 and b == 4 * 4096 * 2048 * 2
    dram = (a + b + 16896 * 2048 * 2) / hbm_curve(132)
    assert parts["dram_s"] == pytest.approx(dram, rel=1e-9) and dram < expected
    # the whole-graph BSP estimate adds one CUDA-graph node
    assert bsp(Region.of(g), H100).latency_s == pytest.approx(expected + 0.8e-6, rel=1e-9)


def test_compute_bound_kernel_on_a_share_of_sms():
    # 264 tiles of 1e9 FLOP each: on 66 SMs 4 waves, on 132 SMs 2 waves
    w = KernelWork("k", "fp16", tensor_flops=264e9, tiles=264)
    per_tile = 1e9 / (989.4e12 * 0.76 / 132)
    assert kernel_time(w, H100, 66) == pytest.approx(4 * per_tile)
    assert kernel_time(w, H100, 132) == pytest.approx(2 * per_tile)
    assert kernel_time(w, H100, 100) == pytest.approx(3 * per_tile)     # ceil(264/100) = 3


# -- memory-bound elementwise --------------------------------------------------------------------
@pytest.mark.parametrize("sms", [132, 16])
def test_memory_bound_elementwise_uses_the_saturating_hbm_curve(sms):
    # relu over [8192, 4096] fp16: 64 MiB read + 64 MiB written, 2048 tiles of 64 KiB
    g = chain_graph(8192, 4096, ("relu",))
    (w,) = kernel_works(Region.of(g), [("op0",)], H100)
    assert w.dram_read_bytes == 8192 * 4096 * 2 and w.dram_write_bytes == 8192 * 4096 * 2
    lat, parts = kernel_time(w, H100, sms, parts=True)
    def b(n):
        return ((n * 38e9) ** -3 + (3.35e12 * 0.87) ** -3) ** (-1 / 3)  # 2.7456 TB/s / 0.6062 TB/s
    expected = 2 * 8192 * 4096 * 2 / b(sms)                          # 48.9 us / 221.4 us
    if sms == 132:
        # 2 CTAs per SM: 7 full waves of 264 tiles, then 200 tiles (64 KiB each) on 100 SMs
        assert (w.tiles, w.ctas_per_sm) == (2048, 2)
        expected += 200 * 65536 * (1 / b(100) - 1 / b(132))           # + 0.32 us
    # (on 16 SMs, 2048 = 64 full waves of 32: no partial wave)
    assert lat == pytest.approx(expected, rel=1e-9)
    assert parts["compute_s"] < parts["dram_s"]


def test_sixteen_sms_are_far_slower_than_a_sixteenth_of_the_peak_suggests():
    w = KernelWork("copy", "fp32", dram_read_bytes=1 << 30, dram_write_bytes=1 << 30, tiles=1 << 15)
    t16, t132 = kernel_time(w, H100, 16), kernel_time(w, H100, 132)
    # linear region: 16 SMs pull ~16*38 GB/s; all SMs saturate near 2.75 TB/s
    assert t16 == pytest.approx(2 ** 31 / hbm_curve(16))
    # 32768 = 248 waves of 132 tiles and a last wave of 32 tiles (64 KiB each) on 32 SMs
    tail = 32 * 65536 * (1 / hbm_curve(32) - 1 / hbm_curve(132))
    assert t132 == pytest.approx(2 ** 31 / hbm_curve(132) + tail)
    assert 4.4 < t16 / t132 < 4.6


def test_few_tiles_use_only_as_many_sms_as_tiles():
    # 4 tiles (1 CTA per SM): only 4 SMs pull from DRAM, whatever the share
    w = KernelWork("small", "fp16", dram_read_bytes=8 * MiB, tiles=4)
    assert kernel_time(w, H100, 132) == pytest.approx(8 * MiB / hbm_curve(4))
    assert kernel_time(w, H100, 4) == pytest.approx(8 * MiB / hbm_curve(4))


def test_a_grid_smaller_than_the_gpu_spreads_over_distinct_sms():
    # 64 CTAs of a 2-CTAs-per-SM kernel on 132 SMs: one CTA on each of 64 SMs
    w = KernelWork("ew", "fp16", simt_flops=64 * 1e6, dram_read_bytes=2 * MiB,
                   dram_write_bytes=2 * MiB, tiles=64, ctas_per_sm=2)
    lat, parts = kernel_time(w, H100, 132, parts=True)
    assert parts["dram_s"] == pytest.approx(4 * MiB / hbm_curve(64))
    # each SM runs one tile of 1e6 FLOP alone, at the fp32 rate (fp16 data, fp32 math)
    assert parts["compute_s"] == pytest.approx(1e6 / SIMT_FP32_PER_SM)


# -- wave quantization ---------------------------------------------------------------------------
def test_133_tiles_on_132_sms_take_two_waves():
    f = 133 * 2e9
    w = KernelWork("q", "fp16", tensor_flops=f, tiles=133)
    per_tile = (f / 133) / (989.4e12 * 0.76 / 132)
    lat, parts = kernel_time(w, H100, 132, parts=True)
    assert parts["waves"] == 2
    assert lat == pytest.approx(2 * per_tile)
    # one tile more than 132 nearly doubles the time of 132 tiles of the same size
    full = KernelWork("q", "fp16", tensor_flops=132 * 2e9, tiles=132)
    assert kernel_time(full, H100, 132) == pytest.approx(per_tile)
    # 264 tiles still fit two waves: doubling the work costs nothing more
    w2 = KernelWork("q", "fp16", tensor_flops=264 * 2e9, tiles=264)
    assert kernel_time(w2, H100, 132) == pytest.approx(lat)


def test_ctas_per_sm_widen_a_wave():
    # 2 CTAs per SM share the SM: a wave of 264 tiles takes 2 tile-times
    w = KernelWork("c", "fp32", simt_flops=264 * 1e7, tiles=264, ctas_per_sm=2)
    per_tile = 1e7 / (66.9e12 * 0.76 / 132)
    _, parts = kernel_time(w, H100, 132, parts=True)
    assert parts["waves"] == 1
    assert parts["compute_s"] == pytest.approx(2 * per_tile)


def test_l2_bound_and_the_max_of_the_three_terms():
    # 64 MiB from L2 on 132 SMs, 1 MiB from DRAM, no FLOPs: the L2 term binds
    w = KernelWork("l2", "fp16", dram_read_bytes=1 * MiB, l2_bytes=64 * MiB, tiles=1024)
    b2 = ((132 * 80e9) ** -3 + (7.4e12 * 0.95) ** -3) ** (-1 / 3)
    lat, parts = kernel_time(w, H100, 132, parts=True)
    assert parts["l2_s"] == pytest.approx(64 * MiB / b2)
    # 1024 tiles: 7 waves of 132, then 100 tiles of 1 KiB on 100 SMs
    assert parts["dram_s"] == pytest.approx(1 * MiB / hbm_curve(132)
                                            + 100 * 1024 * (1 / hbm_curve(100) - 1 / hbm_curve(132)))
    assert lat == pytest.approx(max(parts["l2_s"], parts["dram_s"], parts["compute_s"]))
    assert lat == pytest.approx(parts["l2_s"])


def test_array_of_sm_counts_equals_scalar_calls():
    w = KernelWork("mix", "fp16", tensor_flops=3e11, simt_flops=1e9, dram_read_bytes=300 * MiB,
                   dram_write_bytes=20 * MiB, l2_bytes=50 * MiB, tiles=777)
    axis = np.arange(1, 133)
    arr = kernel_time(w, H100, axis)
    assert arr.shape == (132,)
    np.testing.assert_allclose(arr, [kernel_time(w, H100, int(s)) for s in axis], rtol=1e-12)


# -- GEMM tile choice ----------------------------------------------------------------------------
def test_gemm_tiles_and_split_k_partials():
    assert gemm_tiles(1, 16896, 2048, (128, 256)) == 132 * 8
    assert gemm_tiles(2, 100, 300, (64, 128)) == 2 * 2 * 3
    assert split_k_partials_bytes(1, 128, 256, 1) == 0
    assert split_k_partials_bytes(1, 128, 256, 4) == 2 * 128 * 256 * 4 * 4


def test_a_gemm_with_one_output_tile_splits_k():
    # 128x256 output = 1 tile of 128x256: split-K spreads K=16384 over more CTAs
    g = gemm_graph(128, 256, 16384)
    (w,) = kernel_works(Region.of(g), [("mm",)], H100)
    assert w.split_k > 1
    assert w.tiles == gemm_tiles(1, 128, 256, w.tile_shape) * w.split_k
    assert w.l2_bytes == 2 * 128 * 256 * 4 * w.split_k
    one = KernelWork("mm", "fp16", tensor_flops=w.tensor_flops, dram_read_bytes=w.dram_read_bytes,
                     dram_write_bytes=w.dram_write_bytes, tiles=1, tile_shape=(128, 256))
    assert kernel_time(w, H100, 132) < kernel_time(one, H100, 132) / 3


def test_best_gemm_tile_prefers_the_larger_tile_on_ties_and_never_loses_to_any_candidate():
    f = 2.0 * 4096 * 4096 * 4096

    def make(tile, ks):
        return KernelWork("g", "fp16", tensor_flops=f, dram_read_bytes=64 * MiB,
                          dram_write_bytes=32 * MiB,
                          l2_bytes=split_k_partials_bytes(1, 4096, 4096, ks),
                          tiles=gemm_tiles(1, 4096, 4096, tile) * ks, tile_shape=tile, split_k=ks)
    for sms in (132, 128, 66, 7):
        w, t = best_gemm_tile(make, H100, sms, 4096)
        for tile in GEMM_TILES:
            for ks in (1, 2, 4, 8, 16):
                if ks > 1 and gemm_tiles(1, 4096, 4096, tile) >= sms:
                    continue       # a library splits K only when the output tiles cannot fill the SMs
                assert t <= kernel_time(make(tile, ks), H100, sms) * (1 + 1e-12)
    # 4096^2 output: all four tiles give the same compute on 128 SMs -> the largest wins
    w, _ = best_gemm_tile(make, H100, 128, 4096)
    assert w.tile_shape == (128, 256) and w.split_k == 1


@settings(max_examples=examples(60), deadline=None)
@given(tflops=st.floats(0, 1e12), simt=st.floats(0, 1e10), dr=st.floats(0, 1e9),
       l2=st.floats(0, 1e9), tiles=st.integers(1, 5000), cps=st.integers(1, 4))
def test_latency_never_increases_with_more_sms(tflops, simt, dr, l2, tiles, cps):
    w = KernelWork("r", "fp16", tensor_flops=tflops, simt_flops=simt, dram_read_bytes=dr,
                   l2_bytes=l2, tiles=tiles, ctas_per_sm=cps)
    sms = np.arange(1, 133)
    t = kernel_time(w, H100, sms)
    assert np.all(np.isfinite(t)) and np.all(t >= 0)
    # apart from the last partial wave's stream on its few SMs (wave quantisation: more SMs can
    # leave fewer tiles in it, each still streaming alone), more SMs never slow a kernel
    tail = _last_wave_s(w, H100, sms) if dr else np.zeros_like(t)
    assert np.all(tail >= 0)
    last = tiles - np.floor(tiles / (sms * cps)) * sms * cps
    alone = last * (w.dram_bytes / tiles) / H100.hbm_bandwidth_from(np.maximum(np.ceil(last / cps), 1))
    assert np.all(tail <= alone * (1 + 1e-12) + 1e-18)      # at most its bytes on its own SMs
    assert np.all(np.diff(t) <= 1e-15 + 1e-12 * t[:-1] + tail[1:])


def test_faster_hardware_is_never_slower_for_one_kernel():
    w = KernelWork("k", "fp16", tensor_flops=5e11, dram_read_bytes=200 * MiB, l2_bytes=10 * MiB,
                   tiles=500)
    base = kernel_time(w, H100, 132)
    assert kernel_time(w, spec(hbm_bandwidth_Bps=6e12), 132) <= base
    assert kernel_time(w, spec(tensor_peak_flop_per_s={"fp16": 2e15}), 132) <= base
    assert math.isclose(kernel_time(KernelWork("z", "fp16"), H100, 132), 0.0, abs_tol=0)


def test_a_gemm_that_fills_the_gpu_is_not_split_along_k():
    g = gemm_graph(4096, 4096, 4096)
    (w,) = kernel_works(Region.of(g), [("mm",)], H100)
    # 128x256 output tiles: 32 * 16 = 512 >= 132 SMs, so there is no reason to split K
    assert gemm_tiles(1, 4096, 4096, (128, 256)) == 512
    assert w.split_k == 1


def test_standalone_gemm_ramp_tile_cost_and_operand_ceiling_by_hand():
    from kitsune_dse.cost.roofline import kernel_time as kt
    base = H100.model_copy(update={"gemm_standalone_tile_fixed_s": 2e-6, "gemm_ramp_s": 5e-6,
                                   "kernel_fixed_s": 3e-6})
    # 264 tiles of 128x128 on 132 SMs: 2 per SM, each 2 us fixed + its FLOPs at the SM's rate
    flops = 264 * 2 * 128 * 128 * 1024
    gemm = KernelWork("g", "fp16", tensor_flops=flops, tiles=264, tile_shape=(128, 128))
    per_tile = 2 * 128 * 128 * 1024 / base.tensor_rate_per_sm("fp16")
    assert kt(gemm, base, 132) == pytest.approx(2 * (2e-6 + per_tile) + 5e-6, rel=1e-12)
    # split along K: a second kernel sums the partials (its fixed cost and a second ramp)
    split = KernelWork("g", "fp16", tensor_flops=flops, tiles=264, tile_shape=(128, 128), split_k=2)
    assert kt(split, base, 132) == pytest.approx(2 * (2e-6 + per_tile) + 2 * 5e-6 + 3e-6, rel=1e-12)
    # a persistent step and an elementwise kernel pay no standalone ramp
    ew = KernelWork("e", "fp16", dram_read_bytes=1e6, tiles=16)
    assert kt(ew, base, 132) == pytest.approx(kt(ew, H100, 132), rel=1e-12)
    # a GEMM's operand stream saturates at efficiency.gemm_hbm, not at efficiency.hbm
    streaming = KernelWork("s", "fp16", tensor_flops=1e6, dram_read_bytes=1e9, tiles=264,
                           tile_shape=(128, 128))
    slow = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={"gemm_hbm": 0.5})})
    assert kt(streaming, slow, 132) > kt(streaming, H100, 132) * 1.5
    assert kt(streaming, slow, np.array([132.0]))[0] == pytest.approx(kt(streaming, slow, 132), rel=1e-12)


def test_persistent_gemm_step_by_hand():
    """Two teams per SM, a tile fed slab by slab pays its fixed cost once, the operand stream
    from the SMs the items keep busy, DRAM not hidden under the math (overlap 0)."""
    sp = H100.model_copy(update={
        "gemm_tile_fixed_s": 3e-6, "persistent_gemm_sm_stream_Bps": 20e9,
        "efficiency": H100.efficiency.model_copy(update={"mem_compute_overlap": 0.0,
                                                         "persistent_gemm_hbm": 0.8})})
    rate = sp.tensor_rate_per_sm("fp16")
    per_tile = 2 * 128 * 128 * 4096 / rate
    step = KernelWork("p", "fp16", tensor_flops=1024 * 2 * 128 * 128 * 4096, tiles=1024,
                      ctas_per_sm=2, tile_shape=(128, 128), persistent=True)
    # 1024 items on 99 SMs x 2 teams: ceil(1024 / 198) = 6 per team, 12 tile times per SM
    assert kernel_time(step, sp, 99) == pytest.approx(12 * (3e-6 + per_tile), rel=1e-12)
    # the same tiles fed in 4 slabs each (a split_k queue): 4x the items, fixed cost once
    slabs = KernelWork("p", "fp16", tensor_flops=step.tensor_flops, tiles=4096, ctas_per_sm=2,
                       tile_shape=(128, 128), split_k=4, persistent=True)
    assert kernel_time(slabs, sp, 99) == pytest.approx(
        math.ceil(4096 / 198) * 2 * (3e-6 / 4 + per_tile / 4), rel=1e-12)
    # a split_k consumer waits for each runtime slab's flag: 6 polls of sync_latency_s per
    # tile-slab, spread over the SM's two teams
    polled = KernelWork("p", "fp16", tensor_flops=step.tensor_flops, tiles=4096, ctas_per_sm=2,
                        tile_shape=(128, 128), split_k=4, persistent=True, slab_polls=6.0)
    assert kernel_time(polled, sp, 99) == pytest.approx(
        math.ceil(4096 / 198) * 2 * (3e-6 / 4 + per_tile / 4 + 6 * sp.sync_latency_s / 2), rel=1e-12)
    # 96 items keep 96 teams = 48 SMs streaming; the bytes come on top of the math
    few = KernelWork("f", "fp16", tensor_flops=96 * 1e6, dram_read_bytes=1e9, tiles=96,
                     ctas_per_sm=2, tile_shape=(128, 128), persistent=True)
    bw = ((48 * 20e9) ** -H100.efficiency.hbm_saturation_exponent
          + (0.8 * H100.hbm_bandwidth_Bps) ** -H100.efficiency.hbm_saturation_exponent) \
        ** (-1 / H100.efficiency.hbm_saturation_exponent)
    compute = 2 * (3e-6 + 1e6 / rate)
    assert kernel_time(few, sp, 132) == pytest.approx(compute + 1e9 / bw, rel=1e-12)
    assert kernel_time(few, sp, np.array([132.0]))[0] == pytest.approx(kernel_time(few, sp, 132), rel=1e-12)


def test_persistent_gemm_feed_as_a_p_norm_by_hand():
    """With efficiency.persistent_feed_exponent p the step's time is the p-norm of its math and
    its operand feed: above both, at most 2^(1/p) times the larger; p = 0 is the larger alone."""
    from kitsune_dse.cost.roofline import _kernel_time_scalar
    eff = H100.efficiency.model_copy(update={"persistent_feed_exponent": 4.0})
    sp = H100.model_copy(update={"gemm_tile_fixed_s": 0.0, "persistent_gemm_l2_Bps": 4e12, "efficiency": eff})
    rate = sp.tensor_rate_per_sm("fp16")
    step = KernelWork("p", "fp16", tensor_flops=1024 * 2 * 128 * 128 * 4096, tiles=1024,
                      ctas_per_sm=2, tile_shape=(128, 128), persistent=True)
    for sms, per_sm in ((132, 8), (99, 12), (66, 16)):     # tiles on the busiest SM
        fed = per_sm * 256 * 4096 * 2 * sms / 4e12
        math_s = per_sm * 2 * 128 * 128 * 4096 / rate
        want = (fed ** 4 + math_s ** 4) ** 0.25
        assert kernel_time(step, sp, sms) == pytest.approx(want, rel=1e-12)
        assert _kernel_time_scalar(step, sp, float(sms)) == pytest.approx(want, rel=1e-12)
        assert max(fed, math_s) < want <= 2 ** 0.25 * max(fed, math_s)
    vec = kernel_time(step, sp, np.array([8.0, 33.0, 66.0, 132.0]))
    assert list(vec) == pytest.approx([_kernel_time_scalar(step, sp, s) for s in (8.0, 33.0, 66.0, 132.0)], rel=1e-12)
    assert np.all(np.diff(vec) <= 0)        # more SMs never slower
    # a step with no feed (not a persistent GEMM) is unchanged by p
    ew = KernelWork("e", "fp16", dram_read_bytes=1e8, tiles=1024, persistent=True)
    assert kernel_time(ew, sp, 66) == kernel_time(ew, H100, 66)


def test_persistent_gemm_operand_feed_by_hand():
    """Every SM in use loads its tiles' A and B slices from L2 through one shared feed: a
    128x128 fp16 tile of K = 4096 loads (128 + 128) x 4096 x 2 bytes = 2 MiB."""
    sp = H100.model_copy(update={"gemm_tile_fixed_s": 0.0, "persistent_gemm_l2_Bps": 4e12})
    rate = sp.tensor_rate_per_sm("fp16")
    step = KernelWork("p", "fp16", tensor_flops=1024 * 2 * 128 * 128 * 4096, tiles=1024,
                      ctas_per_sm=2, tile_shape=(128, 128), persistent=True)
    tile_bytes = 256 * 4096 * 2
    # 132 SMs: 8 tile times per SM (ceil(1024 / 264) x 2); each SM gets 4e12 / 132 of the feed
    fed = 8 * tile_bytes * 132 / 4e12
    math_s = 8 * 2 * 128 * 128 * 4096 / rate
    assert fed > math_s
    assert kernel_time(step, sp, 132) == pytest.approx(fed, rel=1e-12)
    lat, parts = kernel_time(step, sp, 132, parts=True)
    assert parts["feed_s"] == pytest.approx(fed, rel=1e-12) and parts["compute_s"] == pytest.approx(math_s)
    # the feed hides the DRAM stream its bytes include and the math: it caps the step
    streamed = KernelWork("p", "fp16", tensor_flops=step.tensor_flops, tiles=1024, ctas_per_sm=2,
                          tile_shape=(128, 128), persistent=True, dram_read_bytes=1e6)
    lat2, p2 = kernel_time(streamed, sp, 132, parts=True)
    ov = 1 - sp.efficiency.mem_compute_overlap
    assert lat2 == pytest.approx(max(fed, max(math_s, p2["dram_s"]) + ov * min(math_s, p2["dram_s"])), rel=1e-12)
    # 8 SMs: the feed per SM is 16x larger and the math binds again
    assert kernel_time(step, sp, 8) == pytest.approx(64 * 2 * 2 * 128 * 128 * 4096 / rate, rel=1e-12)
    # a 64-row tile loads 1.5x the bytes per FLOP of a 128-row one
    narrow = KernelWork("n", "fp16", tensor_flops=2048 * 2 * 64 * 128 * 4096, tiles=2048,
                        ctas_per_sm=2, tile_shape=(64, 128), persistent=True)
    assert kernel_time(narrow, sp, 132, parts=True)[1]["feed_s"] == pytest.approx(
        16 * (64 + 128) * 4096 * 2 * 132 / 4e12, rel=1e-12)
    # no feed for standalone kernels, nor without the calibrated constant
    assert kernel_time(step, H100, 132, parts=True)[1]["feed_s"] == 0.0
    alone = KernelWork("s", "fp16", tensor_flops=step.tensor_flops, tiles=1024, tile_shape=(128, 128))
    assert kernel_time(alone, sp, 132, parts=True)[1]["feed_s"] == 0.0
    assert kernel_time(step, sp, np.array([8.0, 132.0])) == pytest.approx(
        [kernel_time(step, sp, 8), kernel_time(step, sp, 132)], rel=1e-12)


def test_weights_beyond_l2_stream_once_per_row_blocks_held_at_once():
    from kitsune_dse.cost.roofline import weight_reread_bytes
    w = KernelWork("w", "fp16", tensor_flops=1.0, tiles=48 * 16, ctas_per_sm=2, tile_shape=(128, 128),
                   persistent=True, weight_pass_bytes=100.0, rbs=16, items_per_rb=48, rbs_at_once_max=16)
    # 66 SMs: 132 teams hold 132 / 48 = 2.75 row-blocks, so 16 / 2.75 passes, one already counted
    assert weight_reread_bytes(w, 66) == pytest.approx(100 * (16 / 2.75 - 1), rel=1e-12)
    # a ring of 2 row-blocks caps what is held at once; one team never holds less than one
    assert weight_reread_bytes(replace(w, rbs_at_once_max=2), 66) == pytest.approx(100 * 7, rel=1e-12)
    assert weight_reread_bytes(w, 8) == pytest.approx(100 * 15, rel=1e-12)
    # every row-block at once: one pass; more SMs never stream more
    assert weight_reread_bytes(w, 400) == 0
    s = np.arange(1, 133)
    assert np.all(np.diff(weight_reread_bytes(w, s)) <= 0)


# -- a standalone layernorm at half the resident warps ----------------------------------------------
def test_cached_row_vectors_follow_the_harness_row_tile():
    from kitsune_dse.cost.region import cached_row_vectors
    from kitsune_dse.validate.lower import row_cfg
    for cols in (8, 256, 1000, 1024, 1793, 2048, 3000, 4096, 8192, 16384, 20000, 40000):
        _, cached, vpl = row_cfg(cols)
        assert cached_row_vectors(cols) == (vpl if cached else 0), cols


@pytest.mark.parametrize("kind,cols,wide", [("layernorm", 4096, True), ("layernorm", 2048, True),
                                            ("layernorm", 1024, False), ("softmax", 4096, False),
                                            ("layernorm", 40000, False)])
def test_only_a_layernorm_that_caches_8_vectors_a_thread_runs_one_cta_per_sm(kind, cols, wide):
    sp = spec(standalone_norm_stream_share=0.5)
    (w,) = kernel_works(Region.of(chain_graph(1024, cols, (kind,))), [("op0",)], sp)
    assert (w.ctas_per_sm, w.stream_share) == ((1, 0.5) if wide else (2, 1.0))


def test_a_kernel_of_half_the_stream_share_streams_on_half_the_ceiling():
    # 2 x 64 MiB in 1056 tiles (8 full waves of one CTA on 132 SMs: no partial wave), no math:
    # the saturating HBM curve with its ceiling halved
    w = KernelWork("ln", "fp16", dram_read_bytes=64 * MiB, dram_write_bytes=64 * MiB, tiles=1056,
                   stream_share=0.5)
    assert kernel_time(w, H100, 132) == pytest.approx(128 * MiB / hbm_curve(132, peak=3.35e12 * 0.87 * 0.5),
                                                      rel=1e-9)
    # a GEMM, or a step of a persistent kernel, keeps its own ceiling
    assert kernel_time(replace(w, persistent=True), H100, 132) == \
        pytest.approx(kernel_time(replace(w, persistent=True, stream_share=1.0), H100, 132))


def test_a_standalone_gemm_combines_math_and_read_stream_by_their_p_norm_by_hand():
    """efficiency.gemm_read_overlap_exponent p: a standalone GEMM takes (compute^p + reads^p)^(1/p),
    at least its whole DRAM stream; stores do not enter the norm (they do not stall the loop)."""
    p = 2.0
    base = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(
        update={"gemm_read_overlap_exponent": p})})
    # 264 tiles: 2 per SM; 1 GB read, nothing written
    reader = KernelWork("r", "fp16", tensor_flops=264 * 2 * 128 * 128 * 1024, dram_read_bytes=1e9,
                        tiles=264, tile_shape=(128, 128))
    lat, parts = kernel_time(reader, base, 132, parts=True)
    bw = base.hbm_bandwidth_from(132, base.efficiency.gemm_hbm or base.efficiency.hbm)
    assert parts["read_s"] == pytest.approx(1e9 / bw, rel=1e-12)
    compute = parts["compute_s"]
    assert lat == pytest.approx(math.hypot(compute, 1e9 / bw) + parts["ramp_s"], rel=1e-9)
    assert lat > kernel_time(reader, H100, 132)         # the old max hides the smaller whole
    # the same bytes written: the norm sees no reads, the stream is the floor
    writer = replace(reader, dram_read_bytes=0.0, dram_write_bytes=1e9)
    lat_w, parts_w = kernel_time(writer, base, 132, parts=True)
    assert lat_w == pytest.approx(max(parts_w["compute_s"], parts_w["dram_s"]) + parts_w["ramp_s"], rel=1e-9)
    # array and scalar paths agree
    assert kernel_time(reader, base, np.array([132.0, 66.0]))[0] == pytest.approx(lat, rel=1e-12)
    assert kernel_time(reader, base, np.array([132.0, 66.0]))[1] == pytest.approx(
        kernel_time(reader, base, 66), rel=1e-12)
    # persistent steps keep their own overlap rule
    step = replace(reader, persistent=True, ctas_per_sm=2)
    assert kernel_time(step, base, 132) == pytest.approx(kernel_time(step, H100, 132), rel=1e-12)


def test_a_gemm_main_loop_pays_whole_k_slabs_by_hand():
    """spec.gemm_k_tile: K = 280 runs five slabs of 64 (the math of K = 320); K = 256 four."""
    slab = H100.model_copy(update={"gemm_k_tile": 64})
    def gemm(k):
        return KernelWork("g", "fp16", tensor_flops=2 * 4096 * 128 * k, tiles=32, tile_shape=(128, 128),
                          gemm_n=128, gemm_k=k)
    for k, padded in ((280, 320), (256, 256), (65, 128)):
        c = kernel_time(gemm(k), slab, 132, parts=True)[1]["compute_s"]
        c0 = kernel_time(gemm(k), H100, 132, parts=True)[1]["compute_s"]
        assert c == pytest.approx(c0 * padded / k, rel=1e-12)
    # split along K: each range in whole slabs (ceil(280 / 2) = 140 -> 192)
    split = replace(gemm(280), split_k=2)
    c = kernel_time(split, slab, 132, parts=True)[1]["compute_s"]
    c0 = kernel_time(split, H100, 132, parts=True)[1]["compute_s"]
    assert c == pytest.approx(c0 * 192 / 140, rel=1e-12)


def test_a_persistent_gemm_streaming_its_a_operand_is_floored_by_the_a_stream_by_hand():
    """The A operand read from DRAM slab by slab streams at its own share of the step's ceiling:
    the step cannot end before those bytes are in, plus the stream's fill (pro rata of the
    record's part of the stream). Below the floor the step keeps its own time."""
    sp = H100.model_copy(update={
        "gemm_tile_fixed_s": 1e-6, "persistent_gemm_sm_stream_Bps": 200e9, "persistent_a_stream_fill_s": 4e-6,
        "efficiency": H100.efficiency.model_copy(update={"mem_compute_overlap": 0.7, "persistent_gemm_hbm": 0.9,
                                                         "persistent_a_stream_share": 0.5})})
    p = H100.efficiency.hbm_saturation_exponent
    a = 134e6
    step = KernelWork("pv", "fp16", tensor_flops=2 * 65536 * 128 * 1024, dram_read_bytes=a + 0.26e6,
                      tiles=512, ctas_per_sm=2, tile_shape=(128, 128), persistent=True, gemm_k=1024,
                      gemm_n=128, a_stream_bytes=a)
    bw_a = ((132 * 200e9) ** -p + (0.9 * 0.5 * H100.hbm_bandwidth_Bps) ** -p) ** (-1 / p)
    floor = a / bw_a + 4e-6
    plain = replace(step, a_stream_bytes=0.0)
    assert kernel_time(plain, sp, 132) < floor           # the floor binds here ...
    assert kernel_time(step, sp, 132) == pytest.approx(floor, rel=1e-12)
    assert kernel_time(step, sp, np.array([132.0]))[0] == pytest.approx(floor, rel=1e-12)
    # ... not where the math is the longer (the same A under 16x the math)
    heavy = replace(step, tensor_flops=16 * step.tensor_flops)
    assert kernel_time(heavy, sp, 132) == pytest.approx(kernel_time(replace(heavy, a_stream_bytes=0.0), sp, 132))
    # a quarter of the stream (one unit of four): a quarter of the bytes and of the fill
    part = step.scaled(0.25, tiles=128)
    assert part.a_stream_bytes == pytest.approx(a / 4) and part.a_stream_part == pytest.approx(0.25)
    assert kernel_time(part, sp, 132) >= a / 4 / bw_a + 1e-6 - 1e-15
    # no share, no floor
    off = sp.model_copy(update={"efficiency": sp.efficiency.model_copy(update={"persistent_a_stream_share": 0.0})})
    assert kernel_time(step, off, 132) == pytest.approx(kernel_time(plain, sp, 132))


def test_a_one_stage_gemm_streams_its_a_from_dram_and_its_weights_are_not_counted_there():
    from kitsune_dse.calibrate.fit import persistent_gemm_time
    from kitsune_dse.cost.pipeline import PipelineChoice, plan_stages, stage_works
    from kitsune_dse.validate.microbench import case_model
    g, _ = case_model("matmul", "fp16", (65536, 128, 1024))
    region = Region.of(g)
    plan = plan_stages(region, H100, PipelineChoice((("mm",),), (132,), 128))
    works, _ = stage_works(region, H100, plan)
    (w,), = works
    assert w.a_stream_bytes * plan.row_blocks / w.inflight == pytest.approx(65536 * 1024 * 2)
    sp = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(
        update={"persistent_a_stream_share": 0.3})})
    # the floor slows this A-streaming step; a GEMM whose A is reused from L2 barely
    assert persistent_gemm_time(sp, 65536, 128, 1024, 132) > 1.2 * persistent_gemm_time(H100, 65536, 128, 1024, 132)
    assert persistent_gemm_time(sp, 4096, 4096, 4096, 132) == pytest.approx(
        persistent_gemm_time(H100, 4096, 4096, 4096, 132))
