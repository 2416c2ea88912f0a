"""The hand-written kernels of ``autobatch.backends.kernels``, called directly.

1. Every single-node case of the ONNX backend node suite whose node resolves to a registered
   kernel runs on that kernel and is compared with the stored outputs by the ONNX runner's own
   rule (same shape, same dtype, assert_allclose with the case's rtol/atol).
2. Targeted checks against ``onnx.reference.ReferenceEvaluator`` on random data for what the
   suite barely covers: float32/float16/bfloat16 kept by the heavy ops, Conv/pool
   configurations, RNN options, and the older opset versions with different semantics (where
   onnx.reference itself is wrong, against the formula instead).
3. Whole CNNs of onnx/backend/test/data/light, with random weights, against onnxruntime.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner
from onnx.reference import ReferenceEvaluator

from autobatch.backends import kernels
from autobatch.backends.kernels.registry import KernelFn, NodeContext

# --------------------------------------------------------------------------- helpers


def attribute_values(node: onnx.NodeProto) -> dict[str, Any]:
    """Attributes as kernels receive them: strings decoded, tensors as arrays."""
    values: dict[str, Any] = {}
    for proto in node.attribute:
        value = helper.get_attribute_value(proto)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif proto.type == onnx.AttributeProto.STRINGS:
            value = [v.decode("utf-8") for v in value]
        elif proto.type == onnx.AttributeProto.TENSOR:
            value = numpy_helper.to_array(value)
        values[proto.name] = value
    return values


def kernel_for(op_type: str, opset: int, domain: str = "") -> KernelFn | None:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    return kernels.lookup(domain, op_type, schema.since_version)


def run_kernel(node: onnx.NodeProto, opset: int, inputs: Sequence[Any]) -> list[Any]:
    fn = kernel_for(node.op_type, opset, node.domain)
    assert fn is not None, f"no kernel for {node.op_type} at opset {opset}"
    ctx = NodeContext(attribute_values(node), len(node.output), node.op_type, node.name)
    result = fn(ctx, *inputs)
    return list(result) if isinstance(result, tuple) else [result]


def normalize(value: Any) -> Any:
    """Test data may hold TensorProtos (and lists of them for sequences)."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def opset_of(model: onnx.ModelProto, domain: str) -> int:
    return next(o.version for o in model.opset_import if (o.domain or "") == (domain or ""))


# --------------------------------------------------------------------------- 1. backend node suite


def _single_kernel_node(case: Any) -> bool:
    graph = case.model.graph
    if len(graph.node) != 1:
        return False
    node = graph.node[0]
    return kernel_for(node.op_type, opset_of(case.model, node.domain), node.domain) is not None


@functools.cache
def _kernel_cases() -> dict[str, Any]:
    with np.errstate(all="ignore"):  # the case generators compute log(0) and the like
        cases = load_model_tests(kind="node")
    return {case.name: case for case in cases if _single_kernel_node(case)}


def _run_case(case: Any) -> None:
    graph = case.model.graph
    node = graph.node[0]
    opset = opset_of(case.model, node.domain)
    for inputs, expected in case.data_sets:
        env: dict[str, Any] = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        env.update(zip((i.name for i in graph.input), (normalize(v) for v in inputs)))
        args = [env[name] if name else None for name in node.input]
        results = dict(zip(node.output, run_kernel(node, opset, args)))
        outputs = [results[o.name] for o in graph.output]
        Runner.assert_similar_outputs([normalize(v) for v in expected], outputs, case.rtol, case.atol)


@pytest.mark.parametrize("name", sorted(_kernel_cases()))
def test_backend_node_case(name: str) -> None:
    _run_case(_kernel_cases()[name])


def test_every_registration_is_a_schema_version() -> None:
    since = {(s.domain, s.name, s.since_version) for s in onnx.defs.get_all_schemas_with_history()}
    assert [key for key in kernels.registered_kernels() if key not in since] == []


# --------------------------------------------------------------------------- 2. targeted checks

RNG = np.random.default_rng(1234)


