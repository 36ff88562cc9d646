"""Atomic, deterministic report files.

Every file is written to a temporary file in the destination folder and renamed into place, so
a crash never leaves a half-written report; floats are printed with a fixed format so re-runs
with the same inputs give byte-identical files.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path

from kitsune_dse.errors import KitsuneError


def fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.9g}"
    if isinstance(v, (list, tuple)):
        return "|".join(fmt(x) for x in v)
    if v is None:
        return ""
    return str(v)


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    columns = columns or (list(rows[0].keys()) if rows else [])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([fmt(r.get(c)) for c in columns])
    atomic_write_text(path, buf.getvalue())


def write_json(path: Path, data) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def prepare_out_dir(out: Path) -> Path:
    """Create the output folder, or explain in one line why it cannot be used. Called before
    any work so a bad --out fails fast and leaves nothing behind."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise KitsuneError("--out: is a file, not a folder", where=str(out))
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        if created:
            try:
                out.rmdir()
            except OSError:
                pass
        raise KitsuneError(f"--out: cannot write there ({e.strerror or e})", where=str(out)) from None
    return out
