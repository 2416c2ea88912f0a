"""ONNX import/export: round trips on real models, preserved structure, and hostile input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from autobatch.backends import NumpyBackend
from autobatch.ir import OnnxImportError, from_onnx, to_onnx
from autobatch.ir.onnx_io import max_onnxruntime_ir_version

LIGHT_MODELS = sorted((Path(onnx.__file__).parent / "backend/test/data/light").glob("*.onnx"))


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for info in model.graph.input:
        if info.name in initializers:
            continue
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        feeds[info.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def test_light_models_are_present():
    assert len(LIGHT_MODELS) == 9, [p.name for p in LIGHT_MODELS]


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_light_model_round_trip(path: Path):
    original = onnx.load(path)
    exported = to_onnx(from_onnx(path))
    onnx.checker.check_model(exported)
    assert exported.ir_version <= max_onnxruntime_ir_version()
    feeds = random_feeds(original)
    expected = ort_run(original, feeds)
    got = ort_run(exported, feeds)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)
    # Compared before a final Softmax: these models' constant weights make logits of about 7e9,
    # where one ulp (1,024) that another summation order gives turns a softmax output of 0.001
    # into 0 (it failed with one BLAS thread only).
    logits = _without_final_softmax(exported)
    expected = ort_run(logits, feeds)
    ours = NumpyBackend.prepare(logits).run(feeds)
    for e, g in zip(expected, ours, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def _without_final_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    last = model.graph.node[-1]
    if last.op_type != "Softmax" or list(last.output) != [o.name for o in model.graph.output]:
        return model
    cut = onnx.shape_inference.infer_shapes(model)
    logits = next(info for info in cut.graph.value_info if info.name == last.input[0])
    cut.graph.node.pop()
    del cut.graph.output[:]
    cut.graph.output.append(logits)
    return cut


def test_export_lowers_ir_version_for_onnxruntime():
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 21)])
    assert model.ir_version == onnx.IR_VERSION  # what onnx writes by default
    exported = to_onnx(from_onnx(model))
    assert exported.ir_version == min(onnx.IR_VERSION, max_onnxruntime_ir_version())
    (y,) = ort_run(exported, {"x": np.array([-1, 2], np.float32)})
    assert y.tolist() == [0, 2]


FUNCTION_MODEL = """
<ir_version: 10, opset_import: ["" : 18, "local" : 1]>
agraph (float[N] x, bool c) => (float[N] y, float[N] z) {
    s = local.Square(x)
    y = If(c) <then_branch = g1 () => (float[N] t) { t = Neg(s) },
                else_branch = g2 () => (float[N] e) { e = Identity(s) }>
    z = local.Square(y)
}
<domain: "local", opset_import: ["" : 18]>
Square (a) => (b) { b = Mul(a, a) }
"""


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_an_ir_3_model_whose_initializers_are_inputs_loads_exports_and_batches(backend):
    """IR 3 (opsets up to 8) lists every initializer as a graph input; our export leaves them
    out, which IR 3 forbids: it is written as IR 4, and the model batches as a newer one."""
    from autobatch import InferenceSession
    from tests.oracle import assert_batched_equals_alone
    weight = onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["L", 4]), helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["L", 4])], initializer=[weight]),
        opset_imports=[helper.make_opsetid("", 7)], ir_version=3)
    onnx.checker.check_model(model)
    exported = to_onnx(from_onnx(model))
    assert exported.ir_version == 4
    onnx.checker.check_model(exported)
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(0)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (2, 3, 5)])
    assert session.stats.report.launches_by_op == {"Add": 1} and not session.stats.report.alone


def test_functions_and_subgraphs_survive_the_round_trip():
    model = onnx.parser.parse_model(FUNCTION_MODEL)
    graph = from_onnx(model)
    exported = to_onnx(graph)
    assert [f.name for f in exported.functions] == ["Square"]
    if_node = next(n for n in exported.graph.node if n.op_type == "If")
    assert {a.name for a in if_node.attribute} == {"then_branch", "else_branch"}
    x = np.array([1.0, -2.0], np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        expected = ort_run(model, feeds)
        for run in (ort_run(exported, feeds), NumpyBackend.prepare(exported).run(feeds)):
            for e, g in zip(expected, run, strict=True):
                np.testing.assert_allclose(g, e)


def test_metadata_is_kept():
    model = onnx.parser.parse_model(FUNCTION_MODEL)
    model.producer_name = "unit-test"
    helper.set_model_props(model, {"author": "us"})
    exported = to_onnx(from_onnx(model))
    assert exported.producer_name == "unit-test"
    assert {p.key: p.value for p in exported.metadata_props} == {"author": "us"}


# ------------------------------------------------------------------ hostile input
def small_model() -> onnx.ModelProto:
    return onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[2] x) => (float[2] y) { y = Relu(x) }
    """)


