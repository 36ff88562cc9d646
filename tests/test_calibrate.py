"""calibrate's fitting half (no GPU): recovers known parameters, writes a loadable spec."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kitsune_dse.calibrate.fit import calibrated_spec, fit_saturating, saturating
from kitsune_dse.hw import load_spec
from kitsune_dse.hw.spec import spec_from_dict

SMS = [1, 2, 4, 8, 16, 24, 33, 48, 66, 99, 132]


@settings(max_examples=25, deadline=None)
@given(per_sm=st.floats(10e9, 100e9), bmax=st.floats(1e12, 8e12), p=st.floats(1.5, 6.0))
def test_fit_recovers_the_curve_it_was_made_from(per_sm, bmax, p):
    pts = [(s, float(saturating(s, per_sm, bmax, p))) for s in SMS]
    f = fit_saturating(pts)
    assert f["rms_rel_error"] < 1e-3
    assert f["per_sm_Bps"] == pytest.approx(per_sm, rel=0.02)
    assert f["max_Bps"] == pytest.approx(bmax, rel=0.05)


def test_fit_of_the_h100_measurements_in_facts():
    # FACTS.md: 4 SMs 0.15 TB/s, 16: 0.61, 33: 1.20, 66: 2.07, 99: 2.5, 132: 2.7
    pts = [(4, 0.15e12), (16, 0.61e12), (33, 1.20e12), (66, 2.07e12), (99, 2.5e12), (132, 2.7e12)]
    f = fit_saturating(pts)
    assert f["max_rel_error"] < 0.03
    assert 36e9 < f["per_sm_Bps"] < 40e9          # ~38 GB/s per SM, as measured


def test_calibrated_spec_is_a_valid_spec_with_provenance():
    base = load_spec("h100-sxm")
    m = {"hbm_read": [(s, float(saturating(s, 40e9, 2.9e12, 3))) for s in SMS],
         "l2_read": [(s, float(saturating(s, 90e9, 7.3e12, 3))) for s in SMS],
         "fp32_flop_per_s": 51e12, "gemm_fp16": [(4096, 700e12), (8192, 760e12)],
         "launch": {"launch_overhead_s": 5e-6, "eager_per_kernel_s": 6e-6,
                    "graph_launch_overhead_s": 0.9e-6},
         "sync_latency_s": 0.6e-6, "device": {"device": "NVIDIA H100 80GB HBM3", "sm_count": 132}}
    spec, res = calibrated_spec(base, m, date="2026-11-22")
    assert spec.efficiency.tensor_core == pytest.approx(760e12 / 989.4e12)
    assert spec.efficiency.simt == pytest.approx(51e12 / 66.9e12)
    assert spec.hbm_per_sm_bandwidth_Bps == pytest.approx(40e9, rel=0.02)
    assert spec.sync_latency_s == 0.6e-6 and spec.graph_launch_overhead_s == 0.9e-6
    assert spec.calibration is not None and res["hbm_rms_rel_error"] < 1e-3
    again = spec_from_dict(spec.model_dump(mode="json"), "round trip")
    assert again == spec


def test_calibrate_without_a_gpu_is_a_one_line_error(capsys, tmp_path):
    from kitsune_dse.cli import main
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        pytest.skip("a GPU is present")
    except Exception:
        pass
    rc = main(["calibrate", "--out", str(tmp_path / "spec.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and ("GPU" in err[0] or "CuPy" in err[0])
    assert not (tmp_path / "spec.yaml").exists()


def test_standalone_gemm_fit_recovers_the_constants_it_was_made_from():
    from kitsune_dse.calibrate.fit import fit_standalone_gemm, standalone_gemm_time
    base = load_spec("h100-sxm").model_copy(update={"gemm_tile_shapes": [(128, 128), (64, 128)]})
    truth = base.model_copy(update={
        "gemm_standalone_tile_fixed_s": 1.5e-6, "gemm_ramp_s": 4e-6,
        "efficiency": base.efficiency.model_copy(update={"tensor_core": 0.4, "gemm_hbm": 0.7})})
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 6144, 12288), (64, 49152, 12288),
              (262144, 256, 256), (16384, 3072, 768), (2048, 2048, 2048), (16384, 768, 3072)]
    rows = [{"m": m, "n": n, "k": k, "time_s": standalone_gemm_time(truth, m, n, k)}
            for m, n, k in shapes]
    fit = fit_standalone_gemm(base, rows)
    assert fit["rms_rel_error"] < 1e-3
    assert fit["tensor_core"] == pytest.approx(0.4, rel=0.01)
    assert fit["gemm_hbm"] == pytest.approx(0.7, rel=0.01)
    assert fit["tile_fixed_s"] == pytest.approx(1.5e-6, rel=0.05)
    assert fit["ramp_s"] == pytest.approx(4e-6, rel=0.1)


def test_standalone_gemm_fit_recovers_the_read_overlap_exponent():
    from kitsune_dse.calibrate.fit import fit_standalone_gemm, standalone_gemm_time
    base = load_spec("h100-sxm").model_copy(update={"gemm_tile_shapes": [(128, 128), (64, 128)],
                                                    "gemm_heuristic": "harness", "gemm_k_tile": 64})
    truth = base.model_copy(update={
        "gemm_standalone_tile_fixed_s": 1.2e-6, "gemm_ramp_s": 3e-6,
        "efficiency": base.efficiency.model_copy(update={"tensor_core": 0.33, "gemm_hbm": 0.8,
                                                         "gemm_read_overlap_exponent": 2.5})})
    # compute-bound, stream-bound, and shapes where the two near each other (one column tile)
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 6144, 12288), (64, 49152, 12288),
              (262144, 256, 256), (16384, 3072, 768), (65536, 128, 1024), (32768, 128, 2048),
              (131072, 128, 512), (65536, 1024, 128), (131072, 128, 280)]
    rows = [{"m": m, "n": n, "k": k, "time_s": standalone_gemm_time(truth, m, n, k)} for m, n, k in shapes]
    fit = fit_standalone_gemm(base, rows, read_overlap=True)
    assert fit["rms_rel_error"] < 2e-3
    assert fit["read_overlap_exponent"] == pytest.approx(2.5, rel=0.05)
    assert fit["tensor_core"] == pytest.approx(0.33, rel=0.02)
    assert fit["gemm_hbm"] == pytest.approx(0.8, rel=0.02)
    # without it the exponent stays the spec's (the cuBLAS spec: 0, the plain max)
    assert fit_standalone_gemm(base, rows)["read_overlap_exponent"] == 0.0


def test_the_committed_harness_spec_carries_the_standalone_gemm_fit():
    sp = load_spec("h100-sxm.calibrated")
    fit = sp.calibration.standalone_gemm_fit
    assert fit["points"] >= 10 and fit["rms_rel_error"] < 0.15
    assert sp.gemm_tile_shapes == [(128, 128), (64, 128)]
    assert sp.gemm_ramp_s == pytest.approx(fit["ramp_s"])
    assert sp.efficiency.gemm_hbm == pytest.approx(fit["gemm_hbm"])
    assert sp.efficiency.gemm_read_overlap_exponent == pytest.approx(fit["read_overlap_exponent"])
    assert sp.gemm_k_tile == 64 and sp.efficiency.gemm_read_overlap_exponent > 1


# one-stage GEMMs of every regime (SM sweep, short and long K, weight streams, narrow N)
PERSISTENT_GEMM_CASES = [((4096, 4096, 4096), s) for s in (8, 33, 66, 132)] + [
    ((16384, 1024, 256), 132), ((65536, 128, 1024), 132), ((64, 49152, 12288), 132),
    ((64, 49152, 12288), 33), ((2048, 6144, 12288), 66), ((262144, 256, 256), 132),
    ((65536, 128, 256), 132), ((65536, 128, 4096), 132)]


def _persistent_truth(base, **efficiency):
    """A spec of planted persistent GEMM constants for the fit to recover."""
    return base.model_copy(update={
        "gemm_tile_fixed_s": 3e-6, "persistent_gemm_sm_stream_Bps": 25e9, "persistent_a_stream_fill_s": 5e-6,
        "efficiency": base.efficiency.model_copy(update={
            "persistent_tensor_core": 0.4, "mem_compute_overlap": 0.3, "persistent_gemm_hbm": 0.7,
            "persistent_a_stream_share": 0.45, **efficiency})})


def test_persistent_gemm_fit_recovers_the_constants_it_was_made_from():
    from kitsune_dse.calibrate.fit import fit_persistent_gemm, persistent_gemm_time
    base = load_spec("h100-sxm")
    truth = _persistent_truth(base)
    cases = PERSISTENT_GEMM_CASES + [((262144, 8, 256), 132)]
    rows = [{"dims": d, "sms": s, "time_s": persistent_gemm_time(truth, *d, s)} for d, s in cases]
    fit = fit_persistent_gemm(base, rows)
    assert fit["rms_rel_error"] < 2e-3
    assert fit["persistent_tensor_core"] == pytest.approx(0.4, rel=0.02)
    assert fit["tile_fixed_s"] == pytest.approx(3e-6, rel=0.1)
    assert fit["persistent_gemm_hbm"] == pytest.approx(0.7, rel=0.05)
    assert fit["persistent_a_stream_share"] == pytest.approx(0.45, rel=0.05)
    assert fit["a_stream_fill_s"] == pytest.approx(5e-6, abs=1.5e-6)


def test_persistent_gemm_fit_recovers_the_one_team_share():
    # kernels whose items each have an SM of their own run one team per SM (their lone item at
    # persistent_solo_team of the two-team rate); a fit on rows with none keeps no such share
    from kitsune_dse.calibrate.fit import fit_persistent_gemm, one_stage_teams, persistent_gemm_time
    base = load_spec("h100-sxm")
    truth = _persistent_truth(base, persistent_lone_team=0.75, persistent_solo_team=0.95)
    solo = [((1024, 2048, 4096), 132), ((2048, 1024, 4096), 132), ((1024, 1024, 8192), 66),
            ((512, 4096, 2048), 132)]
    assert all(one_stage_teams(truth, "matmul", d, s) == 1 for d, s in solo)
    cases = PERSISTENT_GEMM_CASES + [((4096, 1024, 4096), 132)]
    assert all(one_stage_teams(truth, "matmul", d, s) == 2 for d, s in cases)
    rows = [{"dims": d, "sms": s, "time_s": persistent_gemm_time(truth, *d, s)} for d, s in cases + solo]
    fit = fit_persistent_gemm(base, rows)
    assert fit["solo_team_cases"] == len(solo) and fit["rms_rel_error"] < 3e-3
    assert fit["persistent_solo_team"] == pytest.approx(0.95, rel=0.02)
    assert fit["spec"].efficiency.persistent_solo_team == fit["persistent_solo_team"]
    none = fit_persistent_gemm(base, rows[:len(cases)])
    assert none["persistent_solo_team"] is None and none["spec"].efficiency.persistent_solo_team is None


def test_persistent_gemm_fit_finds_the_operand_feed():
    # a planted 4 TB/s feed binds the long-K cases at 132 SMs (and the 64-row tiles), not at 8-33
    from kitsune_dse.calibrate.fit import fit_persistent_gemm, persistent_gemm_time
    base = load_spec("h100-sxm")
    truth = base.model_copy(update={
        "gemm_tile_fixed_s": 3e-6, "persistent_gemm_sm_stream_Bps": 25e9, "persistent_gemm_l2_Bps": 4e12,
        "persistent_a_stream_fill_s": 4e-6,
        "efficiency": base.efficiency.model_copy(update={
            "persistent_tensor_core": 0.4, "mem_compute_overlap": 0.3, "persistent_gemm_hbm": 0.7,
            "persistent_a_stream_share": 0.6})})
    cases = [((4096, 4096, 4096), s, 128) for s in (8, 33, 66, 99, 132)] + [
        ((4096, 4096, 4096), 132, 64), ((4096, 4096, 4096), 33, 64), ((16384, 1024, 256), 132, 128),
        ((65536, 128, 1024), 132, 128), ((64, 49152, 12288), 132, 64), ((64, 49152, 12288), 33, 128),
        ((2048, 6144, 12288), 132, 128), ((2048, 6144, 12288), 66, 128),
        ((65536, 128, 256), 132, 128), ((65536, 128, 4096), 132, 128)]
    rows = [{"dims": d, "sms": s, "time_s": persistent_gemm_time(truth, *d, s, rows=r),
             **({"tile_rows": r} if r != 128 else {})} for d, s, r in cases]
    fit = fit_persistent_gemm(base, rows)
    assert fit["rms_rel_error"] < 5e-3
    assert fit["operand_l2_Bps"] == pytest.approx(4e12, rel=0.05)
    assert "64x49152x12288@132/r64" in fit["rel_error_by_case"]


def test_the_committed_harness_spec_carries_the_persistent_gemm_fit():
    sp = load_spec("h100-sxm.calibrated")
    fit = sp.calibration.tile_gemm_fit
    assert fit["points"] >= 20 and fit["rms_rel_error"] < 0.15
    assert sp.gemm_tile_fixed_s == pytest.approx(fit["tile_fixed_s"])
    assert sp.persistent_gemm_sm_stream_Bps == pytest.approx(fit["sm_stream_Bps"])
    assert sp.efficiency.persistent_gemm_hbm == pytest.approx(fit["persistent_gemm_hbm"])
    assert sp.persistent_gemm_l2_Bps == pytest.approx(fit["operand_l2_Bps"])
    assert sp.efficiency.persistent_a_stream_share == pytest.approx(fit["persistent_a_stream_share"])
    assert sp.persistent_a_stream_fill_s == pytest.approx(fit["a_stream_fill_s"])
    # one team per SM where every item has an SM of its own: its lone item is faster than a
    # lone item beside an idle second team (no spills at 255 registers a thread)
    assert fit["solo_team_cases"] >= 4
    assert sp.efficiency.persistent_solo_team == pytest.approx(fit["persistent_solo_team"])
    assert sp.efficiency.persistent_solo_team > sp.efficiency.persistent_lone_team


def test_tile_handoff_fit_recovers_the_constants_it_was_made_from():
    """Probe rows made from planted per-tile costs through the model's busiest-SM tile count."""
    from kitsune_dse.calibrate.fit import fit_tile_handoff
    from kitsune_dse.cost.region import Region as CRegion
    from kitsune_dse.cost.region import kernel_works
    from kitsune_dse.cost.roofline import busiest_sm_tiles
    from kitsune_dse.validate.microbench import TILESYNC_PROBES, case_model
    sp = load_spec("h100-sxm.calibrated")
    rows = []
    for i, (_, _, kind, dims) in enumerate(TILESYNC_PROBES):
        g, _ = case_model(kind, "fp16", dims)
        w = kernel_works(CRegion.of(g), [(o.name,) for o in g.ops], sp)[0]
        x = float(busiest_sm_tiles(w, sp.sm_count))
        plain = 1e-4 * (1 + i)
        # a GEMM or wide norm (one CTA per SM) pays 0.25 us a signalled tile, a kernel sharing
        # its SMs 0.03
        sig = plain + 2e-6 + (0.03e-6 if w.ctas_per_sm > 1 else 0.25e-6) * x
        rows.append({"kind": kind, "dims": list(dims), "plain_s": plain,
                     "signal_s": sig, "both_s": sig + 0.1e-6 * x})
    fit = fit_tile_handoff(sp, rows)
    assert any(fit["shared_sm"]) and not all(fit["shared_sm"])
    assert fit["fixed_s"] == pytest.approx(2e-6, rel=1e-6)
    assert fit["tile_signal_s"] == pytest.approx(0.25e-6, rel=1e-6)
    assert fit["tile_signal_shared_s"] == pytest.approx(0.03e-6, rel=1e-6)
    assert fit["tile_wait_s"] == pytest.approx(0.1e-6, rel=1e-6)
    assert fit["rms_s"] < 1e-12


