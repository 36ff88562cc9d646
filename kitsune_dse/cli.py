"""The `kitsune-dse` command line: a thin typer layer over the Python API.

Every user error is a KitsuneError: printed as one line on stderr, exit code 2, and a traceback
only with --debug.
"""
from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from kitsune_dse.errors import KitsuneError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Decide how a DL model graph should run on a GPU, and prove it.")
graph_app = typer.Typer(no_args_is_help=True, help="Inspect model graphs.")
hw_app = typer.Typer(no_args_is_help=True, help="Inspect GPU hardware specs.")
models_app = typer.Typer(no_args_is_help=True, help="The model zoo.")
app.add_typer(graph_app, name="graph")
app.add_typer(hw_app, name="hw")
app.add_typer(models_app, name="models")

console = Console(width=160)
_state = {"debug": False}

SetOpt = typer.Option(None, "--set", help="Override a model size, e.g. --set tokens=64 (repeatable)")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")):
    _state["debug"] = debug


def parse_sets(items: Optional[list[str]], flag: str = "--set") -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items or []:
        if "=" not in item:
            raise KitsuneError(f"{flag} {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise KitsuneError(f"{flag} {item!r}: {v!r} is not an integer") from None
    return out


def parse_kv(items: Optional[list[str]], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise KitsuneError(f"{flag} {item!r}: expected FIELD=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _fmt_bytes(b: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b:.0f} B"


# -- graph -------------------------------------------------------------------------------------
@graph_app.command("show")
def graph_show(model: str = typer.Argument(..., help="zoo name, .yaml or .onnx path"),
               set_: Optional[list[str]] = SetOpt):
    """Print a model's ops with FLOPs, bytes, intensity and tile dependency patterns."""
    from kitsune_dse.graph import load_model
    g = load_model(model, parse_sets(set_))
    t = Table(title=f"{g.name}: {len(g.ops)} ops, {g.total_flops / 1e9:.4g} GFLOP", show_lines=False)
    for col in ("op", "kind", "class", "output shape", "dtype", "GFLOP", "read", "written",
                "FLOP/B", "unit", "patterns (input: pattern)"):
        t.add_column(col, justify="right" if col in ("GFLOP", "read", "written", "FLOP/B") else "left")
    for op in g.ops:
        i = op.info
        out = g.tensors[op.outputs[0]]
        pats = ", ".join(f"{k}:{v.value}" for k, v in i.patterns.items())
        t.add_row(op.name, op.kind, i.op_class.value + (" (view)" if i.is_view else ""),
                  "x".join(map(str, out.shape)), out.dtype, f"{i.flops / 1e9:.4g}",
                  _fmt_bytes(i.bytes_read), _fmt_bytes(i.bytes_written), f"{i.intensity:.3g}",
                  i.unit, pats)
    console.print(t)
    if g.meta.get("sizes"):
        console.print("sizes: " + ", ".join(f"{k}={v}" for k, v in g.meta["sizes"].items()))


# -- models ------------------------------------------------------------------------------------
@models_app.command("list")
def models_list():
    """List the zoo's models with their descriptions."""
    from kitsune_dse.graph import list_models
    from kitsune_dse.yamlio import read_yaml
    t = Table(title="model zoo")
    t.add_column("name")
    t.add_column("description")
    for name, path in list_models().items():
        data = read_yaml(path)
        t.add_row(name, str(data.get("description", "")) if isinstance(data, dict) else "")
    console.print(t)


# -- hw ----------------------------------------------------------------------------------------
@hw_app.command("list")
def hw_list():
    """List the shipped GPU specs."""
    from kitsune_dse.hw import list_specs, load_spec
    t = Table(title="GPU specs")
    for col in ("name", "GPU", "SMs", "fp16 TC TFLOP/s", "HBM TB/s", "L2 MiB"):
        t.add_column(col)
    for name, path in list_specs().items():
        s = load_spec(path)
        t.add_row(name, s.full_name, str(s.sm_count),
                  f"{s.tensor_peak_flop_per_s.get('fp16', 0) / 1e12:.4g}",
                  f"{s.hbm_bandwidth_Bps / 1e12:.3g}", f"{s.l2_bytes / 2**20:.4g}")
    console.print(t)


@hw_app.command("show")
def hw_show(name: str = typer.Argument(..., help="spec name or YAML path")):
    """Print every field of a GPU spec (SI units)."""
    from kitsune_dse.hw import load_spec
    s = load_spec(name)
    t = Table(title=f"{s.name}: {s.full_name}")
    t.add_column("field")
    t.add_column("value", justify="right")
    for k, v in s.model_dump(mode="json").items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                t.add_row(f"{k}.{k2}", f"{v2:.6g}" if isinstance(v2, float) else str(v2))
        elif isinstance(v, list):
            t.add_row(k, "; ".join(map(str, v)))
        else:
            t.add_row(k, f"{v:.6g}" if isinstance(v, float) else str(v))
    console.print(t)


def _register_optional_commands() -> None:
    """Commands of later boxes register themselves here when their modules exist."""
    import importlib
    for mod in ("kitsune_dse.cost.cli_cmds", "kitsune_dse.search.cli_cmds",
                "kitsune_dse.report.cli_cmds", "kitsune_dse.validate.cli_cmds",
                "kitsune_dse.calibrate.cli_cmds"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        m.register(app)


_register_optional_commands()


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        app(args=args, standalone_mode=False)
    except KitsuneError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except Exception as e:  # click usage errors carry their own exit codes
        usage, exits = _click_exceptions()
        if isinstance(e, usage):
            e.show()
            return 2
        if isinstance(e, exits):
            return e.exit_code
        if debug:
            raise
        print(f"internal error: {e.__class__.__name__}: {e} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1
    return 0


def _click_exceptions() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage-error classes, exit classes) of the click typer runs on: the click package, or
    the copy newer typer releases carry as typer._click (without the click package)."""
    import importlib
    usage, exits = [], [typer.Exit]
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        usage += [c for c in (getattr(mod, "ClickException", None),) if c]
        exits += [c for c in (getattr(mod, "Exit", None),) if c]
    return tuple(usage), tuple(exits)


if __name__ == "__main__":
    sys.exit(main())
