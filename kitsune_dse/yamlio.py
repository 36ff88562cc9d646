"""YAML reading with errors that name the file and line."""
from __future__ import annotations

from pathlib import Path

import yaml

from kitsune_dse.errors import KitsuneError


def read_yaml(path: Path) -> object:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KitsuneError("file not found", where=str(path)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise KitsuneError(f"cannot read: {e.__class__.__name__}", where=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise KitsuneError(f"{line}malformed YAML: {problem}", where=str(path)) from None
