"""The worker-by-worker schedule of a pipeline stage of several dependent steps."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helpers_graphs import examples

from kitsune_dse.cost.pipeline import PipelineChoice, pipeline, plan_stages, stage_time_table
from kitsune_dse.cost.region import Region
from kitsune_dse.cost.stage_sim import StageShape, makespan
from kitsune_dse.graph import load_model
from kitsune_dse.hw import load_spec


def test_two_steps_two_row_blocks_by_hand():
    # items (1, 1) per row-block, 1 s each, no hand-off latency. Two workers: row-block 0 goes to
    # worker 0 (step 0 in [0, 1], step 1 in [1, 2]), row-block 1 rotates to worker 1 (the same,
    # side by side): 2 s. One worker does the four items one after another: 4 s.
    shape = StageShape(items=(1, 1), row_blocks=2, lookahead=2, slots=(2, 2))
    got = makespan(shape, np.ones((2, 2)), np.array([2, 1]), 0.0)
    assert got.tolist() == [2.0, 4.0]


def test_a_step_waits_for_the_whole_previous_step_of_its_row_block():
    # step 0 has 2 items of 1 s, step 1 one item of 3 s; 2 workers, 1 row-block, 0.5 s hand-off:
    # step 1 starts when both step-0 items are done (1 s) plus the hand-off: ends at 4.5 s
    shape = StageShape(items=(2, 1), row_blocks=1, lookahead=1, slots=(2, 2))
    tau = np.array([[1.0], [3.0]])
    assert makespan(shape, tau, np.array([2]), 0.5).tolist() == [4.5]


def test_lookahead_one_serialises_row_blocks():
    # lookahead 1: row-block rb starts only after rb - 1 is done, whatever the free workers
    shape = StageShape(items=(1, 1), row_blocks=4, lookahead=1, slots=(2, 2))
    assert makespan(shape, np.ones((2, 1)), np.array([8]), 0.0).tolist() == [8.0]


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.integers(1, 40), min_size=2, max_size=4),
       rbs=st.integers(1, 60), workers=st.integers(1, 80), look=st.integers(1, 64),
       taus=st.lists(st.floats(1e-6, 1e-3), min_size=4, max_size=4))
def test_never_faster_than_the_work_spread_over_all_workers_nor_the_chain(items, rbs, workers, look, taus):
    K = len(items)
    tau = np.array(taus[:K])[:, None]
    shape = StageShape(items=tuple(items), row_blocks=rbs, lookahead=look, slots=(2,) * K)
    got = float(makespan(shape, tau, np.array([workers]), 0.0)[0])
    work = rbs * sum(n * t for n, t in zip(items, tau[:, 0])) / workers
    chain = sum(np.ceil(n / workers) * t for n, t in zip(items, tau[:, 0]))
    assert got >= (1 - 1e-9) * max(work, chain)
    # and never slower than doing every item on one worker
    assert got <= (1 + 1e-9) * rbs * sum(n * t for n, t in zip(items, tau[:, 0])) + 1e-12


def test_a_one_stage_gemm_chain_is_priced_by_its_worker_schedule():
    # five dependent 2048 x 1024 x 1024 GEMMs as one stage on 132 SMs, every row-block in flight:
    # measured 107.6 us on the H100 (calibration run of 2026-11-22, harness version 3); with
    # every row-block assumed independent of the step before it the model gave the five GEMMs'
    # time side by side. The worker schedule (lone items, hand-offs between steps) stays within 10%
    from kitsune_dse.validate.microbench import case_model
    sp = load_spec("h100-sxm.calibrated")
    g, _ = case_model("chain", "fp16", (2048, 1024, 5))
    ops = tuple(o.name for o in g.ops)
    est = pipeline(Region.of(g), sp, PipelineChoice((ops,), (132,), 2048))
    assert est.latency_s == pytest.approx(107.6e-6, rel=0.10)
    one, _ = case_model("chain", "fp16", (2048, 1024, 1))
    single = pipeline(Region.of(one), sp, PipelineChoice((("mm0",),), (132,), 2048)).latency_s
    assert est.latency_s > 4 * (single - sp.persistent_launch_cost_s)


def test_stage_tables_agree_with_the_estimate_at_every_sm_count():
    # the solver's closed form reads these tables; the exact estimate must use the same numbers
    sp = load_spec("h100-sxm.calibrated")
    g = load_model("gpt3-mlp", {"tokens": 2048, "tp": 8})
    ops = tuple(o.name for o in g.ops)
    r = Region.of(g, list(ops))
    from kitsune_dse.cost.pipeline import stage_unit_time, stage_works
    plan = plan_stages(r, sp, PipelineChoice((ops,), (132,), 1024))
    tab = stage_time_table(r, sp, plan)
    works, tot = stage_works(r, sp, plan)
    for s in (1, 3, 8, 13, 64, 100, 132):
        assert tab[0][s] == pytest.approx(stage_unit_time(works[0], sp, s, tot["stage_shapes"][0]),
                                          rel=1e-12)


def test_the_models_runtime_constants_equal_the_runtimes():
    # the harness keeps its own copies (it must import without pydantic on the GPU machine)
    from kitsune_dse.cost import pipeline as model
    from kitsune_dse.validate import lower as runtime
    assert model.ROW_VPL_MAX == runtime.MAX_VPL
    assert model.INTRA_RING_BYTES == runtime.INTRA_RING_BYTES
    assert model.TEAMS_PER_SM == runtime.TEAMS
    assert model.TEAM_THREADS == runtime.THREADS


@settings(max_examples=examples(80), deadline=None)
@given(n_tiles=st.integers(1, 400), workers=st.integers(2, 264), k=st.sampled_from([256, 768, 1024, 3072, 4096, 11008, 12288, 49152]),
       slab_w=st.sampled_from([64, 128]), nslots=st.integers(1, 32), cols=st.sampled_from([128, 768, 4096, 12288]),
       nb=st.integers(1, 2))
def test_the_models_k_split_is_the_runtimes(n_tiles, workers, k, slab_w, nslots, cols, nb):
    # cost.pipeline.runtime_ksplit is a copy of validate.lower._choose_ksplit
    from types import SimpleNamespace

    from kitsune_dse.cost import pipeline as model
    from kitsune_dse.validate import lower as runtime
    assert model.KSPLIT_MIN_RANGE == runtime.KSPLIT_MIN_RANGE
    assert model.KSPLIT_WS_BYTES == runtime.KSPLIT_WS_BYTES
    g = SimpleNamespace(k=k, nb=nb, cols=cols, ops=["mm"])
    step = SimpleNamespace(group=g, n_tiles=n_tiles, ksplit=1, kper=0, items=n_tiles, sid=1)
    ring = SimpleNamespace(slab_w=slab_w, nslots=nslots, bm=128)
    runtime._choose_ksplit(step, ring, workers, [])
    assert model.runtime_ksplit(n_tiles, workers, k, slab_w, nslots * nb * 128 * cols * 4) == step.ksplit


def test_split_k_consumer_servers_by_hand():
    # gpt3 t64's fc2 behind a split_k queue: 96 column tiles, K = 49152 in 128-column slabs, 58
    # SMs = 116 workers: the runtime splits K in 6 ranges (576 items); a unit (one of 16 slabs)
    # spreads over every worker while an item covers 16 / 6 slabs of one tile:
    # 16 x 116 / (6 x 96) = 3.2 -> the nearest divisor of 16 units: 4 servers
    from kitsune_dse.cost import pipeline as model
    assert model.runtime_ksplit(96, 116, 49152, 128, 1 * 1 * 64 * 12288 * 4) == 6
    assert model.servers_for(1.0, 16 * 116 / (6 * 96), 16, 16) == 4
    assert model.servers_for(1.0, 1.2, 16, 16) == 1 and model.servers_for(1.0, 7.0, 4, 16) == 4
    # a ratio halfway between two divisors goes to the fewer servers whatever the last bits of
    # the unit time (property test: one SM more on the chip doubled a consumer's servers, 8 ->
    # 16, through a unit time 1 ulp smaller)
    for t in (3.0784269255490018e-06, 3.0784269255490013e-06, 1.0, 0.1, 7e-5):
        assert model.servers_for(t, 12.0 * t, 16, 32) == 8
        assert model.servers_for(t, 6.0 * t, 8, 8) == 4


def _dense_schedule(shape, tau, workers, sync_s):
    """The schedule replayed over every worker of every SM count (the plain form of
    stage_sim._simulate's replay, which touches only the workers with items)."""
    from kitsune_dse.cost.stage_sim import SIM_ROW_BLOCKS
    K, Rs = len(shape.items), min(max(1, shape.row_blocks), SIM_ROW_BLOCKS)
    n_s, W = len(workers), int(workers.max())
    c = np.arange(W)[None, :]
    Wc = workers[:, None]
    free = np.zeros((n_s, W))
    done = np.zeros((Rs, K, n_s))
    look = max(1, int(shape.lookahead))
    for rb in range(Rs):
        for k, n in enumerate(shape.items):
            i0 = c - ((rb * n) % workers)[:, None]
            i0 += Wc * (i0 < 0)
            active = (c < Wc) & (i0 < n)
            cnt = active * ((n - 1 - i0) // Wc + 1)
            ready = np.zeros(n_s)
            after = shape.after[k] if shape.after else k - 1
            reader = shape.reader[k] if shape.reader else (k + 1 if k + 1 < K else -1)
            if after >= 0:
                ready = done[rb, after] + sync_s
            elif rb >= look:
                ready = done[rb - look, K - 1] + sync_s
            slots = shape.slots[k]
            if slots and reader > k and rb >= slots:
                ready = np.maximum(ready, done[rb - slots, reader] + sync_s)
            end = np.maximum(free, ready[:, None]) + cnt * tau[k][:, None]
            free = np.where(active, end, free)
            done[rb, k] = np.max(np.where(active, end, -np.inf), axis=1)
    return done


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.integers(1, 300), min_size=1, max_size=5), rbs=st.integers(1, 160),
       workers=st.lists(st.integers(1, 280), min_size=1, max_size=6), look=st.integers(1, 20),
       slots=st.lists(st.integers(0, 4), min_size=5, max_size=5), seed=st.integers(0, 99),
       sync=st.sampled_from([0.0, 1e-6, 3.7e-7]), links=st.booleans())