def test_the_committed_harness_spec_carries_the_tile_handoff_fit():
    sp = load_spec("h100-sxm.calibrated")
    fit = sp.calibration.tile_handoff_fit
    assert len(fit["busiest_sm_tiles"]) >= 5
    assert sp.tile_signal_s == pytest.approx(fit["tile_signal_s"])
    assert sp.tile_wait_s == pytest.approx(fit["tile_wait_s"])
    assert sp.tile_signal_shared_s == pytest.approx(fit["tile_signal_shared_s"])
    assert sp.tilesync_fixed_s == pytest.approx(fit["fixed_s"])
    assert 0 <= sp.tile_signal_s < 2e-6 and 0 <= sp.tile_wait_s < 2e-6


def test_row_op_fit_recovers_the_constants_it_was_made_from():
    from kitsune_dse.calibrate.fit import fit_persistent_rows, one_stage_time
    base = load_spec("h100-sxm.calibrated")      # the fit runs on the calibrated HBM curve
    truth = base.model_copy(update={"persistent_row_sm_stream_Bps": 60e9,
                                    "persistent_row_item_fixed_s": 0.3e-6})
    cases = [("layernorm", (4096, 4096), s) for s in (4, 16, 66, 132)] + [
        ("softmax", (8192, 4096), 68), ("softmax", (65536, 1024), 68), ("softmax", (65536, 1024), 132),
        ("softmax", (32768, 2048), 68), ("layernorm", (65536, 1024), 66)]
    rows = [{"kind": k, "dims": d, "sms": s, "time_s": one_stage_time(truth, k, d, s)} for k, d, s in cases]
    fit = fit_persistent_rows(base, rows)
    assert fit["rms_rel_error"] < 2e-3
    assert fit["sm_stream_Bps"] == pytest.approx(60e9, rel=0.02)
    assert fit["item_fixed_s"] == pytest.approx(0.3e-6, rel=0.1)


