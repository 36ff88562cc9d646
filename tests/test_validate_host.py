"""Host-side tests of the validation harness (no GPU, no CuPy): plan reading and retargeting,
fusion grouping, pipeline layout, generated CUDA source, ncu output parsing, statistics."""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kitsune_dse.errors import KitsuneError
from kitsune_dse.graph import load_model
from kitsune_dse.validate import codegen
from kitsune_dse.validate.lower import (Region, bsp_groups, cublas_plan, empty_target_per_gen,
                                        fusion_groups, layout_pipeline, row_cfg)
from kitsune_dse.validate.plan import DeviceInfo, check_plan, check_target, load_plan

DATA = Path(__file__).resolve().parent / "data"
PLANS = DATA / "plans"
H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)


def _plan(name):
    return load_plan(PLANS / f"{name}.json")


def _region(plan, i=0):
    from kitsune_dse.validate.harness import resolve_model_ref
    g = load_model(resolve_model_ref(plan), plan["model"]["sizes"])
    return Region(g, plan["regions"][i]), plan["regions"][i]


def test_import_without_cupy():
    code = ("import sys; import kitsune_dse.validate, kitsune_dse.validate.codegen, "
            "kitsune_dse.validate.lower, kitsune_dse.validate.harness, kitsune_dse.validate.runtime, "
            "kitsune_dse.validate.cli_cmds; print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


ALL_PLANS = sorted(PLANS.glob("*.json")) + sorted((PLANS / "explorer").glob("*.json"))


@pytest.mark.parametrize("path", ALL_PLANS, ids=lambda p: p.stem)
def test_example_plans_build_every_variant(path):
    """Every example plan (hand-made and explorer-written) lowers to kernel sources for every
    variant, without a GPU."""
    from kitsune_dse.validate.runtime import Tensors, make_variants
    plan = load_plan(path)
    assert plan["schema"] == "kitsune-dse/plan/v1"
    plan, _ = check_target(plan, H100)
    reg, region = _region(plan)
    assert reg.outputs
    vs = make_variants(reg, region, Tensors(reg), H100, which=["plan", "plan-1team", "bsp-eager", "bsp-graph",
                                                               "fusion", "fusion-graph", "cublas", "cublas-graph"])
    names = [v.name for v in vs]
    assert names[:1] == ["plan"] and "bsp-eager" in names and "fusion" in names
    if region["strategy"] in ("bsp", "fusion"):      # one CUDA graph, as the explorer prices it
        assert vs[0].graph_mode
    # eager variants are timed from an idle GPU (their model is the host's issue timeline)
    assert {v.name for v in vs if getattr(v, "host_issued", False)} <= {"bsp-eager", "fusion", "cublas"}
    assert all(v.host_issued for v in vs if v.name in ("bsp-eager", "fusion", "cublas"))
    for v in vs:
        src = v.build()
        assert 'extern "C" __global__' in src


def test_plan_errors_name_the_field():
    plan = _plan("gpt3-mlp-t2048-tp8")
    bad = copy.deepcopy(plan)
    bad["schema"] = "other"
    with pytest.raises(KitsuneError, match="schema"):
        check_plan(bad, "p.json")
    bad = copy.deepcopy(plan)
    bad["regions"][0]["stages"][1]["ops"].append("fc1")
    with pytest.raises(KitsuneError, match="two stages"):
        check_plan(bad, "p.json")
    bad = copy.deepcopy(plan)
    bad["regions"][0]["queues"][0]["mode"] = "sideways"
    with pytest.raises(KitsuneError, match="mode"):
        check_plan(bad, "p.json")
    bad = copy.deepcopy(plan)
    bad["regions"][0]["stages"][0]["ops"] = ["fc1"]
    with pytest.raises(KitsuneError, match="in no stage"):
        check_plan(bad, "p.json")


def test_foreign_plan_is_refused_unless_retargeted():
    plan = _plan("gpt3-mlp-t2048-tp8")
    a100 = DeviceInfo(name="NVIDIA A100-SXM4-80GB", arch="sm_80", sm_count=108)
    with pytest.raises(KitsuneError, match="--retarget"):
        check_target(plan, a100)
    out, notes = check_target(plan, a100, retarget=True)
    sms = [s["sms"] for s in out["regions"][0]["stages"]]
    assert sum(sms) <= 108 and sms == [54, 54]
    assert all(s["ctas"] == s["sms"] for s in out["regions"][0]["stages"])
    assert "retargeted" in notes[0]
    assert plan["regions"][0]["stages"][0]["sms"] == 66      # the input is not modified
    same, notes = check_target(plan, H100)
    assert not notes and same["regions"][0]["stages"][0]["sms"] == 66


def test_retarget_keeps_sum_within_device():
    plan = _plan("ln-gemm-t2048")
    small = DeviceInfo(name="x", arch="sm_90", sm_count=7)
    out, _ = check_target(plan, small, retarget=True)
    sms = [s["sms"] for s in out["regions"][0]["stages"]]
    assert sum(sms) <= 7 and min(sms) >= 1


def test_too_many_sms_refused():
    plan = _plan("gpt3-mlp-t2048-tp8")
    plan["regions"][0]["stages"][0]["sms"] = 100
    with pytest.raises(KitsuneError, match="take 166 SMs"):
        check_target(plan, H100)


def test_bsp_and_fusion_groups_gpt3():
    reg, _ = _region(_plan("gpt3-mlp-t2048-tp8"))
    bsp = bsp_groups(reg)
    assert [g.kind for g in bsp] == ["gemm", "ew", "gemm", "ew"]
    assert [g.stores for g in bsp] == [["h"], ["a"], ["o"], ["y"]]
    fus = fusion_groups(reg)
    assert [g.kind for g in fus] == ["gemm", "gemm"]
    assert fus[0].ops == ["fc1", "gelu"] and fus[0].stores == ["a"]
    assert fus[1].full_inputs() == ["x"] and fus[1].vec_inputs() == ["b2"]
    src = codegen.functor(fus[0])
    assert "act_gelu" in src and "store8" in src


def test_swiglu_dual_gemm_group():
    reg, _ = _region(_plan("llama2-7b-mlp-t512"))
    fus = fusion_groups(reg)
    g0 = fus[0]
    assert g0.kind == "gemm" and g0.nb == 2 and g0.weights == ["w_gate", "w_up"]
    assert g0.stores == ["inter"]
    src = codegen.functor(g0)
    assert "act_silu(acc[0][q])" in src and "acc[1][q]" in src
    # the residual add(x, mlp) fuses into the down projection whichever operand is the chain
    assert fus[1].ops == ["down_proj", "residual"]


def test_row_group_with_pre_op_and_two_outputs():
    reg, _ = _region(_plan("ln-gemm-fusion-t2048"))
    fus = fusion_groups(reg)
    g0 = fus[0]
    assert g0.kind == "row" and g0.row_op == "ln" and g0.stores == ["h", "z"]
    assert g0.gamma == "gamma" and g0.beta == "beta"
    src = codegen.functor(g0)
    assert "void pre(" in src and "void post(" in src and "if (store)" in src


def test_row_cfg_keeps_rows_in_registers():
    assert row_cfg(2048) == (1, True, 8)
    assert row_cfg(4096) == (2, True, 8)
    assert row_cfg(12288) == (8, True, 6)
    assert row_cfg(65536)[1] is False


def test_unsupported_op_is_a_clear_error():
    g = load_model("gpt3-mlp", {"tokens": 64, "hidden": 256})
    from kitsune_dse.graph.yaml_model import model_from_dict
    m = model_from_dict({"name": "t", "dtype": "fp16", "inputs": {"a": [64, 128], "b": [64, 128]},
                         "ops": [{"name": "mm", "kind": "matmul", "inputs": ["a", "b"], "outputs": ["c"],
                                  "attrs": {"trans_a": True}}]}, "<t>")
    reg = Region(m, {"id": 0, "strategy": "bsp", "ops": ["mm"]})
    with pytest.raises(KitsuneError, match="transposed"):
        bsp_groups(reg)
    assert g.op("fc1")


def test_pipeline_layout_gpt3_t2048():
    reg, region = _region(_plan("gpt3-mlp-t2048-tp8"))
    lay = layout_pipeline(reg, region)
    assert lay.bm == 128 and lay.nrb == 16 and lay.grid == 132
    assert [(s.first_cta, s.ctas) for s in lay.stages] == [(0, 66), (66, 66)]
    (ring,) = lay.rings
    assert ring.tensor == "a" and ring.depth == 8 and ring.nslots == 8 and not ring.direct
    assert lay.steps[0].items == 48 and lay.steps[1].items == 96
    assert empty_target_per_gen(lay, ring) == min(96, 66 * lay.teams)
    # control words: header, one smid per CTA, then counters that do not overlap
    spans = [(ring.full_off, ring.nslots), (ring.empty_off, ring.nslots)]
    assert ring.full_off >= lay.smid_off + lay.grid
    ends = sorted((a, a + n) for a, n in spans)
    assert all(ends[i][1] <= ends[i + 1][0] for i in range(len(ends) - 1))
    assert lay.ctrl_words >= ends[-1][1]


def test_pipeline_layout_split_k_splits_k():
    reg, region = _region(_plan("gpt3-mlp-t64"))
    lay = layout_pipeline(reg, region)
    assert lay.bm == 64 and lay.nrb == 1
    st = lay.steps[1]
    assert st.split_k_ring == 0 and st.ksplit > 1 and st.kper % lay.rings[0].slab_w == 0
    assert st.items == st.n_tiles * st.ksplit
    assert lay.rings[0].slab_w == 128 and lay.rings[0].nslabs == 384


def test_direct_ring_for_region_output_consumed_inside():
    plan = {"schema": "kitsune-dse/plan/v1", "model": {"ref": str(DATA / "models/ln-gemm.yaml"),
                                                         "sizes": {"tokens": 300, "hidden": 1024, "ffn": 512}},
            "hw": {"name": "h100", "arch": "sm_90", "sm_count": 132},
            "regions": [{"id": 0, "strategy": "pipeline", "ops": ["resid", "ln", "fc", "act"],
                         "stages": [{"id": 0, "ops": ["resid"], "sms": 8, "ctas": 8, "tile": {"rows": 128}},
                                    {"id": 1, "ops": ["ln"], "sms": 16, "ctas": 16, "tile": {"rows": 128}},
                                    {"id": 2, "ops": ["fc", "act"], "sms": 100, "ctas": 100, "tile": {"rows": 128}}],
                         "queues": [{"producer": 0, "consumer": 1, "tensors": ["h"], "slot_bytes": 1, "depth": 2,
                                     "mode": "row"}]}]}
    check_plan(plan)
    reg, region = _region(plan)
    lay = layout_pipeline(reg, region)
    rings = {r.tensor: r for r in lay.rings}
    assert rings["h"].direct and rings["h"].nslots == lay.nrb == 3
    assert not rings["z"].direct and rings["z"].nslots == 2
    src = codegen.pipeline_source(lay, codegen.BufTable())
    # a direct ring is never waited on for free slots
    assert f"ctrl + {rings['h'].empty_off}" not in src


def test_lead_schema_slabs_count_queue_depth():
    plan = _plan("gpt3-mlp-t2048-tp8")
    r = plan["regions"][0]
    for s in r["stages"]:
        s["tile"] = {"rows": 128, "slabs": 4}
    r["queues"][0]["depth"] = 8      # 8 slabs = 2 row-blocks
    reg, region = _region(plan)
    assert layout_pipeline(reg, region).rings[0].depth == 2


def test_pipeline_source_structure():
    reg, region = _region(_plan("gpt3-mlp-t2048-tp8"))
    lay = layout_pipeline(reg, region)
    bt = codegen.BufTable()
    src = codegen.pipeline_source(lay, bt)
    assert f"__launch_bounds__({256 * lay.teams}, 1) kdse_pipeline" in src
    assert "ctrl[8 + blockIdx.x] = smid();" in src
    assert "if (b < 66) stage_0(" in src and "else if (b < 132) stage_1(" in src
    assert src.count("team_wait_geq(") == 1      # the consumer's full wait; the GEMM producer's
    assert src.count("SlotWait<") == 1           # free-slot wait comes just before its epilogue
    assert "team_publish(" in src and "team_arrive(" in src
    assert "+ 1u, ctrl" not in src
    assert set(bt.names) == {"x", "w1", "b1", "ring:a", "w2", "b2", "y"}
    from kitsune_dse.validate.runtime import expand_includes
    full = expand_includes(src)
    assert "hook.before_epilogue(tm)" in full and "struct SlotWait" in full
    for needle in ("ld.acquire.gpu", "st.release.gpu", "red.release.gpu", "%globaltimer", "%smid",
                   "ld.global.cg", "cp.async.cg", "mma.sync.aligned.m16n8k16", "ldmatrix", "bar.red.and.pred"):
        assert needle in full, needle
    assert "#include \"" not in full
    planted = codegen.pipeline_source(layout_pipeline(reg, region, plant_deadlock=True), codegen.BufTable())
    assert planted.count("+ 1u, ctrl") == 1
    assert "atomicMax" not in src and lay.trace_off == 0
    traced = layout_pipeline(reg, region, trace=True)
    # four u64 per (step, row-block) after the worker timers, inside the control block: the
    # items' last end, first start, last start and first end
    from kitsune_dse.validate.lower import TRACE_ARRAYS
    assert TRACE_ARRAYS == 4
    assert traced.trace_off >= lay.ctrl_words and traced.trace_off % 2 == 0
    # then two u64 per worker: its clock64 at start and end (its SM clock over its span)
    assert traced.clock_off == traced.trace_off + 2 * 4 * len(traced.steps) * traced.nrb
    assert traced.ctrl_words == traced.clock_off + traced.grid * traced.teams * 4
    tsrc = codegen.pipeline_source(traced, codegen.BufTable())
    assert tsrc.count("atomicMax(") == 4 * len(traced.steps)
    n = len(traced.steps) * traced.nrb
    assert f"+ {traced.trace_off}) + 1 * {traced.nrb} + rb" in tsrc
    # the minima complemented, at the arrays' offsets
    assert f"atomicMax(tr + 1 * {n}, ~t)" in tsrc and f"atomicMax(tr + 2 * {n}, t)" in tsrc
    assert f"atomicMax(tr + 3 * {n}, ~t)" in tsrc and "atomicMax(tr, t)" in tsrc
    assert tsrc.count("clock64()") == 2 and f"ctrl + {traced.clock_off})" in tsrc
    # the untraced kernel (what is timed) carries none of it
    assert lay.clock_off == 0 and "clock64" not in src


def _carried_items(c, items, workers, nrb):
    """The default code's cursors, step by step: (row-block, offset) of worker c's items."""
    nx, rb, out = c, 0, []
    if items < workers and nx >= items:
        rb, nx = nx // items, nx % items
    while rb < nrb:
        i = nx
        nx -= items % workers
        if nx < 0:
            nx += workers
        at, rb = rb, rb + 1
        if items < workers and nx >= items:
            rb, nx = rb + nx // items, nx % items
        out += [(at, j) for j in range(i, items, workers)]
    return out


def _stateless_items(c, items, workers, nrb):
    """The same from the row-block alone (codegen.CURSOR_HELPERS, written out in Python)."""
    def first(r):
        return (c - r * items) % workers

    def next_rb(r):
        return (r * items + first(r)) // items
    out, rb = [], next_rb(0)
    while rb < nrb:
        out += [(rb, j) for j in range(first(rb), items, workers)]
        rb = next_rb(rb + 1)
    return out


@pytest.mark.parametrize("items,workers", [(2, 264), (3, 264), (1, 132), (96, 88), (48, 132), (7, 5), (264, 264)])
def test_stateless_cursors_visit_the_carried_cursors_items(items, workers):
    nrb = 37
    every = set()
    for c in range(workers):
        want = _carried_items(c, items, workers, nrb)
        assert _stateless_items(c, items, workers, nrb) == want
        every |= set(want)
    assert every == {(rb, j) for rb in range(nrb) for j in range(items)}     # each item once


def test_item_offset_wrap_is_emitted_even_where_it_cannot_trigger():
    """A step with as many items per row-block as workers (4096^3 on 16 SMs: 32 column tiles,
    32 teams) gets the same cursor code as one with fewer: left out, nvcc scheduled the GEMM
    main loop 7-12% slower (bench/codegen_probe.py)."""
    from kitsune_dse.validate.microbench import pipe_case_region
    for sms in (16, 17):
        g, region = pipe_case_region("matmul", (4096, 4096, 4096), sms)
        src = codegen.pipeline_source(layout_pipeline(Region(g, region), region), codegen.BufTable())
        assert "int nx_0 = c, rb_0 = 0; if (nx_0 >= 32) { rb_0 = nx_0 / 32; nx_0 %= 32; }" in src
        assert "++rb_0; if (nx_0 >= 32) { rb_0 += nx_0 / 32; nx_0 %= 32; }" in src


def test_stateless_cursor_source(monkeypatch):
    reg, region = _region(_plan("gpt3-mlp-t2048-tp8"))
    carried = codegen.pipeline_source(layout_pipeline(reg, region), codegen.BufTable())
    assert "kdse_next_rb" not in carried and "int nx_0 = c" in carried
    monkeypatch.setenv("KDSE_CURSORS", "stateless")
    stateless = codegen.pipeline_source(layout_pipeline(reg, region), codegen.BufTable())
    assert "int nx_" not in stateless and stateless.count("kdse_first_item(rb, c, ") == 2
    assert stateless.count("rb = kdse_next_rb(rb + 1, c, ") == 2         # one per stage
    monkeypatch.setenv("KDSE_CURSORS", "cached")
    with pytest.raises(KitsuneError, match="KDSE_CURSORS"):
        codegen.pipeline_source(layout_pipeline(reg, region), codegen.BufTable())


def test_standalone_source_and_split_k_baseline():
    reg, _ = _region(_plan("gpt3-mlp-t64"))
    bt = codegen.BufTable()
    src, launches, ws = codegen.standalone_source(reg, bsp_groups(reg), bt, 132, "bsp")
    names = [ln.kernel for ln in launches]
    assert names[0] == "bsp_g0" and "bsp_g2_reduce" in names       # fc2: 96 tiles < 132 SMs
    fc2 = [ln for ln in launches if ln.kernel == "bsp_g2"][0]
    assert fc2.grid[2] > 1 and ws
    assert fc2.grid[0] == 96 and "per_group" in src
    assert all(f"void __launch_bounds__(256) {n}(" in src or f") {n}(void" in src for n in names)
    assert re.search(r'extern "C" __global__ void __launch_bounds__\(256, \d\) bsp_g0', src)


def test_cublas_plan_splits_bias():
    reg, _ = _region(_plan("gpt3-mlp-t2048-tp8"))
    steps = cublas_plan(reg)
    kinds = [k for k, _ in steps]
    assert kinds == ["cublas", "group", "group", "cublas", "group", "group"]
    assert reg.extra_shapes["h:raw"] == (2048, 6144)


def test_ncu_csv_parsing():
    from kitsune_dse.validate.ncu import parse_ncu_csv
    text = ('==PROF== Connected\n"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
            '"Section Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","1","python","h","range0","1","7","Command line profiler metrics","dram__bytes_read.sum","byte","1,234,567"\n'
            '"0","1","python","h","range0","1","7","Command line profiler metrics","dram__bytes_write.sum","byte","89"\n'
            '"1","1","python","h","range1","1","7","Command line profiler metrics","dram__bytes_read.sum","byte","5"\n'
            '"1","1","python","h","range1","1","7","Command line profiler metrics","dram__bytes_write.sum","byte","6"\n')
    rows = parse_ncu_csv(text)
    assert rows == [{"dram__bytes_read.sum": 1234567.0, "dram__bytes_write.sum": 89.0},
                    {"dram__bytes_read.sum": 5.0, "dram__bytes_write.sum": 6.0}]


def test_timing_statistics():
    from kitsune_dse.validate.measure import Timing
    t = Timing.of([float(i) for i in range(1, 101)])
    assert t.median_s == 50.5 and abs(t.p10_s - 10.9) < 1e-9 and abs(t.p90_s - 90.1) < 1e-9 and t.runs == 100


def test_predicted_for_variants():
    from kitsune_dse.validate.harness import predicted_for
    plan = _plan("gpt3-mlp-t2048-tp8")
    r = plan["regions"][0]
    assert predicted_for(plan, r, "plan") == r["predicted"]
    assert predicted_for(plan, r, "bsp-graph") == plan["baselines"]["bsp"]
    assert predicted_for(plan, r, "cublas") == {}


def test_csv_writer(tmp_path):
    from kitsune_dse.validate.harness import CSV_FIELDS, write_csv
    write_csv([{"plan": "p", "variant": "plan", "measured_latency_s": 1.23456789e-4, "correct": True}],
              tmp_path / "v.csv")
    lines = (tmp_path / "v.csv").read_text().splitlines()
    assert lines[0].split(",") == CSV_FIELDS
    assert "0.000123457" in lines[1]


def test_cli_validate_registered():
    import typer
    from typer.testing import CliRunner

    from kitsune_dse.validate.cli_cmds import register
    app = typer.Typer()
    register(app)

    @app.command("other")
    def _other():
        pass
    res = CliRunner().invoke(app, ["validate", "--help"])
    assert res.exit_code == 0
    for opt in ("--out", "--runs", "--retarget", "--ncu"):
        assert opt in res.output


def test_precompile_cache_key_is_stable():
    from kitsune_dse.validate.runtime import source_key
    reg, region = _region(_plan("ln-gemm-t2048"))
    a = codegen.pipeline_source(layout_pipeline(reg, region), codegen.BufTable())
    b = codegen.pipeline_source(layout_pipeline(reg, region), codegen.BufTable())
    assert source_key(a, "sm_90") == source_key(b, "sm_90") != source_key(a, "sm_80")


def test_kernel_sources_compile_with_nvrtc_if_available():
    """Where NVRTC is installed (through CuPy's bindings), every example plan's kernels compile."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except Exception:  # noqa: BLE001
        pytest.skip("no NVRTC here")
    from kitsune_dse.validate.runtime import expand_includes
    import os
    inc = [f"-I{p}/include" for p in ("/usr/local/cuda",) if os.path.isdir(f"{p}/include")]
    reg, region = _region(_plan("llama2-7b-mlp-t512"))
    src = codegen.pipeline_source(layout_pipeline(reg, region), codegen.BufTable())
    try:
        prog = nvrtc.createProgram(expand_includes(src), "k.cu", [], [])
        nvrtc.compileProgram(prog, ["-arch=sm_90", "-std=c++17", *inc])
    except Exception as e:  # noqa: BLE001
        if "libnvrtc" in str(e) or "not found" in str(e).lower():
            pytest.skip(f"NVRTC unusable here: {e}")
        raise AssertionError(nvrtc.getProgramLog(prog))
    assert json.dumps  # keep json imported for the plan helpers


# -- tilesync / concurrent regions (programmatic launches with flag hand-offs) ----------------------
def _strategy_region(plan_name, strategy, kernels=None):
    plan = copy.deepcopy(_plan(plan_name))
    region = plan["regions"][0]
    region["strategy"] = strategy
    region.pop("stages", None)
    region.pop("queues", None)
    if kernels is not None:
        region["kernels"] = kernels
    return _region(plan)


def test_tilesync_plan_waits_for_rows_and_counts_tiles():
    from kitsune_dse.validate.runtime import Tensors, TilesyncVariant, make_variants
    reg, region = _strategy_region("gpt3-mlp-t2048-tp8", "tilesync", [["fc1", "gelu"], ["fc2", "residual"]])
    (v,) = make_variants(reg, region, Tensors(reg), H100, which=["plan"])
    assert isinstance(v, TilesyncVariant) and v.graph_mode
    src = v.build()
    g0, g1 = (v.sync.groups[g.name] for g in v.groups)
    # fc1's 128-row blocks are counted (its consumer reads rows of a), fc2's are not
    assert g0.count_units and not g0.count_done and not g1.count_units and not g1.count_done
    assert [(p.name, how, t) for p, how, t in g1.waits] == [("g0", "rows", "a")]
    tiles = codegen.choose_gemm_tile(v.groups[0], 132)
    assert g0.unit_rows == tiles["bm"] and g0.per_unit == -(-v.groups[0].cols // tiles["bn"])
    assert g0.units == -(-v.groups[0].rows // tiles["bm"])
    # every kernel releases the next one's launch; only the consumer waits, only the producer counts
    assert src.count("    kdse_launch_dependents();") == 2        # one per kernel
    assert src.count("tilesync_wait_rows(sync,") == 1
    assert src.count("tilesync_signal((u32*)bufs[") == 1
    assert v.sync.words == 8 + g0.units + 1 + g1.units + 1


def test_traced_tilesync_records_every_cta_after_the_counters():
    from kitsune_dse.validate.lower import fusion_groups
    from kitsune_dse.validate.runtime import Tensors, TilesyncVariant
    reg, _ = _strategy_region("gpt3-mlp-t2048-tp8", "tilesync", [["fc1", "gelu"], ["fc2", "residual"]])
    plain = TilesyncVariant("plan", reg, Tensors(reg), H100, fusion_groups(reg), "tilesync")
    traced = TilesyncVariant("plan", reg, Tensors(reg), H100, fusion_groups(reg), "tilesync", trace=True)
    plain_src, src = plain.build(), traced.build()
    assert "globaltimer" not in plain_src and plain.sync.trace_off == -1
    g0, g1 = (traced.sync.groups[g.name] for g in traced.groups)
    grids = {ln.group: ln.grid[0] for ln in traced._launches}
    # one record per CTA of each kernel, in launch order, 8-byte aligned after the counters
    assert (g0.ctas, g1.ctas) == (grids[g0.name], grids[g1.name])
    assert traced.sync.trace_off >= plain.sync.words and traced.sync.trace_off % 2 == 0
    assert (g0.trace_base, g1.trace_base) == (0, g0.ctas)
    # six u64 a CTA: start, inputs ready, end, SM id, clock64 at start and end
    assert traced.sync.words == traced.sync.trace_off + 12 * (g0.ctas + g1.ctas)
    # the last kernel counts nothing but still records its CTAs
    assert src.count("tr[0] = kdse_t0;") == 2 and src.count("tilesync_signal((u32*)bufs[") == 1
    assert src.count("tr[4] = (u64)kdse_c0; tr[5] = (u64)clock64();") == 2


def test_concurrent_plan_waits_for_whole_producers_in_level_order():
    from kitsune_dse.validate.runtime import Tensors, TilesyncVariant, level_order, make_variants
    reg, region = _strategy_region("gpt3-mlp-t2048-tp8", "concurrent", [])
    (v,) = make_variants(reg, region, Tensors(reg), H100, which=["plan"])
    assert isinstance(v, TilesyncVariant) and v.strategy == "concurrent"
    v.build()
    assert [g.ops for g in v.groups] == [["fc1"], ["gelu"], ["fc2"], ["residual"]]
    hows = {how for gs in v.sync.groups.values() for _, how, _ in gs.waits}
    assert hows == {"all"}
    # a topological order a, c (reads a), b (independent of a): the level order runs a and b
    # side by side, then c
    a, c, b = (type("G", (), {"name": n, "reads": lambda self, r=r: r, "stores": s})()
               for n, r, s in (("a", ["x"], ["y1"]), ("c", ["y1"], ["z"]), ("b", ["x"], ["y2"])))
    assert [g.name for g in level_order([a, c, b])] == ["a", "b", "c"]


def test_tilesync_split_k_producer_fixes_up_in_its_last_k_range():
    from kitsune_dse.validate.lower import fusion_groups
    from kitsune_dse.validate.runtime import Tensors, TilesyncVariant
    reg, region = _strategy_region("gpt3-mlp-t64", "tilesync", [["fc1", "gelu"], ["fc2", "residual"]])
    v = TilesyncVariant("plan", reg, Tensors(reg), H100, fusion_groups(reg), "tilesync")
    src = v.build()
    fc2 = codegen.choose_gemm_tile(v.groups[1], 132)
    assert fc2["splits"] > 1
    # no reduce kernel: the K ranges of a tile are adjacent CTAs and the last one sums them
    assert not [ln for ln in v._launches if ln.kernel.endswith("_reduce")]
    launch = [ln for ln in v._launches if ln.group == v.groups[1].name][0]
    assert launch.grid[0] == 96 * fc2["splits"] and launch.grid[2] == 1
    assert "last_split" in src and "splitk_reduce_vec" in src
    assert v.sync.groups[v.groups[1].name].arrive > 0


def test_tilesync_probe_counts_and_checks_every_tile():
    from kitsune_dse.validate.microbench import TILESYNC_PROBES, probe_variants
    (case, _, _, (plain, signal, both)), *_ = probe_variants(H100, TILESYNC_PROBES[:1])
    assert "tilesync" not in plain.build()
    s_src, b_src = signal.build(), both.build()
    assert "tilesync_signal(" in s_src and "tilesync_wait_rows(sync," not in s_src
    assert "tilesync_wait_rows(sync," in b_src
    (gs,) = both.sync.groups.values()
    assert gs.waits[0][0].per_unit == 0           # an always-complete counter: one load, no wait


def test_timing_keeps_its_samples_and_the_host_issue():
    from kitsune_dse.validate.measure import Timing
    t = Timing.of([3e-6, 1e-6, 2e-6], [0.1e-6, 0.3e-6, 0.2e-6])
    assert t.median_s == 2e-6 and t.min_s == 1e-6 and t.runs == 3
    assert t.host_s == pytest.approx(0.2e-6)
    assert t.samples_s == (3e-6, 1e-6, 2e-6) and t.host_samples_s == (0.1e-6, 0.3e-6, 0.2e-6)
    assert Timing.of([1.0]).host_s == 0.0 and Timing.of([1.0]).host_samples_s == ()


def test_kernel_compiler_note_warns_only_after_an_nvrtc_compile(monkeypatch):
    from kitsune_dse.validate import runtime
    monkeypatch.setattr(runtime, "MODULES_BY_COMPILER", {"nvcc cubin": 3, "NVRTC": 0})
    assert runtime.kernel_compiler_note() is None
    monkeypatch.setattr(runtime, "MODULES_BY_COMPILER", {"nvcc cubin": 3, "NVRTC": 2})
    note = runtime.kernel_compiler_note()
    assert note.startswith("2 kernel module(s) compiled here by NVRTC") and "KDSE_CUBIN_CACHE" in note


def test_the_check_tolerance_grows_with_the_roundings_on_the_path():
    from kitsune_dse.graph import load_model
    from kitsune_dse.validate.lower import Region as VRegion
    from kitsune_dse.validate.reference import REF_DEPTH, TOLERANCE, rounding_depth, tolerance

    def depths(name):
        g = load_model(name)
        reg = VRegion(g, {"id": 0, "strategy": "bsp", "ops": [o.name for o in g.ops]})
        return {t: rounding_depth(reg, t) for t in reg.outputs}
    # an MLP block rounds four times: fc1, gelu, fc2, residual add; the tolerance is the base one
    assert depths("gpt3-mlp") == {"y": REF_DEPTH}
    assert tolerance("fp16", REF_DEPTH) == TOLERANCE["fp16"]
    # NeRF: eight trunk layers and their ReLUs (exact), the feature and view layers, the sigmoid;
    # the skip and direction concatenations are exact too
    assert depths("nerf-mlp") == {"sigma": 9, "rgb": 12}
    assert tolerance("fp16", 12) == pytest.approx(1e-2 * 3 ** 0.5)
    # never below the base, whatever the depth
    assert tolerance("bf16", 1) == TOLERANCE["bf16"]
    # a region's own ops only: its inputs arrive rounded once, as stored
    g = load_model("gpt3-mlp")
    assert rounding_depth(VRegion(g, {"id": 1, "strategy": "bsp", "ops": ["fc2", "residual"]}), "y") == 2


def test_elementwise_grid_is_the_one_the_cost_model_orders():
    # the cost model (cost.reuse, HwSpec.elementwise_grid_ctas_per_sm of the calibrated spec)
    # places an element-wise kernel's touches by the harness's grid-stride loop: 256 threads a
    # CTA, a vector of 8 a thread, at most 32 CTAs per SM in the grid
    from kitsune_dse.cost.reuse import EW_THREADS, EW_VECTOR
    from kitsune_dse.hw import load_spec
    reg, _ = _region(_plan("gpt3-mlp-t2048-tp8"))
    bt = codegen.BufTable()
    _, launches, _ = codegen.standalone_source(reg, bsp_groups(reg), bt, 132, "bsp")
    g = [grp for grp in bsp_groups(reg) if grp.ops == ["gelu"]][0]
    total = g.rows * (g.cols // EW_VECTOR)
    per_sm = load_spec("h100-sxm.calibrated").elementwise_grid_ctas_per_sm
    assert per_sm == 32
    ln = next(ln for ln in launches if ln.group == g.name)
    assert ln.block == EW_THREADS and ln.grid[0] == min(-(-total // EW_THREADS), 132 * per_sm)


def test_a_product_narrower_than_its_tile_gets_a_narrow_epilogue_and_wider_ones_keep_their_type():
    """GemmCfg's NV (8-column vectors a row the epilogue stores) is emitted only where the
    product is narrower than the tile (nerf's rgb_fc, N = 3 padded to 8: one vector), so every
    wider GEMM keeps the source, and the cubin, it had."""
    from kitsune_dse.validate.codegen import gemm_cfg
    assert gemm_cfg(128, 128, 1, 64, 3, False, 8)["type"] == "GemmCfg<128, 128, 64, 3, 1, false, 1>"
    assert gemm_cfg(128, 128, 1, 64, 3, True, 64)["type"] == "GemmCfg<128, 128, 64, 3, 1, true, 8>"
    for cols in (0, 128, 136, 4096):
        assert gemm_cfg(128, 128, 1, 64, 3, False, cols)["type"] == "GemmCfg<128, 128, 64, 3, 1>"
    assert gemm_cfg(128, 64, 2, 32, 4, False, 64)["type"] == "GemmCfg<128, 64, 32, 4, 2>"
    assert gemm_cfg(128, 128, 1, 64, 3, False, 8)["SMEM_BYTES"] == gemm_cfg(128, 128, 1, 64, 3)["SMEM_BYTES"]


def _nerf_stage_layout(stage_ops, sizes=None):
    g = load_model("nerf-mlp", sizes or {"rays": 64})
    ops = [o.name for o in g.ops]
    region = {"id": 0, "strategy": "pipeline", "ops": stage_ops, "kernels": [stage_ops],
              "stages": [{"id": 0, "ops": stage_ops, "sms": 66, "ctas": 66, "tile": {"rows": 128}}],
              "queues": []}
    assert all(o in ops for o in stage_ops)
    reg = Region(g, region)
    return reg, region, layout_pipeline(reg, region)


def test_a_concats_items_never_straddle_two_inputs():
    """NeRF's skip concat is [xyz encoding (60, laid out as 64) | a5 (256)]: 128-column items
    would be [0, 128) (both inputs), [128, 256), [256, 320); split at the inputs' boundary they
    are [0, 64), [64, 192), [192, 320): as many items, none branching between two inputs per
    vector. The kernel runs those."""
    from kitsune_dse.validate.lower import ew_chunks
    reg, region, lay = _nerf_stage_layout(["skip_concat"])
    st = lay.steps[0]
    assert ew_chunks(st.group, st.bn) == [(0, 64), (64, 192), (192, 320)] == st.chunks
    assert st.items == 3
    src = codegen.pipeline_source(lay, codegen.BufTable())
    assert "ew_tile(f, rows_valid, i == 0 ? 0 : i == 1 ? 64 : 192, i == 0 ? 64 : i == 1 ? 192 : 320, tm);" in src
    # dir_concat [feature (256) | dir encoding (24)]: the boundary is a tile's: the plain form
    reg, region, lay = _nerf_stage_layout(["dir_concat"])
    st = lay.steps[0]
    assert ew_chunks(st.group, st.bn) == [(0, 128), (128, 256), (256, 280)]
    src = codegen.pipeline_source(lay, codegen.BufTable())
    assert "ew_tile(f, rows_valid, i * 128, min(280, (i + 1) * 128), tm);" in src


@pytest.mark.parametrize("plan, split", [("hand-p4x33-r1024-d4-row", True), ("hand-p4-r2048-d2-splitk", False)])
def test_a_concat_handing_a_split_k_queue_over_keeps_its_plain_column_tiles(plan, split):
    # its consumer reads slab i as columns [i bn, (i + 1) bn): the split would publish the wrong
    # columns under a slab's flag (the suite's p4-r2048 plan computed wrong outputs with it)
    root = Path(__file__).resolve().parents[1]
    p = load_plan(root / "bench/suite/nerf-mlp/plans" / f"{plan}.json")
    reg, region = _region(p)
    st = next(s for s in layout_pipeline(reg, region).steps if s.group.cat and "skip_concat" in s.group.ops)
    assert (st.chunks is not None) == split
    assert st.items == 3


def test_an_elementwise_steps_chunks_are_plain_column_tiles():
    from types import SimpleNamespace

    from kitsune_dse.validate.lower import ew_chunks
    assert ew_chunks(SimpleNamespace(cat=[], cols=320), 128) == [(0, 128), (128, 256), (256, 320)]
    assert ew_chunks(SimpleNamespace(cat=[], cols=64), 128) == [(0, 64)]
    assert ew_chunks(SimpleNamespace(cat=[("a", 0, 200), ("b", 200, 24)], cols=224), 64) == [
        (0, 64), (64, 128), (128, 192), (192, 200), (200, 224)]


def test_the_models_concat_items_are_the_runtimes():
    # cost.pipeline._atom_items prices the runtime's items of a concat step: one chunk list per
    # input (validate.lower.ew_chunks), whatever the widths
    from kitsune_dse.cost.pipeline import _atom_items
    for sizes in ({"rays": 64}, {"rays": 64, "xyz_enc": 200, "dir_enc": 136}, {"rays": 64, "width": 384}):
        g = load_model("nerf-mlp", sizes)
        for op in ("skip_concat", "dir_concat"):
            _, _, lay = _nerf_stage_layout([op], sizes)
            assert _atom_items(g, (op,), 128, 1) == lay.steps[0].items, (sizes, op)


def test_one_team_only_where_the_second_would_idle(monkeypatch):
    # dlrm's hand plan, its five layers in one stage: 8 items a row-block x 16 row-blocks = 128
    # <= 132 CTAs, so the second team of every CTA would only idle; gpt3 t2048's stages hold more
    from kitsune_dse.validate.lower import solo_team_fits
    root = Path(__file__).resolve().parents[1]
    reg, region = _region(load_plan(root / "bench/suite/dlrm-top-mlp/plans/hand-p1-132-r128.json"))
    region = {**region, "pipeline": {k: v for k, v in region["pipeline"].items() if k != "teams_per_sm"}}
    two = layout_pipeline(reg, region, teams=2)
    assert solo_team_fits(two)
    assert max(st.items for st in two.steps) * two.nrb <= two.stages[0].ctas
    one = layout_pipeline(reg, region)              # the rule, where the plan names no count
    assert one.teams == 1 and one.grid == two.grid
    src = codegen.pipeline_source(one, codegen.BufTable())
    assert "__launch_bounds__(256, 1)" in src and "team * 132" in src
    big_reg, big_region = _region(_plan("gpt3-mlp-t2048-tp8"))
    big = layout_pipeline(big_reg, big_region)
    assert big.teams == 2 and not solo_team_fits(big)
    # the plan's priced count wins over the rule, an explicit count over both; =0 turns it off
    assert layout_pipeline(reg, {**region, "pipeline": {**region["pipeline"], "teams_per_sm": 2}}).teams == 2
    assert layout_pipeline(reg, region, teams=2).teams == 2
    monkeypatch.setenv("KDSE_SOLO_TEAM", "0")
    assert layout_pipeline(reg, region).teams == 2
    with pytest.raises(KitsuneError, match="teams_per_sm is 3"):
        monkeypatch.delenv("KDSE_SOLO_TEAM")
        layout_pipeline(reg, {**region, "pipeline": {**region["pipeline"], "teams_per_sm": 3}})


def test_the_time_outside_a_persistent_kernels_span():
    from types import SimpleNamespace

    from kitsune_dse.validate.measure import outside_span_s
    v = SimpleNamespace(placement={"kernel_begin_ns": 1_000_000, "kernel_end_ns": 1_020_000})
    assert outside_span_s(v, 23.15e-6) == pytest.approx(3.15e-6, rel=1e-9)     # 23.15 - 20 us
    assert outside_span_s(SimpleNamespace(placement={}), 1e-5) is None       # no span recorded


def test_the_cost_model_prices_the_team_count_the_harness_runs():
    # cost.pipeline.solo_team_fits is the model's copy of validate.lower.solo_team_fits: on every
    # pipeline region of the suite's plans, and on one-stage dlrm plans at SM counts around where
    # its items stop fitting, both pick the same count
    from kitsune_dse.cost.pipeline import PipelineChoice, pipeline
    from kitsune_dse.cost.region import Region as CostRegion
    from kitsune_dse.hw import load_spec
    from kitsune_dse.report.plan import evaluate_plan
    from kitsune_dse.validate.harness import resolve_model_ref
    from kitsune_dse.validate.lower import solo_team_fits
    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "hw_specs/h100-sxm.calibrated.yaml")
    seen = {1: 0, 2: 0}
    for f in sorted((root / "bench/suite").glob("*/plans/*.json")):
        plan = json.loads(f.read_text())
        g = load_model(resolve_model_ref(plan), plan["model"]["sizes"])
        for i, r in enumerate(evaluate_plan(plan, g, spec)["regions"]):
            if r["strategy"] != "pipeline":
                continue
            lay = layout_pipeline(Region(g, plan["regions"][i]), plan["regions"][i], teams=2)
            assert r["pipeline"]["teams_per_sm"] == (1 if solo_team_fits(lay) else 2), (f.name, i)
            seen[r["pipeline"]["teams_per_sm"]] += 1
    assert seen[1] >= 5 and seen[2] >= 20
    plan = load_plan(root / "bench/suite/dlrm-top-mlp/plans/hand-p1-132-r128.json")
    g = load_model(resolve_model_ref(plan), plan["model"]["sizes"])
    ops = tuple(plan["regions"][0]["stages"][0]["ops"])
    for sms in (64, 127, 128, 132):
        for rows in (64, 128):
            est = pipeline(CostRegion.of(g), spec, PipelineChoice((ops,), (sms,), rows))
            pr = {"id": 0, "strategy": "pipeline", "ops": list(ops), "kernels": plan["regions"][0]["kernels"],
                  "stages": [{"id": 0, "ops": list(ops), "sms": sms, "ctas": sms,
                              "tile": {"rows": rows, "slabs": 1}}], "queues": []}
            lay = layout_pipeline(Region(g, pr), pr, teams=2)
            assert est.breakdown["teams_per_sm"] == (1 if solo_team_fits(lay) else 2), (sms, rows)


def test_address_sets_lie_on_distinct_pages():
    # each address set of an e2e measurement must put the tensors on other pages: distinct pads,
    # whole 2-MiB pages, the first set where a single measurement puts them (no pad)
    from kitsune_dse.validate.e2e import ADDRESS_SET_PAD, address_pad_bytes
    pads = [address_pad_bytes(k) for k in range(12)]
    assert pads[0] == 0
    assert len(set(pads)) == len(pads)
    assert all(p % ADDRESS_SET_PAD == 0 and 0 < p <= 97 * ADDRESS_SET_PAD for p in pads[1:])
    assert address_pad_bytes(1) == 76 * ADDRESS_SET_PAD      # (7919 + 13) % 97 + 1 pages