def random(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def make_node(op_type: str, inputs: Sequence[np.ndarray | None], outputs: int = 1, **attrs: Any) -> onnx.NodeProto:
    names = [f"x{i}" if value is not None else "" for i, value in enumerate(inputs)]
    return helper.make_node(op_type, names, [f"y{i}" for i in range(outputs)], **attrs)


def reference_run(node: onnx.NodeProto, opset: int, inputs: Sequence[np.ndarray | None]) -> list[Any]:
    feeds = {name: value for name, value in zip(node.input, inputs) if name}
    # The evaluator only needs names; the declared types are not checked.
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in feeds],
        [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in node.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)


def assert_same(actual: Sequence[Any], expected: Sequence[Any], rtol: float = 1e-4, atol: float = 1e-5) -> None:
    assert len(actual) >= len(expected)
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def check_against_reference(op_type: str, opset: int, inputs: Sequence[np.ndarray | None], outputs: int = 1,
                            **attrs: Any) -> list[Any]:
    node = make_node(op_type, inputs, outputs, **attrs)
    actual = run_kernel(node, opset, inputs)
    assert_same(actual, reference_run(node, opset, inputs))
    return actual


FLOAT32_CASES: dict[str, tuple[str, int, list[np.ndarray | None], dict[str, Any]]] = {
    "softmax": ("Softmax", 13, [random(2, 3, 5)], {"axis": 1}),
    "log_softmax": ("LogSoftmax", 13, [random(2, 3, 5)], {}),
    "gemm": ("Gemm", 13, [random(4, 3), random(5, 4), random(5)], {"alpha": 0.5, "beta": 2.0, "transA": 1, "transB": 1}),
    "matmul": ("MatMul", 13, [random(2, 3, 4), random(4, 5)], {}),
    "mean": ("Mean", 13, [random(3, 4), random(4), random(1, 4)], {}),
    "sigmoid": ("Sigmoid", 13, [random(3, 4) * 10], {}),
    "selu": ("Selu", 6, [random(3, 4)], {"alpha": 1.5, "gamma": 2.0}),
    "reduce_mean": ("ReduceMean", 18, [random(3, 4, 5), np.array([0, 2])], {"keepdims": 0}),
    "reduce_l2": ("ReduceL2", 18, [random(3, 4, 5), np.array([-1])], {}),
    "reduce_log_sum_exp": ("ReduceLogSumExp", 18, [random(3, 4, 5) * 50, np.array([1])], {}),
    "batch_norm": ("BatchNormalization", 15, [random(2, 3, 4, 4), random(3), random(3), random(3), np.abs(random(3)) + 0.5], {}),
    "conv": ("Conv", 11, [random(1, 4, 7, 7), random(6, 2, 3, 3), random(6)], {"group": 2, "dilations": [2, 1], "pads": [1, 0, 2, 1]}),
    "average_pool": ("AveragePool", 19, [random(1, 2, 7, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "lstm": ("LSTM", 14, [random(4, 2, 3), random(1, 20, 3), random(1, 20, 5), random(1, 40)], {"hidden_size": 5}),
    "gru": ("GRU", 14, [random(4, 2, 3), random(1, 15, 3), random(1, 15, 5), random(1, 30)], {"hidden_size": 5}),
    "rnn": ("RNN", 14, [random(4, 2, 3), random(1, 5, 3), random(1, 5, 5), random(1, 10)], {"hidden_size": 5}),
}


@pytest.mark.parametrize("case", sorted(FLOAT32_CASES))
def test_float32_kept(case: str) -> None:
    op_type, opset, inputs, attrs = FLOAT32_CASES[case]
    outputs = check_against_reference(op_type, opset, inputs, **attrs)
    assert outputs[0].dtype == np.float32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(FLOAT32_CASES))
def test_low_precision_float_kept(case: str, dtype: str) -> None:
    """float16/bfloat16 results keep their type (ml_dtypes promotes bfloat16 in mixed
    arithmetic) and stay close to the float32 results."""
    low = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)
    op_type, opset, inputs, attrs = FLOAT32_CASES[case]
    node = make_node(op_type, inputs, **attrs)
    low_inputs = [v.astype(low) if v is not None and v.dtype == np.float32 else v for v in inputs]
    actual = run_kernel(node, 22, low_inputs)  # the versions that accept bfloat16
    for got, want in zip(actual, run_kernel(node, opset, inputs)):
        assert got.dtype == low
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=0.1, atol=0.1)


