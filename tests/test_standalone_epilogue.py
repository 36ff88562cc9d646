"""A residual read in a standalone GEMM kernel's epilogue: the CTA's wait after its main loop,
of which its SM loses the share its other CTA cannot cover (roofline._standalone_epilogue_s),
priced through the fused kernel, the tilesync region and the fit that calibrates it."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kitsune_dse.calibrate.fit import fit_standalone_epilogue_input, fused_time
from kitsune_dse.cost.region import Region, epilogue_inputs, kernel_works
from kitsune_dse.cost.roofline import KernelWork, _kernel_time_scalar, _standalone_epilogue_s, kernel_time
from kitsune_dse.cost.strategies import tilesync
from kitsune_dse.graph.yaml_model import model_from_dict
from kitsune_dse.hw import load_spec
from kitsune_dse.validate.microbench import case_model

CAL = load_spec("h100-sxm.calibrated")
GEMM = KernelWork("mm+res", "fp16", tensor_flops=2.0 * 4096 ** 3, dram_read_bytes=96e6,
                  dram_write_bytes=32e6, tiles=1024, tile_shape=(128, 128), gemm_n=4096, gemm_k=4096,
                  epilogue_inputs=1)


def _spec(wait_s, lone):
    return CAL.model_copy(update={"standalone_epilogue_input_s": wait_s, "standalone_lone_share": lone})


def test_the_wait_by_hand():
    # a tile of 10 us on its SM (20 us for a CTA beside another): a 3 us wait loses 0.3 of it
    # to the lone CTA's slower rate and 3 / 20 of it to the other CTA waiting too
    sp = _spec(3e-6, 0.7)
    assert _standalone_epilogue_s(GEMM, sp, 10e-6) == pytest.approx(3e-6 * (0.3 + 3 / 20))
    # a 128 x 64 tile waits half as long per input (per 128 x 128 of area); two inputs twice
    half = replace(GEMM, tile_shape=(128, 64))
    assert _standalone_epilogue_s(half, sp, 10e-6) == pytest.approx(1.5e-6 * (0.3 + 3 / 20))
    assert _standalone_epilogue_s(replace(GEMM, epilogue_inputs=2), sp, 10e-6) == \
        pytest.approx(2 * 3e-6 * (0.3 + 3 / 20))
    # a tile shorter than the wait: both CTAs wait the whole of it
    assert _standalone_epilogue_s(GEMM, sp, 1e-6) == pytest.approx(3e-6 * (0.3 + 1.0))


def test_the_kernel_pays_it_once_per_tile_of_its_busiest_sm():
    sp0, sp = _spec(0.0, 0.7), _spec(3e-6, 0.7)
    _, parts = kernel_time(GEMM, sp, 132, parts=True)
    busiest = math.ceil(1024 / 132)
    tile_s = parts["compute_s"] / busiest
    added = kernel_time(GEMM, sp, 132) - kernel_time(GEMM, sp0, 132)
    assert added == pytest.approx(busiest * 3e-6 * (0.3 + 3e-6 / (2 * tile_s)), rel=1e-9)
    assert parts["epilogue_s"] == pytest.approx(added, rel=1e-9)
    # none without an epilogue input, and none in a kernel that is no GEMM
    assert kernel_time(replace(GEMM, epilogue_inputs=0), sp, 132) == kernel_time(replace(GEMM, epilogue_inputs=0),
                                                                                  sp0, 132)
    ew = KernelWork("add", "fp16", dram_read_bytes=64e6, dram_write_bytes=32e6, tiles=4096, epilogue_inputs=1)
    assert kernel_time(ew, sp, 132) == kernel_time(ew, sp0, 132)


def test_scalar_and_array_paths_agree_with_the_wait():
    sp = _spec(3e-6, 0.7)
    axis = np.arange(1, 133)
    np.testing.assert_allclose(kernel_time(GEMM, sp, axis), [_kernel_time_scalar(GEMM, sp, float(s)) for s in axis],
                               rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(wait=st.floats(0.0, 10e-6), lone=st.floats(0.5, 1.0), dl=st.floats(0.0, 0.5), dw=st.floats(0.0, 5e-6))
def test_a_longer_wait_or_a_slower_lone_cta_never_speeds_the_kernel(wait, lone, dl, dw):
    t = kernel_time(GEMM, _spec(wait, lone), 132)
    assert kernel_time(GEMM, _spec(wait + dw, lone), 132) >= t - 1e-15
    assert kernel_time(GEMM, _spec(wait, max(0.5, lone - dl)), 132) >= t - 1e-15


def test_only_the_inputs_after_the_gemm_count():
    g, _ = case_model("mmadd", "fp16", (4096, 4096, 4096))
    (w,) = kernel_works(Region.of(g), [("mm", "res")], CAL)
    assert w.epilogue_inputs == 1
    (plain,) = kernel_works(Region.of(g), [("mm",)], CAL)
    assert plain.epilogue_inputs == 0
    # a prologue's input (an element-wise op on the GEMM's A, [m, k] with k >= n) is none
    d = {"name": "pro", "dtype": "fp16", "inputs": {"a": [4096, 8192], "r": [4096, 4096]},
         "weights": {"b": [8192, 4096]},
         "ops": [{"name": "act", "kind": "relu", "inputs": ["a"], "outputs": ["ar"]},
                 {"name": "mm", "kind": "matmul", "inputs": ["ar", "b"], "outputs": ["c"]},
                 {"name": "res", "kind": "add", "inputs": ["c", "r"], "outputs": ["out"]}]}
    pro = model_from_dict(d, "<test>")
    assert epilogue_inputs(pro, ("act", "mm", "res"), pro.op("mm").info.gemm)[0] == 2
    (w,) = kernel_works(Region.of(pro), [("act", "mm", "res")], CAL)
    assert w.epilogue_inputs == 1


def test_a_tilesync_chain_prices_the_wait_of_its_streaming_producer_too():
    g, _ = case_model("mmadd", "fp16", (4096, 4096, 4096))
    region = Region.of(g)
    t0 = tilesync(region, _spec(0.0, 0.7)).latency_s
    t1 = tilesync(region, _spec(3e-6, 0.7)).latency_s
    assert t1 > t0


def test_fit_recovers_the_truth_from_increments():
    truth = _spec(2.5e-6, 0.75)
    rows = []
    for dims in [(16384, 3072, 768), (16384, 1024, 256), (16384, 768, 3072)]:
        rows.append({"kind": "matmul", "dims": list(dims), "fused_s": fused_time(truth, "matmul", dims)})
        rows.append({"kind": "mmadd", "dims": list(dims), "fused_s": fused_time(truth, "mmadd", dims)})
    # the lone share is the GEMM fit's: the wait alone is fitted
    fit = fit_standalone_epilogue_input(_spec(0.0, 0.75), rows)
    assert fit["standalone_epilogue_input_s"] == pytest.approx(2.5e-6, rel=0.02)
    assert fit["standalone_lone_share"] == 0.75
    assert fit["rms_rel_error"] < 1e-4


def test_fit_refuses_without_references():
    with pytest.raises(ValueError, match="no fused GEMM"):
        fit_standalone_epilogue_input(CAL, [{"kind": "mmadd", "dims": [4096, 4096, 4096], "fused_s": 1e-3}])


def test_the_calibrated_spec_prices_the_measured_increments():
    # bench/epilogue_probe.py's fused kernels, medians of the calibration runs (us): the GEMM +
    # add over the GEMM alone, 16384 x 3072 x 768: +33.5, 16384 x 1024 x 256: +17.3,
    # 16384 x 768 x 3072: +6.0 (the p-norm of the DRAM stream alone gave 2.7, 2.3, 1.2)
    for dims, inc in [((16384, 3072, 768), 33.5e-6), ((16384, 1024, 256), 17.3e-6), ((16384, 768, 3072), 6.0e-6)]:
        got = fused_time(CAL, "mmadd", dims) - fused_time(CAL, "matmul", dims)
        assert got == pytest.approx(inc, rel=0.25), dims
