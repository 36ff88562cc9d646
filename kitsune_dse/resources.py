"""Where the shipped model zoo and GPU specs live.

Installed, they are package data (kitsune_dse/data/...); in a source checkout they are the
top-level models/ and hw_specs/ folders. KITSUNE_DSE_MODELS / KITSUNE_DSE_HW_SPECS add folders.
"""
from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def _dirs(kind: str, env: str) -> list[Path]:
    out: list[Path] = []
    if os.environ.get(env):
        out += [Path(p) for p in os.environ[env].split(os.pathsep) if p]
    out.append(_REPO / kind)
    # installed: package data beside the code (kitsune_dse/data/<kind>, a namespace package:
    # importlib.resources gives a MultiplexedPath there, whose str() is not a path)
    out.append(Path(__file__).resolve().parent / "data" / kind)
    seen, uniq = set(), []
    for d in out:
        if d.is_dir() and d.resolve() not in seen:
            seen.add(d.resolve())
            uniq.append(d)
    return uniq


def catalogue(kind: str, env: str) -> dict[str, Path]:
    """name -> YAML path; earlier folders win."""
    found: dict[str, Path] = {}
    for d in _dirs(kind, env):
        for p in sorted(d.glob("*.yaml")):
            found.setdefault(p.stem, p)
    return found


def models() -> dict[str, Path]:
    return catalogue("models", "KITSUNE_DSE_MODELS")


def hw_specs() -> dict[str, Path]:
    return catalogue("hw_specs", "KITSUNE_DSE_HW_SPECS")