CONV_CASES: list[tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
    # (x shape, w shape, attributes)
    ((2, 3, 11), (4, 3, 3), {"strides": [2], "pads": [1, 2], "dilations": [2]}),
    ((1, 4, 9, 8), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "strides": [1, 2], "pads": [1, 0, 2, 1]}),
    ((2, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 3, 9, 10), (5, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    ((1, 3, 9, 10), (5, 3, 4, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 3, 9, 10), (5, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 4, 6, 7), (8, 2, 1, 1), {"group": 2}),  # 1x1: the matmul-only path
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]}),
    ((1, 4, 0), (2, 4, 3), {"pads": [1, 1]}),  # a text of no tokens (the fuzzer's)
    ((1, 4, 0), (2, 4, 1), {}),  # and by the matmul-only path
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", CONV_CASES)
def test_conv_against_reference(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    check_against_reference("Conv", 11, [random(*x_shape), random(*w_shape), random(w_shape[0])], **attrs)


def test_conv_im2col_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of one output row, two rows, two samples give the same result as one block."""
    from autobatch.backends.kernels import conv

    inputs = [random(3, 4, 9, 9), random(6, 2, 3, 3), random(6)]
    node = make_node("Conv", inputs, group=2, pads=[1, 1, 1, 1], strides=[2, 1])  # output 5 x 9
    whole = run_kernel(node, 22, inputs)[0]
    row = 9 * 4 * 9  # im2col elements of one output row: width * channels * taps
    for block in (1, 2 * row, 2 * 5 * row):
        monkeypatch.setattr(conv, "_IM2COL_BLOCK", block)
        np.testing.assert_allclose(run_kernel(node, 22, inputs)[0], whole, rtol=1e-6, atol=1e-6)


POOL_CASES: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("MaxPool", (2, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (1, 2, 10, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "dilations": [2, 1], "ceil_mode": 1}),
    ("MaxPool", (1, 2, 9), {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),
    ("MaxPool", (1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2]}),
    ("AveragePool", (2, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (2, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", (1, 2, 10, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}),
    ("AveragePool", (1, 2, 10, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1,
                                    "count_include_pad": 1}),
    ("AveragePool", (1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("AveragePool", (1, 2, 9, 10), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
    ("AveragePool", (1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "pads": [1, 1, 0, 0, 1, 1]}),
]


@pytest.mark.parametrize("op_type, x_shape, attrs", POOL_CASES)
def test_pool_against_reference(op_type: str, x_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    check_against_reference(op_type, 19 if op_type == "AveragePool" else 12, [random(*x_shape)], **attrs)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_against_reference(storage_order: int) -> None:
    # Strides > 1 take onnx.reference through its index-computing implementation.
    check_against_reference("MaxPool", 12, [random(2, 3, 8, 7)], outputs=2, kernel_shape=[3, 2], strides=[2, 2],
                            pads=[1, 0, 1, 1], storage_order=storage_order)


def test_max_pool_indices_address_the_maximum() -> None:
    x = random(2, 3, 7, 6)
    node = make_node("MaxPool", [x], 2, kernel_shape=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1], dilations=[1, 2])
    y, indices = run_kernel(node, 22, [x])
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(x.reshape(-1)[indices], y)


def test_lrn_on_more_channels_than_batch() -> None:
    # onnx.reference's LRN loops over the batch instead of the channels; check the formula directly.
    x = random(1, 6, 3, 3)
    y = run_kernel(make_node("LRN", [x], size=3, alpha=0.1, beta=0.6, bias=2.0), 13, [x])[0]
    squares = np.pad(x**2, [(0, 0), (1, 1), (0, 0), (0, 0)])
    window_sums = squares[:, :-2] + squares[:, 1:-1] + squares[:, 2:]
    np.testing.assert_allclose(y, x / (2.0 + 0.1 / 3 * window_sums) ** 0.6, rtol=1e-5)


def test_batch_norm_v9_inference_ignores_momentum() -> None:
    # One output means inference, whatever `momentum` says (onnx.reference mixes in batch statistics).
    x, scale, bias, mean, var = random(2, 3, 4), random(3), random(3), random(3), np.abs(random(3)) + 0.5
    y = run_kernel(make_node("BatchNormalization", [x, scale, bias, mean, var], momentum=0.9), 9, [x, scale, bias, mean, var])[0]
    expected = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * scale[:, None] + bias[:, None]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- recurrent layers


def lstm_inputs(directions: int, batch_first: bool, hidden: int = 4, seq: int = 5, batch: int = 3, size: int = 2) -> list[np.ndarray]:
    x = random(batch, seq, size) if batch_first else random(seq, batch, size)
    state_shape = (batch, directions, hidden) if batch_first else (directions, batch, hidden)
    return [x, random(directions, 4 * hidden, size), random(directions, 4 * hidden, hidden), random(directions, 8 * hidden),
            None, random(*state_shape), random(*state_shape), random(directions, 3 * hidden)]


def gru_inputs(directions: int, batch_first: bool, hidden: int = 4, seq: int = 5, batch: int = 3, size: int = 2) -> list[np.ndarray]:
    x = random(batch, seq, size) if batch_first else random(seq, batch, size)
    state_shape = (batch, directions, hidden) if batch_first else (directions, batch, hidden)
    return [x, random(directions, 3 * hidden, size), random(directions, 3 * hidden, hidden), random(directions, 6 * hidden),
            None, random(*state_shape)]


RNN_OPTIONS = list(itertools.product(["forward", "reverse", "bidirectional"], [0, 1]))


@pytest.mark.parametrize("direction, layout", RNN_OPTIONS)
def test_lstm_against_reference(direction: str, layout: int) -> None:
    inputs = lstm_inputs(2 if direction == "bidirectional" else 1, bool(layout))
    check_against_reference("LSTM", 14, inputs, 3, hidden_size=4, direction=direction, layout=layout)


@pytest.mark.parametrize("direction, layout", RNN_OPTIONS)
@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_against_reference(direction: str, layout: int, linear_before_reset: int) -> None:
    inputs = gru_inputs(2 if direction == "bidirectional" else 1, bool(layout))
    check_against_reference("GRU", 14, inputs, 2, hidden_size=4, direction=direction, layout=layout,
                            linear_before_reset=linear_before_reset)


@pytest.mark.parametrize("op_type", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens_match_truncated_runs(op_type: str, direction: str) -> None:
    """A sequence shorter than the batch's longest gives what it gives alone, then zeros."""
    directions = 2 if direction == "bidirectional" else 1
    inputs = (lstm_inputs if op_type == "LSTM" else gru_inputs)(directions, batch_first=False)
    lengths = np.array([5, 2, 4], dtype=np.int32)
    inputs[4] = lengths
    node = make_node(op_type, inputs, 3 if op_type == "LSTM" else 2, hidden_size=4, direction=direction)
    y, *finals = run_kernel(node, 22, inputs)
    for b, length in enumerate(lengths):
        alone = [None if v is None else v for v in inputs]
        alone[0] = inputs[0][:length, b : b + 1]
        alone[4] = None
        alone[5:] = [None if v is None else (v[:, b : b + 1] if v.ndim == 3 else v) for v in inputs[5:]]
        y_alone, *finals_alone = run_kernel(node, 22, alone)
        np.testing.assert_allclose(y[:length, :, b : b + 1], y_alone, rtol=1e-5, atol=1e-6)
        assert not y[length:, :, b].any()
        for final, final_alone in zip(finals, finals_alone):
            np.testing.assert_allclose(final[:, b : b + 1], final_alone, rtol=1e-5, atol=1e-6)


def test_rnn_activation_parameters_are_consumed_in_order() -> None:
    x, w, r, b = random(3, 2, 2), random(2, 4, 2), random(2, 4, 4), random(2, 8)
    node = make_node("RNN", [x, w, r, b], 2, hidden_size=4, direction="bidirectional",
                     activations=["LeakyRelu", "ScaledTanh"], activation_alpha=[0.3, 2.0], activation_beta=[0.5])
    y, _ = run_kernel(node, 22, [x, w, r, b])
    functions = [lambda v: np.where(v >= 0, v, 0.3 * v), lambda v: 2.0 * np.tanh(0.5 * v)]
    for d, f in enumerate(functions):
        h = np.zeros((2, 4), dtype=np.float32)
        steps = range(3) if d == 0 else reversed(range(3))
        for t in steps:
            h = f(x[t] @ w[d].T + h @ r[d].T + b[d, :4] + b[d, 4:])
            np.testing.assert_allclose(y[t, d], h, rtol=1e-5, atol=1e-6)


def test_lstm_input_forget_and_clip() -> None:
    x, w, r = random(3, 1, 2) * 5, random(1, 8, 2), random(1, 8, 2)
    y = run_kernel(make_node("LSTM", [x, w, r], 1, hidden_size=2, input_forget=1, clip=0.5), 22, [x, w, r])[0]
    h = c = np.zeros((1, 2), dtype=np.float32)
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    for t in range(3):
        gates = np.clip(x[t] @ w[0].T + h @ r[0].T, -0.5, 0.5)
        i, o, _, g = np.split(gates, 4, axis=1)
        i = sigmoid(i)
        c = (1 - i) * c + i * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        np.testing.assert_allclose(y[t, 0], h, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- older opset versions

OLD_VERSION_CASES: dict[str, tuple[str, int, list[np.ndarray | None], int, dict[str, Any]]] = {
    "hardmax_11_last_axis": ("Hardmax", 11, [random(2, 3, 4)], 1, {"axis": 2}),
    "reduce_sum_11_attr_axes": ("ReduceSum", 11, [random(2, 3, 4)], 1, {"axes": [0, -1], "keepdims": 0}),
    "reduce_max_13_all_axes": ("ReduceMax", 13, [random(2, 3, 4)], 1, {}),
    "reduce_prod_18_noop": ("ReduceProd", 18, [random(2, 3), np.array([], dtype=np.int64)], 1, {"noop_with_empty_axes": 1}),
    "reduce_sum_square_18_noop": ("ReduceSumSquare", 18, [random(2, 3), None], 1, {"noop_with_empty_axes": 1}),
    "argmax_11_negative_axis": ("ArgMax", 11, [random(2, 3, 4)], 1, {"axis": -2, "keepdims": 0}),
    "slice_1_attrs": ("Slice", 1, [random(5, 6)], 1, {"starts": [1, -4], "ends": [100, -1], "axes": [0, 1]}),
    "slice_13_negative_steps": ("Slice", 13, [random(5, 6), np.array([-1, 4]), np.array([-100, 0]), np.array([0, 1]),
                                              np.array([-2, -3])], 1, {}),
    "split_2_attr": ("Split", 2, [random(6, 3)], 2, {"split": [2, 4]}),
    "split_18_uneven": ("Split", 18, [random(7, 3)], 3, {"num_outputs": 3}),
    "squeeze_11_attr": ("Squeeze", 11, [random(1, 3, 1, 2)], 1, {"axes": [-2]}),
    "unsqueeze_11_attr": ("Unsqueeze", 11, [random(3, 2)], 1, {"axes": [0, -1]}),
    "clip_6_attrs": ("Clip", 6, [random(3, 4)], 1, {"min": -0.5, "max": 0.5}),
    "gemm_7_no_trans": ("Gemm", 7, [random(3, 4), random(4, 5), random(1, 5)], 1, {"beta": 0.5}),
    "concat_4": ("Concat", 4, [random(2, 3), random(2, 1)], 1, {"axis": 1}),
    "reshape_5_zero_copies": ("Reshape", 5, [random(2, 3, 4), np.array([0, -1])], 1, {}),
    "flatten_9": ("Flatten", 9, [random(2, 3, 4)], 1, {"axis": 2}),
    "shape_15_start_end": ("Shape", 15, [random(2, 3, 4, 5)], 1, {"start": -3, "end": -1}),
    "tile_6": ("Tile", 6, [random(2, 3), np.array([2, 1])], 1, {}),
    "pow_int_base_float_exponent": ("Pow", 15, [np.array([1, 2, 3], dtype=np.int32), np.array([0.5, 2.0, 1.5], dtype=np.float32)], 1, {}),
    "dropout_7_inference": ("Dropout", 7, [random(3, 4)], 1, {"ratio": 0.3}),
    "max_pool_8": ("MaxPool", 8, [random(1, 2, 6, 6)], 1, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "cast_to_bfloat16": ("Cast", 19, [random(3, 4)], 1, {"to": onnx.TensorProto.BFLOAT16}),
    "cast_to_float8": ("Cast", 19, [random(3, 4)], 1, {"to": onnx.TensorProto.FLOAT8E4M3FN}),
}


@pytest.mark.parametrize("case", sorted(OLD_VERSION_CASES))
def test_versions_against_reference(case: str) -> None:
    op_type, opset, inputs, outputs, attrs = OLD_VERSION_CASES[case]
    check_against_reference(op_type, opset, inputs, outputs, **attrs)


@pytest.mark.parametrize("opset", [1, 11])
def test_softmax_before_13_normalizes_the_flattened_2d_rows(opset: int) -> None:
    # onnx.reference applies the opset-13 per-axis semantics to every version.
    x = random(2, 3, 4)
    rows = x.reshape(2, 12)
    softmax = np.exp(rows) / np.exp(rows).sum(axis=1, keepdims=True)
    y = run_kernel(make_node("Softmax", [x]), opset, [x])[0]  # default axis 1
    np.testing.assert_allclose(y, softmax.reshape(2, 3, 4), rtol=1e-5)
    y = run_kernel(make_node("LogSoftmax", [x]), opset, [x])[0]
    np.testing.assert_allclose(y, np.log(softmax).reshape(2, 3, 4), rtol=1e-5, atol=1e-6)
    hard = run_kernel(make_node("Hardmax", [x], axis=0), opset, [x])[0]
    np.testing.assert_array_equal(hard.reshape(-1), np.eye(24, dtype=np.float32)[np.argmax(x)])


def test_legacy_broadcast_with_axis() -> None:
    a, b = random(2, 3, 4, 5), random(3, 4)
    y = run_kernel(make_node("Add", [a, b], broadcast=1, axis=1), 6, [a, b])[0]
    np.testing.assert_allclose(y, a + b[None, :, :, None])


def test_integer_division_truncates_toward_zero() -> None:
    a, b = np.array([-7, 7, -7, 7, 6], dtype=np.int32), np.array([2, -2, -2, 2, -3], dtype=np.int32)
    y = run_kernel(make_node("Div", [a, b]), 14, [a, b])[0]
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [-3, -3, 3, 3, -2])


def test_reductions_over_an_empty_set() -> None:
    x = np.zeros((2, 0, 3), dtype=np.float32)
    axes = np.array([1])
    expected = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceSum": 0, "ReduceProd": 1, "ReduceLogSumExp": -np.inf}
    for op_type, value in expected.items():
        y = run_kernel(make_node(op_type, [x, axes]), 18, [x, axes])[0]
        assert y.shape == (2, 1, 3) and y.dtype == np.float32
        np.testing.assert_array_equal(y, np.full((2, 1, 3), value, dtype=np.float32))
    ints = np.zeros((2, 0), dtype=np.int32)
    y = run_kernel(make_node("ReduceMax", [ints, axes], keepdims=0), 20, [ints, axes])[0]
    np.testing.assert_array_equal(y, np.full(2, np.iinfo(np.int32).min, dtype=np.int32))


def test_sigmoid_and_softplus_do_not_overflow() -> None:
    x = np.array([-1000.0, -20.0, 0.0, 20.0, 1000.0], dtype=np.float32)
    with np.errstate(all="raise"):
        sig = run_kernel(make_node("Sigmoid", [x]), 13, [x])[0]
        soft = run_kernel(make_node("Softplus", [x]), 22, [x])[0]
    np.testing.assert_allclose(sig, [0.0, 2.0611537e-09, 0.5, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(soft, [0.0, 2.0611537e-09, np.log(2), 20.0, 1000.0], rtol=1e-6)


def test_erf_is_exact_in_float64() -> None:
    x = np.linspace(-5, 5, 101)
    y = run_kernel(make_node("Erf", [x]), 13, [x])[0]
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, [math.erf(v) for v in x])


def test_constant_attributes() -> None:
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0, 7.0], dtype=np.float32)), numpy_helper.from_array(np.array([1, 4])), [2, 3])
    cases: list[tuple[dict[str, Any], np.ndarray]] = [
        ({"sparse_value": sparse}, np.array([[0, 5, 0], [0, 7, 0]], dtype=np.float32)),
        ({"value_floats": [1.0, 2.5]}, np.array([1.0, 2.5], dtype=np.float32)),
        ({"value_int": 3}, np.array(3, dtype=np.int64)),
        ({"value": np.arange(4, dtype=np.int8)}, np.arange(4, dtype=np.int8)),
    ]
    for attrs, expected in cases:
        y = kernel_for("Constant", 13)(NodeContext(attrs, 1), )
        assert y.dtype == expected.dtype and y.shape == expected.shape
        np.testing.assert_array_equal(y, expected)