def test_narrow_rows_stream_as_fast_as_wide_ones():
    """Softmax rows of 1024 and of 4096 columns move the same bytes in the same time (harness
    version 4: 132.3 us for [65536, 1024] against 2 x 65.1 for [8192, 4096] on 68 SMs; the
    narrow rows' old deficit was the runtime visiting every row-block)."""
    from kitsune_dse.calibrate.fit import one_stage_time
    sp = load_spec("h100-sxm").model_copy(update={"persistent_row_sm_stream_Bps": 20e9})
    narrow = one_stage_time(sp, "softmax", (65536, 1024), 8)
    wide = one_stage_time(sp, "softmax", (16384, 4096), 8)      # the same bytes
    assert narrow == pytest.approx(wide, rel=0.05)


def test_merge_raw_takes_the_median_of_each_measurement():
    from kitsune_dse.calibrate.fit import merge_raw
    runs = [{"env": {"date": d}, "device": {"sm_count": 132}, "sync_latency_s": v,
             "hbm_read": [[8, v * 10], [16, v * 20]],
             "pipe_rows": [{"label": "sweep", "kind": "matmul", "dims": [64, 64, 64], "sms": 8,
                            "time_s": v, "correct": True, "placement": {"x": v}}]
             + ([{"label": "row op", "kind": "softmax", "dims": [8, 8], "sms": 4, "time_s": 7.0}]
                if d == "c" else [])}
            for d, v in (("a", 1.0), ("b", 3.0), ("c", 2.0))]
    m = merge_raw(runs)
    assert m["sync_latency_s"] == 2.0
    assert m["hbm_read"] == [[8, 20.0], [16, 40.0]]
    assert len(m["pipe_rows"]) == 2
    assert m["pipe_rows"][0]["time_s"] == 2.0 and m["pipe_rows"][0]["correct"] is True
    assert m["pipe_rows"][1]["time_s"] == 7.0                # measured in one run only
    assert m["env"] == {"date": "a"} and m["merged_from"] == ["a", "b", "c"]


