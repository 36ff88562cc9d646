"""Rebuild validation_ncu.csv here from a device run's ncu_raw.csv and ncu_order.json (when the
device's file limit left the CSV behind), then copy the run into the suite folder.

    python bench/collect_ncu.py DEVICE_DIR    # files fetched from the device's $OUT
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kitsune_dse.validate.harness import write_csv  # noqa: E402
from kitsune_dse.validate.ncu import parse_ncu_csv  # noqa: E402

NCU_COMMAND = ("ncu --clock-control none --replay-mode range "
               "--metrics dram__bytes_read.sum,dram__bytes_write.sum")


def main(src: Path) -> None:
    out = Path(tempfile.mkdtemp(prefix="suite-"))
    for name in ("validation.csv", "env.json", "log.txt", "ncu_log.txt"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    names = json.loads((src / "ncu_order.json").read_text())
    res = parse_ncu_csv((src / "ncu_raw.csv").read_text())
    rows = []
    for (wname, stem, region, variant, prd), r in zip(names, res):
        rows.append({"plan": f"{wname}/{stem}", "region": region, "variant": variant,
                     "predicted_dram_read_bytes": prd.get("dram_read_bytes", ""),
                     "predicted_dram_write_bytes": prd.get("dram_write_bytes", ""),
                     "measured_dram_read_bytes": r.get("dram__bytes_read.sum", float("nan")),
                     "measured_dram_write_bytes": r.get("dram__bytes_write.sum", float("nan")),
                     "correct": True, "command": NCU_COMMAND})
    write_csv(rows, out / "validation_ncu.csv")
    subprocess.run([sys.executable, str(ROOT / "bench" / "validate_suite.py"), "--collect", str(out)],
                   check=True)
    print(f"{len(rows)} ncu rows; collected from {src}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
