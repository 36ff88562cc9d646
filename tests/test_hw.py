"""GPU specs: every shipped spec loads and is self-consistent; derived figures of h100-sxm by
hand; what-if overrides; the content hash."""
from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kitsune_dse.errors import KitsuneError
from kitsune_dse.hw import HwSpec, list_specs, load_spec, spec_with_overrides
from kitsune_dse.hw.spec import spec_from_dict
from kitsune_dse.units import parse_quantity

SPECS = sorted(list_specs())
# hand-written datasheet specs (calibrated variants written by `calibrate` carry `calibration:`)
DATASHEET_SPECS = [n for n in SPECS
                   if not (yaml.safe_load(list_specs()[n].read_text(encoding="utf-8")) or {})
                   .get("calibration")]
# the GPUs the project promises to ship
EXPECTED = {"h100-sxm", "h100-pcie", "h200-sxm", "a100-sxm-80gb", "a100-pcie-40gb", "l40s",
            "rtx-4090", "b200"}


@functools.lru_cache(maxsize=None)
def spec(name: str) -> HwSpec:
    return load_spec(name)


def raw(name: str) -> dict:
    return yaml.safe_load(list_specs()[name].read_text(encoding="utf-8"))


# -- every shipped spec -----------------------------------------------------------------------
def test_the_promised_specs_are_shipped():
    assert EXPECTED <= set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_spec_loads_and_is_sane(name):
    s = spec(name)
    assert s.name == name == list_specs()[name].stem
    assert re.fullmatch(r"sm_\d{2,3}[a-z]?", s.arch)
    for field in ("sm_count", "registers_per_sm", "max_ctas_per_sm", "max_threads_per_sm",
                  "sm_granularity"):
        assert getattr(s, field) > 0 and isinstance(getattr(s, field), int), field
    for field, v in s.model_dump().items():
        if isinstance(v, float):
            # the calibrated fixed costs are zero until `calibrate` measures them
            zero_ok = field in ("kernel_fixed_s", "gemm_tile_fixed_s", "gemm_standalone_tile_fixed_s",
                                    "gemm_ramp_s", "tilesync_fixed_s", "tile_wait_s", "tile_signal_s",
                                    "persistent_row_item_fixed_s", "region_gap_s", "tilesync_handoff_s",
                                    "transcendental_flops", "persistent_row_load_slowdown", "epilogue_input_s", "epilogue_vector_s",
                                    "persistent_narrow_tile_saving", "standalone_narrow_tile_saving", "standalone_epilogue_input_s", "gemm_tail_tiles",
                                    "region_boundary_hidden_s", "local_frame_step_bytes",
                                    "local_frame_concat_bytes", "persistent_a_stream_fill_s")
            assert (v >= 0 if zero_ok else v > 0) and math.isfinite(v), field
    assert s.tensor_peak_flop_per_s.get("fp16", 0) > 0
    assert s.simt_peak_flop_per_s.get("fp32", 0) > 0
    assert s.smem_per_cta_max_bytes <= s.smem_per_sm_bytes
    assert s.l2_bytes < s.hbm_bytes
    assert s.hbm_bandwidth_Bps < s.l2_bandwidth_Bps  # L2 is faster than DRAM
    assert s.hbm_per_sm_bandwidth_Bps * s.sm_count > s.hbm_bandwidth_Bps * s.efficiency.hbm * 0.9
    assert s.max_threads_per_sm % 32 == 0
    assert s.sm_granularity <= s.sm_count
    assert 1e-7 < s.sync_latency_s < 1e-5 and 1e-7 < s.launch_overhead_s < 1e-4
    assert s.sources, "every spec names its sources"


