"""The session-9 pieces: a region boundary's hidden launch measured directly, a GEMM epilogue's
special functions priced per runtime (standalone kernels hide part of them), and the
one-parameter fits on increments over a reference case, each against a hand-computed value
or a synthetic truth."""
from __future__ import annotations

import pytest

from kitsune_dse.calibrate.fit import (EPILOGUE_REFS, fit_region_boundaries,
                                       fit_standalone_transcendental, fit_transcendental, fused_time,
                                       one_stage_time)
from kitsune_dse.cost.estimate import Estimate
from kitsune_dse.cost.region import Region, compose_sequential
from kitsune_dse.cost.roofline import simt_flops
from kitsune_dse.cost.strategies import fusion
from kitsune_dse.hw import load_spec
from kitsune_dse.validate.microbench import case_model

CAL = load_spec("h100-sxm.calibrated")


# -- region boundaries ---------------------------------------------------------------------------

def test_a_measured_boundary_replaces_latency_less_gap():
    sp = CAL.model_copy(update={"launch_latency_s": 3.0e-6, "region_gap_s": 1.0e-6,
                                "region_boundary_hidden_s": None})
    assert sp.region_overlap_s == pytest.approx(2.0e-6)
    assert sp.model_copy(update={"region_boundary_hidden_s": 0.4e-6}).region_overlap_s == pytest.approx(0.4e-6)


def test_three_regions_hide_the_measured_boundary_twice():
    sp = CAL.model_copy(update={"region_boundary_hidden_s": 0.5e-6})
    g, _ = case_model("ewchain", "fp16", (128, 1024, 3))
    parts = [((f"r{i}",), Estimate(latency_s=10e-6, dram_read_bytes=1.0, dram_write_bytes=2.0))
             for i in range(3)]
    est = compose_sequential(g, sp, parts)
    assert est.latency_s == pytest.approx(30e-6 - 2 * 0.5e-6)
    assert est.dram_bytes == pytest.approx(9.0)


def test_fit_region_boundaries_takes_the_median_of_a_plus_b_less_ab():
    rows = [{"label": "graph->pipe", "a_s": 10e-6, "b_s": 7e-6, "ab_s": 16e-6},      # 1.0 hidden
            {"label": "graph->graph", "a_s": 10e-6, "b_s": 10e-6, "ab_s": 19.7e-6},  # 0.3
            {"label": "pipe->pipe", "a_s": 7e-6, "b_s": 7e-6, "ab_s": 13.5e-6},      # 0.5
            {"label": "pipe->graph", "a_s": 7e-6, "b_s": 10e-6, "ab_s": 1e-6, "correct": False}]
    fit = fit_region_boundaries(rows)
    assert fit["region_boundary_hidden_s"] == pytest.approx(0.5e-6)
    assert fit["points"] == 3
    assert fit["median_by_kind_s"]["graph->pipe"] == pytest.approx(1.0e-6)
    with pytest.raises(ValueError):
        fit_region_boundaries([])


# -- epilogue special functions per runtime ---------------------------------------------------------

def test_a_standalone_gemm_epilogue_uses_its_own_price_a_persistent_one_the_other():
    g, _ = case_model("mmgelu", "fp16", (256, 512, 64))
    act = g.op("act").info
    sp = CAL.model_copy(update={"transcendental_flops": 60.0, "standalone_transcendental_flops": 20.0})
    n = 256 * 512
    assert simt_flops([act], sp) == act.flops + 60.0 * n
    assert simt_flops([act], sp, standalone_epilogue=True) == act.flops + 20.0 * n
    unset = sp.model_copy(update={"standalone_transcendental_flops": None})
    assert simt_flops([act], unset, standalone_epilogue=True) == act.flops + 60.0 * n


def test_the_standalone_price_moves_fused_kernels_only():
    dims = (16384, 3072, 768)
    lo = CAL.model_copy(update={"standalone_transcendental_flops": 10.0})
    hi = CAL.model_copy(update={"standalone_transcendental_flops": 90.0})
    assert fused_time(hi, "mmgelu", dims) > fused_time(lo, "mmgelu", dims)
    # a ReLU has no special function; the persistent kernel keeps transcendental_flops
    assert fused_time(hi, "mmrelu", dims) == pytest.approx(fused_time(lo, "mmrelu", dims))
    assert one_stage_time(hi, "mmgelu", dims, 132) == pytest.approx(one_stage_time(lo, "mmgelu", dims, 132))
    # compute bound: the price difference over the busiest SM's tiles at the SIMT rate
    # (the SM's two CTAs share it: its whole tile work, its whole special-function work)
    per_sm = 16384 * 3072 / 132 * 80.0 / CAL.simt_rate_per_sm("fp32")   # fp16 data, fp32 math
    assert fused_time(hi, "mmgelu", dims) - fused_time(lo, "mmgelu", dims) == pytest.approx(per_sm, rel=0.15)


