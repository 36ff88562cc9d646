"""The queue-occupancy model (kitsune_dse.cost.queues.simulate): hand-evaluated recurrences,
closed forms, and the vectorised solver against the plain-loop reference.

Recurrence (blocking after service, b[j] slots counting the one the consumer works on):
    D[j][n] = max( max(D[j-1][n] + s, D[j][n-1]) + t[j][n],  D[j+1][n-b[j]] + s )
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_graphs import examples
from kitsune_dse.cost.queues import _general, simulate, simulate_reference


# -- hand-evaluated cases ------------------------------------------------------------------------
def test_two_stages_deep_queue_by_hand():
    # t = [1, 2], 3 tiles, plenty of slots: D0 = 1, 2, 3; D1 = 3, 5, 7
    r = simulate([[1, 1, 1], [2, 2, 2]], [8])
    np.testing.assert_allclose(r.departures, [[1, 2, 3], [3, 5, 7]])
    np.testing.assert_allclose(r.starts, [[0, 1, 2], [1, 3, 5]])
    assert r.makespan_s == 7 and r.fill_s == 3 and r.drain_s == 7 - 3
    assert r.period_s == pytest.approx((7 - 3) / 2)
    assert r.bottleneck_stage == 1
    # stage 0: starts at 0, ends at 3, busy 3 -> no stall; stage 1: 1..7, busy 6 -> 0
    np.testing.assert_allclose(r.stall_s, [0, 0])
    # queue holds tile n from D0[n] to D1[n]: (3-1)+(5-2)+(7-3) = 9 tile-units over 7
    assert r.mean_occupancy[0] == pytest.approx(9 / 7)
    assert r.max_occupancy[0] == 2       # at t=3: tile 0 leaves, tile 2 enters; tiles 1, 2 held


def test_two_stages_depth_one_blocks_the_fast_producer():
    # t = [1, 2], depth 1, sync 0. By hand:
    #   n=0: D0=1, D1=max(1, -)+2=3
    #   n=1: D0=max(1+1, D1[0]=3)=3, D1=max(3, 3)+2=5
    #   n=2: D0=max(3+1, D1[1]=5)=5, D1=max(5, 5)+2=7
    r = simulate([[1, 1, 1], [2, 2, 2]], [1])
    np.testing.assert_allclose(r.departures, [[1, 3, 5], [3, 5, 7]])
    # the producer finishes tile 1 at t=2 but holds it until t=3: it starts tile 1 at 1
    np.testing.assert_allclose(r.starts[0], [0, 1, 3])
    assert r.period_s == 2                      # max(t)
    # stage 0 spans 0..5 with 3 units of work: 2 blocked
    np.testing.assert_allclose(r.stall_s, [2, 0])
    assert r.max_occupancy[0] == 1


def test_two_stages_depth_one_with_sync_period_is_slow_stage_plus_two_handoffs():
    # t = [1, 2], depth 1, s = 0.5. By hand:
    #   n=0: D0=1,                         D1=max(1+.5, -)+2 = 3.5
    #   n=1: D0=max(1+1, D1[0]+.5=4) = 4,  D1=max(4+.5, 3.5)+2 = 6.5
    #   n=2: D0=max(4+1, 6.5+.5=7) = 7,    D1=max(7+.5, 6.5)+2 = 9.5
    r = simulate([[1, 1, 1], [2, 2, 2]], [1], sync_s=0.5)
    np.testing.assert_allclose(r.departures, [[1, 4, 7], [3.5, 6.5, 9.5]])
    assert r.period_s == pytest.approx(2 + 2 * 0.5)
    # with two slots the hand-offs overlap: the period is the slow stage alone
    r2 = simulate([[1] * 6, [2] * 6], [2], sync_s=0.5)
    assert r2.period_s == pytest.approx(2.0)


def test_three_stages_depth_one_by_hand():
    # t = [1, 3, 2], depths [1, 1], sync 0, 4 tiles.
    #   n=0: D0=1                    D1=max(1,-)+3=4            D2=max(4,-)+2=6
    #   n=1: D0=max(1+1, D1[0]=4)=4  D1=max(max(4,4)+3, D2[0]=6)=7   D2=max(7,6)+2=9
    #   n=2: D0=max(4+1, 7)=7        D1=max(max(7,7)+3, 9)=10        D2=max(10,9)+2=12
    #   n=3: D0=max(7+1, 10)=10      D1=max(max(10,10)+3, 12)=13     D2=max(13,12)+2=15
    t = np.array([[1.0] * 4, [3.0] * 4, [2.0] * 4])
    r = simulate(t, [1, 1])
    want = [[1, 4, 7, 10], [4, 7, 10, 13], [6, 9, 12, 15]]
    np.testing.assert_allclose(r.departures, want)
    np.testing.assert_allclose(simulate_reference(t, [1, 1]), want)
    assert r.makespan_s == 15 and r.period_s == 3 and r.bottleneck_stage == 1


def test_three_stages_slow_tail_backs_up_through_two_depth_one_queues():
    # t = [1, 1, 3], depths [1, 1], sync 0, 4 tiles.
    #   n=0: D0=1                 D1=2                        D2=5
    #   n=1: D0=max(2, D1[0]=2)=2 D1=max(max(2,2)+1, D2[0]=5)=5   D2=max(5,5)+3=8
    #   n=2: D0=max(3, D1[1]=5)=5 D1=max(max(5,5)+1, D2[1]=8)=8   D2=max(8,8)+3=11
    #   n=3: D0=max(6, D1[2]=8)=8 D1=max(max(8,8)+1, 11)=11       D2=max(11,11)+3=14
    t = np.array([[1.0] * 4, [1.0] * 4, [3.0] * 4])
    r = simulate(t, [1, 1])
    np.testing.assert_allclose(r.departures, [[1, 2, 5, 8], [2, 5, 8, 11], [5, 8, 11, 14]])
    # stall = (last departure - first start) - busy: 8-0-4, 11-1-4, 14-2-12
    np.testing.assert_allclose(r.stall_s, [4, 6, 0])
    assert r.fill_s == 5 and r.drain_s == 14 - 8


def test_three_stages_with_sync_and_per_tile_times_by_hand():
    # t0 = [1, 2, 1], t1 = [2, 1, 2], depth [2], sync 0.25
    #   n=0: D0=1                          D1=max(1.25, -)+2 = 3.25
    #   n=1: D0=max(1+2, -) = 3            D1=max(3.25, 3.25)+1 = 4.25
    #   n=2: D0=max(3+1, D1[0]+.25=3.5)=4  D1=max(4.25, 4.25)+2 = 6.25
    t = [[1, 2, 1], [2, 1, 2]]
    r = simulate(t, [2], sync_s=0.25)
    np.testing.assert_allclose(r.departures, [[1, 3, 4], [3.25, 4.25, 6.25]])
    np.testing.assert_allclose(simulate_reference(t, [2], 0.25), r.departures)


def test_release_times_delay_the_first_stage():
    r = simulate([[1, 1, 1]], [], release=[0, 5, 5])
    np.testing.assert_allclose(r.departures, [[1, 6, 7]])


def test_bad_depths_are_rejected():
    with pytest.raises(ValueError):
        simulate([[1, 1], [1, 1]], [])
    with pytest.raises(ValueError):
        simulate([[1, 1], [1, 1]], [0])


# -- closed forms --------------------------------------------------------------------------------
@settings(max_examples=examples(40), deadline=None)
@given(t=st.lists(st.floats(0.01, 10), min_size=1, max_size=5), n=st.integers(1, 40),
       sync=st.sampled_from([0.0, 0.3]))
def test_deep_queues_give_sum_plus_n_minus_one_times_max(t, n, sync):
    J = len(t)
    r = simulate(np.repeat(np.array(t)[:, None], n, axis=1), [n + 1] * (J - 1), sync)
    expected = sum(t) + (J - 1) * sync + (n - 1) * max(t)
    assert r.makespan_s == pytest.approx(expected, rel=1e-9)


@settings(max_examples=examples(30), deadline=None)
@given(t=st.floats(0.01, 10), J=st.integers(1, 6), n=st.integers(1, 50))
def test_equal_stages_deep_queues(t, J, n):
    r = simulate(np.full((J, n), t), [n] * (J - 1))
    assert r.makespan_s == pytest.approx(J * t + (n - 1) * t, rel=1e-9)   # sum(t) + (N-1) max(t)
    if n > 1:
        assert r.period_s == pytest.approx(t, rel=1e-9)


@settings(max_examples=examples(40), deadline=None)
@given(t0=st.floats(0.01, 10), t1=st.floats(0.01, 10), n=st.integers(2, 30))
def test_two_stages_depth_one_period_is_the_slower_stage(t0, t1, n):
    # derived above: D0[n] = max(D0[n-1]+t0, D1[n-1]), D1[n] = max(D0[n], D1[n-1]) + t1
    #   t0 < t1: D0[n] = D1[n-1] and D1[n] = D1[n-1] + t1; t0 > t1: D0[n] = D0[n-1] + t0
    r = simulate([[t0] * n, [t1] * n], [1])
    assert r.period_s == pytest.approx(max(t0, t1), rel=1e-9)
    assert r.makespan_s == pytest.approx(t0 + t1 + (n - 1) * max(t0, t1), rel=1e-9)


# -- vectorised solver against the plain loop ----------------------------------------------------
@st.composite
def tandem(draw):
    J = draw(st.integers(1, 5))
    N = draw(st.integers(1, 14))
    per_tile = draw(st.booleans())
    if per_tile:
        t = draw(st.lists(st.lists(st.floats(0.0, 5.0), min_size=N, max_size=N),
                          min_size=J, max_size=J))
    else:
        row = draw(st.lists(st.floats(0.01, 5.0), min_size=J, max_size=J))
        t = [[x] * N for x in row]
    depth = draw(st.lists(st.integers(1, 5), min_size=J - 1, max_size=J - 1))
    sync = draw(st.sampled_from([0.0, 0.1, 0.56, 2.0]))
    return np.array(t, dtype=float), depth, sync


@settings(max_examples=examples(150), deadline=None)
@given(tandem())
def test_simulate_equals_the_reference_loop(case):
    t, depth, sync = case
    ref = simulate_reference(t, depth, sync)
    r = simulate(t, depth, sync)
    np.testing.assert_allclose(r.departures, ref, rtol=1e-9, atol=1e-9)


@settings(max_examples=examples(100), deadline=None)
@given(tandem())
def test_chunked_fallback_equals_the_reference_loop(case):
    # max_sweeps=0 forces the exact chunked evaluation
    t, depth, sync = case
    r = simulate(t, depth, sync, max_sweeps=0)
    np.testing.assert_allclose(r.departures, simulate_reference(t, depth, sync),
                               rtol=1e-9, atol=1e-9)


@settings(max_examples=examples(100), deadline=None)
@given(tandem())
def test_tile_by_tile_chunks_equal_the_numpy_chunks_bit_for_bit(case):
    # short chunks run in plain floats: the same operations in the same order
    from kitsune_dse.cost import queues
    t, depth, sync = case
    fast = simulate(t, depth, sync, max_sweeps=0).departures
    keep = queues.SCALAR_CHUNK_MAX
    try:
        queues.SCALAR_CHUNK_MAX = 0
        slow = simulate(t, depth, sync, max_sweeps=0).departures
    finally:
        queues.SCALAR_CHUNK_MAX = keep
    assert fast.tobytes() == slow.tobytes()


@settings(max_examples=examples(100), deadline=None)
@given(tandem())
def test_invariants_occupancy_stall_and_causality(case):
    t, depth, sync = case
    J, N = t.shape
    r = simulate(t, depth, sync)
    D, S = r.departures, r.starts
    # occupancy never exceeds the slots (the consumer's slot counted): <= depth (<= depth + 1)
    assert np.all(r.max_occupancy <= np.array(depth) + 1e-9)
    assert np.all(r.mean_occupancy >= 0) and np.all(r.mean_occupancy <= np.array(depth) + 1e-9)
    assert np.all(r.stall_s >= 0)
    # a tile is served after it arrives and after the previous one left; service takes t
    assert np.all(D >= S + t - 1e-9)
    for j in range(1, J):
        assert np.all(S[j] >= D[j - 1] + sync - 1e-9)
    assert np.all(np.diff(D, axis=1) >= t[:, 1:] - 1e-9)
    # the makespan is at least any stage's total work and the critical path of tile 0
    assert r.makespan_s >= t.sum(axis=1).max() - 1e-9
    assert r.makespan_s >= t[:, 0].sum() + (J - 1) * sync - 1e-9
    # one more slot never slows the pipeline down
    if J > 1:
        deeper = simulate(t, [d + 1 for d in depth], sync)
        assert deeper.makespan_s <= r.makespan_s + 1e-9


@settings(max_examples=examples(60), deadline=None)
@given(tandem())
def test_unclipped_stall_is_non_negative(case):
    # stall = (last departure - first start) - busy time; it must not need clipping
    t, depth, sync = case
    r = simulate(t, depth, sync)
    raw = (r.departures[:, -1] - r.starts[:, 0]) - t.sum(axis=1)
    assert np.all(raw >= -1e-9)


# -- several servers per stage, slots released a row-block at a time ----------------------------
def test_one_stage_of_two_servers_emits_pairs():
    # c = 2 servers of latency 2: units leave two at a time, at 2 and 4
    r = simulate([[2, 2, 2, 2]], [], servers=[2])
    np.testing.assert_allclose(r.departures, [[2, 2, 4, 4]])
    assert r.makespan_s == 4 and r.stall_s[0] == pytest.approx(0.0)


def test_two_server_producer_feeds_a_one_server_consumer_by_hand():
    # D0 = 2, 2, 4, 4; D1 = max(D0, D1[n-1]) + 1 = 3, 4, 5, 6
    r = simulate([[2] * 4, [1] * 4], [8], servers=[2, 1])
    np.testing.assert_allclose(r.departures, [[2, 2, 4, 4], [3, 4, 5, 6]])


def test_grouped_release_holds_the_row_block_until_its_last_slab():
    # 2 slabs per row-block, 2 slots: unit 2 needs the consumer done with unit 1 (the row-block),
    # not unit 0. Consumer: D1 = 3, 5, 7, 9 either way; producer: 1, 2, 5, 6 against 1, 2, 3, 5
    grouped = simulate([[1] * 4, [2] * 4], [2], group=[2])
    single = simulate([[1] * 4, [2] * 4], [2])
    np.testing.assert_allclose(grouped.departures, [[1, 2, 5, 6], [3, 5, 7, 9]])
    np.testing.assert_allclose(single.departures, [[1, 2, 3, 5], [3, 5, 7, 9]])


def test_bad_servers_and_groups_are_rejected():
    with pytest.raises(ValueError):
        simulate([[1, 1], [1, 1]], [2], servers=[0, 1])
    with pytest.raises(ValueError):
        simulate([[1, 1], [1, 1]], [3], group=[2])      # 3 slots are not whole row-blocks


@st.composite
def served_tandem(draw):
    t, depth, sync = draw(tandem())
    J, N = t.shape
    servers = draw(st.lists(st.integers(1, 4), min_size=J, max_size=J))
    g = draw(st.integers(1, 3))
    return t, [d * g for d in depth], sync, servers, [g] * (J - 1)


@settings(max_examples=examples(150), deadline=None)
@given(served_tandem())
def test_servers_and_groups_equal_the_reference_loop(case):
    t, depth, sync, servers, group = case
    ref = simulate_reference(t, depth, sync, servers, group)
    r = simulate(t, depth, sync, servers=servers, group=group)
    np.testing.assert_allclose(r.departures, ref, rtol=1e-9, atol=1e-9)
    # the unit-by-unit evaluation (one sweep never settles from -inf) agrees too
    one = _general(t, np.array(depth), np.array(servers), np.array(group), sync, np.zeros(t.shape[1]), 1)
    np.testing.assert_allclose(one, ref, rtol=1e-9, atol=1e-9)


@settings(max_examples=examples(60), deadline=None)
@given(tandem())
def test_general_path_with_one_server_equals_the_plain_model(case):
    t, depth, sync = case
    J = t.shape[0]
    D = _general(t, np.array(depth, dtype=int), np.ones(J, dtype=int), np.ones(J - 1, dtype=int),
                 sync, np.zeros(t.shape[1]), 8)
    np.testing.assert_allclose(D, simulate(t, depth, sync).departures, rtol=1e-9, atol=1e-9)


@settings(max_examples=examples(60), deadline=None)
@given(t=st.floats(0.01, 10), c=st.integers(1, 6), m=st.integers(1, 8))
def test_a_stage_of_c_servers_keeps_its_throughput(t, c, m):
    # c servers of latency c * t over a multiple of c units: alone it takes units * t
    n = c * m
    r = simulate(np.full((1, n), c * t), [], servers=[c])
    assert r.makespan_s == pytest.approx(n * t, rel=1e-9)
