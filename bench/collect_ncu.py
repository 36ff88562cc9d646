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

sys.path.insert(0, str(ROOT / "bench"))

from kitsune_dse.validate.harness import write_csv  # noqa: E402
from kitsune_dse.validate.ncu import parse_ncu_csv  # noqa: E402
from validate_suite import ncu_rows  # noqa: E402


def main(src: Path) -> None:
    out = Path(tempfile.mkdtemp(prefix="suite-"))
    for name in ("validation.csv", "env.json", "log.txt", "ncu_log.txt"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    names = json.loads((src / "ncu_order.json").read_text())
    rows = ncu_rows(names, parse_ncu_csv((src / "ncu_raw.csv").read_text()))
    write_csv(rows, out / "validation_ncu.csv")
    subprocess.run([sys.executable, str(ROOT / "bench" / "validate_suite.py"), "--collect", str(out)],
                   check=True)
    print(f"{len(rows)} ncu rows; collected from {src}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
