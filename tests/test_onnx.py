"""ONNX import: models are built here with onnx.helper (nothing is downloaded)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from kitsune_dse.cli import main  # noqa: E402
from kitsune_dse.errors import KitsuneError  # noqa: E402
from kitsune_dse.graph import load_model  # noqa: E402
from kitsune_dse.graph.onnx_import import SUPPORTED, load_onnx_model  # noqa: E402

F32, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, shape, dtype=np.float32, value=None):
    arr = np.asarray(value, dtype=dtype) if value is not None else np.zeros(shape, dtype=dtype)
    return numpy_helper.from_array(arr, name)


def const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))


def save(tmp_path, nodes, inputs, outputs, inits=(), opset=17, name="m", **save_kw):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    p = tmp_path / f"{name}.onnx"
    onnx.save_model(m, str(p), **save_kw)
    return p


def load(p, **overrides):
    g = load_model(p, overrides)
    bad = [n for n in g.meta["notes"] if "shape inference says" in n]
    assert not bad, bad
    return g


def kinds(g):
    return [op.kind for op in g.ops]


def shape(g, t):
    return list(g.tensors[t].shape)


def cli_error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- models ------------------------------------------------------------------------------------
def mlp(tmp_path, batch=4, **save_kw):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["a"], name="act"),
             helper.make_node("MatMul", ["a", "w2"], ["o"], name="fc2"),
             helper.make_node("Add", ["o", "b2"], ["y"], name="bias2")]
    inits = [init("w1", (16, 32)), init("b1", (32,)), init("w2", (32, 8)), init("b2", (8,))]
    return save(tmp_path, nodes, [vi("x", F32, [batch, 16])], [vi("y", F32, None)], inits,
                **save_kw)


def test_mlp(tmp_path):
    g = load(mlp(tmp_path))
    assert g.name == "m"
    assert kinds(g) == ["matmul", "add", "relu", "matmul", "add"]
    assert [op.name for op in g.ops] == ["fc1", "bias1", "act", "fc2", "bias2"]
    assert g.inputs == ("x",) and g.outputs == ("y",)
    assert g.weights == {"w1", "b1", "w2", "b2"}
    assert shape(g, "y") == [4, 8] and g.tensors["y"].dtype == "fp32"
    assert g.op("fc1").info.flops == 2 * 4 * 16 * 32
    assert main(["graph", "show", str(tmp_path / "m.onnx")]) == 0


def test_gemm_trans_b_and_bias(tmp_path):
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=0.5)]
    p = save(tmp_path, nodes, [vi("a", F16, [4, 16])], [vi("y", F16, None)],
             [init("b", (32, 16), np.float16), init("c", (32,), np.float16)])
    g = load(p)
    (op,) = g.ops
    assert op.name == "Gemm_0" and op.kind == "gemm"
    assert op.inputs == ("a", "b", "c") and op.attrs["trans_b"] is True
    assert "trans_a" not in op.attrs and op.attrs["alpha"] == 0.5
    assert shape(g, "y") == [4, 32] and g.tensors["y"].dtype == "fp16"
    assert op.info.flops == 2 * 4 * 32 * 16 + 4 * 32
    assert op.info.unit == "tensor"


def test_gemm_beta_zero_drops_c(tmp_path):
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, beta=0.0)]
    p = save(tmp_path, nodes, [vi("a", F32, [16, 4])], [vi("y", F32, None)],
             [init("b", (16, 32)), init("c", (32,))])
    (op,) = load(p).ops
    assert op.inputs == ("a", "b") and op.attrs["trans_a"] is True


def test_conv_batchnorm_relu(tmp_path):
    n, c, h, w, k, r, s = 2, 3, 32, 32, 8, 3, 3
    nodes = [helper.make_node("Conv", ["x", "wc"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="down",
                              strides=[2, 2], auto_pad="SAME_UPPER"),
             helper.make_node("Conv", ["c2", "w3"], ["c3"], name="grouped", group=4,
                              auto_pad="VALID"),
             helper.make_node("GlobalAveragePool", ["c3"], ["pool"], name="pool"),
             helper.make_node("Flatten", ["pool"], ["y"], name="flat")]
    inits = [init("wc", (k, c, r, s)), init("g", (k,)), init("b", (k,)), init("m", (k,)),
             init("v", (k,)), init("w2", (16, k, 3, 3)), init("b2", (16,)),
             init("w3", (16, 4, 3, 3))]
    g = load(save(tmp_path, nodes, [vi("x", F32, [n, c, h, w])], [vi("y", F32, None)], inits))
    assert kinds(g) == ["conv2d", "batchnorm", "relu", "conv2d", "conv2d", "reduce_mean",
                        "flatten"]
    conv = g.op("conv")
    assert conv.attrs["layout"] == "NCHW" and shape(g, "c1") == [n, k, h, w]
    p, q = h, w   # pads 1, stride 1, 3x3 keeps the size
    assert conv.info.flops == 2 * n * k * p * q * c * r * s
    assert g.op("bn").attrs["axis"] == 1
    assert g.op("down").attrs["pads"] == [0, 0, 1, 1]     # SAME_UPPER, stride 2, even input
    assert shape(g, "c2") == [n, 16, 16, 16]
    assert shape(g, "c3") == [n, 16, 14, 14]
    assert g.op("grouped").info.flops == 2 * n * 16 * 14 * 14 * 4 * 3 * 3
    assert shape(g, "y") == [n, 16]


def test_conv1d(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1], strides=[2])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [1, 4, 20])], [vi("y", F32, None)],
                  [init("w", (6, 4, 3))]))
    assert kinds(g) == ["reshape", "reshape", "conv2d", "reshape"]
    assert shape(g, "y") == [1, 6, 10]
    conv = g.ops[2]
    assert conv.info.flops == 2 * 1 * 6 * 10 * 4 * 3


def test_layernorm_decomposed(tmp_path):
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
             helper.make_node("Sub", ["x", "mu"], ["d"]),
             const("two", 2.0),
             helper.make_node("Pow", ["d", "two"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
             const("eps", 1e-5),
             helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["xn"]),
             helper.make_node("Mul", ["xn", "gamma"], ["xs"]),
             helper.make_node("Add", ["xs", "beta"], ["y"])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [2, 8, 16])], [vi("y", F32, None)],
                  [init("gamma", (16,)), init("beta", (16,))]))
    assert kinds(g) == ["reduce_mean", "sub", "pow", "reduce_mean", "add", "sqrt", "div", "mul",
                        "add"]
    assert [op.name for op in g.ops][:3] == ["ReduceMean_0", "Sub_1", "Pow_3"]
    assert shape(g, "mu") == [2, 8, 1] and shape(g, "y") == [2, 8, 16]
    assert shape(g, "two") == [1] and shape(g, "eps") == [1]   # scalars become [1]
    assert {"two", "eps", "gamma", "beta"} <= g.weights


def test_reduce_mean_axes_input_opset18(tmp_path):
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)]
    g = load(save(tmp_path, nodes, [vi("x", F32, [2, 8, 16])], [vi("y", F32, None)],
                  [init("axes", None, np.int64, [-1])], opset=18))
    assert shape(g, "y") == [2, 8]
    assert "axes" not in g.tensors     # a shape-like constant is consumed, not a weight


def test_gelu_erf(tmp_path):
    nodes = [const("sqrt2", np.sqrt(2.0)), const("one", 1.0), const("half", 0.5),
             helper.make_node("Div", ["x", "sqrt2"], ["t"]),
             helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["x", "e1"], ["xe"]),
             helper.make_node("Mul", ["xe", "half"], ["y"])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [4, 64])], [vi("y", F32, None)]))
    assert kinds(g) == ["div", "erf", "add", "mul", "mul"]
    assert shape(g, "y") == [4, 64]
    assert g.weights == {"sqrt2", "one", "half"}


def test_native_layernorm_gelu_softmax(tmp_path):
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], ["ln"]),
             helper.make_node("LayerNormalization", ["x", "s2"], ["ln2"], axis=1),
             helper.make_node("Gelu", ["ln"], ["ge"]),
             helper.make_node("Softmax", ["ge"], ["y"])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [2, 4, 16])], [vi("y", F32, None),
                  vi("ln2", F32, None)], [init("s", (16,)), init("b", (16,)), init("s2", (4, 16))],
                  opset=20))
    assert kinds(g) == ["layernorm", "reshape", "reshape", "layernorm", "reshape", "gelu",
                        "softmax"]
    assert shape(g, "ln2") == [2, 4, 16]


def test_symbolic_batch(tmp_path, capsys):
    p = mlp(tmp_path, batch="batch")
    with pytest.raises(KitsuneError) as e:
        load_onnx_model(p, {})
    msg = str(e.value)
    assert msg.startswith(str(p)) and "input 'x' has symbolic dimension 'batch'" in msg
    assert "--set batch=VALUE" in msg
    g = load(p, batch=8)
    assert shape(g, "x") == [8, 16] and shape(g, "y") == [8, 8]
    assert g.meta["sizes"] == {"batch": 8}
    with pytest.raises(KitsuneError, match=r"no symbolic dimension 'bacth'.*batch"):
        load_onnx_model(p, {"bacth": 8})
    line = cli_error(capsys, ["graph", "show", str(p)])
    assert "symbolic dimension 'batch'" in line
    assert main(["graph", "show", str(p), "--set", "batch=8"]) == 0
    assert "batch=8" in capsys.readouterr().out
    line = cli_error(capsys, ["graph", "show", str(p), "--set", "seq=8"])
    assert "its symbolic dimensions are batch" in line


def test_set_on_static_model(tmp_path):
    with pytest.raises(KitsuneError, match="it has no symbolic dimensions"):
        load_onnx_model(mlp(tmp_path), {"batch": 2})


def test_external_data_not_present(tmp_path):
    p = mlp(tmp_path, save_as_external_data=True, all_tensors_to_one_file=True,
            location="w.bin", size_threshold=0)
    m = onnx.load(str(p), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer)
    (tmp_path / "w.bin").unlink()
    g = load(p)
    assert kinds(g) == ["matmul", "add", "relu", "matmul", "add"]
    assert shape(g, "w1") == [16, 32] and shape(g, "w2") == [32, 8] and shape(g, "y") == [4, 8]
    assert main(["graph", "show", str(p)]) == 0


def test_constant_subgraph_folds_the_same_without_external_data(tmp_path):
    nodes = [helper.make_node("Sqrt", ["c"], ["sc"]),          # a constant sub-graph
             helper.make_node("Mul", ["sc", "s"], ["k"]),
             helper.make_node("Mul", ["x", "k"], ["y"])]
    args = (tmp_path, nodes, [vi("x", F32, [4, 8])], [vi("y", F32, None)],
            [init("c", None, np.float32, 2.0), init("s", (8,))])
    kw = dict(save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    with_data = load(save(*args, **kw))
    (tmp_path / "w.bin").unlink()
    without = load(tmp_path / "m.onnx")
    for g in (with_data, without):
        assert kinds(g) == ["mul"] and g.weights == {"k"} and shape(g, "k") == [8]


def test_external_shape_constant_missing(tmp_path, capsys):
    nodes = [helper.make_node("Reshape", ["x", "shp"], ["y"], name="r")]
    p = save(tmp_path, nodes, [vi("x", F32, [2, 3, 4])], [vi("y", F32, None)],
             [init("shp", None, np.int64, [0, -1])], save_as_external_data=True,
             all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    assert load(p).tensors["y"].shape == (2, 12)     # present: the value is read
    (tmp_path / "w.bin").unlink()
    line = cli_error(capsys, ["graph", "show", str(p)])
    assert "node 'r' (op type Reshape)" in line and "'w.bin'" in line and "not present" in line


def test_not_onnx(tmp_path, capsys):
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\x07\xff\x00garbage, not a protobuf \xde\xad\xbe\xef" * 10)
    with pytest.raises(KitsuneError, match="not an ONNX model"):
        load_onnx_model(p, {})
    line = cli_error(capsys, ["graph", "show", str(p)])
    assert line.startswith(f"error: {p}: not an ONNX model")
    p2 = tmp_path / "text.onnx"
    p2.write_text("name: not-onnx\n")
    assert "not an ONNX model" in cli_error(capsys, ["graph", "show", str(p2)])


def test_unsupported_op(tmp_path, capsys):
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"], name="nms")]
    p = save(tmp_path, nodes, [vi("boxes", F32, [1, 10, 4]), vi("scores", F32, [1, 1, 10])],
             [vi("sel", I64, None)])
    line = cli_error(capsys, ["graph", "show", str(p)])
    assert "node 'nms' (op type NonMaxSuppression) is not supported" in line
    assert "supported: " + ", ".join(SUPPORTED) in line
    assert list(SUPPORTED) == sorted(SUPPORTED) and "MatMul" in SUPPORTED


def test_reshape_and_shape_folding(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"], name="r0"),         # [0, -1]
             # exporter-style: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
             helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Gather", ["xs", "i0"], ["n0"], axis=0),
             helper.make_node("Unsqueeze", ["n0", "ax0"], ["n0u"]),
             helper.make_node("Concat", ["n0u", "rest"], ["tgt"], axis=0),
             helper.make_node("Reshape", ["x", "tgt"], ["b"], name="r1"),
             helper.make_node("Add", ["a", "b"], ["y"])]
    inits = [init("s1", None, np.int64, [0, -1]), init("i0", None, np.int64, 0),
             init("ax0", None, np.int64, [0]), init("rest", None, np.int64, [-1])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [2, 3, 4])], [vi("y", F32, None)], inits))
    assert kinds(g) == ["reshape", "reshape", "add"]      # the shape arithmetic is folded
    assert shape(g, "a") == [2, 12] and shape(g, "b") == [2, 12]
    assert g.op("r0").info.is_view
    assert not ({"s1", "tgt", "xs"} & set(g.tensors))


def test_reshape_from_runtime_shape_is_an_error(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="r")]
    p = save(tmp_path, nodes, [vi("x", F32, [2, 3]), vi("s", I64, [2])], [vi("y", F32, None)])
    with pytest.raises(KitsuneError, match="'s' is computed at run time"):
        load_onnx_model(p, {})


def test_split_concat(tmp_path):
    nodes = [helper.make_node("Split", ["x", "sizes"], ["p", "q"], axis=1, name="split13"),
             helper.make_node("Concat", ["q", "p"], ["c"], axis=-1, name="cat"),
             helper.make_node("Split", ["c"], ["u", "v", "w"], axis=0, num_outputs=3,
                              name="split18"),
             helper.make_node("Concat", ["u", "v", "w"], ["y"], axis=0)]
    g = load(save(tmp_path, nodes, [vi("x", F32, [8, 6])], [vi("y", F32, None)],
                  [init("sizes", None, np.int64, [2, 4])], opset=18))
    assert kinds(g) == ["split", "concat", "split", "concat"]
    assert shape(g, "p") == [8, 2] and shape(g, "q") == [8, 4] and shape(g, "c") == [8, 6]
    assert g.op("split18").attrs["sizes"] == [3, 3, 2]
    assert shape(g, "w") == [2, 6] and shape(g, "y") == [8, 6]


def test_split_attr_opset11(tmp_path):
    nodes = [helper.make_node("Split", ["x"], ["p", "q"], axis=-1, split=[1, 5]),
             helper.make_node("Split", ["x"], ["r", "s"], axis=0)]
    g = load(save(tmp_path, nodes, [vi("x", F32, [8, 6])], [vi("p", F32, None),
                  vi("q", F32, None), vi("r", F32, None), vi("s", F32, None)], opset=11))
    assert shape(g, "p") == [8, 1] and shape(g, "s") == [4, 6]


def test_transpose(tmp_path):
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["t"], ["y"])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [2, 3, 4, 5])], [vi("y", F32, None)]))
    assert kinds(g) == ["transpose", "transpose"]
    assert shape(g, "t") == [2, 4, 3, 5] and shape(g, "y") == [5, 3, 4, 2]


def test_gather_embedding(tmp_path):
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Gather", ["e", "zero"], ["first"], name="first")]
    g = load(save(tmp_path, nodes, [vi("ids", I64, [2, 5])], [vi("first", F16, None)],
                  [init("table", (100, 16), np.float16), init("zero", None, np.int64, 0)]))
    assert kinds(g) == ["gather", "gather", "reshape"]
    assert shape(g, "e") == [2, 5, 16] and g.tensors["e"].dtype == "fp16"
    assert shape(g, "first") == [5, 16]      # a scalar index drops the axis
    assert g.op("embed").info.read_bytes["table"] == 2 * 5 * 16 * 2


def test_gather_other_axis_is_an_error(tmp_path, capsys):
    nodes = [helper.make_node("Gather", ["x", "ids"], ["y"], axis=1, name="g1")]
    p = save(tmp_path, nodes, [vi("x", F32, [4, 8]), vi("ids", I64, [3])], [vi("y", F32, None)])
    line = cli_error(capsys, ["graph", "show", str(p)])
    assert "node 'g1' (op type Gather)" in line and "axis 1" in line and "axis 0" in line


def test_scatter_elements(tmp_path):
    nodes = [helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=0,
                              reduction="add", name="sc")]
    g = load(save(tmp_path, nodes, [vi("data", F32, [10, 4]), vi("idx", I64, [6, 4]),
                                    vi("upd", F32, [6, 4])], [vi("y", F32, None)], opset=18))
    assert [op.kind for op in g.ops if not op.info.is_view] == ["scatter_add"]
    assert shape(g, "y") == [10, 4]
    sc = next(op for op in g.ops if op.kind == "scatter_add")
    assert sc.info.flops == 6 * 4
    assert sc.info.bytes_read == 10 * 4 * 4 + 6 * 4 * 8 + 6 * 4 * 4
    nodes[0] = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], name="sc")
    g = load(save(tmp_path, nodes, [vi("data", F32, [10, 4]), vi("idx", I64, [6, 4]),
                                    vi("upd", F32, [6, 4])], [vi("y", F32, None)], opset=18))
    assert any("reduction 'none'" in n for n in g.meta["notes"])
    nodes[0] = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"],
                                reduction="mul", name="sc")
    p = save(tmp_path, nodes, [vi("data", F32, [10, 4]), vi("idx", I64, [6, 4]),
                               vi("upd", F32, [6, 4])], [vi("y", F32, None)], opset=18)
    with pytest.raises(KitsuneError, match="reduction 'mul' is not supported"):
        load_onnx_model(p, {})


def test_scatter_nd_rows(tmp_path):
    nodes = [helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], reduction="add")]
    g = load(save(tmp_path, nodes, [vi("data", F32, [10, 4]), vi("idx", I64, [6, 1]),
                                    vi("upd", F32, [6, 4])], [vi("y", F32, None)], opset=18))
    assert kinds(g) == ["reshape", "scatter_add"] and shape(g, "y") == [10, 4]


def test_matmul_vector_operands(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "v"], ["xv"]),      # [3,4,5] @ [5] -> [3,4]
             helper.make_node("MatMul", ["u", "x"], ["ux"])]      # [4] @ [3,4,5] -> [3,5]
    g = load(save(tmp_path, nodes, [vi("x", F32, [3, 4, 5])], [vi("xv", F32, None),
                  vi("ux", F32, None)], [init("v", (5,)), init("u", (4,))]))
    assert shape(g, "xv") == [3, 4] and shape(g, "ux") == [3, 5]
    mm = [op for op in g.ops if op.kind == "matmul"]
    assert [op.info.flops for op in mm] == [2 * 3 * 4 * 5, 2 * 3 * 4 * 5]


def test_cast_dtypes_identity_and_pow_exponent(tmp_path):
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Pow", ["h", "two"], ["p"]),           # fp32 exponent, fp16 base
             helper.make_node("Identity", ["p"], ["i"]),
             helper.make_node("Cast", ["i"], ["y"], to=TensorProto.BFLOAT16)]
    g = load(save(tmp_path, nodes, [vi("x", F32, [4, 8])], [vi("y", TensorProto.BFLOAT16, None)],
                  [init("two", None, np.float32, 2.0)]))
    assert kinds(g) == ["cast", "pow", "identity", "cast"]
    assert g.tensors["h"].dtype == "fp16" and g.tensors["y"].dtype == "bf16"


def test_unsupported_dtype(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    p = save(tmp_path, nodes, [vi("x", TensorProto.UINT32, [4])], [vi("y", TensorProto.UINT32,
                                                                     None)])
    with pytest.raises(KitsuneError, match="input 'x' has ONNX dtype UINT32"):
        load_onnx_model(p, {})


def test_transformer_block_fragment(tmp_path):
    """Attention scores with exporter-style reshapes, softmax and a scaled matmul."""
    b, s, h, d = 2, 8, 4, 16
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("Reshape", ["q", "hs"], ["q4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["q4"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["qt", "kt"], ["sc"]),
             helper.make_node("Mul", ["sc", "scale"], ["scs"]),
             helper.make_node("Softmax", ["scs"], ["pr"], axis=-1),
             helper.make_node("MatMul", ["pr", "qt"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ct", "flat"], ["y"])]
    inits = [init("wq", (h * d, h * d)), init("hs", None, np.int64, [0, 0, h, d]),
             init("scale", None, np.float32, 0.25), init("flat", None, np.int64, [0, 0, -1])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [b, s, h * d])], [vi("y", F32, None)], inits))
    assert shape(g, "sc") == [b, h, s, s] and shape(g, "y") == [b, s, h * d]
    assert g.op("MatMul_4").info.flops == 2 * b * h * s * s * d


def test_exporter_style_position_embedding(tmp_path):
    """Positions from Shape -> Gather -> Range -> Unsqueeze (folded) index a position table."""
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["tok"], name="wte_lookup"),
             helper.make_node("Shape", ["ids"], ["ids_shape"]),
             helper.make_node("Gather", ["ids_shape", "one"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
             helper.make_node("Unsqueeze", ["pos", "ax0"], ["pos2"]),
             helper.make_node("Gather", ["wpe", "pos2"], ["pe"], name="wpe_lookup"),
             helper.make_node("Add", ["tok", "pe"], ["h"]),
             helper.make_node("ConstantOfShape", ["ids_shape"], ["mask"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Unsqueeze", ["mask", "ax2"], ["mask3"]),
             helper.make_node("Mul", ["h", "mask3"], ["y"])]
    # a position table above the folding limit stays a gather (a small one would be folded)
    inits = [init("wte", (50, 8)), init("wpe", (10000, 8)), init("zero", None, np.int64, 0),
             init("one", None, np.int64, 1), init("ax0", None, np.int64, [0]),
             init("ax2", None, np.int64, [2])]
    g = load(save(tmp_path, nodes, [vi("ids", I64, [2, 6])], [vi("y", F32, None)], inits))
    assert kinds(g) == ["gather", "gather", "add", "mul"]
    assert shape(g, "pos2") == [1, 6] and g.tensors["pos2"].dtype == "int64"
    assert shape(g, "pe") == [1, 6, 8] and shape(g, "y") == [2, 6, 8]
    assert {"pos2", "mask3", "wte", "wpe"} == set(g.weights)


def test_approximated_activations_are_noted(tmp_path):
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
             helper.make_node("Clip", ["a", "lo", "hi"], ["y"])]
    g = load(save(tmp_path, nodes, [vi("x", F32, [4, 8])], [vi("y", F32, None)],
                  [init("lo", None, np.float32, 0.0), init("hi", None, np.float32, 6.0)]))
    assert kinds(g) == ["relu", "relu"]
    assert any("LeakyRelu" in n and "relu" in n for n in g.meta["notes"])


def test_input_that_is_an_initializer_is_a_weight(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    p = save(tmp_path, nodes, [vi("x", F32, ["n", 4]), vi("w", F32, ["k", 3])],
             [vi("y", F32, None)], [init("w", (4, 3))])
    g = load(p, n=5)
    assert g.inputs == ("x",) and g.weights == {"w"} and shape(g, "y") == [5, 3]
    with pytest.raises(KitsuneError, match="its symbolic dimensions are n$"):
        load_onnx_model(p, {"k": 4})


def test_softmax_opset11_coerces_to_2d(tmp_path):
    nodes = [helper.make_node("Softmax", ["x"], ["y"])]        # axis 1 of [2, 3, 4]: over 3*4
    g = load(save(tmp_path, nodes, [vi("x", F32, [2, 3, 4])], [vi("y", F32, None)], opset=11))
    assert kinds(g) == ["reshape", "softmax", "reshape"]
    assert shape(g, g.ops[1].outputs[0]) == [2, 12] and shape(g, "y") == [2, 3, 4]


def test_two_symbolic_dims_error_names_the_rest(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    p = save(tmp_path, nodes, [vi("x", F32, ["batch", "seq", 8])], [vi("y", F32, None)])
    with pytest.raises(KitsuneError, match=r"'batch'; give it a value with --set batch=VALUE "
                                           r"\(also unset: seq\)"):
        load_onnx_model(p, {})
    with pytest.raises(KitsuneError, match="symbolic dimension 'seq'"):
        load_onnx_model(p, {"batch": 2})
    assert shape(load(p, batch=2, seq=3), "y") == [2, 3, 8]