def test_the_sparse_replay_equals_the_dense_one_bit_for_bit(items, rbs, workers, look, slots,
                                                            seed, sync, links):
    # only the workers holding items are replayed: every finish time must stay the same double
    # (links: steps that read an earlier step other than the one before, or only the stage's
    # input, and rings whose slots a later step frees, or none)
    from kitsune_dse.cost import stage_sim
    K = len(items)
    after = reader = ()
    if links:
        rng = np.random.default_rng(seed + 1000)
        after = tuple(int(rng.integers(-1, k)) if k else -1 for k in range(K))
        reader = tuple(int(rng.choice([-1, *range(k + 1, K)])) for k in range(K))
    shape = StageShape(tuple(items), rbs, look, tuple(slots[:K]), after=after, reader=reader)
    w = np.array(workers, dtype=np.int64)
    tau = np.random.default_rng(seed).uniform(1e-7, 1e-4, (K, len(w)))
    done = _dense_schedule(shape, tau, w, sync)
    Rs = done.shape[0]
    ends = np.maximum.accumulate(done.max(axis=1), axis=0)
    got = stage_sim._simulate(shape, tau, w, sync)
    if rbs == Rs:
        assert got.tobytes() == ends[-1].tobytes()
    else:       # the extrapolated period starts from the same simulated ends
        half = Rs // 2
        work = (np.asarray(items, float)[:, None] * tau).sum(axis=0) / w
        period = np.maximum((ends[-1] - ends[half - 1]) / (Rs - half), work)
        assert got.tobytes() == (ends[-1] + (rbs - Rs) * period).tobytes()


