"""What a kernel finds in L2 of what an earlier kernel touched, and what is still dirty in L2 when
a sequence of kernels ends (kitsune_dse.cost.reuse), by hand and as properties."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_graphs import H100, MiB, build
from kitsune_dse.cost.gemm_l2 import WAVE_CTAS, raster
from kitsune_dse.cost.region import Region, kernel_works
from kitsune_dse.cost.reuse import dirty_residue, hit_fraction, touch_positions
from kitsune_dse.cost.strategies import bsp, bsp_groups, fusion
from kitsune_dse.graph.ir import Tensor
from kitsune_dse.hw.spec import spec_with_overrides


def mlp_head(m=2048, k=8192, n=4096):
    """h = x @ w1, a = gelu(h): a GEMM of 16 x 32 = 512 CTAs, two waves of 264 and 248."""
    return build("head", [Tensor("x", (m, k), "fp16"), Tensor("w1", (k, n), "fp16")],
                 [("fc1", "matmul", ("x", "w1"), ("h",)), ("gelu", "gelu", ("h",), ("a",))],
                 ["x"], ["w1"])


def test_a_gemm_writes_each_output_tile_when_its_wave_ends():
    g = mlp_head()
    first, last = touch_positions(g, ("fc1",), "h", frozenset({"h"}))
    rb, ct = raster(16, 32)
    at = np.empty((16, 32))
    at[rb, ct] = np.where(np.arange(512) < WAVE_CTAS, WAVE_CTAS / 512, 1.0)
    assert np.array_equal(last, at.ravel()) and np.array_equal(first, last)
    assert np.count_nonzero(last == 1.0) == 512 - WAVE_CTAS


def test_a_kernel_after_a_gemm_finds_only_the_last_waves_output():
    # fc1 touches x (32 MiB), w1 (64) and h (16): 112 MiB. A tile of the first wave has 248 / 512
    # of that after it (54 MiB > 37.5): gelu reads it from DRAM. A tile of the last wave has
    # nothing of fc1 after it, and gelu reaches it after at most its own 32 MiB: from L2
    g = mlp_head()
    fc1, gelu = kernel_works(Region.of(g), bsp_groups(Region.of(g)), H100)
    h = 2048 * 4096 * 2
    assert gelu.dram_read_bytes == h * WAVE_CTAS / 512
    assert gelu.l2_bytes == h * (512 - WAVE_CTAS) / 512


def test_an_element_wise_pair_streams_in_memory_order():
    # relu writes t1's part p with (1 - (p + 1) / n) x 32 MiB of its own traffic to go and the next
    # relu reads it after p / n x 32 MiB of its own: 32 - 32 / n MiB apart, within 37.5
    g = build("pair", [Tensor("x", (2048, 4096), "fp16")],
              [("op0", "relu", ("x",), ("t1",)), ("op1", "relu", ("t1",), ("y",))], ["x"], [])
    works = kernel_works(Region.of(g), bsp_groups(Region.of(g)), H100)
    assert works[1].dram_read_bytes == 0.0 and works[1].l2_bytes == 16 * MiB


def test_an_element_wise_kernel_runs_the_harness_grid_stride_order():
    # relu over [1024, 1024] fp16 on one SM: 131,072 vectors of 8; a grid of 32 CTAs (the cap per
    # SM) sweeps 8,192 a step in 16 steps; 8 CTAs at a time, so 4 batches. Part (0, 0): vector 0
    # (batch 0, step 0) first; its row 127 reaches vector 16,271 (step 1, CTA 31: batch 3) last,
    # at (3 + 2/16) / 4. Part (7, 7): row 896's vector 114,800 is step 14 of CTA 0, at
    # (0 + 14/16) / 4; row 1023's last is step 15 of CTA 31, the run's end. In memory order the
    # last part would come at 63/64 of the run
    g = build("one", [Tensor("x", (1024, 1024), "fp16")], [("op0", "relu", ("x",), ("y",))], ["x"], [])
    first, last = touch_positions(g, ("op0",), "x", frozenset({"x"}), 1, 32, 8)
    assert (first[0], last[0]) == (0.0, (3 + 2 / 16) / 4)
    assert (first[63], last[63]) == ((14 / 16) / 4, 1.0)
    mem_first, _ = touch_positions(g, ("op0",), "x", frozenset({"x"}))
    assert mem_first[63] == 63 / 64
    # a GEMM keeps its waves whatever the SMs
    h = mlp_head()
    assert np.array_equal(touch_positions(h, ("fc1",), "h", frozenset({"h"}), 132, 32, 8)[1],
                          touch_positions(h, ("fc1",), "h", frozenset({"h"}))[1])


def test_an_add_after_its_gemm_finds_the_last_wave_it_reaches_early():
    # o = x @ w (12288 x 4096 x 1024, bertm's fc2: 768 tiles, 2.9 waves of 264), then y = o + r:
    # 1.57 M vectors a tensor against a grid's sweep of 1.08 M, so the add's CTAs reach o's last
    # rows (the GEMM's last wave) in their second step, within the first half of the add: found
    # in L2 (ncu, bench/dram_probe.py gg-ctl: 5.1-5.5 MB of o's 25 MB); in memory order none
    g = build("ga", [Tensor("x", (12288, 4096), "fp16"), Tensor("w", (4096, 1024), "fp16"),
                     Tensor("r", (12288, 1024), "fp16")],
              [("mm", "matmul", ("x", "w"), ("o",)), ("add", "add", ("o", "r"), ("y",))], ["x", "r"], ["w"])
    harness = H100.model_copy(update={"elementwise_grid_ctas_per_sm": 32})
    mm, add = kernel_works(Region.of(g), bsp_groups(Region.of(g)), harness)
    found = add.l2_bytes
    assert 2 * MiB < found < 12 * MiB
    assert add.dram_read_bytes == pytest.approx(2 * 12288 * 1024 * 2 - found)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.floats(0, 200), st.floats(0, 200),
       st.floats(0, 200), st.floats(1, 100), st.floats(0, 50))
def test_hit_fraction_is_monotone(pos, last_mb, between_mb, now_mb, budget_mb, more_mb):
    last = np.array(pos)
    first = np.array(pos[::-1])
    h = hit_fraction(last, first, last_mb, between_mb, now_mb, budget_mb)
    assert 0.0 <= h <= 1.0
    # more traffic in between, before or after never finds more; a larger L2 never finds less
    assert hit_fraction(last, first, last_mb, between_mb + more_mb, now_mb, budget_mb) <= h
    assert hit_fraction(last, first, last_mb + more_mb, between_mb, now_mb, budget_mb) <= h
    assert hit_fraction(last, first, last_mb, between_mb, now_mb + more_mb, budget_mb) <= h
    assert hit_fraction(last, first, last_mb, between_mb, now_mb, budget_mb + more_mb) >= h


def residue_spec(recent, dirty):
    return spec_with_overrides(H100, {"efficiency.l2_recent_fraction": recent,
                                      "efficiency.l2_dirty_fraction": dirty})


def test_dirty_residue_by_hand():
    s = residue_spec(0.8, 0.3)      # the last 40 MiB brought in, at most 15 MiB of it dirty
    # the last kernel brings in 30 MiB, a third written: 10 dirty; 10 MiB more of the kernel
    # before, a fifth written: 2
    assert dirty_residue([100 * MiB, 30 * MiB], [20 * MiB, 10 * MiB], s) == [2 * MiB, 10 * MiB]
    # all 30 MiB of the last written: 15 MiB at most stay dirty, nothing of the kernel before
    assert dirty_residue([100 * MiB, 30 * MiB], [20 * MiB, 30 * MiB], s) == [0.0, 15 * MiB]
    # intermediates the region keeps in L2 take their share of the dirty lines
    assert dirty_residue([100 * MiB, 30 * MiB], [20 * MiB, 10 * MiB], s, kept_dirty=12 * MiB) == [0.0, 3 * MiB]
    # the uncalibrated default: every write reaches DRAM within the sequence
    assert dirty_residue([100 * MiB, 30 * MiB], [20 * MiB, 10 * MiB], H100) == [0.0, 0.0]


def test_a_sequence_reports_its_dirty_residue_beside_its_writes():
    # relu, relu over 64 MiB tensors: op1 brings in t1 (64) and y (64), half written; the last
    # 50 MiB of it hold 25 MiB of y, at most 15 MiB of it dirty
    g = build("chain", [Tensor("x", (8192, 4096), "fp16")],
              [("op0", "relu", ("x",), ("t1",)), ("op1", "relu", ("t1",), ("y",))], ["x"], [])
    e = bsp(Region.of(g), residue_spec(1.0, 0.3))
    t = 8192 * 4096 * 2
    assert e.dram_write_bytes == 2 * t                      # every write still reaches DRAM ...
    assert e.dram_deferred_write_bytes == pytest.approx(15 * MiB)   # ... 15 MiB after the run
    assert e.dram_bytes_in_run == pytest.approx(4 * t - 15 * MiB)


def _chain3():
    return build("chain", [Tensor("x", (8192, 4096), "fp16")],
                 [("op0", "relu", ("x",), ("t1",)), ("op1", "relu", ("t1",), ("t2",)),
                  ("op2", "relu", ("t2",), ("y",))], ["x"], [])


def test_a_kernel_leaves_its_dirty_lines_to_the_next_and_writes_back_those_it_finds():
    # relu over 64 MiB tensors (128 MiB brought in, half written). L2 keeps the last 50 MiB
    # brought in, at most 15 MiB of it dirty. The graph's first kernel finds the flush's 15 MiB
    # (a store of twice L2) and leaves 15: its time carries exactly its own writes
    g, s, t = _chain3(), residue_spec(1.0, 0.3), 8192 * 4096 * 2
    whole = Region.of(g)
    ws = kernel_works(whole, bsp_groups(whole), s)
    for w in ws:
        assert w.incoming_dirty_bytes == pytest.approx(15 * MiB)
        assert w.after_end_write_bytes == pytest.approx(15 * MiB)
        assert w.timed_dram_bytes == pytest.approx(2 * t)
    # a region after op0 finds op0's 15 MiB as a lone kernel would have left them
    tail = kernel_works(Region.of(g, ("op1", "op2")), [("op1",), ("op2",)], s)
    assert tail[0].incoming_dirty_bytes == pytest.approx(15 * MiB)
    # uncalibrated, nothing stays dirty: every write is timed where it is made
    assert all(w.timed_dram_bytes == w.dram_bytes for w in kernel_works(whole, bsp_groups(whole), H100))


def test_the_timed_writes_of_a_region_conserve_its_dirty_lines():
    # over any split of a chain, the writes the kernels' times carry are the writes made plus
    # what was dirty before less what is dirty after
    g, s = _chain3(), residue_spec(0.8, 0.3)
    for ops in (("op0",), ("op0", "op1"), ("op1", "op2"), ("op0", "op1", "op2")):
        ws = kernel_works(Region.of(g, ops), [(o,) for o in ops], s)
        timed = sum(w.timed_dram_bytes - w.dram_read_bytes for w in ws)
        made = sum(w.dram_write_bytes for w in ws)
        assert timed == pytest.approx(made + ws[0].incoming_dirty_bytes - ws[-1].after_end_write_bytes)
        for a, b in zip(ws, ws[1:]):
            assert b.incoming_dirty_bytes == a.after_end_write_bytes


def test_a_compute_bound_gemm_hides_the_dirty_lines_it_finds_and_a_reader_leaves_them():
    # gelu then a GEMM: the GEMM's time does not move when it writes back gelu's dirty lines;
    # a read-mostly GEMM finds the dirty lines still in the window and evicts few of them
    g = build("t", [Tensor("x", (2048, 8192), "fp16"), Tensor("w", (8192, 4096), "fp16")],
              [("act", "gelu", ("x",), ("a",)), ("fc", "matmul", ("a", "w"), ("y",))], ["x"], ["w"])
    s = residue_spec(1.0, 0.3)
    fc = Region.of(g, ("fc",))
    w = kernel_works(fc, [("fc",)], s)[0]
    assert w.incoming_dirty_bytes > 0
    assert fusion(fc, s).latency_s == pytest.approx(fusion(fc, H100).latency_s, rel=1e-9)
    assert w.timed_dram_bytes - w.dram_read_bytes < w.dram_write_bytes + w.incoming_dirty_bytes


def test_the_residue_fit_recovers_the_writes_it_was_made_from():
    from kitsune_dse.calibrate.fit_dram import fit_dirty_residue, sequence_dram_bytes
    truth = residue_spec(0.9, 0.3)
    rows = []
    # sequences ending in an element-wise kernel (residue capped), in a GEMM (a small share of
    # its traffic written) and in a short one (all of it within the window)
    for name, rows_, ops in (("relu2-64", 8192, ("relu", "relu")), ("relu2-16", 2048, ("relu", "relu")),
                             ("relu1-32", 4096, ("relu",))):
        g = build(name, [Tensor("x", (rows_, 4096), "fp16")],
                  [(f"op{i}", k, ("x",) if i == 0 else (f"t{i}",), (f"t{i + 1}",)) for i, k in enumerate(ops)],
                  ["x"], [])
        rows.append({"name": name, "graph": g, "ops": [o.name for o in g.ops], "kernels": [[o.name] for o in g.ops]})
    g = mlp_head(2048, 8192, 4096)
    rows.append({"name": "gemm", "graph": g, "ops": ["fc1"], "kernels": [["fc1"]]})
    rows.append({"name": "gemm-gelu", "graph": g, "ops": ["fc1", "gelu"], "kernels": [["fc1"], ["gelu"]]})
    for r in rows:
        r["write_bytes"] = sequence_dram_bytes(truth, r["graph"], r["ops"], r["kernels"])[1]
    f = fit_dirty_residue(H100, rows)
    assert f["rms_write_error_bytes"] < 0.05 * MiB < f["rms_write_error_bytes_before"]
    fitted = residue_spec(f["l2_recent_fraction"], f["l2_dirty_fraction"])
    for r in rows:
        assert sequence_dram_bytes(fitted, r["graph"], r["ops"], r["kernels"])[1] == pytest.approx(r["write_bytes"], abs=0.1 * MiB)


def test_l2_evicts_a_share_of_the_intermediates_that_fit():
    # relu, relu over 8 MiB tensors: t1 fits with everything from op0 on (x, t1, y: 24 MiB), yet
    # L2 evicts the pipelines' logistic share of it at 24 MiB: half at 0.6 x 50 = 30 MiB, 2.5 MiB
    # wide (the test spec's is a 0.5 MiB step: widen it)
    from kitsune_dse.cost.l2_residency import write_back_fraction
    s = H100.model_copy(update={"efficiency": H100.efficiency.model_copy(update={"l2_writeback_width": 0.05})})
    g = build("chain", [Tensor("x", (1024, 4096), "fp16")],
              [("op0", "relu", ("x",), ("t1",)), ("op1", "relu", ("t1",), ("y",))], ["x"], [])
    op0, op1 = kernel_works(Region.of(g), bsp_groups(Region.of(g)), s)
    share = 1 / (1 + np.exp(-(24 - 30) / 2.5))
    assert write_back_fraction(24 * MiB, s) == pytest.approx(share)
    assert op0.dram_write_bytes == pytest.approx(8 * MiB * share)      # 8% of t1
    assert op1.dram_write_bytes == 8 * MiB and op1.dram_read_bytes == 0.0


def test_parts_grow_on_large_tensors_and_cover_them():
    from kitsune_dse.cost.reuse import MAX_PARTS, PART, part_grid
    assert part_grid((2048, 4096)) == (2048, 4096, 16, 32, PART, PART)
    rows, cols, pr, pc, part_r, part_c = part_grid((1 << 20, 4096))      # 262,144 parts of 128
    assert pr * pc <= MAX_PARTS and pr * part_r >= rows and pc * part_c >= cols
    assert (part_r, part_c) == (PART * 16, PART)
    # a GEMM's output on the coarse grid: positions still one per part, in (0, 1]
    g = build("big", [Tensor("x", (1 << 17, 1024), "fp16"), Tensor("w", (1024, 8192), "fp16")],
              [("mm", "matmul", ("x", "w"), ("y",))], ["x"], ["w"])
    first, last = touch_positions(g, ("mm",), "y", frozenset({"y"}))
    assert first.size == part_grid((1 << 17, 8192))[2] * part_grid((1 << 17, 8192))[3] <= MAX_PARTS
    assert 0.0 < last.min() and last.max() == 1.0


def test_evicted_ring_writes_count_in_the_bytes_not_in_the_time_by_hand():
    """A persistent step's ring lines that L2 writes back on its own are DRAM bytes its SMs
    do not wait for; scaling a step scales them with its other bytes."""
    from kitsune_dse.cost.roofline import KernelWork
    w = KernelWork("s", "fp16", dram_read_bytes=100.0, dram_write_bytes=60.0, evicted_write_bytes=40.0,
                   persistent=True)
    assert w.dram_bytes == 160.0
    assert w.timed_dram_bytes == 120.0
    assert w.scaled(0.5).evicted_write_bytes == 20.0 and w.scaled(0.5).timed_dram_bytes == 60.0
    # never below the reads
    assert w.but(evicted_write_bytes=60.0, incoming_dirty_bytes=0.0).timed_dram_bytes == 100.0
