"""A standalone GEMM grid's operand reads when its waves drift apart (cost.gemm_l2), by hand,
and the two fits that calibrate them on ncu's bytes (calibrate.fit_dram)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_graphs import H100, MiB, examples, gemm_graph
from kitsune_dse.calibrate.fit_dram import (fit_grid_reuse, fit_library_read_grid, harness_grid_reads,
                                            library_reads)
from kitsune_dse.cost.gemm_l2 import LOCKSTEP, WAVE_CTAS, grid_reads, operand_reads


def reuse(center=1.0, half=0.0, drift=0.0, drift_exp=2.0, desync_exp=0.5, sharers=16.0):
    return (center, half, drift, drift_exp, desync_exp, sharers)


def test_a_ramp_around_the_threshold_by_hand():
    # 2048 x 8192 x 4096 in waves of 64 CTAs: 8 row-blocks x 8 column tiles of 1 MiB operand
    # blocks per wave (16 MiB) and 2 MiB of output. A group's row-blocks come back one wave
    # (18 MiB) later, its columns one group (8 waves, 144 MiB) later.
    # Threshold 20 MiB, half-width 0.25 x 20 = 5 MiB (no desync): a row-block misses with
    # 0.5 + (18 - 20) / 10 = 0.3; a column always. Per group 8 cold row-blocks, then 7 waves of
    # 8 x 0.3.
    a, b = grid_reads(2048, 8192, 4096, 128, 128, 2, 64, 20 * MiB, reuse=reuse(half=0.25, desync_exp=0.0))
    assert a == pytest.approx(2 * (8 + 7 * 8 * 0.3) * MiB)
    assert b == pytest.approx(128 * MiB)
    # a step at the threshold (half-width 0) is the lockstep model
    assert grid_reads(2048, 8192, 4096, 128, 128, 2, 64, 20 * MiB, reuse=reuse()) == (16 * MiB, 128 * MiB)


def test_the_ramp_is_at_most_one_wave_wide():
    # half-width 8 x 20 MiB capped at the wave's 16 MiB of operands: 0.5 + (18 - 20) / 32
    a, _ = grid_reads(2048, 8192, 4096, 128, 128, 2, 64, 20 * MiB, reuse=reuse(half=8.0, desync_exp=0.0))
    assert a == pytest.approx(2 * (8 + 7 * 8 * (0.5 - 2 / 32)) * MiB)


def test_drift_inside_one_wave_by_hand():
    # 256 x 1024 x 4096: one wave of 16 CTAs, 2 row-blocks each used by 8 CTAs, 8 column tiles
    # each used by 2; 1 MiB per block, 10 MiB of operands over a 20 MiB budget. Drift 0.1 with
    # exponent 1: q = 0.1 x 0.5 = 0.05 of each further use, at most 4 further uses a tile.
    a, b = grid_reads(256, 1024, 4096, 128, 128, 2, 264, 20 * MiB,
                      reuse=reuse(drift=0.1, drift_exp=1.0, sharers=4.0))
    assert a == pytest.approx((2 + 0.05 * 4 * 2) * MiB)
    assert b == pytest.approx((8 + 0.05 * 1 * 8) * MiB)
    # the drift grows with the wave index: ((w + 1) ** 0.5) in the second wave of 8 CTAs
    a2, _ = grid_reads(256, 1024, 4096, 128, 128, 2, 8, 1024 * MiB,
                       reuse=reuse(drift=0.1, drift_exp=0.0, sharers=100.0, desync_exp=0.5))
    # waves: rows {0,1} x cols 0-3, then rows {0,1} x cols 4-7: each row used by 4 CTAs a wave
    assert a2 == pytest.approx((2 + 0.1 * 3 * 2 + 0.1 * math.sqrt(2) * 3 * 2) * MiB)


@settings(max_examples=examples(60), deadline=None)
@given(m=st.integers(64, 8192), n=st.integers(128, 8192), k=st.sampled_from([512, 2048, 8192]),
       ctas=st.sampled_from([16, 132, 264]), center=st.floats(0.5, 2.0), half=st.floats(0.0, 2.0),
       drift=st.floats(0.0, 0.01), drift_exp=st.floats(0.0, 3.0), desync=st.floats(0.0, 1.0),
       sharers=st.floats(1.0, 64.0))
def test_more_l2_never_reads_more_and_never_below_the_operands(m, n, k, ctas, center, half, drift,
                                                                drift_exp, desync, sharers):
    ru = reuse(center, half, drift, drift_exp, desync, sharers)
    small = sum(grid_reads(m, n, k, 128, 128, 2, ctas, 8 * MiB, reuse=ru))
    big = sum(grid_reads(m, n, k, 128, 128, 2, ctas, 32 * MiB, reuse=ru))
    assert big <= small * (1 + 1e-12)
    assert big >= (m * k + k * n) * 2 * (1 - 1e-12)


def test_a_library_reads_with_its_own_grid():
    lib = H100.model_copy(update={"gemm_read_grids": [(2048, 128, 256, 132), (2 ** 31 - 1, 256, 128, 132)]})
    assert operand_reads(lib, 4096, 4096, 8192, (64, 64), 2) == \
        grid_reads(4096, 4096, 8192, 256, 128, 2, 132, H100.l2_usable_bytes, reuse=LOCKSTEP)
    # up to 2048 rows the first grid
    assert operand_reads(lib, 2048, 4096, 8192, (64, 64), 2) == \
        grid_reads(2048, 4096, 8192, 128, 256, 2, 132, H100.l2_usable_bytes, reuse=LOCKSTEP)
    # without one: the priced tile, WAVE_CTAS a wave
    assert operand_reads(H100, 4096, 4096, 8192, (64, 64), 2) == \
        grid_reads(4096, 4096, 8192, 64, 64, 2, WAVE_CTAS, H100.l2_usable_bytes, reuse=LOCKSTEP)


SHAPES = [(2048, 4096, 4096), (4096, 4096, 8192), (4096, 4096, 2048), (1024, 8192, 8192),
          (8192, 2048, 4096), (64, 16384, 4096), (8192, 256, 4096), (2048, 8192, 16384)]


def test_fit_grid_reuse_recovers_the_reads_it_was_made_from():
    truth = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={
        "grid_reuse_center": 1.1, "grid_reuse_halfwidth": 0.5, "grid_drift_miss": 0.002,
        "grid_drift_exponent": 1.5, "grid_desync_exponent": 0.5, "grid_drift_sharers": 12.0})})
    rows = [{"m": m, "n": n, "k": k, "read_bytes": harness_grid_reads(truth, m, n, k)} for m, n, k in SHAPES]
    f = fit_grid_reuse(H100, rows)
    assert f["rms_log_error"] < 0.01 < f["rms_log_error_before"]
    fitted = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(
        update={k: f[k] for k in ("grid_reuse_center", "grid_reuse_halfwidth", "grid_drift_miss",
                                  "grid_drift_exponent", "grid_desync_exponent", "grid_drift_sharers")})})
    for r in rows:
        assert harness_grid_reads(fitted, r["m"], r["n"], r["k"]) == pytest.approx(r["read_bytes"], rel=0.03)


def test_fit_library_read_grid_finds_the_grids_it_was_made_from():
    truth = H100.model_copy(update={"gemm_read_grids": [(2048, 128, 256, 132), (2 ** 31 - 1, 256, 128, 132)]})
    probes = [{"name": f"{m}x{n}x{k}", "graph": gemm_graph(m, n, k), "ops": ["mm"],
               "read_bytes": library_reads(truth, gemm_graph(m, n, k), ["mm"])} for m, n, k in SHAPES]
    f = fit_library_read_grid(H100, probes)
    assert f["gemm_read_grids"] == [[2048, 128, 256, 132], [2 ** 31 - 1, 256, 128, 132]]
    assert f["rms_log_error"] < 1e-9 < f["rms_log_error_before"]