@settings(max_examples=examples(80), deadline=None)
@given(m=st.integers(1, 70000), n=st.integers(1, 50000), k=st.integers(16, 50000))
def test_the_models_harness_gemm_choice_is_the_harnesss(m, n, k):
    # cost.roofline.harness_gemm_choice is a copy of validate.codegen.choose_gemm_tile (one B)
    from types import SimpleNamespace

    from kitsune_dse.cost.roofline import harness_gemm_choice
    from kitsune_dse.validate.codegen import choose_gemm_tile
    got = choose_gemm_tile(SimpleNamespace(tile=None, rows=m, cols=n, k=k, nb=1), 132)
    assert harness_gemm_choice(m, n, k, 132) == ((got["bm"], got["bn"]), got["splits"])


def test_bert_one_stage_replay_matches_the_gpu_trace():
    # bert-base-ffn's one-stage hand plan (fc1+gelu: 24 items of ~26 us per 128-row block, then
    # fc2+residual: 6 of ~75 us; rings of 8 row-blocks; 128 row-blocks). The GPU's trace
    # (bench/pipeline_trace.py, 2026-11-22) ends at 3.11 ms. Replayed from 16 row-blocks and
    # extrapolated it was 4.7-6.2 ms depending on the SM count; the whole replay stays 2.9-3.4
    from kitsune_dse.cost.stage_sim import makespan
    shape = StageShape((24, 6), 128, 128, (8, 8), 8)
    workers = np.array([256, 264, 272])
    tau = np.array([[26.1e-6] * 3, [74.7e-6] * 3])
    span = makespan(shape, tau, workers, 0.53e-6)
    assert np.all((span > 2.9e-3) & (span < 3.4e-3)), span


