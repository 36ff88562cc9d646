"""sweep: the cross product in parallel, errors recorded, Dask gives the local results."""
from __future__ import annotations

import csv

import pytest

from kitsune_dse.cli import main
from kitsune_dse.report.sweep import run_sweep

MODELS = ["gpt3-mlp", "nerf-mlp"]
SPECS = ["h100-sxm", "a100-sxm-80gb"]
SETS = {}


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]


def test_sweep_local_parallel_records_failures(tmp_path):
    rows, wall = run_sweep(MODELS + ["no-such-model"], SPECS, out=tmp_path, jobs=2,
                           time_limit_s=5)
    assert len(rows) == 6
    bad = [r for r in rows if r["error"]]
    assert len(bad) == 2 and all("no-such-model" in r["error"] for r in bad)
    good = [r for r in rows if not r["error"]]
    assert all(r["speedup_vs_bsp"] >= 1 - 1e-9 for r in good)
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert len(_rows(tmp_path / "sweep.csv")) == 6


def test_sweep_on_dask_equals_local(tmp_path):
    distributed = pytest.importorskip("distributed")
    run_sweep(MODELS, SPECS, out=tmp_path / "local", jobs=1, time_limit_s=5)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        run_sweep(MODELS, SPECS, out=tmp_path / "dask", executor="dask",
                  scheduler=cluster.scheduler_address, time_limit_s=5)
    assert _rows(tmp_path / "local" / "sweep.csv") == _rows(tmp_path / "dask" / "sweep.csv")


def test_sweep_cli_bad_executor(tmp_path, capsys):
    rc = main(["sweep", "--models", "gpt3-mlp", "--hw", "h100-sxm", "--out", str(tmp_path),
               "--executor", "spark"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "executor" in err[0]