def test_truncated_bytes():
    data = small_model().SerializeToString()
    with pytest.raises(OnnxImportError, match="not an ONNX model"):
        from_onnx(data[: len(data) // 2])


@pytest.mark.parametrize("data", [b"", b"\x00" * 64, b"GIF89a this is not a model", bytes(range(256)) * 8])
def test_garbage_bytes(data: bytes):
    with pytest.raises(OnnxImportError, match="not an ONNX model"):
        from_onnx(data)


def test_missing_file(tmp_path):
    with pytest.raises(OnnxImportError, match="no such file"):
        from_onnx(tmp_path / "absent.onnx")


def model_with_external_weight(location: str) -> onnx.ModelProto:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4], [0.0] * 4)
    weight.ClearField("float_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, "offset": "0", "length": "16"}.items():
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    path = folder / "m.onnx"
    path.write_bytes(model_with_external_weight(location).SerializeToString())
    with pytest.raises(OnnxImportError, match="outside the model's folder"):
        from_onnx(path)


def test_external_data_inside_the_model_folder_is_read(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    path = tmp_path / "m.onnx"
    path.write_bytes(model_with_external_weight("w.bin").SerializeToString())
    graph = from_onnx(path)
    np.testing.assert_array_equal(graph.initializers()["w"], [0, 1, 2, 3])


def test_external_data_shorter_than_declared(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\x00" * 8)
    path = tmp_path / "m.onnx"
    path.write_bytes(model_with_external_weight("w.bin").SerializeToString())
    with pytest.raises(OnnxImportError, match="asks for 16 bytes"):
        from_onnx(path)


def test_external_data_from_bytes_needs_a_folder():
    with pytest.raises(OnnxImportError, match="load the model from its path"):
        from_onnx(model_with_external_weight("w.bin").SerializeToString())


def test_enormous_declared_tensor_is_refused_without_allocating():
    model = small_model()
    huge = TensorProto(name="huge", data_type=TensorProto.FLOAT, dims=[1 << 20, 1 << 20, 1 << 20], float_data=[1.0])
    model.graph.initializer.append(huge)
    with pytest.raises(OnnxImportError, match=r"declares shape .* but holds data for at most 2"):
        from_onnx(model.SerializeToString())


def test_enormous_constant_attribute_is_refused():
    model = small_model()
    huge = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[1 << 40], float_data=[1.0])
    model.graph.node.append(helper.make_node("Constant", [], ["c"], value=huge))
    with pytest.raises(OnnxImportError, match="declares shape"):
        from_onnx(model)


def test_cycle_in_model_is_refused():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(OnnxImportError, match="invalid ONNX model.*"):
        from_onnx(model)


def test_unknown_op_is_refused():
    model = small_model()
    model.graph.node[0].op_type = "Frobnicate"
    with pytest.raises(OnnxImportError, match="Frobnicate"):
        from_onnx(model)


def test_packed_int4_initializer_is_accepted():
    weight = helper.make_tensor("w", TensorProto.INT4, [7, 1], [1, -2, 3, -4, 5, -6, 7])
    model = small_model()
    model.graph.initializer.append(weight)
    graph = from_onnx(model.SerializeToString())
    assert graph.initializers()["w"].astype(np.int8).ravel().tolist() == [1, -2, 3, -4, 5, -6, 7]
