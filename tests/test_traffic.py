"""DRAM traffic of kernel sequences (kitsune_dse.cost.region.kernel_works), by hand.

Test spec: usable L2 = 50 MiB * 0.75 = 37.5 MiB. A part of a tensor stays in L2 between the
kernel that last touched it and the one that reads it when the bytes touched in between fit that
budget: the rest of the earlier kernel after the part, the kernels between, and the later kernel
up to the part (cost.reuse: element-wise kernels stream in memory order, a GEMM by waves and,
along K, slice by slice); otherwise the part is re-read from DRAM. Every tensor a kernel writes
reaches DRAM (L2 writes dirty lines back: ncu on the suite's baselines), even one read from L2
later, unless it is the region's own and the bytes from its writer on fit L2 (H100_STEP keeps
all of those; test_reuse prices the share L2 evicts); the test spec keeps none of it dirty past
the region (efficiency.l2_dirty_fraction 0).
"""
from __future__ import annotations

import pytest
from hypothesis import given, note, settings

from helpers_graphs import (H100, H100_STEP, L2_USABLE, MiB, build, chain_graph, describe, examples,
                            gemm_graph, mlp_graph, small_graphs)
from kitsune_dse.cost.gemm_l2 import grid_reads, raster
from kitsune_dse.cost.region import Region, kernel_works
from kitsune_dse.cost.roofline import split_k_partials_bytes
from kitsune_dse.cost.strategies import bsp, bsp_groups, fusion, fusion_groups
from kitsune_dse.graph.ir import Tensor


def traffic(works):
    """[(name, DRAM read MiB, DRAM write MiB, L2 MiB)] per kernel."""
    return [(w.name, w.dram_read_bytes / MiB, w.dram_write_bytes / MiB, w.l2_bytes / MiB)
            for w in works]


def bsp_works(g, ops=None):
    r = Region.of(g, ops)
    return kernel_works(r, bsp_groups(r), H100_STEP)


def test_usable_l2_budget():
    assert H100.l2_usable_bytes == L2_USABLE == 37.5 * MiB


def test_intermediate_bigger_than_l2_is_written_and_reread():
    # [8192, 4096] fp16 = 64 MiB > 37.5 MiB: relu writes t1 out, the next relu reads it back
    g = chain_graph(8192, 4096, ("relu", "relu"))
    a = 8192 * 4096 * 2 / MiB                                   # 64 MiB
    assert traffic(bsp_works(g)) == [("op0", a, a, 0.0), ("op1", a, a, 0.0)]
    e = bsp(Region.of(g), H100_STEP)
    assert e.dram_read_bytes == 2 * 8192 * 4096 * 2           # x, t1
    assert e.dram_write_bytes == 2 * 8192 * 4096 * 2          # t1, y


def test_small_intermediate_is_read_from_l2_and_written_back_only_when_evicted():
    # [1024, 4096] fp16 = 8 MiB: t1 is read from L2, and the region's distinct bytes from op0 on
    # (x, t1, y: 24 MiB) fit the usable L2, so nothing evicts t1's dirty lines while it runs
    g = chain_graph(1024, 4096, ("relu", "relu"))
    assert traffic(bsp_works(g)) == [("op0", 8.0, 0.0, 0.0), ("op1", 0.0, 8.0, 8.0)]
    # [2048, 4096] = 16 MiB: t1 still fits L2 for the next kernel, but 48 MiB from op0 on do not
    # fit: its write reaches DRAM
    g = chain_graph(2048, 4096, ("relu", "relu"))
    assert traffic(bsp_works(g)) == [("op0", 16.0, 16.0, 0.0), ("op1", 0.0, 16.0, 16.0)]