def test_merge_raw_keeps_cublas_figures_of_the_newest_call_path_only():
    """Runs that called cuBLAS another way keep their harness and GPU figures, not cuBLAS's."""
    from kitsune_dse.calibrate.fit import merge_raw

    def run(d, v, cv):
        return {"env": {"date": d}, "sync_latency_s": v, "cublas_version": cv,
                "cublas_call_rows": [{"shape": [128, 128, 128], "host_s": v * 10}],
                "tile_gemm_shapes": [{"m": 64, "n": 64, "k": 64, "tile_time_s": v, "cublas_time_s": v * 2}],
                "tile_rows": [{"kernel": "gemm", "shape": "64x64x64", "impl": "tile", "time_s": v},
                              {"kernel": "gemm", "shape": "64x64x64", "impl": "cublas", "time_s": v * 2}]}
    runs = [run("a", 1.0, 0), run("b", 5.0, 0), run("c", 3.0, 1), run("d", 4.0, 1)]
    m = merge_raw(runs)
    assert m["cublas_version"] == 1
    assert m["sync_latency_s"] == 3.5                               # all four runs
    assert m["tile_gemm_shapes"][0]["tile_time_s"] == 3.5
    assert m["tile_gemm_shapes"][0]["cublas_time_s"] == 7.0         # c and d only
    assert m["cublas_call_rows"][0]["host_s"] == 35.0
    cub = [r for r in m["tile_rows"] if r["impl"] == "cublas"]
    assert len(cub) == 1 and cub[0]["time_s"] == 7.0
    assert merge_raw(runs[:2])["cublas_call_rows"][0]["host_s"] == 30.0   # no newer run: all kept


