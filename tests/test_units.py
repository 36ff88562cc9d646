"""kitsune_dse.units: parse_quantity for every dimension, prefixes, errors; fmt_si."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kitsune_dse.units import DIMENSIONS, UnitError, fmt_si, parse_quantity


# -- parse_quantity: accepted spellings, one block per dimension --------------------------------
@pytest.mark.parametrize("text, dimension, expected", [
    # bytes: decimal and binary prefixes
    ("50 MiB", "bytes", 50 * 2**20),
    ("50 MB", "bytes", 50e6),
    ("1 KiB", "bytes", 1024),
    ("1 kB", "bytes", 1000),
    ("1 KB", "bytes", 1000),            # capital K is read as decimal kilo
    ("2 GiB", "bytes", 2 * 2**30),
    ("2 GB", "bytes", 2e9),
    ("1 TiB", "bytes", 2**40),
    ("1 PiB", "bytes", 2**50),
    ("228 KiB", "bytes", 228 * 1024),
    ("7 B", "bytes", 7),
    ("64KiB", "bytes", 65536),          # no space
    ("1_000 B", "bytes", 1000),         # digit separators
    # bytes per second
    ("3.35 TB/s", "bytes_per_s", 3.35e12),
    ("3.35 TBps", "bytes_per_s", 3.35e12),
    ("864 GB/s", "bytes_per_s", 864e9),
    ("1 GiB/s", "bytes_per_s", 2**30),
    ("38 GB/s", "bytes_per_s", 38e9),
    # FLOP/s, every spelling
    ("989.4 TFLOP/s", "flop_per_s", 989.4e12),
    ("989.4 TFLOPS", "flop_per_s", 989.4e12),
    ("2.25 Pflop/s", "flop_per_s", 2.25e15),
    ("624 TOP/s", "flop_per_s", 624e12),
    ("624 TOPS", "flop_per_s", 624e12),
    ("19.5 TFLOP/s", "flop_per_s", 19.5e12),
    # hertz
    ("1.98 GHz", "hz", 1.98e9),
    ("1410 MHz", "hz", 1.41e9),
    ("100 kHz", "hz", 1e5),
    ("5 Hz", "hz", 5),
    # seconds
    ("0.8 us", "seconds", 8e-7),
    ("0.8 µs", "seconds", 8e-7),
    ("5 ms", "seconds", 5e-3),
    ("560 ns", "seconds", 5.6e-7),
    ("2 s", "seconds", 2.0),
    (".5 ms", "seconds", 5e-4),
    # count and fraction
    ("132", "count", 132),
    ("75%", "fraction", 0.75),
    ("0.87", "fraction", 0.87),
    ("87 %", "fraction", 0.87),
])
def test_parse_quantity_accepts(text, dimension, expected):
    assert parse_quantity(text, dimension) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dimension", sorted(DIMENSIONS))
@pytest.mark.parametrize("value", [0, 3, 2.5, -1.25, 1e12])
def test_plain_numbers_are_si_in_every_dimension(dimension, value):
    assert parse_quantity(value, dimension) == float(value)
    assert parse_quantity(str(value), dimension) == pytest.approx(float(value))


@pytest.mark.parametrize("text, expected", [
    ("1e3 MHz", 1e9), ("1.5E-3 GHz", 1.5e6), ("  2 GHz  ", 2e9), ("+3 GHz", 3e9), ("-3 GHz", -3e9),
])
def test_number_syntax(text, expected):
    assert parse_quantity(text, "hz") == pytest.approx(expected)


def test_binary_prefix_is_bigger_than_decimal():
    for p in ("K", "M", "G", "T", "P"):
        binary = parse_quantity(f"1 {p}iB", "bytes")
        decimal = parse_quantity(f"1 {p if p != 'K' else 'k'}B", "bytes")
        assert binary > decimal
    assert parse_quantity("1 MiB", "bytes") / parse_quantity("1 MB", "bytes") == pytest.approx(
        1.048576)


# -- parse_quantity: errors -----------------------------------------------------------------------
@pytest.mark.parametrize("text, dimension", [
    ("3.35 GHz", "bytes_per_s"),    # a frequency where a bandwidth belongs
    ("3.35 TB", "bytes_per_s"),     # bytes where bytes/s belong
    ("50 MB/s", "bytes"),           # bytes/s where bytes belong
    ("50 Mb", "bytes"),             # bits are not bytes
    ("50 miB", "bytes"),            # lowercase binary prefix is not a prefix
    ("3 XB", "bytes"),              # no such prefix
    ("989 TB/s", "flop_per_s"),
    ("1.98 GB", "hz"),
    ("1.98 ghz", "hz"),             # units are case-sensitive
    ("1 min", "seconds"),
    ("5 Hz", "seconds"),
    ("5 k", "count"),
    ("5 B", "count"),
    ("5 B", "fraction"),
    ("5 %", "bytes"),
])
def test_mismatched_units_are_errors(text, dimension):
    with pytest.raises(UnitError) as e:
        parse_quantity(text, dimension)
    msg = str(e.value)
    assert "\n" not in msg
    assert "unit" in msg


@pytest.mark.parametrize("value", ["abc", "", "GB/s", "inf B", "nan"])
def test_unreadable_strings(value):
    with pytest.raises(UnitError, match="cannot read"):
        parse_quantity(value, "bytes")


def test_two_decimal_points_are_an_error():
    with pytest.raises(UnitError):
        parse_quantity("1.2.3 GB", "bytes")


@pytest.mark.parametrize("value", [True, False, None, [1], {"a": 1}])
def test_non_numbers(value):
    with pytest.raises(UnitError):
        parse_quantity(value, "count")


def test_unknown_dimension():
    with pytest.raises(UnitError, match="unknown dimension"):
        parse_quantity("1 B", "furlongs")


def test_unit_error_is_a_value_error():
    # pydantic turns ValueErrors raised in validators into validation errors; HwSpec relies on it
    assert issubclass(UnitError, ValueError)


# -- fmt_si ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, unit, expected", [
    (3.35e12, "B/s", "3.35 TB/s"),
    (989.4e12, "FLOP/s", "989 TFLOP/s"),
    (2.25e15, "FLOP/s", "2.25 PFLOP/s"),
    (1.98e9, "Hz", "1.98 GHz"),
    (52428800, "B", "52.4 MB"),
    (8e-7, "s", "800 ns"),
    (5.6e-7, "s", "560 ns"),
    (1.5e-3, "s", "1.5 ms"),
    (6e-6, "s", "6 µs"),
    (42, "B", "42 B"),
    (1000, "B", "1 kB"),
    (-2e9, "Hz", "-2 GHz"),
    (0, "B", "0 B"),
])
def test_fmt_si(value, unit, expected):
    assert fmt_si(value, unit) == expected


def test_fmt_si_digits():
    assert fmt_si(3.3512e12, "B/s", digits=5) == "3.3512 TB/s"
    assert fmt_si(3.3512e12, "B/s", digits=2) == "3.4 TB/s"


def test_fmt_si_nan():
    assert fmt_si(float("nan"), "B") == "nan B"


def test_fmt_si_rounding_across_a_prefix():
    assert fmt_si(999.9e9, "B/s") == "1 TB/s"


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1.0, max_value=1e17, allow_nan=False, allow_infinity=False))
def test_fmt_si_round_trips_through_parse_quantity_bandwidth(x):
    assert parse_quantity(fmt_si(x, "B/s", digits=15), "bytes_per_s") == pytest.approx(x, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e-9, max_value=999.0, allow_nan=False, allow_infinity=False))
def test_fmt_si_round_trips_through_parse_quantity_seconds(x):
    assert parse_quantity(fmt_si(x, "s", digits=15), "seconds") == pytest.approx(x, rel=1e-12)


def test_parse_quantity_never_returns_nan_for_good_input():
    for dim, text in (("bytes", "1 GiB"), ("hz", "1 GHz"), ("seconds", "1 us")):
        assert not math.isnan(parse_quantity(text, dim))
