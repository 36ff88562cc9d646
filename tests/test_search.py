"""The search layer: candidates, the CP-SAT solver and its guarantees, on small cases one can
check by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helpers_graphs import H100, build, chain_graph, gemm_graph, mlp_graph, spec
from kitsune_dse.cost.compare import compare
from kitsune_dse.cost.pipeline import pipeline, plan_stages, stage_time_table
from kitsune_dse.cost.region import Region, kernel_works
from kitsune_dse.cost.roofline import _last_wave_s
from kitsune_dse.cost.strategies import bsp, concurrent, fusion, tilesync
from kitsune_dse.errors import InfeasibleError, KitsuneError
from kitsune_dse.graph import load_model
from kitsune_dse.graph.ir import Tensor
from kitsune_dse.search import build_candidates, solve, solve_exact
from kitsune_dse.search import solver as solver_mod
from kitsune_dse.search.candidates import atom_chain, table_and_totals

FNS = {"bsp": bsp, "fusion": fusion, "tilesync": tilesync, "concurrent": concurrent}


def covers_once(graph, chosen):
    ops = [o for c in chosen for o in c.ops]
    return sorted(ops) == sorted(o.name for o in graph.ops) and len(ops) == len(set(ops))


def in_topological_order(graph, chosen):
    pos = {o: i for i, c in enumerate(chosen) for o in c.ops}
    return all(pos[p] <= pos[o] for o in pos for p in graph.preds(o))


@pytest.fixture(scope="module")
def gemm_softmax():
    # h = x @ w is 8192 x 8192 fp16 = 128 MiB, more than the usable L2 (37.5 MiB); the softmax
    # over 8192 columns cannot join the GEMM's epilogue (a CTA tile is at most 256 columns), so
    # bsp and fusion both write h to DRAM and read it back. A two-stage pipeline streams h by
    # row-blocks through L2 and saves those 2 x 128 MiB.
    return gemm_graph(8192, 8192, 1024, epilogue="softmax")


@pytest.fixture(scope="module")
def gemm_softmax_cands(gemm_softmax):
    return build_candidates(gemm_softmax, H100)


# -- candidates ------------------------------------------------------------------------------------
def test_atoms_are_fused_groups_in_topological_order():
    g = load_model("bert-base-encoder")
    atoms, segs = atom_chain(g)
    assert sorted(o for a in atoms for o in a) == sorted(o.name for o in g.ops)
    where = {o: i for i, a in enumerate(atoms) for o in a}
    assert all(where[p] <= where[o] for o in where for p in g.preds(o))
    assert segs == sorted(segs)


def test_every_window_gets_the_four_kernel_strategies_with_cost_layer_numbers():
    g = mlp_graph(2048, 1024, 4096)
    cs = build_candidates(g, H100)
    n = len(cs.atoms)
    spans = cs.by_span()
    assert set(spans) == {(lo, hi) for lo in range(n) for hi in range(lo + 1, n + 1)}
    for span, cands in spans.items():
        strategies = [c.strategy for c in cands]
        assert strategies[:4] == ["bsp", "fusion", "tilesync", "concurrent"]
        for c in cands[:4]:
            e = FNS[c.strategy](Region.of(g, c.ops), H100)
            assert c.estimate.latency_s == e.latency_s and c.estimate.dram_bytes == e.dram_bytes
    for c in cs.candidates:
        assert list(c.ops) == sorted(c.ops, key=g.index)


def test_pipeline_candidates_carry_tables_and_exact_estimates(gemm_softmax, gemm_softmax_cands):
    pipes = [c for c in gemm_softmax_cands.candidates if c.strategy == "pipeline"]
    assert pipes
    for c in pipes:
        J = len(c.choice.stages)
        assert c.stage_tables.shape == (J, H100.sm_count + 1)
        region = Region.of(gemm_softmax, c.ops)
        assert c.estimate == pipeline(region, H100, c.choice)
        plan = plan_stages(region, H100, c.choice)
        assert c.units == plan.row_blocks * plan.slabs
        assert len(c.slot_bytes) == J - 1


def test_table_and_totals_is_stage_time_table(gemm_softmax, gemm_softmax_cands):
    for c in gemm_softmax_cands.candidates:
        if c.strategy != "pipeline":
            continue
        region = Region.of(gemm_softmax, c.ops)
        plan = plan_stages(region, H100, c.choice)
        tab, totals = table_and_totals(region, H100, plan)
        np.testing.assert_array_equal(tab, stage_time_table(region, H100, plan))
        assert totals["dram_read_bytes"] + totals["dram_write_bytes"] == pytest.approx(
            pipeline(region, H100, c.choice).dram_bytes)


def repeated_layers(n_layers: int, rows=2048, width=1024):
    ts = [Tensor("x0", (rows, width), "fp16")]
    ops, ws = [], []
    for i in range(n_layers):
        ts.append(Tensor(f"w{i}", (width, width), "fp16"))
        ws.append(f"w{i}")
        ops.append((f"mm{i}", "matmul", (f"x{i}" if i == 0 else f"r{i - 1}", f"w{i}"), (f"h{i}",)))
        ops.append((f"act{i}", "relu", (f"h{i}",), (f"r{i}",)))
    return build("layers", ts, ops, ["x0"], ws)


def test_identical_layers_are_costed_once_and_renamed():
    g = repeated_layers(6)
    cs = build_candidates(g, H100, max_window=3)
    assert cs.stats["window_cache_hits"] > 0
    for c in cs.candidates:
        region = Region.of(g, c.ops)
        if c.strategy == "pipeline":
            assert {o for st in c.choice.stages for o in st} == set(c.ops)
            e = pipeline(region, H100, c.choice)
        else:
            e = FNS[c.strategy](region, H100)
        assert c.estimate.latency_s == pytest.approx(e.latency_s, rel=1e-12)
        assert c.estimate.dram_bytes == pytest.approx(e.dram_bytes, rel=1e-12)
        for k in cs.own(c).estimate.breakdown.get("kernels", []):   # the copy's own names
            assert set(k["kernel"].split("+")) <= set(c.ops)
    res = solve(cs)
    for c in res.chosen:
        for k in c.estimate.breakdown.get("kernels", []):
            assert set(k["kernel"].split("+")) <= set(c.ops)


@pytest.mark.parametrize("model", ["bert-base-attention", "gpt3-mlp", "resnet50-bottleneck"])
def test_baselines_are_compares_whole_model_strategies(model):
    g = load_model(model)
    cs = build_candidates(g, H100)
    whole = compare(g, H100)
    for s, (lat, _) in cs.baseline_estimates().items():
        assert lat == pytest.approx(whole[s].latency_s, rel=1e-9), s
    res = solve(cs)
    assert res.latency_s <= min(whole[s].latency_s for s in cs.baselines) * (1 + 1e-9)


# -- hand-checkable plans ------------------------------------------------------------------------
def test_two_op_chain_fuses():
    # relu -> relu over 8192 x 4096 fp16 (64 MiB per tensor): bsp writes and re-reads the 64 MiB
    # intermediate (it does not fit the 37.5 MiB usable L2) and launches twice; fusion reads x
    # and writes y once: half the DRAM bytes and about half the time.
    g = chain_graph(8192, 4096, ("relu", "relu"))
    cs = build_candidates(g, H100, strategies=("bsp", "fusion"))
    res = solve(cs)
    assert [c.strategy for c in res.chosen] == ["fusion"]
    assert res.chosen[0].ops == ("op0", "op1")
    assert res.dram_bytes == pytest.approx(2 * 8192 * 4096 * 2)
    b = bsp(Region.of(g), H100)
    assert res.latency_s < 0.6 * b.latency_s and b.dram_bytes == pytest.approx(2 * res.dram_bytes)
    # with every strategy allowed, nothing beats the fused kernel's one read and one write but
    # by its last partial wave (200 tiles on 100 SMs: a persistent one-stage pipeline's drain
    # is not modelled)
    res_all = solve(build_candidates(g, H100))
    (w,) = kernel_works(Region.of(g), [("op0", "op1")], H100)
    tail = _last_wave_s(w, H100, 132)
    assert 0 < tail < 0.01 * res.latency_s
    assert res.latency_s - tail * (1 + 1e-9) <= res_all.latency_s <= res.latency_s * (1 + 1e-9)
    assert res_all.dram_bytes == pytest.approx(res.dram_bytes)


def test_pipeline_wins_when_the_intermediate_does_not_fit_l2(gemm_softmax, gemm_softmax_cands):
    res = solve(gemm_softmax_cands)
    assert [c.strategy for c in res.chosen] == ["pipeline"]
    (c,) = res.chosen
    assert sum(c.choice.sms) <= H100.sm_count
    region = Region.of(gemm_softmax)
    # streaming h by row-blocks keeps it out of DRAM: fewer bytes and less time than any
    # kernel-per-group strategy on the whole graph
    assert res.dram_bytes < fusion(region, H100).dram_bytes - 8192 * 8192 * 2
    assert res.latency_s < min(FNS[s](region, H100).latency_s for s in FNS)
    # the estimate is the exact queue model at the solver's SMs and depths
    assert c.estimate == pipeline(region, H100, c.choice)
    assert res.latency_s == pytest.approx(c.estimate.latency_s)


def test_multi_stage_pipeline_model(gemm_softmax, gemm_softmax_cands):
    # only the two-stage pipelines (GEMM | softmax): the solver must give each stage SMs, a
    # depth to the queue, and predict the exact queue model within the ns rounding
    cs = only_multi_stage(gemm_softmax_cands)
    res = solve(cs)
    (c,) = res.chosen
    assert c.choice.stages == (("mm",), ("epi",))
    assert sum(c.choice.sms) <= H100.sm_count and min(c.choice.sms) >= 1
    assert c.choice.depths[0] in (1, 2, 4, 8)
    assert res.model_latency_s == pytest.approx(res.latency_s, rel=1e-3)
    assert res.status == "OPTIMAL" and res.stats["sm_booleans"] > 0
    ex = solve_exact(cs)
    assert ex.model_latency_s == res.model_latency_s


def only_multi_stage(cs):
    from dataclasses import replace
    keep = [c for c in cs.candidates if c.strategy == "pipeline" and len(c.choice.stages) > 1]
    keep = [replace(c, id=i) for i, c in enumerate(keep)]
    return replace(cs, candidates=keep, baselines={})


def test_same_inputs_give_the_same_plan():
    g = load_model("bert-base-attention")
    a = solve(build_candidates(g, H100), alternatives=2)
    b = solve(build_candidates(g, H100), alternatives=2)
    assert a.plan_key() == b.plan_key()
    assert [x.plan_key() for x in a.alternatives] == [x.plan_key() for x in b.alternatives]
    assert (a.latency_s, a.dram_bytes) == (b.latency_s, b.dram_bytes)


def test_sm_granularity_8_gives_multiples_of_8(gemm_softmax):
    cs = build_candidates(gemm_softmax, H100, sm_granularity=8)

    def ok(c):       # a single stage partitions nothing and may take the whole GPU
        return all(s % 8 == 0 for s in c.choice.sms) or c.choice.sms == (H100.sm_count,)
    for c in cs.candidates:
        if c.strategy == "pipeline":
            assert ok(c), c.choice.sms
    res = solve(cs, sm_granularity=8, alternatives=3)
    for r in [res, *res.alternatives]:
        for c in r.chosen:
            if c.strategy == "pipeline":
                assert ok(c), c.choice.sms
                assert sum(c.choice.sms) <= H100.sm_count
    # with only two-stage pipelines to choose from, both stages get multiples of 8
    multi = solve(only_multi_stage(cs), sm_granularity=8)
    (c,) = multi.chosen
    assert len(c.choice.sms) == 2 and all(s % 8 == 0 for s in c.choice.sms), c.choice.sms
    # a granularity given only to solve() applies too
    multi = solve(only_multi_stage(build_candidates(gemm_softmax, H100)), sm_granularity=8)
    assert all(s % 8 == 0 for s in multi.chosen[0].choice.sms)


@pytest.mark.parametrize("g", [0, -8, 200, 133])
def test_infeasible_granularity_raises(g):
    graph = chain_graph(1024, 1024)
    with pytest.raises(InfeasibleError) as e:
        build_candidates(graph, H100, sm_granularity=g)
    if g > 132:
        assert str(e.value) == f"--sm-granularity {g} is larger than test-h100's 132 SMs"
    cs = build_candidates(graph, H100)
    with pytest.raises(InfeasibleError):
        solve(cs, sm_granularity=g)
    with pytest.raises(InfeasibleError):
        solve_exact(cs, sm_granularity=g)


def test_bad_objective_and_strategy_are_one_line_errors():
    g = chain_graph(1024, 1024)
    with pytest.raises(KitsuneError, match="objective"):
        solve(build_candidates(g, H100), objective="speed")
    with pytest.raises(KitsuneError, match="did you mean 'fusion'"):
        build_candidates(g, H100, strategies=("fuson",))


def test_forced_pipelines_with_no_room_for_a_queue_slot_raise():
    # a 1 MiB L2 (0.75 MiB usable) cannot hold one 64-row slot of the GEMM's 16384-column fp16
    # output (2 MiB): no two-stage pipeline fits
    tiny = spec(l2_bytes=1024 * 1024)
    g = gemm_graph(4096, 16384, 1024, epilogue="softmax")
    cs = build_candidates(g, tiny)           # with every strategy: the model drops them
    items = solver_mod.model_items(cs, 1)
    assert items and all(it.pm is None or it.pm.J == 1 for it in items)
    res = solve(cs)
    assert covers_once(g, res.chosen)
    for c in res.chosen:      # only compare()'s own spilling pipelines may remain, spill priced
        if c.strategy == "pipeline" and len(c.choice.stages) > 1:
            assert c.estimate.breakdown["queue_spill_bytes"] > 0
    with pytest.raises(InfeasibleError, match="too small for one slot per queue"):
        build_candidates(g, tiny, strategies=("pipeline",))


def test_traffic_objective_picks_the_fewest_dram_bytes():
    g = load_model("bert-base-attention")
    cs = build_candidates(g, H100)
    t = solve(cs, objective="traffic")
    lat = solve(cs, objective="latency")
    ex = solve_exact(cs, objective="traffic")
    assert t.model_dram_bytes == ex.model_dram_bytes
    assert t.dram_bytes <= lat.dram_bytes * (1 + 1e-12)
    assert t.dram_bytes <= min(b for _, b in cs.baseline_estimates().values()) * (1 + 1e-12)
    # no single candidate cover with fewer (additive) bytes than the model's optimum
    assert t.model_dram_bytes <= sum(
        min(c.estimate.dram_bytes for c in cs.candidates if c.span == (i, i + 1))
        for i in range(len(cs.atoms))) + 1024 * len(cs.atoms)


def test_pareto_plans_are_mutually_non_dominated():
    # a ViT block: fusion, tile sync and pipelines trade a little latency for DRAM bytes
    g = load_model("vit-b16-block")
    res = solve(build_candidates(g, H100), objective="pareto", time_limit_s=20)
    front = res.pareto
    assert len(front) >= 2
    lats = [p.latency_s for p in front]
    assert lats == sorted(lats)
    for i, a in enumerate(front):
        assert covers_once(g, a.chosen) and in_topological_order(g, a.chosen)
        for j, b in enumerate(front):
            if i != j:
                assert not (b.latency_s <= a.latency_s and b.dram_bytes <= a.dram_bytes)
    assert res.latency_s == front[0].latency_s
    # the front's extremes: the fastest plan and the plan with the fewest bytes
    cs = build_candidates(g, H100)
    assert front[0].latency_s <= solve(cs).latency_s * (1 + 1e-9)
    assert front[-1].dram_bytes <= solve(cs, objective="traffic").dram_bytes * (1 + 1e-9)


def test_alternatives_are_distinct_and_ranked():
    g = load_model("attention-head")
    res = solve(build_candidates(g, H100), alternatives=4)
    alts = res.alternatives
    assert len(alts) == 4
    keys = [res.plan_key()] + [a.plan_key() for a in alts]
    assert len(set(keys)) == len(keys)
    model = [a.model_latency_s for a in alts]
    assert model == sorted(model)
    assert model[0] >= res.model_latency_s - 1e-12 or res.source != "cp-sat"
    for a in alts:
        assert covers_once(g, a.chosen)
    # each alternative chooses another set of candidates, not the same ones on other SM counts
    sets = [frozenset(c.id for c in r.chosen) for r in [res, *alts]]
    assert len(set(sets)) == len(sets)
    # and runs other kernels, not the same kernels cut into other regions
    kernels = [r.kernel_key() for r in [res, *alts]]
    assert len(set(kernels)) == len(kernels)


def test_kernel_key_ignores_region_boundaries_and_sm_splits():
    from kitsune_dse.search.solver import SolverResult
    g = load_model("gpt3-mlp", {"tokens": 64})
    cs = build_candidates(g, H100)
    by = {(c.ops, c.strategy): c for c in cs.candidates if c.choice is None}
    ops = tuple(o.name for o in g.ops)
    whole = by.get((ops, "bsp"))
    parts = [by.get((tuple(a), "bsp")) for a in (ops[:2], ops[2:])]     # fc1+gelu | fc2+residual
    assert whole is not None and all(parts)

    def res(chosen):
        return SolverResult("OPTIMAL", 0.0, "latency", chosen, 0.0, 0.0, 0.0)
    # one bsp region of four kernels or two regions of two: the same kernels
    assert res([whole]).kernel_key() == res(parts).kernel_key()
    assert res([whole]).plan_key() != res(parts).plan_key()
    fused = by.get((ops, "fusion"))
    assert fused is not None and res([fused]).kernel_key() != res([whole]).kernel_key()


def test_kernel_key_counts_a_one_kernel_region_as_that_kernel_whatever_its_label():
    from kitsune_dse.search.solver import SolverResult
    g = load_model("gpt3-mlp", {"tokens": 64})
    cs = build_candidates(g, H100)
    by = {(c.ops, c.strategy): c for c in cs.candidates if c.choice is None}
    ops = tuple(o.name for o in g.ops)
    tail = ops[2:]                                          # fc2 + residual: one fused kernel

    def res(chosen):
        return SolverResult("OPTIMAL", 0.0, "latency", chosen, 0.0, 0.0, 0.0)
    head = by[(ops[:2], "fusion")]
    keys = {s: res([head, by[(tail, s)]]).kernel_key() for s in ("fusion", "tilesync")
            if (tail, s) in by}
    assert len(keys) == 2 and keys["fusion"] == keys["tilesync"]
    # two kernels overlapped by tilesync are not the fusion region's two graph kernels
    both = by[(ops, "tilesync")]
    assert res([both]).kernel_key() != res([by[(ops, "fusion")]]).kernel_key()


def test_alternatives_are_not_the_pick_relabelled():
    # nerf-mlp: every region split and one-kernel relabelling of the pick's fusion kernels costs
    # a few us more; none of them may come back as an alternative (one no-good excludes them all)
    g = load_model("nerf-mlp")
    res = solve(build_candidates(g, H100), alternatives=3, time_limit_s=60)
    plans = [res, *res.alternatives]
    assert len(res.alternatives) == 3
    kernels = [r.kernel_key() for r in plans]
    assert len(set(kernels)) == len(kernels)
    for a in res.alternatives:
        assert covers_once(g, a.chosen)
        assert a.latency_s >= res.latency_s * (1 - 1e-9)


def test_plan_covers_every_op_once_in_order_and_beats_whole_model_strategies():
    for m in ("bert-base-encoder", "llama2-7b-mlp", "mixtral-moe-ffn"):
        g = load_model(m)
        cs = build_candidates(g, H100)
        res = solve(cs)
        assert covers_once(g, res.chosen) and in_topological_order(g, res.chosen)
        assert res.status in ("OPTIMAL", "FEASIBLE") and 0 <= res.gap <= 1
        best = min(lat for lat, _ in cs.baseline_estimates().values())
        assert res.latency_s <= best * (1 + 1e-9), m
        assert res.latency_s == pytest.approx(sum(c.estimate.latency_s for c in res.chosen))


def test_sm_booleans_and_presolved_pipelines_agree(monkeypatch):
    g = load_model("attention-head")
    cs = build_candidates(g, H100)
    a = solve(cs)
    assert a.stats["sm_booleans"] > 0
    monkeypatch.setattr(solver_mod, "SM_BOOL_LIMIT", 0)
    b = solve(cs)
    assert b.stats["pipelines_presolved"]
    assert a.model_latency_s == b.model_latency_s and a.model_dram_bytes == b.model_dram_bytes


def test_exact_oracle_methods_agree_with_the_solver_on_a_zoo_model():
    g = load_model("gpt3-mlp")
    cs = build_candidates(g, H100)
    r = solve(cs)
    for method in ("dp", "brute-force"):
        e = solve_exact(cs, method=method)
        assert e.model_latency_s == r.model_latency_s
        assert e.model_dram_bytes == r.model_dram_bytes


def test_time_limit_is_honoured():
    g = load_model("llama2-7b-prefill")
    cs = build_candidates(g, H100)
    res = solve(cs, time_limit_s=0.5)
    assert res.wall_s < 3.0
    assert covers_once(g, res.chosen)
    assert not math.isnan(res.latency_s)


@pytest.mark.parametrize("model", ["nerf-mlp", "llama2-7b-prefill"])
def test_reused_windows_have_the_cost_layers_numbers(model):
    # these models repeat layers: windows costed once per structural signature must still
    # carry exactly what the cost functions give on their own region
    g = load_model(model)
    cs = build_candidates(g, H100)
    assert cs.stats["window_cache_hits"] > 0
    for c in cs.candidates:
        region = Region.of(g, c.ops)
        e = (pipeline(region, H100, c.choice) if c.strategy == "pipeline"
             else FNS[c.strategy](region, H100))
        assert c.estimate.latency_s == pytest.approx(e.latency_s, rel=1e-12), (c.strategy, c.ops)
        assert c.estimate.dram_bytes == pytest.approx(e.dram_bytes, rel=1e-12), (c.strategy, c.ops)


def test_closed_form_pacing_matches_the_queue_simulation():
    # the solver's pipeline latency: sum T + (J - 1) sync + (N - 1) P with the period
    # P = max(max T, max_q (T_{q+1} + 2 sync) / depth_q); cost.queues.simulate is the truth
    from kitsune_dse.cost.queues import simulate
    rng = np.random.default_rng(7)
    sync = 0.5
    for _ in range(400):
        J = int(rng.integers(2, 5))
        N = int(rng.integers(2, 64))
        T = rng.uniform(0.2, 5.0, J)
        d = [int(x) for x in rng.choice([1, 2, 4, 8], J - 1)]
        sim = simulate(np.repeat(T[:, None], N, axis=1), d, sync).makespan_s
        P = max([T.max()] + [(T[q + 1] + 2 * sync) / d[q] for q in range(J - 1)])
        closed = T.sum() + (J - 1) * sync + (N - 1) * P
        assert 0.99 * closed <= sim <= closed * (1 + 1e-12)


def test_maximal_depth_vectors_equal_the_pairwise_dominance_test():
    # raising one depth a level is enough to find every dominated vector (fit is downward closed)
    import itertools
    import random
    from kitsune_dse.search.solver import QUEUE_DEPTHS, _maximal_depths
    rng = random.Random(7)
    for _ in range(500):
        J = rng.randint(1, 4)
        slots = tuple(rng.choice([0, 1, 64, 1000, rng.randint(0, 5000)]) for _ in range(J - 1))
        budget = rng.choice([-1, 0, 100, rng.randint(0, 60000)])
        fit = [dv for dv in itertools.product(QUEUE_DEPTHS, repeat=J - 1)
               if sum(d * s for d, s in zip(dv, slots)) <= budget]
        pairwise = tuple(dv for dv in fit if not any(
            o != dv and all(a >= b for a, b in zip(o, dv)) for o in fit))
        assert _maximal_depths(J, slots, budget) == pairwise


@pytest.mark.parametrize("model,sizes", [("attention-head", {}), ("gpt3-mlp", {"tokens": 64}),
                                         ("ln-residual-gemm", {})])
def test_the_dp_hint_is_a_complete_solution_of_the_integer_model(model, sizes):
    # every variable hinted (candidates, SMs, and each pipeline's period, overlap, depths,
    # excess and floor steps): fixed to the hint, the model is feasible and its latency is the
    # DP's own total of pre-solved items; each one-stage pipeline keeps a single SM count
    from ortools.sat.python import cp_model

    from kitsune_dse.search.exact import _dp_lexi
    cs = build_candidates(load_model(model, sizes), H100)
    items = solver_mod.model_items(cs, 1)
    cov = solver_mod._Cover(cs, items, True)
    assert cov.sm_vars and all(len(it.pm.allowed[0]) == 1 for it in items
                               if it.pm is not None and it.pm.J == 1)
    hint = cov.dp_hint("latency")
    hinted = {v.index for v, _ in hint}
    aux = [x for a in cov.aux.values() for x in [a["E"], a["B"], a["M"], *[z for zq in a["z"] for z in zq],
                                                  *[u for u, _ in a["u"]]] if x is not None]
    assert aux and all(x.index in hinted for x in aux)
    m = cov.model.clone()
    for v, val in hint:
        m.add(v == val)
    m.minimize(cov.lat)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.solve(m) == cp_model.OPTIMAL
    dp = _dp_lexi(len(cs.atoms), [(it.cand.span, (it.lat, it.kib), k) for k, it in enumerate(items)])
    assert round(s.objective_value) == dp[0][0]
