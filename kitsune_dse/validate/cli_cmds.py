"""`kitsune-dse validate PLAN.json`: run a plan and its baselines on this machine's GPU."""
from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate(plan: Path = typer.Argument(..., help="plan.json (schema kitsune-dse/plan/v1)"),
                 out: Path = typer.Option(Path("."), "--out", help="folder for validation.csv"),
                 runs: int = typer.Option(30, "--runs", help="timed runs per variant (median, p10, p90)"),
                 retarget: bool = typer.Option(False, "--retarget",
                                               help="rescale a plan made for another SM count or arch"),
                 ncu: bool = typer.Option(False, "--ncu", help="also measure DRAM bytes with Nsight Compute"),
                 variants: str = typer.Option("", "--variants",
                                              help="comma list of plan,bsp-eager,bsp-graph,fusion,fusion-graph,cublas,cublas-graph"),
                 timeout_s: float = typer.Option(1.0, "--timeout-s",
                                                 help="a pipeline wait longer than this is reported as a deadlock"),
                 checks: int = typer.Option(2, "--checks", help="correctness runs on fresh random inputs")):
        """Run PLAN's regions and their baselines on the GPU: check every output against an fp32
        reference on fresh random inputs, time them (CUDA events, L2 flushed and warm), and write
        validation.csv with predicted against measured latency (and DRAM bytes with --ncu)."""
        from rich.console import Console

        from kitsune_dse.errors import KitsuneError
        from kitsune_dse.validate.harness import table, validate_plan
        if runs < 1:
            raise KitsuneError("--runs must be at least 1")
        console = Console(width=170)
        rows = validate_plan(plan, out_dir=out, runs=runs, retarget=retarget, ncu=ncu,
                             variants=[v for v in variants.split(",") if v] or None,
                             timeout_s=timeout_s, checks=checks, console=console)
        console.print(table(rows, title=f"validation of {plan.name}"))
        console.print(f"wrote {out / 'validation.csv'}")
        from kitsune_dse.validate.runtime import kernel_compiler_note
        note = kernel_compiler_note()
        if note:
            console.print(f"[yellow]note:[/yellow] {note}")
        bad = [r for r in rows if not r.get("correct")]
        if bad:
            for r in bad:
                console.print(f"[red]not correct[/red] region {r['region']} {r['variant']}: "
                              f"{r.get('error') or r.get('rel_err')}")
            raise typer.Exit(1)