def test_traffic_of_the_kernels_in_between_evicts_an_intermediate():
    # op0: t1 = relu(x); op1: t2 = relu(x); op2: y = t1 + t2 (all [rows, 4096] fp16)
    def graph(rows):
        return build("between", [Tensor("x", (rows, 4096), "fp16")],
                     [("op0", "relu", ("x",), ("t1",)), ("op1", "relu", ("x",), ("t2",)),
                      ("op2", "add", ("t1", "t2"), ("y",))], ["x"], [])
    # 16 MiB tensors: between op0's write of a part of t1 and op2's read of it lie the rest of op0
    # (x, t1: 32 MiB in all), op1 (32) and the start of op2 (t1, t2, y: 48): > 37.5, from DRAM.
    # x: op0 reads row f at f of its 32 MiB, op1 at f of its 32: 32 MiB apart, from L2. t2: op1
    # writes row f with (1 - f) x 32 MiB of op1 to go, op2 reads it after f x 48: within 37.5 MiB
    # for f <= 5.5 / 16 (179 of its 512 parts of 128 x 128), the rest from DRAM
    works = bsp_works(graph(2048))
    assert traffic(works[:2]) == [("op0", 16.0, 16.0, 0.0), ("op1", 0.0, 16.0, 16.0)]
    t2_hit = 16.0 * 179 / 512
    assert traffic(works[2:]) == [("op2", 32.0 - t2_hit, 16.0, t2_hit)]
    assert t2_hit == pytest.approx(16.0 * 5.5 / 16, abs=16.0 * 3 / 512)
    # 8 MiB tensors: t1's row f waits (1 - f) x 16 MiB of op0, op1's 16 and f x 24 of op2: within
    # 37.5 for f <= 11 / 16 (179 of 256 parts), the rest from DRAM; t2 (16 + 8 f) always fits.
    # The region's 32 distinct MiB stay in L2: only y is written
    t1_miss = 8.0 * 77 / 256
    assert traffic(bsp_works(graph(1024))) == [
        ("op0", 8.0, 0.0, 0.0), ("op1", 0.0, 0.0, 8.0), ("op2", t1_miss, 8.0, 16.0 - t1_miss)]


def test_weights_are_read_once_when_they_stay_in_l2():
    # h = x @ w, y = h @ w with x, w [1024, 1024] fp16 = 2 MiB: w read from DRAM by the first
    # GEMM only, the second finds it (and h) in L2
    t = [Tensor("x", (1024, 1024), "fp16"), Tensor("w", (1024, 1024), "fp16")]
    g = build("shared-w", t, [("mm1", "matmul", ("x", "w"), ("h",)),
                              ("mm2", "matmul", ("h", "w"), ("y",))], ["x"], ["w"])
    (k0, k1) = bsp_works(g)
    assert (k0.dram_read_bytes, k0.dram_write_bytes) == (2 * 2 * MiB, 0)     # h stays in L2
    assert k1.dram_read_bytes == 0 and k1.dram_write_bytes == 2 * MiB
    # L2 serves h and w (2 MiB each) plus any split-K partial sums
    assert k1.l2_bytes == 4 * MiB + split_k_partials_bytes(1, 1024, 1024, k1.split_k)
    # a 64 MiB weight cannot stay: both GEMMs read it from DRAM
    t = [Tensor("x", (256, 4096), "fp16"), Tensor("w", (4096, 4096 * 2), "fp16"),
         Tensor("v", (8192, 4096), "fp16")]
    g = build("big-w", t, [("mm1", "matmul", ("x", "w"), ("h",)),
                           ("mm2", "matmul", ("h", "v"), ("z",)),
                           ("mm3", "matmul", ("z", "w"), ("y",))], ["x"], ["w", "v"])
    works = bsp_works(g)
    w_bytes = 4096 * 8192 * 2                                    # 64 MiB
    assert works[0].dram_read_bytes == 256 * 4096 * 2 + w_bytes
    # z (2 MiB, written at mm2's end) is read one K slice at a time as mm3 streams w: the slice at
    # k of its 32 after k x 70 MiB of mm3 (z, w, y), from DRAM beyond 37.5 MiB: 15 of 32 slices
    z_bytes = 256 * 4096 * 2
    assert works[2].dram_read_bytes == w_bytes + z_bytes * 15 / 32


def test_a_large_weight_used_once_is_read_exactly_once():
    g = gemm_graph(512, 8192, 8192)                               # w = 128 MiB
    (w,) = bsp_works(g)
    assert w.dram_read_bytes == 512 * 8192 * 2 + 8192 * 8192 * 2
    assert w.dram_write_bytes == 512 * 8192 * 2


def test_graph_outputs_are_always_written():
    # a (8 MiB) is both a graph output and the next op's input: written although it fits L2
    g = build("out-and-used", [Tensor("x", (1024, 4096), "fp16")],
              [("op0", "relu", ("x",), ("a",)), ("op1", "relu", ("a",), ("y",))],
              ["x"], [], outputs=["a", "y"])
    assert traffic(bsp_works(g)) == [("op0", 8.0, 8.0, 0.0), ("op1", 0.0, 8.0, 8.0)]
    assert traffic(kernel_works(Region.of(g), [("op0", "op1")], H100_STEP)) == [
        ("op0+op1", 8.0, 16.0, 0.0)]


def test_graph_inputs_are_read_cold_even_when_small():
    g = chain_graph(64, 64, ("relu",))
    assert traffic(bsp_works(g)) == [("op0", 64 * 64 * 2 / MiB, 64 * 64 * 2 / MiB, 0.0)]