@pytest.mark.parametrize("name", SPECS)
def test_peaks_agree_with_sm_count_and_clock(name):
    """Datasheet peaks are SMs x FLOP/clk x clock: FP32 is 128 (GA100) or 256 FLOP/clk/SM at the
    boost clock; dense FP16 tensor is a power of two per clock, quoted at or below boost."""
    s = spec(name)
    per_clk = s.simt_peak_flop_per_s["fp32"] / (s.sm_count * s.sm_clock_Hz)
    assert min(abs(per_clk / 128 - 1), abs(per_clk / 256 - 1)) < 0.02, per_clk
    tc = s.tensor_peak_flop_per_s["fp16"] / (s.sm_count * s.sm_clock_Hz)
    pow2 = 2 ** round(math.log2(tc))
    assert 0.9 * pow2 <= tc <= 1.01 * pow2, tc


@pytest.mark.parametrize("name", DATASHEET_SPECS)
def test_full_chip_saturates_dram(name):
    s = spec(name)
    achievable = s.hbm_bandwidth_Bps * s.efficiency.hbm
    assert 0.9 * achievable <= s.hbm_bandwidth_from(s.sm_count) <= achievable


@pytest.mark.parametrize("name", DATASHEET_SPECS)
def test_spec_yaml_names_its_unit_in_every_figure(name):
    """Every dimensioned figure in the YAML is written with a unit (no bare SI numbers)."""
    data = raw(name)
    for key, v in data.items():
        if key.endswith("_flop_per_s"):
            assert all(isinstance(x, str) for x in v.values()), key
        elif key.endswith(("_Bps", "_bytes", "_Hz", "_s")):
            assert isinstance(v, str), f"{key}: write the unit"


# -- derived figures on h100-sxm, by hand ----------------------------------------------------
def test_h100_tensor_rate_per_sm():
    h = spec("h100-sxm")
    assert h.tensor_rate_per_sm("fp16") == pytest.approx(989.4e12 * 0.76 / 132, rel=1e-12)
    assert h.tensor_rate_per_sm("fp8") == pytest.approx(1978.9e12 * 0.76 / 132, rel=1e-12)


def test_h100_dtype_without_tensor_rate_falls_back_to_simt():
    h = spec("h100-sxm")
    assert h.tensor_rate_per_sm("fp32") == pytest.approx(66.9e12 * 0.76 / 132, rel=1e-12)
    assert h.simt_rate_per_sm("fp64") == pytest.approx(33.5e12 * 0.76 / 132, rel=1e-12)
    # an unlisted SIMT dtype runs at the fp32 rate
    assert h.simt_rate_per_sm("int32") == pytest.approx(66.9e12 * 0.76 / 132, rel=1e-12)


def test_bf16_falls_back_to_fp16_tensor_rate():
    data = raw("h100-sxm")
    del data["tensor_peak_flop_per_s"]["bf16"]
    s = spec_from_dict(data, "<test>")
    assert s.tensor_rate_per_sm("bf16") == pytest.approx(989.4e12 * 0.76 / 132)


@pytest.mark.parametrize("sms, measured", [(132, 2.75e12), (16, 0.606e12)])
def test_h100_hbm_bandwidth_from_matches_facts(sms, measured):
    # FACTS.md: HBM read bandwidth vs SMs used, 16 SMs 0.61 TB/s, 132 SMs 2.7 TB/s
    assert spec("h100-sxm").hbm_bandwidth_from(sms) == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("sms, measured", [(4, 0.15e12), (33, 1.20e12), (66, 2.07e12),
                                           (99, 2.5e12), (132, 2.7e12)])
def test_h100_hbm_curve_follows_every_measurement(sms, measured):
    assert spec("h100-sxm").hbm_bandwidth_from(sms) == pytest.approx(measured, rel=0.10)


def test_hbm_bandwidth_from_accepts_arrays():
    h = spec("h100-sxm")
    out = h.hbm_bandwidth_from(np.array([16, 132]))
    assert out.shape == (2,)
    assert out[0] == pytest.approx(h.hbm_bandwidth_from(16))
    assert isinstance(h.hbm_bandwidth_from(16), float)


