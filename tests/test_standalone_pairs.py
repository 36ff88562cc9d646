"""A standalone GEMM grid of paired CTAs (two a SM, the harness's 128-wide tile): a CTA alone
on its SM runs at standalone_lone_share of its rate, and the last round ends with the pair's
slower CTA (gemm_tail_tiles), both math that a stream-bound grid hides (roofline.busiest_sm_time,
_tail_s, tail_share), fitted with the GEMM's rate (fit.fit_standalone_gemm, pairs=True)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kitsune_dse.calibrate.fit import fit_standalone_gemm, standalone_gemm_time
from kitsune_dse.cost.region import Region, kernel_works
from kitsune_dse.cost.roofline import KernelWork, busiest_sm_time, kernel_time, tail_share
from kitsune_dse.graph.yaml_model import model_from_dict
from kitsune_dse.hw import load_spec

CAL = load_spec("h100-sxm.calibrated")
# compute bound: no DRAM bytes, so the last round is all math
MATH = KernelWork("mm", "fp16", tensor_flops=2.0 * 4096 ** 3, tiles=1376, tile_shape=(128, 128),
                  gemm_n=4096, gemm_k=4096, paired_ctas=True)


def _spec(lone=0.75, tail=0.2):
    return CAL.model_copy(update={"standalone_lone_share": lone, "gemm_tail_tiles": tail})


def test_the_busiest_sm_by_hand():
    sp = _spec(lone=0.8)
    # 1376 tiles on 132 SMs: 11 on the busiest, five pairs and a last CTA alone at 0.8 of the SM
    assert busiest_sm_time(MATH, sp, 132) == pytest.approx(10 + 1 / 0.8)
    # 1024: eight, four whole pairs
    assert busiest_sm_time(replace(MATH, tiles=1024), sp, 132) == pytest.approx(8.0)
    # 64 tiles: every CTA alone on its SM
    assert busiest_sm_time(replace(MATH, tiles=64), sp, 132) == pytest.approx(1 / 0.8)
    # a grid of one CTA per SM (a dual-B GEMM) keeps whole tiles
    assert busiest_sm_time(replace(MATH, paired_ctas=False), sp, 132) == pytest.approx(11.0)


def test_the_last_round_by_hand():
    sp0, sp = _spec(lone=1.0, tail=0.0), _spec(lone=1.0, tail=0.2)
    _, parts = kernel_time(MATH, sp0, 132, parts=True)
    per_tile = parts["compute_s"] / 11
    # all math: the tail adds 0.2 tile times to the busiest SM
    assert kernel_time(MATH, sp, 132) - kernel_time(MATH, sp0, 132) == pytest.approx(0.2 * per_tile, rel=1e-9)
    assert kernel_time(MATH, sp, 132, parts=True)[1]["tail_s"] == pytest.approx(0.2 * per_tile, rel=1e-9)
    # no SM runs two CTAs: no last round
    one = replace(MATH, tiles=100)
    assert kernel_time(one, sp, 132) == kernel_time(one, sp0, 132)


def test_a_stream_bound_grid_hides_its_last_round():
    assert tail_share(1.0, 0.0) == 1.0
    assert tail_share(1.0, 3.0) == pytest.approx(0.25)
    streamed = replace(MATH, dram_read_bytes=20e9)
    sp0, sp = _spec(lone=1.0, tail=0.0), _spec(lone=1.0, tail=0.2)
    _, p = kernel_time(streamed, sp0, 132, parts=True)
    added = kernel_time(streamed, sp, 132, parts=True)[1]["tail_s"]
    stream = p["read_s"] or p["dram_s"]
    assert added == pytest.approx(0.2 * p["compute_s"] / 11 * p["compute_s"] / (p["compute_s"] + stream), rel=1e-6)


def test_scalar_and_array_paths_agree():
    import numpy as np
    sp = _spec()
    for w in (MATH, replace(MATH, dram_read_bytes=2e9), replace(MATH, tiles=200)):
        axis = np.arange(1, 133)
        np.testing.assert_allclose(kernel_time(w, sp, axis), [kernel_time(w, sp, int(s)) for s in axis], rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(lone=st.floats(0.5, 1.0), dl=st.floats(0.0, 0.5), tail=st.floats(0.0, 1.0), dt=st.floats(0.0, 1.0),
       tiles=st.integers(1, 5000), dram=st.floats(0.0, 5e9))
def test_a_slower_lone_cta_or_a_longer_tail_never_speeds_a_grid(lone, dl, tail, dt, tiles, dram):
    w = replace(MATH, tiles=tiles, dram_read_bytes=dram)
    t = kernel_time(w, _spec(lone, tail), 132)
    assert kernel_time(w, _spec(max(0.5, lone - dl), tail), 132) >= t * (1 - 1e-12)
    assert kernel_time(w, _spec(lone, tail + dt), 132) >= t * (1 - 1e-12)


def test_only_a_one_gemm_group_of_128_wide_tiles_pairs():
    d = {"name": "pair", "dtype": "fp16", "inputs": {"a": [4096, 4096]},
         "weights": {"b": [4096, 4096], "c": [4096, 4096]},
         "ops": [{"name": "g", "kind": "matmul", "inputs": ["a", "b"], "outputs": ["x"]},
                 {"name": "u", "kind": "matmul", "inputs": ["a", "c"], "outputs": ["y"]},
                 {"name": "m", "kind": "mul", "inputs": ["x", "y"], "outputs": ["z"]}]}
    g = model_from_dict(d, "<test>")
    one, = kernel_works(Region.of(g), [("g",)], CAL)
    assert one.paired_ctas == (one.tile_shape[1] == 128)
    dual, = kernel_works(Region.of(g), [("g", "u", "m")], CAL)
    assert not dual.paired_ctas


def test_fit_recovers_the_pairs_from_the_calibration_shapes():
    truth = _spec(lone=0.75, tail=0.25)
    shapes = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (2048, 11008, 4096),
              (2048, 1024, 1024), (16384, 3072, 768), (16384, 768, 3072), (65536, 512, 512),
              (2048, 6144, 12288), (64, 49152, 12288), (2048, 256, 512), (131072, 128, 512)]
    rows = [{"m": m, "n": n, "k": k, "time_s": standalone_gemm_time(truth, m, n, k)} for m, n, k in shapes]
    fit = fit_standalone_gemm(_spec(lone=1.0, tail=0.0), rows, read_overlap=True, pairs=True)
    assert fit["lone_share"] == pytest.approx(0.75, abs=0.02)
    assert fit["tail_tiles"] == pytest.approx(0.25, abs=0.03)
    assert fit["rms_rel_error"] < 2e-3
    # without pairs (cuBLAS's kernels) the spec's own stay
    plain = fit_standalone_gemm(_spec(lone=1.0, tail=0.0), rows, read_overlap=True)
    assert plain["lone_share"] == 1.0 and plain["tail_tiles"] == 0.0


def test_the_calibrated_spec_carries_the_traces_figures():
    # CTA traces (results/validation/h100/clock_probe/cta_trace_2026-11-24): a lone CTA keeps
    # 0.64-0.80 of its SM; the span is whole rounds plus 0.13-0.26 tile times
    assert 0.64 <= CAL.standalone_lone_share <= 0.85
    assert 0.1 <= CAL.gemm_tail_tiles <= 0.3
    assert math.isclose(load_spec("h100-sxm-cublas.calibrated").standalone_lone_share, 1.0)