def test_a_region_output_that_does_not_fit_l2_is_written_for_the_next_region():
    # chain of 64 MiB tensors cut after op1: t2 leaves the region through DRAM, and the region
    # that consumes it reads it from DRAM
    g = chain_graph(8192, 4096, ("relu", "relu", "relu"))
    first = Region.of(g, ["op0", "op1"])
    assert first.outputs == ("t2",)
    assert traffic(kernel_works(first, bsp_groups(first), H100_STEP)) == [
        ("op0", 64.0, 64.0, 0.0), ("op1", 64.0, 64.0, 0.0)]
    assert traffic(kernel_works(first, [("op0", "op1")], H100_STEP)) == [("op0+op1", 64.0, 64.0, 0.0)]
    second = Region.of(g, ["op2"])
    assert second.inputs == ("t2",)
    assert traffic(kernel_works(second, bsp_groups(second), H100_STEP)) == [("op2", 64.0, 64.0, 0.0)]


def test_a_small_hand_off_between_regions_is_read_from_l2():
    # 8 MiB t2 produced by one region and consumed by the next fits the usable L2: the next
    # region reads it from L2 (regions run back to back; region.handed_over); as an output of
    # its region its write reaches DRAM, while t1, the first region's own, stays in L2
    g = chain_graph(1024, 4096, ("relu", "relu", "relu"))
    first, second = Region.of(g, ["op0", "op1"]), Region.of(g, ["op2"])
    assert traffic(kernel_works(first, bsp_groups(first), H100_STEP)) == [
        ("op0", 8.0, 0.0, 0.0), ("op1", 0.0, 8.0, 8.0)]
    assert traffic(kernel_works(second, bsp_groups(second), H100_STEP)) == [("op2", 0.0, 8.0, 8.0)]
    # the two regions move t2's write more than the whole chain as one region (x in, y out)
    total = sum(w.dram_bytes for reg in (first, second)
                for w in kernel_works(reg, bsp_groups(reg), H100_STEP))
    assert total == 24 * MiB and sum(w.dram_bytes for w in bsp_works(g)) == 16 * MiB


def test_fused_intermediates_never_touch_memory():
    g = chain_graph(8192, 4096, ("relu", "gelu", "scale"))
    (w,) = kernel_works(Region.of(g), [("op0", "op1", "op2")], H100)
    assert (w.dram_read_bytes, w.dram_write_bytes, w.l2_bytes) == (64 * MiB, 64 * MiB, 0)


@pytest.mark.parametrize("rows, resident", [(1024, True), (8192, False)])
def test_free_views_alias_their_source(rows, resident):
    # x -> relu -> a -> reshape -> b -> relu -> y costs what the chain without the view costs
    g = build("view", [Tensor("x", (rows, 4096), "fp16")],
              [("r1", "relu", ("x",), ("a",)),
               ("v", "reshape", ("a",), ("b",), {"shape": [rows * 2, 2048]}),
               ("r2", "relu", ("b",), ("y",))], ["x"], [])
    mb = rows * 4096 * 2 / MiB
    want = ([("r1", mb, 0.0, 0.0), ("r2", 0.0, mb, mb)] if resident
            else [("r1", mb, mb, 0.0), ("r2", mb, mb, 0.0)])
    assert traffic(bsp_works(g)) == want


def test_gpt3_mlp_bsp_traffic_by_hand():
    # tokens 2048, hidden 12288, ffn 49152 (fp16): h and a are 192 MiB each, o 48 MiB, the
    # weights 1.125 GiB each; nothing but the biases fits in L2 across kernels
    T, H, F = 2048, 12288, 49152
    g = mlp_graph(T, H, F)
    works = bsp_works(g)
    x, w1, b1, w2, b2 = T * H * 2, H * F * 2, F * 2, F * H * 2, H * 2
    h = a = T * F * 2
    o = y = T * H * 2
    reads = [w.dram_read_bytes for w in works]
    writes = [w.dram_write_bytes for w in works]
    # each GEMM reads its operands again where later waves of its grid miss L2 (gemm_l2): the
    # 1.125 GiB weights at least once per group of 8 row-blocks (2048 rows: 2 groups)
    budget = H100.l2_usable_bytes

    def again(w, m, n, k):
        a, b = grid_reads(m, n, k, w.tile_shape[0], w.tile_shape[1], 2, 2 * H100.sm_count, budget)
        assert b >= 2 * k * n * 2
        return a - m * k * 2 + b - k * n * 2
    assert reads == [x + w1 + b1 + again(works[0], T, F, H), h, a + w2 + b2 + again(works[2], T, H, F), o + x]
    assert writes == [h, a, o, y]
    e = fusion(Region.of(g), H100)
    # fused [fc1, gelu], [fc2, residual]: h and o never leave the kernel; a is 192 MiB
    f1, f2 = kernel_works(Region.of(g), [("fc1", "gelu"), ("fc2", "residual")], H100)
    assert e.dram_read_bytes == x + w1 + b1 + a + w2 + b2 + x + again(f1, T, F, H) + again(f2, T, H, F)
    assert e.dram_write_bytes == a + y


