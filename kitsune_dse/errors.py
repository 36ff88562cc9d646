"""User-facing errors.

Every problem the user can fix (a bad file, an unknown name, an impossible constraint) is raised
as a KitsuneError carrying one line that names where (file, field, node) and what is wrong. The
CLI prints that line and exits with code 2; tracebacks are shown only with --debug.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class KitsuneError(Exception):
    """An error in the user's input or request; its message is one complete line."""

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        self.what = message
        text = f"{where}: {message}" if where else message
        super().__init__(" ".join(text.split("\n")))


class InfeasibleError(KitsuneError):
    """A request no plan can satisfy, explained in the user's terms (stage, resource)."""


def closest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """A ' (did you mean ...?)' suffix listing the closest names, or '' when none is close."""
    cands = sorted(set(candidates))
    hits = difflib.get_close_matches(name, cands, n=n, cutoff=0.5)
    if not hits:
        hits = [c for c in cands if name.lower() in c.lower() or c.lower() in name.lower()][:n]
    return f" (did you mean {', '.join(repr(h) for h in hits)}?)" if hits else ""