@st.composite
def _spec_and_two_sm_counts(draw):
    name = draw(st.sampled_from(SPECS))
    n = spec(name).sm_count
    a = draw(st.integers(1, n))
    b = draw(st.integers(a, n))
    return name, a, b


@settings(max_examples=300, deadline=None)
@given(_spec_and_two_sm_counts())
def test_bandwidth_from_is_monotone_and_bounded(case):
    name, a, b = case
    s = spec(name)
    for f, per_sm, cap in ((s.hbm_bandwidth_from, s.hbm_per_sm_bandwidth_Bps,
                            s.hbm_bandwidth_Bps * s.efficiency.hbm),
                           (s.l2_bandwidth_from, s.l2_per_sm_bandwidth_Bps,
                            s.l2_bandwidth_Bps * s.efficiency.l2)):
        fa, fb = f(a), f(b)
        assert 0 < fa <= fb * (1 + 1e-12)
        assert fb <= min(b * per_sm, cap) * (1 + 1e-12)


def test_hbm_bandwidth_from_monotone_over_every_sm_count():
    for name in SPECS:
        s = spec(name)
        curve = s.hbm_bandwidth_from(np.arange(1, s.sm_count + 1))
        assert np.all(np.diff(curve) >= 0), name


# -- units through the spec ----------------------------------------------------------------------
@pytest.mark.parametrize("text, dimension, expected", [
    ("3.35 TB/s", "bytes_per_s", 3.35e12), ("50 MiB", "bytes", 52428800), ("0.8 us", "seconds", 8e-7),
])
def test_units_from_the_brief(text, dimension, expected):
    assert parse_quantity(text, dimension) == pytest.approx(expected, rel=1e-12)


def test_h100_fields_are_si():
    h = spec("h100-sxm")
    assert h.hbm_bandwidth_Bps == pytest.approx(3.35e12)
    assert h.l2_bytes == 52428800
    assert h.graph_launch_overhead_s == pytest.approx(8e-7)
    assert h.sm_clock_Hz == pytest.approx(1.98e9)
    assert h.l2_usable_bytes == pytest.approx(52428800 * 0.75)


# -- overrides -------------------------------------------------------------------------------------
def test_override_with_unit():
    h = spec("h100-sxm")
    t = spec_with_overrides(h, {"l2_bytes": "100MiB"})
    assert t.l2_bytes == 100 * 2**20
    assert h.l2_bytes == 50 * 2**20  # the original is untouched
    assert t.sm_count == h.sm_count


@pytest.mark.parametrize("key, value, attr, expected", [
    ("efficiency.hbm", "0.9", lambda s: s.efficiency.hbm, 0.9),
    ("tensor_peak_flop_per_s.fp16", "500 TFLOP/s", lambda s: s.tensor_peak_flop_per_s["fp16"], 5e14),
    ("sm_count", "100", lambda s: s.sm_count, 100),
    ("hbm_bandwidth_Bps", "4.8 TB/s", lambda s: s.hbm_bandwidth_Bps, 4.8e12),
    ("sync_latency_s", "1 us", lambda s: s.sync_latency_s, 1e-6),
])
def test_overrides(key, value, attr, expected):
    assert attr(spec_with_overrides(spec("h100-sxm"), {key: value})) == pytest.approx(expected)