def test_grid_reads_by_hand():
    MiB = 2**20
    # grouped raster: 16 row-blocks x 64 column tiles, groups of 8 row-blocks over every column
    rb, ct = raster(16, 64)
    assert (rb[:9].tolist(), ct[:9].tolist()) == ([0, 1, 2, 3, 4, 5, 6, 7, 0], [0] * 8 + [1])
    assert (rb[512], ct[512]) == (8, 0)
    # one wave holds the whole grid (8 x 8 tiles of 1 MiB operand blocks): each read once
    assert grid_reads(1024, 1024, 4096, 128, 128, 2, 264, 40 * MiB) == (8 * MiB, 8 * MiB)
    # 2048 x 8192 x 4096 in waves of 64 CTAs (8 row-blocks x 8 column tiles: 8 + 8 MiB of
    # operands, 2 MiB of output per wave). A 32 MiB L2 keeps a group's row-blocks from wave to
    # wave; the columns come back one group (8 waves, 144 MiB) later: B streams twice
    assert grid_reads(2048, 8192, 4096, 128, 128, 2, 64, 32 * MiB) == (16 * MiB, 128 * MiB)
    # an 8 MiB L2 keeps nothing from one wave to the next: A again in every wave of its group
    assert grid_reads(2048, 8192, 4096, 128, 128, 2, 64, 8 * MiB) == (128 * MiB, 128 * MiB)
    # everything fits: once
    assert grid_reads(2048, 8192, 4096, 128, 128, 2, 64, 1024 * MiB) == (16 * MiB, 64 * MiB)


@settings(max_examples=examples(80), deadline=None)
@given(g=small_graphs())
def test_bsp_and_fusion_move_at_least_the_compulsory_bytes(g):
    note(describe(g))
    r = Region.of(g)
    cr, cw = r.compulsory_bytes()
    for est in (bsp(r, H100), fusion(r, H100)):
        assert est.dram_read_bytes >= cr * (1 - 1e-12)
        assert est.dram_write_bytes >= cw * (1 - 1e-12)
    # per kernel: nothing negative
    for w in kernel_works(r, fusion_groups(r), H100):
        assert min(w.dram_read_bytes, w.dram_write_bytes, w.l2_bytes) >= 0


@settings(max_examples=examples(80), deadline=None)
@given(g=small_graphs(chain=True))
def test_fusion_never_moves_more_dram_bytes_than_bsp_on_a_chain(g):
    # on a chain fusion runs the same kernels in the same order, merged: nothing lives longer.
    # (Not a law on branching graphs: fusing an op into an early group can keep its output
    # alive across a large kernel that BSP runs before it, and evict it.)
    note(describe(g))
    r = Region.of(g)
    assert fusion(r, H100).dram_bytes <= bsp(r, H100).dram_bytes * (1 + 1e-12)


def test_every_tile_variant_carries_its_own_operand_rereads():
    # a kernel's variants (other CTA tiles, split-K) re-read the operands their own grid re-reads:
    # pricing them with the first tile's re-reads made tilesync 0.06% slower with twice the HBM
    # bandwidth (property tests at 6x), when the faster spec picked a tile that re-reads more
    from kitsune_dse.cost.gemm_l2 import WAVE_CTAS
    from kitsune_dse.cost.region import kernel_variants
    m, k, n = 1024, 4096, 4096
    g = build("mm", [Tensor("x", (m, k), "fp32"), Tensor("w", (k, n), "fp32")],
              [("mm", "matmul", ("x", "w"), ("y",))], ["x"], ["w"])
    small_l2 = H100.model_copy(update={"l2_bytes": 8 * MiB})
    r = Region.of(g)
    (work,) = kernel_works(r, [("mm",)], small_l2)
    assert work.cold_operands == "ab"
    compulsory = (m * k + k * n) * 4
    variants = kernel_variants(r, ("mm",), small_l2, work)
    assert len({v.grid_reread_bytes for v in variants}) > 2     # tiles re-read differently
    for v in variants:
        if v.split_k > 1:
            assert v.grid_reread_bytes == 0
        else:
            a, b = grid_reads(m, n, k, *v.tile_shape, 4, WAVE_CTAS, small_l2.l2_usable_bytes)
            assert v.grid_reread_bytes == pytest.approx(a + b - compulsory)
        assert v.dram_read_bytes - v.grid_reread_bytes == pytest.approx(compulsory)
