"""The one-stage persistent GEMM grid (bench/gemm_grid_probe.sh) beside the model: measured
time, the model's (calibrated harness spec), ncu's DRAM bytes of the timed run against the A and
C operands' sizes, and L2's hit rate. Also writes DIR/grid.csv: one row per case with the device,
driver, date and command of the timed run, its times, ncu's bytes and hit rate.

    python bench/gemm_grid_report.py results/validation/h100/gemm_probe/grid_2026-11-23
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kitsune_dse.calibrate.fit import persistent_gemm_time  # noqa: E402
from kitsune_dse.hw import load_spec  # noqa: E402


def main() -> None:
    src = Path(sys.argv[1])
    spec = load_spec(ROOT / "hw_specs/h100-sxm.calibrated.yaml")
    timed = json.loads((src / "time/gemm_probe.json").read_text())
    rows = timed["rows"]
    kernels: dict[int, dict] = {}
    for r in csv.reader((src / "ncu.csv").open()):
        if r and r[0].isdigit():
            kernels.setdefault(int(r[0]), {})[r[12]] = float(r[14].replace(",", ""))
    ids = sorted(kernels)
    per = len(ids) // len(rows)
    table = []
    print(f"{'m x n x k @ SMs':>22s} {'meas us':>8s} {'model':>8s} {'err':>7s} {'read MB':>8s} "
          f"{'A MB':>7s} {'write MB':>8s} {'C MB':>7s} {'L2 hit':>6s} {'read TB/s':>9s}")
    for i, r in enumerate(rows):
        m, n, k = r["dims"]
        t = r["time_s"]
        last = kernels[ids[i * per + per - 1]]
        p = persistent_gemm_time(spec, m, n, k, r["sms"])
        rd, wr = last["dram__bytes_read.sum"] / 1e6, last["dram__bytes_write.sum"] / 1e6
        print(f"{m:>7d}x{n:>5d}x{k:>5d} @{r['sms']:>3d} {t * 1e6:8.1f} {p * 1e6:8.1f} {p / t - 1:+7.1%} "
              f"{rd:8.1f} {m * k * 2 / 1e6:7.1f} {wr:8.1f} {m * n * 2 / 1e6:7.1f} "
              f"{last['lts__t_sector_hit_rate.pct']:6.1f} {rd / 1e6 / t:9.2f}")
        table.append({"device": timed["env"].get("gpu"), "driver": timed["env"].get("driver_version"),
                      "date": timed["date"], "command": timed["command"], "m": m, "n": n, "k": k,
                      "sms": r["sms"], "time_s": t, "p10_s": r["p10_s"], "p90_s": r["p90_s"],
                      "correct": r["correct"], "dram_read_bytes": rd * 1e6, "dram_write_bytes": wr * 1e6,
                      "l2_hit_pct": last["lts__t_sector_hit_rate.pct"], "model_s": p})
    with (src / "grid.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)


if __name__ == "__main__":
    main()
