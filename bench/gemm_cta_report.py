"""What the calibration's standalone GEMMs do CTA by CTA, from the records
`bench/gemm_clock_probe.py --records` writes (gemm_ctas.csv.gz: each traced CTA's SM, start,
end and SM cycles; here, no GPU):

- the time of a CTA beside another on its SM (`pair_us`, the median over CTAs that shared
  their SM nearly all their life) and of a CTA alone (`lone_us`): a lone CTA's share of its
  SM's rate is pair / (2 lone);
- SM cycles per K slab of 64 of a paired CTA (`cyc_per_slab`) and the same in nanoseconds;
- the kernel's span in paired CTA times (`X`) against the two schedules a model could assume:
  whole rounds of two CTAs per SM, ceil(T / S) / 2 (`X - ceil/2`), and the tiles spread evenly,
  T / 2S (`X - T/2S`).

    python bench/gemm_cta_report.py results/validation/h100/clock_probe/cta_trace_2026-11-24/gemm_ctas.csv.gz
"""
from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd

SMS = 132


def shared_share(g: pd.DataFrame) -> np.ndarray:
    """Per CTA, the share of its life another CTA ran on its SM."""
    out = np.zeros(len(g))
    for _, idx in g.groupby("smid").indices.items():
        s = g["start_ns"].to_numpy()[idx]
        e = g["end_ns"].to_numpy()[idx]
        for j, i in enumerate(idx):
            overlap = np.clip(np.minimum(e, e[j]) - np.maximum(s, s[j]), 0, None).sum() - (e[j] - s[j])
            out[i] = overlap / max(1, e[j] - s[j])
    return out


def report(path: str) -> pd.DataFrame:
    d = pd.read_csv(path, comment="#")
    rows = []
    for shape, runs in d.groupby("shape", sort=False):
        m, n, k = map(int, shape.split("x"))
        per_run = []
        for _, g in runs.groupby("run"):
            g = g.reset_index(drop=True)
            dur = (g["end_ns"] - g["start_ns"]).to_numpy()
            share = shared_share(g)
            paired, lone = dur[share > 0.9], dur[share < 0.1]
            pair = float(np.median(paired)) if paired.size else math.nan
            span = float(g["end_ns"].max() - g["start_ns"].min())
            cyc = g["cycles"].to_numpy()[share > 0.9]
            per_run.append((pair, float(np.median(lone)) if lone.size else math.nan, span,
                            float(np.median(cyc)) if cyc.size else math.nan, len(g)))
        pair, lone, span, cyc, tiles = (float(np.median([r[i] for r in per_run])) for i in range(5))
        slabs = math.ceil(k / 64)
        x = span / pair if pair == pair else math.nan
        rows.append({"shape": shape, "tiles": int(tiles), "span_us": span / 1e3, "pair_us": pair / 1e3,
                     "lone_us": lone / 1e3, "lone_share": pair / (2 * lone) if lone == lone else math.nan,
                     "cyc_per_slab": cyc / slabs, "ns_per_slab": pair / slabs,
                     "X": x, "X - ceil/2": x - math.ceil(tiles / SMS) / 2, "X - T/2S": x - tiles / (2 * SMS)})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    pd.set_option("display.width", 200)
    print(report(sys.argv[1]).round(3).to_string(index=False))
