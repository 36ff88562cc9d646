"""Quantities with units, for input files and command-line values.

Inside the code everything is SI (seconds, bytes, FLOP, Hz). Input files and `--hw-set` may write
`3.35 TB/s`, `50 MiB`, `1.98 GHz`, `5 us`; a suffix that does not fit the field's dimension is an
error, never silently ignored.
"""
from __future__ import annotations

import re

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

# dimension -> accepted base unit spellings
DIMENSIONS = {
    "bytes": ("B",),
    "bytes_per_s": ("B/s", "Bps"),
    "flop_per_s": ("FLOP/s", "FLOPS", "flop/s", "OP/s", "OPS"),
    "hz": ("Hz",),
    "seconds": tuple(_TIME),
    "count": ("",),
    "fraction": ("", "%"),
}

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"


class UnitError(ValueError):
    pass


def parse_quantity(value: object, dimension: str) -> float:
    """Parse a number or a string like '3.35 TB/s' into SI units of `dimension`."""
    if isinstance(value, bool):
        raise UnitError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise UnitError(f"expected a number or a string with a unit, got {type(value).__name__}")
    text = value.strip().replace("_", "")
    m = re.fullmatch(_NUM + r"\s*(.*)", text)
    if not m:
        raise UnitError(f"cannot read {value!r} as a quantity")
    number, suffix = float(m.group(1)), m.group(2).strip()
    if dimension not in DIMENSIONS:
        raise UnitError(f"unknown dimension {dimension!r}")
    if suffix == "":
        return number
    if dimension == "seconds":
        if suffix in _TIME:
            return number * _TIME[suffix]
        raise UnitError(f"unit {suffix!r} is not a time (use s, ms, us or ns)")
    if dimension == "fraction":
        if suffix == "%":
            return number / 100.0
        raise UnitError(f"unit {suffix!r} is not a fraction (use a plain number or %)")
    for base in DIMENSIONS[dimension]:
        if base and suffix.endswith(base):
            prefix = suffix[: -len(base)]
            if prefix in _BINARY:
                return number * _BINARY[prefix]
            if prefix in _DECIMAL:
                return number * _DECIMAL[prefix]
    expected = " or ".join(b for b in DIMENSIONS[dimension] if b)
    if not expected:
        raise UnitError(f"unit {suffix!r} does not fit this field (expected a plain number)")
    raise UnitError(f"unit {suffix!r} does not fit this field (expected {expected}, "
                    f"with an optional prefix such as k, M, G, T, Ki, Mi, Gi)")


def fmt_si(value: float, unit: str, digits: int = 3) -> str:
    """Display helper: 3.35e12, 'B/s' -> '3.35 TB/s'."""
    if value == 0 or value != value:
        return f"{value:g} {unit}"
    for p, f in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0),
                 ("m", 1e-3), ("µ", 1e-6), ("n", 1e-9)):
        # compare after rounding, so 999.9e9 shows as 1 T rather than 1e+03 G
        if abs(float(f"{value:.{digits}g}")) >= f:
            return f"{float(f'{value:.{digits}g}') / f:.{digits}g} {p}{unit}"
    return f"{value:.{digits}g} {unit}"
