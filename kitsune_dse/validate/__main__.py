"""`python -m kitsune_dse.validate PLAN.json [--out DIR] [--runs N] [--retarget] [--ncu]`: the
validate command on its own (needs only CuPy, typer and rich: no pydantic, no OR-Tools)."""
from __future__ import annotations

import sys

import typer

from kitsune_dse.errors import KitsuneError
from kitsune_dse.validate.cli_cmds import register

app = typer.Typer(add_completion=False)
register(app)


def main() -> int:
    try:
        app(args=sys.argv[1:], standalone_mode=False)
    except KitsuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except typer.Exit as e:
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