def test_merge_raw_drops_only_what_a_harness_version_changed():
    """Version 7 changed tilesync's waits only: version-6 runs keep their pipeline figures,
    version-5 runs (every kernel changed in 6) keep only the GPU's own figures."""
    from kitsune_dse.calibrate.fit import merge_raw

    def run(d, v, hv):
        return {"env": {"date": d}, "harness_version": hv, "sync_latency_s": v,
                "pipe_rows": [{"label": "sweep", "kind": "matmul", "dims": [64, 64, 64], "sms": 8, "time_s": v}],
                "tilesync_probe_rows": [{"label": "probe", "kind": "matmul", "dims": [64, 64, 64], "both_s": v}]}
    m = merge_raw([run("a", 1.0, 7), run("b", 3.0, 6), run("c", 100.0, 5)])
    assert m["harness_version"] == 7
    assert m["sync_latency_s"] == 3.0                              # all three runs
    assert m["pipe_rows"][0]["time_s"] == 2.0                      # versions 7 and 6
    assert m["tilesync_probe_rows"][0]["both_s"] == 1.0            # version 7 only


def test_merge_raw_drops_the_cases_harness_8_compiled_differently():
    """Harness 8 emits the item-offset wrap in every persistent stage: a version-7 one-stage
    case whose step had at least as many items per row-block as workers (4096^3 on 16 SMs: 32
    column tiles, 32 teams) ran other code and is dropped; on 33 SMs (66 teams) it is kept."""
    from kitsune_dse.calibrate.fit import merge_raw

    def run(d, hv, v):
        return {"env": {"date": d}, "harness_version": hv,
                "pipe_rows": [{"label": "sweep", "kind": "matmul", "dims": [4096, 4096, 4096], "sms": s,
                               "time_s": v} for s in (16, 33)],
                "pipe_gemm_fp16_sms": [[16, v], [33, v]],
                "epilogue_rows": [{"kind": "mmgelu", "dims": [64, 64, 64], "persistent_s": v}]}
    m = merge_raw([run("a", 8, 1.0), run("b", 7, 3.0)])
    assert m["harness_version"] == 8
    by_sms = {r["sms"]: r["time_s"] for r in m["pipe_rows"]}
    assert by_sms == {16: 1.0, 33: 2.0}                  # 16 SMs from version 8 alone
    assert m["pipe_gemm_fp16_sms"] == [[16, 1.0], [33, 1.0]]
    assert m["epilogue_rows"][0]["persistent_s"] == 1.0


