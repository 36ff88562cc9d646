"""The model zoo: every model loads, --set works, and hand-computed FLOPs and bytes match.

The expected numbers below are worked out by hand from the op rules (FLOPs = 2*M*N*K for a GEMM
plus M*N for a bias, 2*N*P*Q*K*C*R*S for a convolution, 5 per element for softmax, 8 per element
for GELU and layernorm, 1 per element for add/scale/relu; bytes = elements x 2 for fp16). Each is
written as its arithmetic *and* as the literal it evaluates to, and the test checks all three agree,
so a reader can audit the figure without running the code.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kitsune_dse.errors import KitsuneError
from kitsune_dse.graph import DepPattern, OpClass, list_models, load_model
from kitsune_dse.graph.ops import KINDS
from kitsune_dse.yamlio import read_yaml

ZOO = sorted(list_models())
MODELS_DIR = Path(__file__).resolve().parent.parent / "models"

REQUIRED = {
    "gpt3-mlp", "gpt3-attention", "llama2-7b-prefill", "llama2-7b-decode", "llama2-7b-mlp",
    "bert-base-encoder", "bert-base-attention", "resnet50-bottleneck", "dlrm-mlps", "nerf-mlp",
    "meshgraphnets-step", "mixtral-moe-ffn", "vit-b16-block", "attention-head", "ln-residual-gemm",
}


def hand(expr_value: int, literal: int) -> int:
    """A hand-computed figure: the written arithmetic and the written literal must agree."""
    assert expr_value == literal, f"arithmetic {expr_value} != literal {literal}"
    return literal


# -- every model ---------------------------------------------------------------------------------
def test_zoo_has_the_required_models():
    assert REQUIRED <= set(ZOO), f"missing: {sorted(REQUIRED - set(ZOO))}"


@pytest.mark.parametrize("name", ZOO)
def test_model_loads_and_validates(name):
    g = load_model(name)
    assert g.name == name, "the model's name field must equal its file name (the CLI name)"
    assert len(g.ops) > 0 and g.total_flops > 0
    assert g.outputs, "a model must have outputs"
    for op in g.ops:
        assert op.info is not None
        assert op.info.flops >= 0
        assert set(op.info.patterns) == set(op.inputs)
        for t in op.outputs:
            assert all(d > 0 for d in g.tensors[t].shape)


@pytest.mark.parametrize("name", ZOO)
def test_model_metadata(name):
    data = read_yaml(list_models()[name])
    assert isinstance(data, dict)
    desc = data.get("description")
    assert isinstance(desc, str) and desc.strip() and "\n" not in desc.strip(), \
        "description must be one line"
    src = data.get("source")
    assert isinstance(src, str) and len(src) > 40, "source must cite where the shapes come from"
    assert re.search(r"(19|20)\d\d", src), "source must cite a dated paper or model card"
    sizes = data.get("sizes")
    assert isinstance(sizes, dict) and sizes, "sizes with defaults that --set can override"
    g = load_model(name)
    assert dict(g.meta["sizes"]).keys() == sizes.keys()


# A small override per model: the model must still validate and get cheaper.
SMALL = {
    "gpt3-mlp": {"tokens": 64},
    "gpt3-attention": {"seq": 256, "tp": 8},
    "llama2-7b-prefill": {"seq": 128, "batch": 2},
    "llama2-7b-decode": {"batch": 2, "kv_len": 256},
    "llama2-7b-mlp": {"tokens": 128},
    "bert-base-encoder": {"batch": 2, "seq": 128},
    "bert-base-attention": {"batch": 2, "seq": 128},
    "resnet50-bottleneck": {"batch": 2},
    "dlrm-mlps": {"batch": 64, "table_rows": 100000},
    "nerf-mlp": {"rays": 64},
    "meshgraphnets-step": {"nodes": 1024},
    "mixtral-moe-ffn": {"tokens": 256},
    "vit-b16-block": {"batch": 2},
    "attention-head": {"seq": 128},
    "ln-residual-gemm": {"tokens": 128},
}


@pytest.mark.parametrize("name", ZOO)
def test_small_override_validates_and_shrinks(name):
    if name not in SMALL:
        pytest.skip("no small override listed for this model")
    big, small = load_model(name), load_model(name, SMALL[name])
    assert small.total_flops < big.total_flops
    for k, v in SMALL[name].items():
        assert small.meta["sizes"][k] == v


# -- --set overrides -------------------------------------------------------------------------------
def test_set_tokens_changes_gpt3_mlp_shapes():
    g = load_model("gpt3-mlp", {"tokens": 64})
    assert g.tensors["x"].shape == (64, 12288)
    assert g.tensors["h"].shape == (64, 49152)
    assert g.tensors["y"].shape == (64, 12288)
    assert load_model("gpt3-mlp").tensors["h"].shape == (2048, 49152)


def test_set_propagates_to_derived_sizes():
    g = load_model("gpt3-mlp", {"tp": 8})
    assert g.meta["sizes"]["ffn"] == 4 * 12288 // 8 == 6144
    assert g.tensors["w1"].shape == (12288, 6144)
    a = load_model("gpt3-attention", {"tp": 8})
    assert a.tensors["w_qkv"].shape == (12288, 3 * 1536)
    assert a.tensors["s"].shape == (96 // 8, 2048, 2048)
    m = load_model("meshgraphnets-step", {"nodes": 1000})
    assert m.tensors["edge_lat"].shape == (6000, 128)
    assert m.tensors["agg"].shape == (1000, 128)
    d = load_model("llama2-7b-decode", {"kv_len": 1024})
    assert d.tensors["k"].shape == (16 * 32, 1024, 128)
    assert d.tensors["s"].shape == (16 * 32, 1, 1024)


def test_set_unknown_size_is_a_clear_error():
    with pytest.raises(KitsuneError, match="no size 'tokenz'.*did you mean 'tokens'"):
        load_model("gpt3-mlp", {"tokenz": 64})
    with pytest.raises(KitsuneError, match="positive integer"):
        load_model("gpt3-mlp", {"tokens": 0})


def test_cli_graph_show_with_set(capsys):
    from kitsune_dse.cli import main
    assert main(["graph", "show", "gpt3-mlp", "--set", "tokens=64"]) == 0
    out = capsys.readouterr().out
    assert "64x49152" in out and "tokens=64" in out


# -- (a) GPT-3 MLP, tokens = 2048, hidden = 12288, ffn = 4*12288 = 49152, fp16 ------------------
def test_gpt3_mlp_hand_flops_and_bytes():
    g = load_model("gpt3-mlp", {"tokens": 2048})
    # fc1: [2048, 12288] @ [12288, 49152] + bias [49152]
    fc1 = hand(2 * 2048 * 12288 * 49152 + 2048 * 49152, 2_474_001_825_792)
    # gelu: 8 FLOPs per element of [2048, 49152]
    gelu = hand(8 * 2048 * 49152, 805_306_368)
    # fc2: [2048, 49152] @ [49152, 12288] + bias [12288]
    fc2 = hand(2 * 2048 * 49152 * 12288 + 2048 * 12288, 2_473_926_328_320)
    # residual add: one FLOP per element of [2048, 12288]
    res = hand(2048 * 12288, 25_165_824)
    total = hand(fc1 + gelu + fc2 + res, 4_948_758_626_304)
    for op, want in (("fc1", fc1), ("gelu", gelu), ("fc2", fc2), ("residual", res)):
        assert g.op(op).info.flops == want, op
    assert g.total_flops == total

    info = g.op("fc1").info
    assert dict(info.read_bytes) == {
        "x": hand(2048 * 12288 * 2, 50_331_648),
        "w1": hand(12288 * 49152 * 2, 1_207_959_552),
        "b1": hand(49152 * 2, 98_304),
    }
    assert dict(info.write_bytes) == {"h": hand(2048 * 49152 * 2, 201_326_592)}
    assert info.bytes_read == 50_331_648 + 1_207_959_552 + 98_304
    assert info.intensity == pytest.approx(
        2_474_001_825_792 / (50_331_648 + 1_207_959_552 + 98_304 + 201_326_592))
    assert info.unit == "tensor" and info.op_class is OpClass.GEMM
    assert (info.gemm.m, info.gemm.n, info.gemm.k) == (2048, 49152, 12288)


# -- (b) BERT-base attention, batch 8, seq 512 -> 4096 tokens, d 768, 12 heads of 64 -------------
def test_bert_attention_hand_flops_and_bytes():
    g = load_model("bert-base-attention")
    assert g.meta["sizes"]["batch"] == 8 and g.meta["sizes"]["seq"] == 512
    # fused QKV projection: [4096, 768] @ [768, 2304] + bias [2304]
    qkv = hand(2 * 4096 * 768 * 2304 + 4096 * 2304, 14_504_951_808)
    # QK^T per head: [512, 64] @ [64, 512], for 8*12 = 96 heads
    qk = hand(2 * 96 * 512 * 512 * 64, 3_221_225_472)
    # scale: one FLOP per score
    scale = hand(96 * 512 * 512, 25_165_824)
    # softmax: 5 FLOPs per score
    softmax = hand(5 * 96 * 512 * 512, 125_829_120)
    # PV per head: [512, 512] @ [512, 64]
    pv = hand(2 * 96 * 512 * 64 * 512, 3_221_225_472)
    # output projection: [4096, 768] @ [768, 768] + bias [768]
    out = hand(2 * 4096 * 768 * 768 + 4096 * 768, 4_834_983_936)
    # residual add and layernorm (8 FLOPs per element) over [4096, 768]
    res = hand(4096 * 768, 3_145_728)
    ln = hand(8 * 4096 * 768, 25_165_824)
    want = {"qkv_proj": qkv, "qk": qk, "scale": scale, "softmax": softmax, "pv": pv,
            "out_proj": out, "residual": res, "layernorm": ln}
    for op, f in want.items():
        assert g.op(op).info.flops == f, op
    # the head split/merge transposes and the views carry no FLOPs
    assert g.total_flops == hand(qkv + qk + scale + softmax + pv + out + res + ln, 25_961_693_184)

    # QK^T reads Q and K ([96, 512, 64] fp16 each) and writes the scores [96, 512, 512] fp16
    qk_info = g.op("qk").info
    assert dict(qk_info.read_bytes) == {"q": hand(96 * 512 * 64 * 2, 6_291_456),
                                        "k": hand(96 * 512 * 64 * 2, 6_291_456)}
    assert dict(qk_info.write_bytes) == {"s": hand(96 * 512 * 512 * 2, 50_331_648)}
    assert (qk_info.gemm.batch, qk_info.gemm.m, qk_info.gemm.n, qk_info.gemm.k) == (96, 512, 512, 64)
    # softmax reads and writes the whole score tensor once
    sm = g.op("softmax").info
    assert sm.bytes_read == 50_331_648 and sm.bytes_written == 50_331_648
    # the head-major transpose is a real copy of the [4096, 2304] fp16 QKV tensor; the split is free
    tr = g.op("heads_split").info
    assert tr.op_class is OpClass.COPY and not tr.is_view
    assert tr.bytes_read == tr.bytes_written == hand(4096 * 2304 * 2, 18_874_368)
    assert g.op("qkv_unbind").info.is_view and g.op("qkv_unbind").info.bytes_read == 0


# -- (c) ResNet-50 conv3_x bottleneck, batch 32, 28x28, 512 -> 128 -> 128 -> 512 -----------------
def test_resnet_bottleneck_hand_flops_and_bytes():
    g = load_model("resnet50-bottleneck")
    # 2 * N * P * Q * K * C * R * S
    conv1 = hand(2 * 32 * 28 * 28 * 128 * 512 * 1 * 1, 3_288_334_336)
    conv2 = hand(2 * 32 * 28 * 28 * 128 * 128 * 3 * 3, 7_398_752_256)
    conv3 = hand(2 * 32 * 28 * 28 * 512 * 128 * 1 * 1, 3_288_334_336)
    assert g.op("conv1").info.flops == conv1
    assert g.op("conv2").info.flops == conv2
    assert g.op("conv3").info.flops == conv3
    assert g.tensors["c2"].shape == (32, 28, 28, 128)  # 3x3, pad 1, stride 1 keeps 28x28
    c2 = g.op("conv2").info
    assert dict(c2.read_bytes) == {"r1": hand(32 * 28 * 28 * 128 * 2, 6_422_528),
                                   "w2": hand(128 * 128 * 3 * 3 * 2, 294_912)}
    assert dict(c2.write_bytes) == {"c2": hand(32 * 28 * 28 * 128 * 2, 6_422_528)}
    assert (c2.gemm.m, c2.gemm.n, c2.gemm.k) == (32 * 28 * 28, 128, 128 * 9)
    # batchnorm 2/element, relu and add 1/element
    elementwise = hand(2 * (2 * 32 * 784 * 128) + 2 * 32 * 784 * 512  # bn1, bn2, bn3
                       + 2 * 32 * 784 * 128 + 32 * 784 * 512  # relu1, relu2, relu3
                       + 32 * 784 * 512, 70_647_808)  # residual add
    assert g.total_flops == conv1 + conv2 + conv3 + elementwise


# -- dependency patterns and views -----------------------------------------------------------------
def test_dependency_patterns():
    bert = load_model("bert-base-encoder")
    assert bert.op("softmax").info.patterns["s_scaled"] is DepPattern.ROW
    assert bert.op("gelu").info.patterns["f1"] is DepPattern.ELEMENTWISE
    assert bert.op("fc1").info.patterns["h"] is DepPattern.ROW      # GEMM A: whole rows (over K)
    assert bert.op("fc1").info.patterns["w1"] is DepPattern.FULL    # GEMM B: all of it
    assert bert.op("fc1").info.patterns["b1"] is DepPattern.FULL    # a bias is needed whole
    assert bert.op("qk").info.patterns["k"] is DepPattern.FULL      # attention's K
    assert bert.op("pv").info.patterns["v"] is DepPattern.FULL      # attention's V
    assert bert.op("ffn_layernorm").info.patterns["h2"] is DepPattern.ROW
    assert bert.op("ffn_residual").info.patterns["h"] is DepPattern.ELEMENTWISE

    rn = load_model("resnet50-bottleneck")
    assert rn.op("conv2").info.patterns["r1"] is DepPattern.HALO    # 3x3 window
    assert rn.op("conv2").info.patterns["w2"] is DepPattern.FULL
    assert rn.op("bn1").info.patterns["bn1_scale"] is DepPattern.FULL

    dlrm = load_model("dlrm-mlps")
    assert dlrm.op("emb_lookup").info.patterns["emb_table"] is DepPattern.GATHER
    assert dlrm.op("emb_lookup").info.op_class is OpClass.GATHER
    # the lookup reads only the rows it picks: 2048*26 rows of 128 fp16, not the 48 GB table
    assert dlrm.op("emb_lookup").info.read_bytes["emb_table"] == hand(2048 * 26 * 128 * 2, 13_631_488)

    mgn = load_model("meshgraphnets-step")
    assert mgn.op("gather_senders").info.patterns["node_lat"] is DepPattern.GATHER
    assert mgn.op("aggregate").info.patterns["e_msg"] is DepPattern.GATHER
    assert mgn.op("aggregate").info.op_class is OpClass.SCATTER
    assert not DepPattern.GATHER.streamable and DepPattern.HALO.streamable


def test_views_and_copies():
    pre = load_model("llama2-7b-prefill")
    # [batch, seq, heads, 128] -> [batch, heads, seq, 128] moves data: a copy
    assert pre.op("q_heads").info.op_class is OpClass.COPY
    assert pre.op("q_view").info.is_view
    dec = load_model("llama2-7b-decode")
    # with one token per sequence the same transpose only moves a size-1 axis: a free view
    assert dec.op("q_heads").info.is_view and dec.op("q_heads").info.bytes_read == 0
    assert dec.op("heads_merge").info.is_view
    # decode attention: [512, 1, 128] x [512, 4096, 128]^T
    gd = dec.op("qk").info.gemm
    assert (gd.batch, gd.m, gd.n, gd.k) == (16 * 32, 1, 4096, 128)
    assert dec.op("qk").info.read_bytes["k"] == hand(16 * 32 * 4096 * 128 * 2, 536_870_912)


def test_mixtral_dispatch_and_combine_shapes():
    g = load_model("mixtral-moe-ffn")
    assert g.meta["sizes"]["capacity"] == 4096 * 2 // 8 == 1024
    assert g.tensors["xe"].shape == (8, 1024, 4096)
    assert g.tensors["e_gate"].shape == (8, 1024, 14336)
    assert g.tensors["moe"].shape == (4096, 4096)
    # expert GEMMs: 8 experts x 2 * 1024 * 4096 * 14336 each, three of them
    expert = hand(8 * 2 * 1024 * 4096 * 14336, 962_072_674_304)
    for op in ("expert_w1", "expert_w3", "expert_w2"):
        assert g.op(op).info.flops == expert


# -- the README documents the format, every op kind and every model -------------------------------
def test_readme_documents_every_kind_and_model():
    text = (MODELS_DIR / "README.md").read_text(encoding="utf-8")
    for kind in KINDS:
        assert f"`{kind}`" in text, f"op kind {kind!r} is not documented in models/README.md"
    for name in ZOO:
        assert f"`{name}`" in text, f"model {name!r} is missing from the zoo table"
    for field in ("name", "description", "source", "dtype", "sizes", "inputs", "weights", "ops",
                  "outputs", "notes"):
        assert f"`{field}`" in text
    for pat in DepPattern:
        assert f"`{pat.value}`" in text


def test_default_sizes_are_gpu_sized():
    """Every default workload is at least about a GFLOP: big enough to fill a GPU."""
    for name in ZOO:
        assert load_model(name).total_flops > 1e9, name


def test_mesh_and_nerf_row_counts():
    nerf = load_model("nerf-mlp")
    assert nerf.tensors["gx"].shape == (4096 * 64, 60)
    assert nerf.tensors["a5s"].shape == (4096 * 64, 256 + 60)     # skip concat at layer 5
    assert nerf.tensors["fd"].shape == (4096 * 64, 256 + 24)      # direction concat
    assert nerf.tensors["rgb"].shape == (4096 * 64, 3)
    mgn = load_model("meshgraphnets-step")
    assert mgn.tensors["e_in"].shape == (393_216, 3 * 128)
    assert mgn.tensors["n_in"].shape == (65_536, 2 * 128)
    assert math.prod(mgn.tensors["edge_out"].shape) == 393_216 * 128


def test_readme_table_gflops_match_the_models():
    """The zoo table in models/README.md states each model's GFLOP at its defaults (4 digits)."""
    text = (MODELS_DIR / "README.md").read_text(encoding="utf-8")
    text = text.split("## The zoo", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|.*\| ([0-9.]+) \| [^|]+ \|$", text, flags=re.M)
    table = {name: float(gf) for name, gf in rows}
    assert set(table) == set(ZOO)
    for name, gf in table.items():
        assert f"{load_model(name).total_flops / 1e9:.4g}" == f"{gf:.4g}", name


def test_narrow_last_dimensions_are_stored_padded_to_eight():
    # the runtime stores a last dimension padded to a multiple of 8 elements: NeRF's density
    # column (262144 x 1 fp16) is 262144 x 8 x 2 bytes as stored, and so is what its relu reads
    # and writes; its positional encoding (60 columns) is stored as 64; a wide tensor as it is
    g = load_model("nerf-mlp")
    assert g.tensors["sigma_pre"].nbytes == hand(262144 * 1 * 2, 524_288)
    assert g.stored_bytes("sigma_pre") == hand(262144 * 8 * 2, 4_194_304)
    assert dict(g.op("sigma_relu").info.read_bytes) == {"sigma_pre": 4_194_304}
    assert dict(g.op("sigma_relu").info.write_bytes) == {"sigma": 4_194_304}
    assert g.op("fc1").info.read_bytes["gx"] == hand(262144 * 64 * 2, 33_554_432)
    assert g.stored_bytes("a8") == g.tensors["a8"].nbytes == 262144 * 256 * 2
    # a convolution's weight (K, C, R, S) is no row-major matrix: its 3 x 3 taps stay unpadded
    # (test_resnet_bottleneck_hand_flops_and_bytes)