def _truth_rows(truth, cases, time_of, base_error_s=0.0):
    """Measured rows of a synthetic truth; every GEMM, reference or not, off by the same base
    error (the GEMM fit's own residual, which an increment cancels)."""
    return [{"kind": k, "dims": d, "sms": 132, "time_s": time_of(truth, k, d) + base_error_s} for k, d in cases]


def test_fit_on_increments_cancels_the_base_gemms_error():
    truth = CAL.model_copy(update={"transcendental_flops": 60.0})
    cases = [(k, d) for d in ((16384, 3072, 768), (16384, 1024, 256)) for k in ("mmgelu", "mmrelu")]
    rows = _truth_rows(truth, cases, lambda sp, k, d: one_stage_time(sp, k, d, 132), base_error_s=15e-6)
    fit = fit_transcendental(CAL.model_copy(update={"transcendental_flops": 0.0}), rows)
    assert fit["transcendental_flops"] == pytest.approx(60.0, rel=0.03)
    assert fit["points"] == 2 and all("over mmrelu" in k for k in fit["rel_error_by_case"])
    # without the references the same rows pull the price up to cover the 15 us
    alone = fit_transcendental(CAL.model_copy(update={"transcendental_flops": 0.0}),
                               [r for r in rows if r["kind"] == "mmgelu"])
    assert alone["transcendental_flops"] > 70.0


def test_fit_standalone_transcendental_recovers_the_truth():
    truth = CAL.model_copy(update={"standalone_transcendental_flops": 40.0})
    cases = [(k, d) for d in ((16384, 3072, 768), (16384, 1024, 256))
             for k in ("mmgelu", "mmrelu", "mmbiasgelu", "mmbias")]
    rows = [{"kind": k, "dims": list(d), "fused_s": fused_time(truth, k, d) + 5e-6, "fused_correct": True,
             "persistent_s": 1.0} for k, d in cases]
    fit = fit_standalone_transcendental(CAL.model_copy(update={"standalone_transcendental_flops": 5.0}), rows)
    assert fit["standalone_transcendental_flops"] == pytest.approx(40.0, rel=0.03)
    assert fit["points"] == 4
    assert set(EPILOGUE_REFS) >= {"mmgelu", "mmbiasgelu"}


def test_the_bias_gelu_case_is_one_fused_kernel_in_the_model():
    g, _ = case_model("mmbiasgelu", "fp16", (2048, 1024, 512))
    est = fusion(Region.of(g), CAL)
    assert est.kernel_launches == 1
    assert g.op("act").info.transcendentals == 2048 * 1024


# -- the cublas baseline's library calls ------------------------------------------------------------

def test_an_eager_library_gemm_costs_its_call_on_the_host():
    from kitsune_dse.cost.strategies import LaunchChoice, kernel_ends, library_bsp
    # three kernels of 1 us each, issued 5, 20 and 5 us apart: the host is the bottleneck
    sp = CAL.model_copy(update={"launch_overhead_s": 5e-6, "kernel_gap_s": 1e-6, "launch_first_s": None,
                                "library_call_first_s": None})
    ends = kernel_ends([1e-6] * 3, sp, [5e-6, 20e-6, 5e-6])
    assert ends == pytest.approx([6e-6, 26e-6, 31e-6])
    assert kernel_ends([1e-6] * 3, sp) == pytest.approx([6e-6, 11e-6, 16e-6])
    # dlrm's top MLP: five GEMMs (cuBLAS calls) and ten of this tool's kernels (bias, activation):
    # it cannot end before the host has issued all fifteen, and a GEMM call's extra host time
    # costs at most itself (some of it hides behind kernels still running)
    g = load_model_dlrm()
    eager = LaunchChoice("eager")
    base = library_bsp(Region.of(g), sp.model_copy(update={"library_call_s": None}), eager)
    slow = library_bsp(Region.of(g), sp.model_copy(update={"library_call_s": 25e-6}), eager)
    assert base.kernel_launches == 15
    assert slow.latency_s > 5 * 25e-6 + 10 * 5e-6
    assert base.latency_s < slow.latency_s <= base.latency_s + 5 * 20e-6 + 1e-12
    # host bound, the first call's extra host time (right after a wait on the GPU) adds itself
    first = library_bsp(Region.of(g), sp.model_copy(update={"library_call_s": 25e-6,
                                                            "library_call_first_s": 40e-6}), eager)
    assert first.latency_s == pytest.approx(slow.latency_s + 15e-6)


def load_model_dlrm():
    from kitsune_dse.graph import load_model
    return load_model("dlrm-top-mlp")