def test_the_input_slot_frees_when_its_reader_is_done():
    # items (1, 1), 1 s each, 4 row-blocks, an input ring of one row-block (lookahead 1), 8
    # workers, no hand-off latency. Freed only when the stage's last step is done with a
    # row-block, the row-blocks run one after another: 8 s. Freed when step 0 (its only reader)
    # is: row-block r's step 0 runs in [r, r + 1] and its step 1 in [r + 1, r + 2]: 5 s
    last = StageShape(items=(1, 1), row_blocks=4, lookahead=1, slots=(2, 2))
    first = StageShape(items=(1, 1), row_blocks=4, lookahead=1, slots=(2, 2), release_step=0)
    tau = np.ones((2, 1))
    assert makespan(last, tau, np.array([8]), 0.0).tolist() == [8.0]
    assert makespan(first, tau, np.array([8]), 0.0).tolist() == [5.0]


def test_a_step_that_reads_only_the_stage_input_runs_beside_the_one_before_it():
    # two steps of one item, 1 s each, 4 row-blocks, 8 workers, rings of 4 row-blocks, no
    # hand-off latency. As a chain, each row-block's step 1 waits for its step 0: 2 s. Step 1
    # reading only the stage's input (nerf's feature_fc beside the sigma head) runs once its
    # worker is free, which for the one worker of a row-block is after its step 0 all the same;
    # but step 0 writing only the stage's outputs never waits for a slot: with rings of one
    # row-block the chain runs them one after another (8 s), apart they run side by side (2 s)
    for slots, chained in (((4, 4), 2.0), ((1, 1), 8.0)):
        chain = StageShape(items=(1, 1), row_blocks=4, lookahead=4, slots=slots)
        apart = StageShape(items=(1, 1), row_blocks=4, lookahead=4, slots=slots, after=(-1, -1),
                           reader=(-1, -1))
        tau = np.ones((2, 2))
        assert makespan(chain, tau, np.array([8, 1]), 0.0).tolist() == [chained, 8.0]
        assert makespan(apart, tau, np.array([8, 1]), 0.0).tolist() == [2.0, 8.0]


def test_a_slot_frees_when_the_last_step_reading_it_is_done():
    # three steps of one item, 1 s each, 4 row-blocks, 8 workers (row-block r on worker r),
    # step 0's ring holds one row-block. Chain: step 0 of r waits for step 1 of r - 1, r's steps
    # run in [2r, 2r + 3]: 9 s. Steps 1 and 2 both reading step 0: its slot frees when step 2
    # is done, r's steps run in [3r, 3r + 3]: 12 s
    chain = StageShape(items=(1, 1, 1), row_blocks=4, lookahead=4, slots=(1, 4, 4))
    both = StageShape(items=(1, 1, 1), row_blocks=4, lookahead=4, slots=(1, 4, 4), after=(-1, 0, 0),
                      reader=(2, -1, -1))
    tau = np.ones((3, 1))
    assert makespan(chain, tau, np.array([8]), 0.0).tolist() == [9.0]
    assert makespan(both, tau, np.array([8]), 0.0).tolist() == [12.0]


