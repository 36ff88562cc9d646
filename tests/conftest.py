"""Shared pytest fixtures.

`cli`        run the command line in-process: `rc, out, err = cli(["hw", "show", "h100-sxm"])`.
`write_yaml` write a YAML file under tmp_path from a string or a Python object; returns its path.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml


class CliResult(NamedTuple):
    rc: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """Call `kitsune_dse.cli.main(argv)` and return (exit code, stdout, stderr).

    Exceptions that `main` lets through (e.g. with --debug) propagate to the test.
    """
    from kitsune_dse.cli import main

    def run(args) -> CliResult:
        capsys.readouterr()  # drop anything printed before this call
        rc = main([str(a) for a in args])
        cap = capsys.readouterr()
        return CliResult(rc, cap.out, cap.err)

    return run


@pytest.fixture
def write_yaml(tmp_path):
    """`write_yaml(content, name="x.yaml") -> Path`: a str is dedented and written as is
    (so it may be malformed on purpose); anything else is dumped with yaml.safe_dump."""

    def write(content, name: str = "file.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(textwrap.dedent(content), encoding="utf-8")
        else:
            path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
        return path

    return write
