"""Step by step inside one-stage persistent kernels: when each step's items of each row-block
start (their waits done) and end. The question (issue 6): dlrm's one-stage chains measured
fc2 (2048 x 1024 x 1024, 128 items) 3.8 us longer a step than fc3 (2048 x 512 x 1024, 64
items, the same item shape and K), where the model prices both alike (suite regions of
explorer-2, -4 and -5). Is an item slower when more SMs load their operands at once, or does
the step start later?

Cases: dlrm's one-stage plan regions, and one-step GEMM pipelines of dlrm's shapes and their
neighbours (items 64-256 on 64-132 SMs, calibrate_device.pipe_region). Each case is timed cold
as the calibration times it (CUDA events behind the L2 flush, the median of --runs), then run
traced (lower.layout_pipeline(trace=True): per step and row-block the first and last start,
the first and last end) --trace-runs times cold; the medians over the traced runs are kept.

Other modes: --forms times every suite pipeline region in both cursor forms; --gaps stamps a
1-thread kernel before and after each region's (untraced) kernel to split its time into the
workers' span and what lies outside it (launch, exit); --spills (here, nvcc) records ptxas's
stack frame and spill bytes of each kernel. --fills random,zeros and --poisons 1,0 run the
traced cases under those input data and output poisoning.

    here:    python bench/step_trace_probe.py --precompile [--forms | --gaps]
    device:  python3 bench/step_trace_probe.py --out $OUT [--runs 30] [--trace-runs 5]
             python3 bench/step_trace_probe.py --gaps --out $OUT [--runs 20]
    here:    python bench/step_trace_probe.py --spills DIR
             python bench/step_trace_probe.py --report DIR      # with the model's step times
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
if (ROOT / "bench/.cubin_cache").is_dir():
    os.environ.setdefault("KDSE_CUBIN_CACHE", str(ROOT / "bench/.cubin_cache"))

PLAN_REGIONS = [("dlrm-top-mlp/plans/explorer-5.json", 0), ("dlrm-top-mlp/plans/explorer-2.json", 0),
                ("dlrm-top-mlp/plans/explorer-4.json", 0), ("dlrm-top-mlp/plans/explorer-3.json", 1),
                ("dlrm-top-mlp/plans/hand-p1-132-r128.json", 0)]
# (M, N, K) @ SMs: dlrm's fc1, fc2, fc3 alone; the same item count at another N; fc2 on half the
# SMs (two items an SM); twice the items
ONE_STEP = [((2048, 1024, 512), 132), ((2048, 1024, 1024), 132), ((2048, 512, 1024), 132),
            ((1024, 1024, 1024), 132), ((2048, 1024, 1024), 64), ((2048, 2048, 1024), 132),
            ((4096, 1024, 1024), 132), ((2048, 256, 1024), 132)]
TRACE_KEYS = ("step_rb_start_us", "step_rb_last_start_us", "step_rb_first_done_us", "step_rb_done_us")


def cases(info=None):
    """(label, graph, region dict) of every case."""
    from calibrate_device import pipe_region

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.plan import load_plan
    out = []
    for rel, ri in PLAN_REGIONS:
        plan = load_plan(ROOT / "bench/suite" / rel)
        g = load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
        out.append((f"{Path(rel).stem} r{ri}", g, plan["regions"][ri]))
    for dims, sms in ONE_STEP:
        g, region = pipe_region("matmul", dims, sms)
        out.append((f"gemm {'x'.join(map(str, dims))}@{sms}", g, region))
    return out


def variants(info, g, region):
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    reg = Region(g, region)
    t = Tensors(reg)
    return (PipelineVariant("plan", reg, t, info, region, 1.0),
            PipelineVariant("traced", reg, t, info, region, 1.0, trace=True))


def fill_inputs(v, fill: str = "random") -> None:
    """Random inputs like the suite's (`check_variant`), or zeros: times depend on the data
    (dlrm explorer-2's region 36.9-37.5 us on uninitialised buffers, 38.0 us on random ones)."""
    from kitsune_dse.validate.harness import _fill_inputs
    from kitsune_dse.validate.reference import input_roles
    reg = v.tensors.reg
    if fill == "zeros":
        for t in reg.inputs:
            v.tensors.get(t).fill(0)
    else:
        _fill_inputs(reg, v.tensors, input_roles(reg))


def suite_regions():
    """(label, graph, region dict) of every distinct pipeline region of the suite's plans."""
    import glob

    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.plan import load_plan
    out, seen = [], set()
    for p in sorted(glob.glob(str(ROOT / "bench/suite/*/plans/*.json"))):
        plan = load_plan(p)
        g = None
        for i, r in enumerate(plan["regions"]):
            if r["strategy"] != "pipeline":
                continue
            key = (Path(p).parts[-3], json.dumps(plan["model"].get("sizes"), sort_keys=True),
                   json.dumps({k: r[k] for k in ("stages", "queues")}, sort_keys=True))
            if key in seen:
                continue
            seen.add(key)
            g = g or load_model(resolve_model_ref(plan), plan["model"].get("sizes") or {})
            out.append((f"{Path(p).parts[-3]}/{Path(p).stem} r{i}", g, r))
    return out


@contextlib.contextmanager
def cursors(form: str | None):
    """KDSE_CURSORS=form while building (codegen reads it; prepare() builds again); None: as is."""
    old = os.environ.get("KDSE_CURSORS")
    if form is not None:
        os.environ["KDSE_CURSORS"] = form
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KDSE_CURSORS", None)
        else:
            os.environ["KDSE_CURSORS"] = old


def plain_in(form: str, info, g, region):
    """The untraced variant built with KDSE_CURSORS=form."""
    with cursors(form):
        v = variants(info, g, region)[0]
        v.build()
        return v


FORMS = ("carried", "stateless")
TEAM_COUNTS = (2, 1)    # the default (two 256-thread teams an SM, 128 registers) and one team


def team_variant(info, g, region, teams: int):
    from kitsune_dse.validate.lower import Region
    from kitsune_dse.validate.runtime import PipelineVariant, Tensors
    reg = Region(g, region)
    return PipelineVariant("plan", reg, Tensors(reg), info, region, 1.0, teams=teams)


def time_alternatives(a, cases, alts: dict, csv_name: str) -> None:
    """Each case's alternatives (prefix -> (make(info, g, region), cursor form or None)) timed
    cold, alternating, 2 reps, random inputs, with each kernel's registers and local frame:
    columns PREFIX_regs, PREFIX_local_bytes, PREFIX_us_0, PREFIX_us_1."""
    import cupy as cp

    from kitsune_dse.validate.measure import time_runs
    from tilesync_probe import probe_session, timing_fields, write_rows
    info, stream, flush, stamp = probe_session(a.out, "step_trace_probe.py")
    rows = []
    for label, g, region in cases:
        row = {**stamp, "case": label}
        vs = {k: (make(info, g, region), form) for k, (make, form) in alts.items()}
        for rep in range(2):
            for k, (v, form) in vs.items():
                with stream:
                    with cursors(form):
                        v.prepare()
                    fill_inputs(v)
                    t = time_runs(v.run, v.pre, v.after, stream, a.runs, 3, flush)
                res = v.resources[codegen_kernel()]
                row[f"{k}_regs"], row[f"{k}_local_bytes"] = res["num_regs"], res["local_bytes"]
                row[f"{k}_us_{rep}"] = timing_fields(t)["time_us"]
                v.tensors.arrays.clear()
                cp.get_default_memory_pool().free_all_blocks()
        rows.append(row)
        print(f"{label:58s} " + " ".join(f"{k}: {row[f'{k}_regs']:3d} regs {row[f'{k}_local_bytes']:4d} B "
                                          f"{row[f'{k}_us_0']:9.2f} {row[f'{k}_us_1']:9.2f}" for k in alts), flush=True)
    write_rows(Path(a.out or ".") / csv_name, rows)


def run_forms(a) -> None:
    """Every suite pipeline region in both cursor forms."""
    time_alternatives(a, suite_regions(), {f: (lambda i, g, r, f=f: plain_in(f, i, g, r), f) for f in FORMS},
                      "cursor_forms.csv")


def run_teams(a) -> None:
    """Every gap case's plain kernel with two teams an SM (512 threads, 128 registers: ptxas
    spills) and with one (256 threads, up to 255 registers)."""
    time_alternatives(a, gap_cases(), {f"t{n}": (lambda i, g, r, n=n: team_variant(i, g, r, n), None)
                                       for n in TEAM_COUNTS}, "teams.csv")


# one thread writes %globaltimer into p[i]: kernels on the same stream before and after a pipeline
STAMP_SRC = r"""extern "C" __global__ void kdse_stamp(unsigned long long* p, int i) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (threadIdx.x == 0) p[i] = t;
}
"""


def gap_cases():
    """cases() and then every other suite pipeline region (labels made unique)."""
    seen, out = set(), []
    for label, g, region in cases():
        seen.add(label)
        out.append((label, g, region))
    for label, g, region in suite_regions():
        short = label.split("/", 1)[1] if label.startswith("dlrm-top-mlp/") else label
        if short not in seen:
            out.append((label, g, region))
    return out


def run_gaps(a) -> None:
    """Where a pipeline's time outside its workers' span goes: a stamp kernel before and after
    the (untraced) pipeline on the same stream, behind the L2 flush, random inputs. Per cold
    run: the events' time, the workers' span (first start to last end, %globaltimer), the gap
    from the stamp before to the first worker's start and from the last worker's end to the
    stamp after; medians over --runs. A stamp-stamp pair with nothing between is the floor."""
    import cupy as cp
    import numpy as np

    from kitsune_dse.validate.runtime import compile_module
    from tilesync_probe import probe_session, write_rows
    info, stream, flush, stamp = probe_session(a.out, "step_trace_probe.py")
    fn = compile_module(STAMP_SRC, info.arch).get_function("kdse_stamp")
    buf = cp.zeros(2, dtype=cp.uint64)

    def stamped(v):
        vals = []
        for k in range(a.runs + 3):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            with stream:   # pre() works on the current stream: the probe's, as the pipeline's
                if v is not None:
                    v.pre(True)
                flush(stream)
                fn((1,), (32,), (buf, np.int32(0)))
                e0.record(stream)
                if v is not None:
                    v.run(stream)
                e1.record(stream)
                fn((1,), (32,), (buf, np.int32(1)))
            stream.synchronize()
            if v is None:
                b = buf.get()
                row = (cp.cuda.get_elapsed_time(e0, e1) * 1e3, 0.0, float(int(b[1]) - int(b[0])) / 1e3, 0.0)
            else:
                v.after()
                b, pl = buf.get(), v.placement
                row = (cp.cuda.get_elapsed_time(e0, e1) * 1e3,
                       (pl["kernel_end_ns"] - pl["kernel_begin_ns"]) / 1e3,
                       (pl["kernel_begin_ns"] - int(b[0])) / 1e3, (int(b[1]) - pl["kernel_end_ns"]) / 1e3)
            if k >= 3:
                vals.append(row)
        return np.median(np.asarray(vals), axis=0)

    rows = []
    ev, _, floor, _ = stamped(None)
    rows.append({**stamp, "case": "nothing", "event_us": round(ev, 2), "span_us": 0.0,
                 "before_us": round(floor, 2), "after_us": 0.0})
    print(f"{'nothing':58s} events {ev:8.2f}  stamp to stamp {floor:6.2f}", flush=True)
    for label, g, region in gap_cases():
        pv = variants(info, g, region)[0]
        with stream:
            pv.prepare()
            fill_inputs(pv)
        ev, span, before, after = stamped(pv)
        rows.append({**stamp, "case": label, "event_us": round(ev, 2), "span_us": round(span, 2),
                     "before_us": round(before, 2), "after_us": round(after, 2)})
        print(f"{label:58s} events {ev:8.2f}  span {span:8.2f}  before {before:6.2f}  after {after:6.2f}", flush=True)
        pv.tensors.arrays.clear()
        cp.get_default_memory_pool().free_all_blocks()
    write_rows(Path(a.out or ".") / "gaps.csv", rows)


def codegen_kernel() -> str:
    from kitsune_dse.validate.codegen import PIPELINE_KERNEL
    return PIPELINE_KERNEL


def run(a) -> None:
    import cupy as cp
    import numpy as np

    from kitsune_dse.validate.measure import time_runs
    from tilesync_probe import probe_session, timing_fields, traced_cold_runs, write_rows
    info, stream, flush, stamp = probe_session(a.out, "step_trace_probe.py")
    rows, full = [], []
    conditions = [(f, bool(int(p))) for f in a.fills.split(",") for p in a.poisons.split(",")]
    for label, g, region in cases():
        if a.only and not any(x in label for x in a.only.split(",")):
            continue
        pv, tv = variants(info, g, region)
        for fill, poison in conditions:
            with stream:
                pv.prepare()
                fill_inputs(pv, fill)
                t = time_runs(pv.run, pv.pre, pv.after, stream, a.runs, 3, flush, poison_every=poison)
                tv.prepare()
                recs = traced_cold_runs(tv, stream, flush, a.trace_runs,
                                        lambda v: [v.placement[k] for k in TRACE_KEYS] + [v.placement["stage_end_us"]],
                                        poison=poison)
            med = np.median(np.asarray([r[:4] for r in recs], dtype=float), axis=0)   # [4, steps, rbs]
            end = float(np.median([r[4][0] for r in recs]))
            steps = []
            for s in range(med.shape[1]):
                st, lst, fd, dn = med[:, s, :]
                steps.append({"start": round(float(st.min()), 2), "last_start": round(float(lst.max()), 2),
                              "first_done": round(float(fd.min()), 2), "done": round(float(dn.max()), 2),
                              "rb_span_mean": round(float((dn - st).mean()), 2),
                              "item_first_mean": round(float((fd - lst).mean()), 2)})
            row = {**stamp, "case": label, "fill": fill, "poison": int(poison), **timing_fields(t),
                   "traced_end_us": round(end, 2), "steps": json.dumps(steps)}
            rows.append(row)
            full.append({"case": label, "fill": fill, "poison": int(poison),
                         **{k: med[i].round(2).tolist() for i, k in enumerate(TRACE_KEYS)}})
            print(f"{label:34s} {fill:6s} poison {int(poison)} {row['time_us']:8.2f} us  traced end {end:7.2f}  "
                  + " ".join(f"{x['done']:7.2f}" for x in steps), flush=True)
        pv.tensors.arrays.clear()
        cp.get_default_memory_pool().free_all_blocks()
    write_rows(Path(a.out or ".") / "step_trace.csv", rows)
    (Path(a.out or ".") / "step_trace_rb.json").write_text(json.dumps(full))


def report(d: Path) -> None:
    import csv

    import numpy as np

    from kitsune_dse.cost.pipeline import _derive_stage_works, pipeline, plan_stages
    from kitsune_dse.cost.region import Region as CRegion
    from kitsune_dse.cost.roofline import busiest_sm_tiles, kernel_time, lone_share
    from kitsune_dse.cost.stage_sim import step_wait_s
    from kitsune_dse.hw.spec import load_spec
    from kitsune_dse.report.plan import choice_from_region
    spec = load_spec(ROOT / "hw_specs/h100-sxm.calibrated.yaml")
    # the suite's condition (random inputs, poisoned outputs) where a file holds several
    meas = {r["case"]: r for r in csv.DictReader(open(d / "step_trace.csv"))
            if r.get("fill", "random") == "random" and r.get("poison", "1") == "1"}
    for label, g, rd in cases():
        if label not in meas:
            continue
        m = meas[label]
        region = CRegion.of(g, [o for s in rd["stages"] for o in s["ops"]])
        choice = choice_from_region(rd)
        est = pipeline(region, spec, choice)
        sp = plan_stages(region, spec, choice)
        core = _derive_stage_works(region, spec, sp)
        works, shape = core.works[0], core.shapes[0]
        print(f"{label:34s} measured {float(m['time_us']):8.2f} us, model {est.latency_s * 1e6:8.2f} us "
              f"(traced end {float(m['traced_end_us']):7.2f}, model stage {est.breakdown['stage_end_s'][0] * 1e6:7.2f})")
        steps = json.loads(m["steps"])
        for s, x in enumerate(steps):
            line = (f"    step {s}: start {x['start']:7.2f}..{x['last_start']:7.2f}  done {x['first_done']:7.2f}.."
                    f"{x['done']:7.2f}  rb span {x['rb_span_mean']:6.2f}")
            if shape is not None and s < len(works):
                w, n = works[s], shape.items[s]
                rb = w.scaled(shape.slabs / shape.rb_per_unit, tiles=n)
                a = lone_share(rb, spec)
                grid = np.array([float(rd["stages"][0]["sms"])])
                tau = float(2 * kernel_time(rb, spec, grid)[0] / busiest_sm_tiles(rb, grid, a)[0])
                line += f"  | model item {tau / (2 * a) * 1e6:6.2f} lone, {tau * 1e6:6.2f} paired, wait {step_wait_s(w, spec) * 1e6:5.2f}"
            print(line)
    if (d / "gaps.csv").exists():
        gaps(d / "gaps.csv", spec)
    if (d / "spills.csv").exists() and (d / "gaps.csv").exists():
        sp = {(r["case"], r["variant"]): r for r in csv.DictReader(open(d / "spills.csv"))}
        outside = float(np.median([float(r["event_us"]) - float(r["span_us"])
                                   for r in csv.DictReader(open(d / "gaps.csv")) if r["case"] != "nothing"]))
        print("\nplain against traced (random inputs): spill loads (B) and the plain kernel's time over "
              "the traced one's end plus the time outside the span")
        for label, m in meas.items():
            p, t = sp.get((label, "plan")), sp.get((label, "traced"))
            if p and t:
                extra = float(m["time_us"]) - float(m["traced_end_us"]) - outside
                print(f"    {label:34s} spill loads {p['spill_load_bytes']:>4} plain, {t['spill_load_bytes']:>4} traced; "
                      f"plain slower by {extra:+6.2f} us")


def spills(d: Path) -> None:
    """Here (nvcc): every gap case's kernel compiled for its resource usage (the plain variant,
    and the traced one of cases()): ptxas's stack frame and spill bytes, into d/spills.csv."""
    import concurrent.futures as cf
    import re
    import tempfile

    from precompile import compile_one

    from kitsune_dse.validate.plan import DeviceInfo
    from tilesync_probe import write_rows
    info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
    traced = {label for label, _, _ in cases()}
    jobs = []
    for label, g, region in gap_cases():
        for v in variants(info, g, region)[:2 if label in traced else 1]:
            jobs.append((label, v.name, v.build()))

    def one(job):
        with tempfile.TemporaryDirectory() as td:
            msg = compile_one(job[2], info.arch, Path(td))
        m = re.search(r"(\d+) registers(?: \[(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\])?", msg)
        if not m:
            raise RuntimeError(f"{job[0]} {job[1]}: {msg}")
        regs, frame, st, ld = (int(x or 0) for x in m.groups())
        return {"case": job[0], "variant": job[1], "registers": regs, "stack_frame_bytes": frame,
                "spill_store_bytes": st, "spill_load_bytes": ld}
    with cf.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        rows = list(ex.map(one, jobs))
    d.mkdir(parents=True, exist_ok=True)
    write_rows(d / "spills.csv", rows)
    print(f"{len(rows)} kernels -> {d / 'spills.csv'}")


def gaps(path: Path, spec) -> None:
    """The time outside the workers' span (events minus span) over the cases of gaps.csv."""
    import csv

    import numpy as np
    rows = [r for r in csv.DictReader(open(path)) if r["case"] != "nothing"]
    out = np.array([float(r["event_us"]) - float(r["span_us"]) for r in rows])
    before = np.array([float(r["before_us"]) for r in rows])
    after = np.array([float(r["after_us"]) for r in rows])
    print(f"\n{len(rows)} persistent kernels: events - span {np.median(out):.2f} us median "
          f"({out.min():.2f}..{out.max():.2f}); stamp gaps before {np.median(before):.2f}, after "
          f"{np.median(after):.2f} us; model persistent_launch_s {spec.persistent_launch_s * 1e6:.2f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--trace-runs", type=int, default=5)
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--report", default="")
    ap.add_argument("--forms", action="store_true",
                    help="time every suite pipeline region in both cursor forms (KDSE_CURSORS)")
    ap.add_argument("--fills", default="random", help="input data of the traced cases: random,zeros")
    ap.add_argument("--poisons", default="1", help="poison the outputs before each run: 1,0")
    ap.add_argument("--only", default="", help="cases whose label contains one of these (comma-separated)")
    ap.add_argument("--spills", default="", help="here: compile the gap cases, write DIR/spills.csv")
    ap.add_argument("--teams", action="store_true",
                    help="every gap case's kernel with two teams an SM and with one (spills against workers)")
    ap.add_argument("--gaps", action="store_true",
                    help="launch and exit outside the workers' span (stamp kernels around each region)")
    a = ap.parse_args()
    if a.report:
        report(Path(a.report))
        return
    if a.spills:
        spills(Path(a.spills))
        return
    if a.precompile:
        from precompile import compile_one

        from kitsune_dse.validate.plan import DeviceInfo
        info = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
        cache = ROOT / "bench/.cubin_cache"
        cache.mkdir(parents=True, exist_ok=True)
        if a.teams:
            for label, g, region in gap_cases():
                for n in TEAM_COUNTS:
                    print(label, n, compile_one(team_variant(info, g, region, n).build(), info.arch,
                                                cache).splitlines()[0], flush=True)
            return
        if a.gaps:
            print(compile_one(STAMP_SRC, info.arch, cache).splitlines()[0])
            for label, g, region in gap_cases():
                print(label, compile_one(variants(info, g, region)[0].build(), info.arch, cache).splitlines()[0], flush=True)
            return
        if a.forms:
            for label, g, region in suite_regions():
                for form in FORMS:
                    print(label, form, compile_one(plain_in(form, info, g, region).source, info.arch,
                                                   cache).splitlines()[0], flush=True)
            return
        for _, g, region in cases():
            for v in variants(info, g, region):
                print(compile_one(v.build(), info.arch, cache).splitlines()[0], flush=True)
        return
    run_teams(a) if a.teams else run_gaps(a) if a.gaps else run_forms(a) if a.forms else run(a)


if __name__ == "__main__":
    main()
