"""The GEMM main loops nvcc scheduled in every cubin of a directory: per function, each loop (a
backward branch) holding 32 or more HMMA, as a string of its memory and math instructions and
the mean number of HMMA issued before each LDSM (lower: fragment loads issued earlier). Harness 7
left a no-op line out of some persistent stages and nvcc scheduled their main loop with the
ldmatrix one mma later, 7-12% slower (results/validation/h100/codegen_probe/): this looks for the
same in every kernel the suite and the calibration run. Needs cuobjdump (the device has it).

    device:  python3 bench/sass_loops.py bench/.cubin_cache --out $OUT/sass_loops.json
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import re
import subprocess
from pathlib import Path

CLASSES = {"HMMA": "H", "LDSM": "L", "LDGSTS": "G", "BAR": "B", "LDGDEPBAR": "D", "DEPBAR": "W",
           "STL": "S", "LDL": "R"}
INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)[^;]*;")


def loops_of(sass: str) -> list[dict]:
    out = []
    for fn_block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = fn_block.split("\n", 1)[0].strip()
        ins = [(int(m.group(1), 16), m.group(3), m.group(0)) for m in INSTR.finditer(fn_block)]
        addr_index = {a: i for i, (a, _, _) in enumerate(ins)}
        for i, (a, op, text) in enumerate(ins):
            if op != "BRA":
                continue
            m = re.search(r"(0x[0-9a-f]+)", text.split("BRA", 1)[1])
            if not m:
                continue
            tgt = int(m.group(1), 16)
            if tgt >= a or tgt not in addr_index:
                continue
            body = ins[addr_index[tgt]: i + 1]
            sig = "".join(CLASSES.get(o.split(".")[0], "") for _, o, _ in body)
            if sig.count("H") < 32:
                continue
            h, before = 0, []
            for ch in sig:
                if ch == "H":
                    h += 1
                elif ch == "L":
                    before.append(h)
            out.append({"function": name, "start": tgt, "end": a, "instructions": len(body), "hmma": sig.count("H"),
                        "ldsm": sig.count("L"), "spill_ops": sig.count("S") + sig.count("R"),
                        "hmma_before_ldsm": round(sum(before) / max(1, len(before)), 2), "signature": sig})
    # innermost loops only (an outer loop around a main loop holds the same instructions again)
    return [x for x in out if not any(y is not x and y["function"] == x["function"]
                                      and x["start"] <= y["start"] and y["end"] <= x["end"] for y in out)]


def one(path: Path) -> tuple[str, list[dict]]:
    p = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True)
    return path.stem, loops_of(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    files = sorted(Path(a.dir).glob("*.cubin"))
    with cf.ThreadPoolExecutor(16) as ex:
        res = dict(ex.map(one, files))
    Path(a.out).write_text(json.dumps(res))
    n = sum(len(v) for v in res.values())
    print(f"{len(files)} cubins, {n} GEMM main loops")


if __name__ == "__main__":
    main()
