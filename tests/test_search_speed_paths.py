"""The candidate search's faster paths give the same doubles as the plain ones: stage replays
side by side, a window's exhaustive search in parts, the queue model's scalar servers."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from kitsune_dse.cost import stage_sim
from kitsune_dse.cost.compare import pipeline_bases, pipeline_candidates
from kitsune_dse.cost.pipeline import _servers_at, servers_for
from kitsune_dse.cost.region import Region
from kitsune_dse.cost.stage_sim import StageShape
from kitsune_dse.graph import load_model
from kitsune_dse.hw import load_spec
from kitsune_dse.search import candidates


@settings(max_examples=40, deadline=None)
@given(jobs=st.lists(st.tuples(st.lists(st.integers(1, 40), min_size=3, max_size=3),
                               st.integers(1, 20), st.lists(st.integers(0, 4), min_size=3, max_size=3),
                               st.lists(st.booleans(), min_size=3, max_size=3),
                               st.integers(-1, 2), st.integers(0, 99)), min_size=1, max_size=6),
       rbs=st.integers(1, 160))
def test_replays_side_by_side_equal_each_alone(jobs, rbs):
    # jobs of one step count and row-blocks, differing in items, lookahead, ring slots, waits,
    # release step and item times: each job's result is the double its own replay gives
    workers = np.array([2, 8, 64, 264], dtype=np.int64)
    batch = []
    for items, look, slots, late, release, seed in jobs:
        shape = StageShape(tuple(items), rbs, look, tuple(slots), 1, 1, tuple(late), release)
        rng = np.random.default_rng(seed)
        tau = rng.uniform(1e-7, 1e-4, (3, workers.size))
        lone = tau * rng.choice([1.0, 1.7], (3, 1))
        batch.append((shape, np.vstack([tau, lone]), (3e-7, 5e-7, 3e-7)))
    together = stage_sim._simulate_batch(batch, workers, 2.4e-6)
    for (shape, tau, waits), got in zip(batch, together):
        alone = stage_sim._simulate_batch([(shape, tau, waits)], workers, 2.4e-6)[0]
        assert got.tobytes() == alone.tobytes()


def test_a_window_search_in_parts_equals_the_whole_search():
    # parts by tile size, merged in the choices' order (a one-stage cut's tile at the stream's
    # rows comes twice among the choices: both stay)
    graph, spec = load_model("ln-residual-gemm"), load_spec("h100-sxm")
    region = Region.of(graph)
    whole = [(pc.choice, pc.estimate) for pc in pipeline_candidates(region, spec)]
    keys = [(b.stages, b.tile_rows, b.depths, b.modes) for b in pipeline_bases(region)]
    assert whole and len(set(keys)) < len(keys)
    candidates._FORKED["args"] = (graph, spec, 1)
    try:
        tiles = dict.fromkeys(b.tile_rows for b in pipeline_bases(region))
        merged = sorted((x for t in tiles for x in candidates._pipeline_search_part(region.ops, t)),
                        key=lambda x: x[0])
    finally:
        candidates._FORKED.clear()
    assert [(c, e.latency_s, e.dram_bytes) for _, c, e in merged] == \
        [(c, e.latency_s, e.dram_bytes) for c, e in whole]


@settings(max_examples=200, deadline=None)
@given(t=st.floats(1e-8, 1e-2), ratio=st.one_of(st.floats(0.0, 80.0), st.integers(1, 80).map(lambda x: x + 0.5)),
       cap=st.integers(1, 64), units=st.integers(1, 4096))
def test_scalar_servers_equal_the_array_rule(t, ratio, cap, units):
    assert _servers_at(t, t * ratio, cap, units) == int(servers_for(t, t * ratio, cap, units))