def test_kernels_do_not_write_into_their_inputs() -> None:
    inputs = [random(2, 4, 6, 6), random(4, 2, 3, 3), random(4)]
    copies = [v.copy() for v in inputs]
    run_kernel(make_node("Conv", inputs, group=2, pads=[1, 1, 1, 1]), 22, inputs)
    run_kernel(make_node("BatchNormalization", [inputs[0], inputs[2], inputs[2], inputs[2], np.abs(inputs[2])]), 15,
               [inputs[0], inputs[2], inputs[2], inputs[2], np.abs(inputs[2])])
    run_kernel(make_node("MaxPool", [inputs[0]], 2, kernel_shape=[2, 2]), 22, [inputs[0]])
    for value, copy in zip(inputs, copies):
        np.testing.assert_array_equal(value, copy)


# --------------------------------------------------------------------------- whole CNNs

LIGHT_MODELS = ["squeezenet", "inception_v1", "resnet50", "shufflenet", "densenet121"]


def _random_weights(shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    if len(shape) <= 1:  # biases and batch-norm parameters (a variance must be positive)
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)


def _randomized_light_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The stored light model with random weights instead of its constant ones (whose outputs
    are a uniform softmax), and the logits as an extra output."""
    path = f"{onnx.__path__[0]}/backend/test/data/light/light_{name}.onnx"
    model = onnx.load(path)
    rng = np.random.default_rng(0)
    shapes = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    kept = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape":
            weights = _random_weights(tuple(shapes[node.input[0]]), rng)
            model.graph.initializer.append(numpy_helper.from_array(weights, node.output[0]))
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    for node in kept:
        if node.op_type == "Softmax":
            model.graph.output.append(helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, None))
    feeds = {value.name: _random_weights([d.dim_value for d in value.type.tensor_type.shape.dim], rng)
             for value in model.graph.input if value.name not in shapes}
    return model, feeds


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_cnn_matches_onnxruntime(name: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    model, feeds = _randomized_light_model(name)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the unused shape initializers are warned about
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    env = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer} | feeds
    opset = opset_of(model, "")
    for node in model.graph.node:
        env.update(zip(node.output, run_kernel(node, opset, [env[n] if n else None for n in node.input])))
    actual = [env[value.name] for value in model.graph.output]
    assert_same(actual, expected, rtol=1e-3, atol=1e-5)
