"""CLI commands that compute and write reports: compare, explore, evaluate."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table



def _fmt_b(b: float) -> str:
    return f"{b / 1e6:,.1f} MB"


def _strategy_table(title: str, rows: list[dict]) -> Table:
    t = Table(title=title)
    for c in ("strategy", "latency", "DRAM read", "DRAM write", "launches", "speedup vs bsp",
              "DRAM vs bsp"):
        t.add_column(c, justify="left" if c == "strategy" else "right")
    for r in rows:
        t.add_row(r["strategy"], f"{r['latency_s'] * 1e6:,.1f} µs", _fmt_b(r["dram_read_bytes"]),
                  _fmt_b(r["dram_write_bytes"]), str(r["kernel_launches"]),
                  f"{r['speedup_vs_bsp']:.2f}x", f"{r['dram_change_vs_bsp'] * 100:+.1f}%")
    return t


class _LazyProgress:
    """A progress bar that appears only once a run has taken longer than a second."""

    def __init__(self, console):
        self.console, self.t0, self.bar, self.task = console, time.perf_counter(), None, None

    def __call__(self, done: int, total: int, what: str = "candidates"):
        if self.bar is None:
            if time.perf_counter() - self.t0 < 1.0:
                return
            from rich.progress import Progress
            self.bar = Progress(console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(what, total=total)
        self.bar.update(self.task, completed=done, total=total, description=what)

    def close(self):
        if self.bar is not None:
            self.bar.stop()


def register(app: typer.Typer) -> None:
    from kitsune_dse.cli import console, parse_kv, parse_sets
    register_sweep(app)

    @app.command("compare")
    def compare_cmd(model: str = typer.Argument(..., help="zoo name, .yaml or .onnx path"),
                    hw: str = typer.Option("h100-sxm", "--hw", help="GPU spec name or YAML path"),
                    out: Optional[Path] = typer.Option(None, "--out", help="folder for strategies.csv"),
                    set_: Optional[list[str]] = typer.Option(None, "--set", help="size override NAME=VALUE"),
                    hw_set: Optional[list[str]] = typer.Option(None, "--hw-set", help="spec override FIELD=VALUE")):
        """Every strategy applied to the whole model: latency, DRAM traffic, launches."""
        from kitsune_dse.cost.compare import compare, compare_rows
        from kitsune_dse.graph import load_model
        from kitsune_dse.hw import load_spec, spec_with_overrides
        from kitsune_dse.report.explore import STRATEGY_COLUMNS
        from kitsune_dse.report.io import prepare_out_dir, write_csv
        spec = load_spec(hw)
        if hw_set:
            spec = spec_with_overrides(spec, parse_kv(hw_set, "--hw-set"))
        graph = load_model(model, parse_sets(set_))
        if out is not None:
            prepare_out_dir(out)
        rows = compare_rows(compare(graph, spec))
        console.print(_strategy_table(f"{graph.name} on {spec.name}", rows))
        if out is not None:
            write_csv(out / "strategies.csv", rows, STRATEGY_COLUMNS)
            console.print(f"wrote {out / 'strategies.csv'}")

    @app.command("explore")
    def explore_cmd(model: str = typer.Argument(..., help="zoo name, .yaml or .onnx path"),
                    hw: str = typer.Option("h100-sxm", "--hw", help="GPU spec name or YAML path"),
                    out: Optional[Path] = typer.Option(None, "--out", help="output folder (default results/<model>__<spec>/)"),
                    set_: Optional[list[str]] = typer.Option(None, "--set", help="size override NAME=VALUE"),
                    objective: str = typer.Option("latency", "--objective", help="latency | traffic | pareto"),
                    sm_granularity: int = typer.Option(1, "--sm-granularity", help="SMs per stage in steps of N"),
                    time_limit: float = typer.Option(10.0, "--time-limit", help="solver time limit in seconds"),
                    alternatives: int = typer.Option(0, "--alternatives", help="also write the K next-best plans (each with another set of regions, strategies or pipeline cuts)"),
                    hw_set: Optional[list[str]] = typer.Option(None, "--hw-set", help="spec override FIELD=VALUE, e.g. l2_bytes=100MiB"),
                    no_plots: bool = typer.Option(False, "--no-plots", help="skip the PNGs and trace.json")):
        """Choose regions, strategies, stages, SMs and queue depths; write the plan and reports."""
        from kitsune_dse.report.explore import explore
        prog = _LazyProgress(console)
        try:
            res = explore(model, hw, out=out, sets=parse_sets(set_), objective=objective,
                          sm_granularity=sm_granularity, time_limit_s=time_limit,
                          alternatives=alternatives, hw_set=parse_kv(hw_set, "--hw-set"),
                          plots=not no_plots, progress=prog)
        finally:
            prog.close()
        _print_summary(console, res.plan, res.strategies)
        console.print(f"wrote {', '.join(str(p) for p in res.files)}")

    @app.command("evaluate")
    def evaluate_cmd(plan_path: Path = typer.Argument(..., help="a plan.json (possibly edited by hand)"),
                     hw: Optional[str] = typer.Option(None, "--hw", help="GPU spec (default: the plan's)"),
                     out: Optional[Path] = typer.Option(None, "--out", help="folder for the evaluated plan")):
        """Check and predict a plan written or edited by hand."""
        from kitsune_dse.graph import load_model
        from kitsune_dse.hw import load_spec
        from kitsune_dse.report.explore import PLAN_COLUMNS, plan_rows
        from kitsune_dse.report.io import prepare_out_dir, write_csv, write_json
        from kitsune_dse.report.plan import evaluate_plan, read_plan
        plan = read_plan(plan_path)
        spec = load_spec(hw or plan["hw"]["name"])
        graph = load_model(plan["model"].get("ref", plan["model"]["name"]), plan["model"].get("sizes", {}))
        outdir = prepare_out_dir(out) if out is not None else None
        new = evaluate_plan(plan, graph, spec, where=str(plan_path))
        t = Table(title=f"{plan_path} on {spec.name}")
        for c in ("region", "strategy", "ops", "SMs per stage", "latency", "DRAM"):
            t.add_column(c)
        for r in new["regions"]:
            t.add_row(str(r["id"]), r["strategy"], ",".join(r["ops"]),
                      "/".join(str(s["sms"]) for s in r["stages"]) or "-",
                      f"{r['predicted']['latency_s'] * 1e6:,.1f} µs", _fmt_b(r["predicted"]["dram_bytes"]))
        t.add_row("total", "", "", "", f"{new['predicted']['latency_s'] * 1e6:,.1f} µs",
                  _fmt_b(new["predicted"]["dram_bytes"]))
        console.print(t)
        if outdir is not None:
            write_json(outdir / "plan.json", new)
            write_csv(outdir / "plan.csv", plan_rows(new), PLAN_COLUMNS)
            console.print(f"wrote {outdir / 'plan.json'}, {outdir / 'plan.csv'}")


def register_sweep(app: typer.Typer) -> None:
    from kitsune_dse.cli import console, parse_kv, parse_sets

    @app.command("sweep")
    def sweep_cmd(models: str = typer.Option(..., "--models", help="comma-separated zoo names or paths ('all' for the zoo)"),
                  hw: str = typer.Option(..., "--hw", help="comma-separated spec names or paths ('all' for the shipped specs)"),
                  out: Path = typer.Option(Path("results/sweep"), "--out", help="folder for sweep.csv and sweep.png"),
                  set_: Optional[list[str]] = typer.Option(None, "--set", help="size override NAME=VALUE"),
                  hw_set: Optional[list[str]] = typer.Option(None, "--hw-set", help="spec override FIELD=VALUE"),
                  objective: str = typer.Option("latency", "--objective"),
                  time_limit: float = typer.Option(10.0, "--time-limit"),
                  sm_granularity: int = typer.Option(1, "--sm-granularity"),
                  jobs: int = typer.Option(1, "--jobs", help="parallel processes"),
                  executor: str = typer.Option("local", "--executor", help="local | dask"),
                  scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Dask scheduler tcp://HOST:PORT")):
        """Explore every model x spec combination; one row each in sweep.csv."""
        from kitsune_dse.graph import list_models
        from kitsune_dse.hw import list_specs
        from kitsune_dse.report.sweep import run_sweep
        ms = sorted(list_models()) if models.strip() == "all" else [m.strip() for m in models.split(",") if m.strip()]
        ss = ([s for s in sorted(list_specs()) if "calibrated" not in s] if hw.strip() == "all"
              else [s.strip() for s in hw.split(",") if s.strip()])
        prog = _LazyProgress(console)
        try:
            rows, wall = run_sweep(ms, ss, out=out, sets=parse_sets(set_), hw_set=parse_kv(hw_set, "--hw-set"),
                                   objective=objective, time_limit_s=time_limit,
                                   sm_granularity=sm_granularity, jobs=jobs, executor=executor,
                                   scheduler=scheduler, progress=prog)
        finally:
            prog.close()
        t = Table(title=f"sweep: {len(rows)} combinations in {wall:.1f} s")
        for c in ("model", "spec", "plan", "vs bsp", "vs fusion", "DRAM vs bsp", "status / error"):
            t.add_column(c)
        for r in rows:
            if r.get("error"):
                t.add_row(r["model"], r["spec"], "", "", "", "", r["error"][:60])
            else:
                t.add_row(r["model"], r["spec"], f"{r['plan_latency_s'] * 1e6:,.1f} µs",
                          f"{r['speedup_vs_bsp']:.2f}x", f"{r['speedup_vs_fusion']:.2f}x",
                          f"{-r['dram_reduction_vs_bsp'] * 100:+.0f}%", str(r["solver_status"]))
        console.print(t)
        console.print(f"wrote {out / 'sweep.csv'}")


def _print_summary(console, plan: dict, rows: list[dict]) -> None:
    by = {r["strategy"]: r for r in rows}
    t = Table(title=f"{plan['model']['name']} on {plan['hw']['name']}: plan vs baselines "
                    f"(solver {plan['solver'].get('status')}, gap {plan['solver'].get('gap', 0):.2%})")
    for c in ("", "latency", "DRAM traffic", "speedup of plan", "traffic change of plan"):
        t.add_column(c, justify="right")
    p = by["plan"]
    for name in ("plan", "bsp", "fusion"):
        r = by[name]
        sp = r["latency_s"] / p["latency_s"] if p["latency_s"] else float("nan")
        tc = p["dram_bytes"] / r["dram_bytes"] - 1 if r["dram_bytes"] else 0.0
        t.add_row(name, f"{r['latency_s'] * 1e6:,.1f} µs", _fmt_b(r["dram_bytes"]),
                  "" if name == "plan" else f"{sp:.2f}x", "" if name == "plan" else f"{tc * 100:+.1f}%")
    console.print(t)
    regions = ", ".join(f"{r['strategy']}[{len(r['ops'])} ops"
                        + (f", SMs {'/'.join(str(s['sms']) for s in r['stages'])}" if r["stages"] else "")
                        + "]" for r in plan["regions"][:12])
    console.print(f"regions: {regions}" + (" ..." if len(plan["regions"]) > 12 else ""))
