"""Memo tables for pure cost functions whose arguments include a HwSpec.

The search prices the same stage (equal KernelWork records on the same spec) under many stage
cuts, tile sizes and SM splits, and the same plan at many SM splits: memoising those calls
removes most of the candidate build's work without changing a number (a hit returns exactly
what the call returned the first time).

A HwSpec is not hashable (it has dict fields), so each spec object gets its own tables, dropped
when the spec is garbage collected: an id is never looked up again once it could name another
spec. A table that reaches MAX_ENTRIES starts again empty (memory stays bounded on long sweeps).
"""
from __future__ import annotations

import weakref

MAX_ENTRIES = 1 << 13

_TABLES: dict[int, dict[str, dict]] = {}


def table(spec, name: str) -> dict:
    """The memo table `name` of this spec object (created empty on first use)."""
    per = _TABLES.get(id(spec))
    if per is None:
        per = _TABLES[id(spec)] = {}
        weakref.finalize(spec, _TABLES.pop, id(spec), None)
    t = per.get(name)
    if t is None or len(t) >= MAX_ENTRIES:
        t = per[name] = {}
    return t