@pytest.mark.parametrize("overrides, words", [
    ({"l2_byte": "100 MiB"}, ["l2_byte", "did you mean", "l2_bytes"]),
    ({"efficiency.hbmm": "0.9"}, ["hbmm", "hbm"]),
    ({"nonsense.x": "1"}, ["nonsense"]),
    ({"l2_bytes": "100 GHz"}, ["l2_bytes", "GHz"]),
    ({"hbm_bandwidth_Bps": "3 TB"}, ["hbm_bandwidth_Bps", "TB"]),
    ({"sm_count": "-3"}, ["sm_count"]),
    ({"sm_count": "13.5"}, ["sm_count"]),
    ({"efficiency.hbm": "1.5"}, ["efficiency.hbm"]),
])
def test_bad_overrides_are_kitsune_errors(overrides, words):
    with pytest.raises(KitsuneError) as e:
        spec_with_overrides(spec("h100-sxm"), overrides)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_override_efficiency_as_percent():
    assert spec_with_overrides(spec("h100-sxm"),
                               {"efficiency.hbm": "90%"}).efficiency.hbm == pytest.approx(0.9)


def test_spec_with_calibration_provenance_loads():
    data = raw("h100-sxm")
    data["calibration"] = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-20"}
    s = spec_from_dict(data, "<test>")
    assert s.calibration is not None


def test_boolean_count_is_rejected():
    data = raw("h100-sxm")
    data["sm_count"] = True
    with pytest.raises(KitsuneError):
        spec_from_dict(data, "<test>")


def test_infinite_bandwidth_is_rejected():
    data = raw("h100-sxm")
    data["hbm_bandwidth_Bps"] = float("inf")
    with pytest.raises(KitsuneError):
        spec_from_dict(data, "<test>")


def test_empty_peak_table_is_rejected():
    data = raw("h100-sxm")
    data["simt_peak_flop_per_s"] = {}
    with pytest.raises(KitsuneError):
        spec_from_dict(data, "<test>")


# -- content hash --------------------------------------------------------------------------------
def test_content_hash_is_stable():
    a = load_spec("h100-sxm")
    b = load_spec(list_specs()["h100-sxm"])
    assert a.content_hash() == b.content_hash()
    assert re.fullmatch(r"[0-9a-f]{16}", a.content_hash())
    # the order fields are written in does not matter
    data = raw("h100-sxm")
    shuffled = dict(reversed(list(data.items())))
    assert spec_from_dict(shuffled, "<test>").content_hash() == a.content_hash()
    # a round trip through overrides with nothing overridden keeps it
    assert spec_with_overrides(a, {}).content_hash() == a.content_hash()


def test_content_hash_changes_with_content():
    a = spec("h100-sxm")
    assert spec_with_overrides(a, {"l2_bytes": "100 MiB"}).content_hash() != a.content_hash()
    assert spec_with_overrides(a, {"efficiency.hbm": "0.8"}).content_hash() != a.content_hash()
    assert len({spec(n).content_hash() for n in SPECS}) == len(SPECS)


def test_hw_list_and_show_every_spec(cli):
    rc, out, err = cli(["hw", "list"])
    assert rc == 0 and err == ""
    for name in SPECS:
        assert name in out
    for name in SPECS:
        rc, out, err = cli(["hw", "show", name])
        assert rc == 0 and err == "", name
        assert "sm_count" in out


def test_an_installed_package_finds_its_shipped_specs(tmp_path):
    # installed, the specs are package data in kitsune_dse/data/hw_specs (a namespace package,
    # which importlib.resources returns as a MultiplexedPath): `kitsune-dse explore ... --hw
    # h100-sxm` from a plain `pip install .` said "unknown hardware spec" until this was fixed
    import importlib.util
    import shutil

    from kitsune_dse import resources
    site = tmp_path / "site-packages"
    pkg = site / "kitsune_dse"
    (pkg / "data" / "hw_specs").mkdir(parents=True)
    shutil.copy(resources.__file__, pkg / "resources.py")
    shutil.copy(resources.hw_specs()["h100-sxm"], pkg / "data" / "hw_specs" / "h100-sxm.yaml")
    spec = importlib.util.spec_from_file_location("installed_resources", pkg / "resources.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    found = mod.hw_specs()
    assert list(found) == ["h100-sxm"]
    assert found["h100-sxm"].resolve() == (pkg / "data" / "hw_specs" / "h100-sxm.yaml").resolve()