def test_l2_residency_fit_is_the_half_hit_crossing():
    # re-read hits 0.9 up to 24 MiB, 0.6 at 28, 0.2 at 32: one half is crossed at 29 MiB
    from kitsune_dse.calibrate.fit import fit_l2_residency
    MiB = 2**20
    rows = [{"bytes": b * MiB, "hit_reread": h} for b, h in ((8, 0.9), (16, 0.85), (24, 0.9), (28, 0.6),
                                                             (32, 0.2), (40, 0.1), (48, 0.55))]
    f = fit_l2_residency(rows, 50 * MiB)
    assert f["capacity_bytes"] == pytest.approx(29 * MiB)
    assert f["l2_usable_fraction"] == pytest.approx(29 / 50)
    # never below one half: all of what was measured; below from the start: the smallest size
    assert fit_l2_residency(rows[:3], 50 * MiB)["capacity_bytes"] == 24 * MiB
    assert fit_l2_residency([{"bytes": 8 * MiB, "hit_reread": 0.1}], 50 * MiB)["capacity_bytes"] == 8 * MiB
    # and calibrated_spec takes it
    base = load_spec("h100-sxm")
    m = {"hbm_read": [(s, float(saturating(s, 40e9, 2.9e12, 3))) for s in SMS],
         "l2_read": [(s, float(saturating(s, 90e9, 7.3e12, 3))) for s in SMS], "l2_residency": rows}
    spec, _ = calibrated_spec(base, m, date="2026-11-22")
    assert spec.l2_usable_bytes == pytest.approx(29 * MiB / (50 * MiB) * base.l2_bytes)
    assert spec.calibration.l2_residency_capacity_bytes == pytest.approx(29 * MiB)


