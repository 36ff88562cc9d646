"""`kitsune-dse calibrate`: microbenchmarks on this machine's GPU -> calibrated spec YAML."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kitsune_dse.errors import KitsuneError


def calibrate(base: str = "h100-sxm", out: Path | None = None, progress=None,
              raw_out: Path | None = None):
    """Run the microbenchmarks, fit, write the calibrated spec; returns (spec, residuals, raw)."""
    import yaml
    from kitsune_dse.calibrate.fit import calibrated_spec, check_finite
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.io import atomic_write_text
    try:
        import cupy
    except ImportError:
        raise KitsuneError("calibrate needs CuPy and an NVIDIA GPU: pip install 'kitsune-dse[gpu]'") from None
    from kitsune_dse.calibrate.microbench import run_all
    spec = load_spec(base)
    try:
        cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(0).compute_capability
    except Exception as e:  # CuPy raises its own runtime errors when no driver or GPU is usable
        raise KitsuneError(f"no usable NVIDIA GPU for calibration ({e.__class__.__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
    raw = run_all(progress)
    check_finite(raw)
    new, residuals = calibrated_spec(spec, raw)
    if out is not None:
        text = (f"# Calibrated from {base} by `kitsune-dse calibrate` on {raw['device'].get('device')}\n"
                f"# (microbenchmarks only; raw measurements in the calibration block's neighbour"
                f" file {Path(out).stem}.raw.json)\n")
        atomic_write_text(Path(out), text + yaml.safe_dump(new.model_dump(mode="json"), sort_keys=False))
    if raw_out is not None:
        atomic_write_text(Path(raw_out), json.dumps(raw, indent=1, default=str) + "\n")
    return new, residuals, raw


def register(app: typer.Typer) -> None:
    from kitsune_dse.cli import console

    @app.command("calibrate")
    def calibrate_cmd(base: str = typer.Option("h100-sxm", "--base", help="spec to start from"),
                      out: Optional[Path] = typer.Option(Path("hw_specs/h100-sxm.calibrated.yaml"), "--out")):
        """Measure this GPU (HBM and L2 bandwidth vs SMs, GEMM and FP32 rates, launch overhead,
        flag hand-off) and write a calibrated spec with the fit residuals."""
        from kitsune_dse.report.cli_cmds import _LazyProgress
        prog = _LazyProgress(console)
        try:
            spec, res, raw = calibrate(base, out, prog, Path(out).with_suffix(".raw.json"))
        finally:
            prog.close()
        console.print(f"wrote {out}: hbm {spec.hbm_per_sm_bandwidth_Bps / 1e9:.1f} GB/s per SM, "
                      f"max {spec.hbm_bandwidth_Bps * spec.efficiency.hbm / 1e12:.2f} TB/s "
                      f"(fit rms {res['hbm_rms_rel_error']:.1%}); sync {spec.sync_latency_s * 1e6:.2f} us")