def test_nerfs_head_stage_knows_which_steps_read_which():
    # sigma_fc + relu and feature_fc both read the stage's input; dir_concat reads feature_fc,
    # view_fc its concat, rgb_fc the view layer; the sigma head leaves the stage
    from kitsune_dse.cost.pipeline import _stage_works_core
    g = load_model("nerf-mlp", {"rays": 64})
    spec = load_spec("hw_specs/h100-sxm.calibrated.yaml")
    head = ["sigma_fc", "sigma_relu", "feature_fc", "dir_concat", "view_fc", "view_relu", "rgb_fc",
            "rgb_sigmoid"]
    body = [o.name for o in g.ops if o.name not in head]
    region = Region.of(g, body + head)
    c = PipelineChoice(stages=(tuple(body), tuple(head)), sms=(66, 66), tile_rows=1024, depths=(4,),
                       modes=("row",))
    shape = _stage_works_core(region, spec, plan_stages(region, spec, c)).shapes[1]
    assert shape.after == (-1, -1, 1, 2, 3)
    assert shape.reader == (-1, 2, 3, 4, -1)


DLRM = load_model("dlrm-top-mlp")
DLRM_2 = (("top_fc1", "top_relu1", "top_fc2", "top_relu2"),
          ("top_fc3", "top_relu3", "top_fc4", "top_relu4", "top_fc5", "sigmoid"))


def test_a_split_k_writer_finishes_a_row_blocks_slabs_together_when_its_items_fit():
    # fc2's 2048-row block is 16 x 8 column tiles: 128 items fit 68 SMs' 136 workers, so both
    # K slabs of the block are written at once (2 units per latency); on 16 SMs (32 workers)
    # the items run in order and the slabs leave one after another
    spec = load_spec("h100-sxm.calibrated")
    region = Region.of(DLRM, [o for s in DLRM_2 for o in s])
    for sms, want in (((68, 64), 2), ((16, 64), 1)):
        est = pipeline(region, spec, PipelineChoice(DLRM_2, sms, 2048, (4,), ("split_k",)))
        assert est.breakdown["slabs"] == 2
        assert est.breakdown["stage_servers"][0] == want


def test_a_several_step_stage_runs_as_many_units_side_by_side_as_its_first_takes_periods():
    # the three-GEMM stage of dlrm's three-stage plan: one unit's trip through fc3 -> fc4 ->
    # fc5 alone is several of its per-unit periods, so the queue model runs it on several
    # servers (each unit's latency servers x period), no more than its rings admit
    from kitsune_dse.cost.pipeline import stage_works
    from kitsune_dse.cost.stage_sim import stage_unit_latency, stage_unit_time
    spec = load_spec("h100-sxm.calibrated")
    stages = (("top_fc1", "top_relu1"), ("top_fc2", "top_relu2"), DLRM_2[1])
    region = Region.of(DLRM, [o for s in stages for o in s])
    choice = PipelineChoice(stages, (40, 60, 32), 128, (4, 4), ("split_k", "split_k"))
    plan = plan_stages(region, spec, choice)
    works, totals = stage_works(region, spec, plan)
    shape = totals["stage_shapes"][2]
    t = stage_unit_time(list(works[2]), spec, 32, shape)
    lat = stage_unit_latency(list(works[2]), spec, 32, shape)
    assert lat > 4 * t
    srv = pipeline(region, spec, choice).breakdown["stage_servers"][2]
    assert 1 < srv <= totals["stage_inflight"][2]


def test_a_slot_between_steps_waits_a_ring_hand_off():
    # a GEMM feeding a softmax in one stage through a two-row-block ring: the GEMM of block
    # r + 2 waits for the softmax of block r to free its slot, a ring hand-off each time, so a
    # slower hand-off slows the stage (and a stage alone of one step does not care)
    from kitsune_dse.calibrate.fit import one_stage_time
    spec = load_spec("h100-sxm.calibrated")
    fast = spec.model_copy(update={"ring_handoff_s": 0.5e-6})
    slow = spec.model_copy(update={"ring_handoff_s": 5e-6})
    dims = (65536, 1024, 128)
    assert one_stage_time(slow, "mmsoftmax", dims, 88, rows=256) > one_stage_time(fast, "mmsoftmax", dims, 88, rows=256)
    assert one_stage_time(slow, "matmul", dims, 88) == pytest.approx(one_stage_time(fast, "matmul", dims, 88))