def test_kernel_chain_fit_separates_the_launch_latency():
    # T(N) = 3 us + 1.7 us x N over chains of 1..16 kernels
    from kitsune_dse.calibrate.fit import fit_kernel_chain
    rows = [{"dims": [128, 1024, n], "graph_s": 3e-6 + 1.7e-6 * n} for n in (1, 2, 4, 8, 16)]
    f = fit_kernel_chain(rows)
    assert f["latency_s"] == pytest.approx(3e-6) and f["per_kernel_s"] == pytest.approx(1.7e-6)
    with pytest.raises(ValueError):
        fit_kernel_chain(rows[:1])


def test_standalone_norm_fit_recovers_the_share_it_was_made_from():
    """Layernorms of 2,048-8,192 columns on their increment over the softmax of the same shape:
    both measured 5% of the softmax's time above the model (a streaming kernel's own residual),
    which the share must not absorb; the narrow layernorm (1,024 columns, 4 vectors a thread)
    is not fitted."""
    from kitsune_dse.calibrate.fit import fit_standalone_norm, standalone_time
    base = load_spec("h100-sxm.calibrated").model_copy(update={"standalone_norm_stream_share": 1.0})
    truth = base.model_copy(update={"standalone_norm_stream_share": 0.7})
    dims = [(16384, 2048), (8192, 4096), (4096, 8192)]
    off = {d: 0.05 * standalone_time(truth, "softmax", d) for d in dims}
    rows = [{"kind": "layernorm", "dims": d, "time_s": standalone_time(truth, "layernorm", d) + off[d]} for d in dims]
    rows += [{"kind": "softmax", "dims": d, "time_s": standalone_time(truth, "softmax", d) + off[d]} for d in dims]
    rows += [{"kind": "layernorm", "dims": (32768, 1024), "time_s": 1.0}]
    fit = fit_standalone_norm(base, rows)
    assert fit["points"] == 3
    assert fit["standalone_norm_stream_share"] == pytest.approx(0.7, rel=0.03)
    with pytest.raises(ValueError):
        fit_standalone_norm(base, [r for r in rows if r["kind"] == "softmax"])


def test_the_committed_harness_spec_carries_the_standalone_norm_fit():
    sp = load_spec("h100-sxm.calibrated")
    fit = sp.calibration.standalone_norm_fit
    assert fit["points"] == 3 and fit["rms_rel_error"] < 0.1
    assert sp.standalone_norm_stream_share == pytest.approx(fit["standalone_norm_stream_share"])
    assert sp.standalone_norm_stream_share < 1.0


def test_the_persistent_launch_splits_at_the_measured_outside_part():
    from kitsune_dse.calibrate.fit import persistent_outside_s
    # the pipe rows' own measurements win; the raw file's probe rows are the fallback
    raw = {"pipe_rows": [{"outside_s": 3e-6}, {"outside_s": 4e-6}, {"outside_s": 3.2e-6}, {"time_s": 1e-5}],
           "persistent_outside": {"rows": [{"event_s": 20e-6, "span_s": 10e-6}]}}
    assert persistent_outside_s(raw) == pytest.approx(3.2e-6, rel=1e-12)
    del raw["pipe_rows"]
    assert persistent_outside_s(raw) == pytest.approx(10e-6, rel=1e-12)
    assert persistent_outside_s({}) is None
    # the committed harness spec: ~3.2 us of the 6.9 us launch outside, the rest a ramp
    sp = load_spec("h100-sxm.calibrated")
    assert 2.5e-6 < sp.persistent_launch_outside_s < 4e-6
    assert sp.persistent_ramp_s == pytest.approx(sp.persistent_launch_s - sp.persistent_launch_outside_s)
