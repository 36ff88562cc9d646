"""Time `compare` (every strategy on the whole model) on every zoo model x every shipped spec.

    python bench/compare_speed.py            # prints one line per pair, the slowest last
Target (issue 3): every pair under 2 s on a 2-core machine.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout too

from kitsune_dse.cost.compare import compare, compare_rows  # noqa: E402
from kitsune_dse.graph import list_models, load_model
from kitsune_dse.hw import list_specs, load_spec


def main() -> None:
    rows = []
    for m in sorted(list_models()):
        g = load_model(m)
        for h in sorted(list_specs()):
            spec = load_spec(h)
            t0 = time.perf_counter()
            res = compare_rows(compare(g, spec))
            dt = time.perf_counter() - t0
            by = {r["strategy"]: r for r in res}
            rows.append((dt, m, h, by))
            print(f"{m:22s} {h:28s} {dt:6.2f} s  pipeline x{by['pipeline']['speedup_vs_bsp']:.2f} "
                  f"DRAM {by['pipeline']['dram_change_vs_bsp'] * 100:+.0f}%  fusion "
                  f"x{by['fusion']['speedup_vs_bsp']:.2f}")
    worst = max(rows, key=lambda r: r[0])
    print(f"{len(rows)} pairs; slowest {worst[1]} on {worst[2]}: {worst[0]:.2f} s; "
          f"total {sum(r[0] for r in rows):.1f} s")


if __name__ == "__main__":
    main()
