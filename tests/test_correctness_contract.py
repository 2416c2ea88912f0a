"""Regression tests of the correctness contract: each case once gave a wrong result batched, or
batched and alone disagreed, or a result was broadcast into a slot sized by a declaration."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from autobatch import InferenceSession
from autobatch.backends import FeedError, Interpreter
from autobatch.ir import OnnxImportError, from_onnx
from tests.oracle import assert_batched_equals_alone

BACKENDS = ["numpy", "onnxruntime"]


def parse(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_op_without_a_rule_reads_every_row_of_a_ragged_value(backend):
    """Relu batches instances of 1 and 2 rows as one block; TopK (no rule) ran on one row of it:
    NumPy gave [[9, 8], [9, 8]] for the second instance, onnxruntime 'Invalid rank'."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 3] x) => (float[N, 2] v, int64[N, 2] i) <int64[1] k = {2}> {
            r = Relu(x)
            v, i = TopK<axis = 1>(r, k)
        }""")
    session = InferenceSession(model, backend=backend)
    instances = [{"x": np.array([[9, 8, 1]], np.float32)},
                 {"x": np.array([[9, 8, 7], [6, 4, 1]], np.float32)},
                 {"x": np.array([[1, 2, 3], [6, 5, 4], [0, 0, 7]], np.float32)}]
    batched = assert_batched_equals_alone(session, instances)
    np.testing.assert_array_equal(batched[1][0], [[9, 8], [6, 4]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_declared_output_shape_does_not_size_the_result(backend):
    """NonZero declared int64[1, 2]: alone [[2]], batched it came back as [[2, 2]]."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[3] x) => (int64[1, 2] y) { y = NonZero(x) }""")
    session = InferenceSession(model, backend=backend)
    batched = assert_batched_equals_alone(session, [{"x": np.array([0, 0, 1], np.float32)},
                                                    {"x": np.array([1, 0, 1], np.float32)}])
    assert batched[0][0].tolist() == [[2]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_value_info_that_lies_about_rows_is_ignored(backend):
    """The model says [5, 3] but computes [N, 3]: it came back as 5 rows."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 3] x) => (float[5, 3] y) <float[5, 3] h> { h = Relu(x)  y = Neg(h) }""")
    model.graph.value_info.extend([onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, [5, 3])])
    del model.graph.initializer[:]
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(0)
    instances = [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (2, 4, 2)]
    batched = assert_batched_equals_alone(session, instances)
    assert [b[0].shape for b in batched] == [(2, 3), (4, 3), (2, 3)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resize_by_scales_of_each_instance(backend):
    """Every Resize with scales crashed batched: 'could not broadcast' into the declared shape."""
    model = parse("""<ir_version: 8, opset_import: ["" : 19]>
        g (float[1, 1, 2, 2] x, float[4] scales) => (float[1, 1, 4, 4] y) {
            y = Resize<mode = "nearest">(x, , scales)
        }""")
    session = InferenceSession(model, backend=backend)
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    instances = [{"x": x, "scales": np.array(s, np.float32)} for s in ([1, 1, 2, 2], [1, 1, 1.5, 3], [1, 1, 2, 2])]
    batched = assert_batched_equals_alone(session, instances)
    assert batched[1][0].shape == (1, 1, 3, 6)


def test_a_result_that_does_not_fit_its_slot_raises():
    """The executor never broadcasts a result into the rows planned for it."""
    from autobatch.backends.flat_executor import SlotMismatch, _fits
    from autobatch.batcher.plan import Step

    with pytest.raises(SlotMismatch, match=r"float32\[1, 1\] where the plan has room for float32\[1, 2\]"):
        _fits(np.zeros((1, 1), np.float32), (1, 2), np.dtype(np.float32), Step(None, 1, [], [], []))


LOOP_WITHOUT_CONDITION = """<ir_version: 8, opset_import: ["" : 17]>
    g (int64 m, float[2] x) => (float[2] y, float[N, 2] scanned) {
        y, scanned = Loop(m, , x) <body = step (int64 i, bool c, float[2] h) => (bool c_out, float[2] h2, float[2] s) {
            c_out = Identity(c)
            h2 = Add(h, h)
            s = Identity(h)
        }>
    }"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_without_a_condition_runs_its_trip_count(backend):
    """Loop(M, "") is a for loop: onnx.reference ran it 0 times alone, batched ran 5."""
    session = InferenceSession(parse(LOOP_WITHOUT_CONDITION), backend=backend)
    instances = [{"m": np.array(m, np.int64), "x": np.array([1, -1], np.float32)} for m in (5, 2)]
    batched = assert_batched_equals_alone(session, instances)
    np.testing.assert_array_equal(batched[0][0], [32, -32])
    assert batched[0][1].shape == (5, 2)


def test_the_interpreter_runs_loops_as_the_spec_says():
    graph = from_onnx(parse(LOOP_WITHOUT_CONDITION))
    y, scanned = Interpreter(graph).run({"m": np.array(3, np.int64), "x": np.array([1, 2], np.float32)})
    np.testing.assert_array_equal(y, [8, 16])
    np.testing.assert_array_equal(scanned, [[1, 2], [2, 4], [4, 8]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_castlike_of_a_shared_value_keeps_the_batch_axis(backend):
    """CastLike(shared constant, per-instance value) lost the batch axis (18 node cases)."""
    model = parse("""<ir_version: 8, opset_import: ["" : 19]>
        g (float[4] x) => (float[4] y) <double[4] alpha = {1.5, -2, 0.25, 3}> {
            a = CastLike(alpha, x)
            y = Mul(a, x)
        }""")
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(1)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal(4).astype(np.float32)} for _ in range(3)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_if_with_a_sequence_output_batches(backend):
    """An If whose branches give sequences was stacked with Reshape, as if a tensor."""
    model = parse("""<ir_version: 8, opset_import: ["" : 13]>
        g (bool c, float[3] x) => (seq(float[3]) out) {
            out = If(c) <then_branch = t () => (seq(float[3]) a) { a = SequenceConstruct(x) },
                         else_branch = e () => (seq(float[3]) b) { n = Neg(x)  b = SequenceConstruct(n, x) }>
        }""")
    session = InferenceSession(model, backend=backend)
    x = np.array([1, 2, 3], np.float32)
    batched = assert_batched_equals_alone(session, [{"c": np.array(flag), "x": x} for flag in (True, False, True)])
    assert len(batched[1][0]) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequences_and_optionals_as_inputs(backend):
    model = parse("""<ir_version: 8, opset_import: ["" : 18]>
        g (seq(float[N]) s) => (float[M] y, bool has) {
            y = ConcatFromSequence<axis = 0>(s)
            o = Optional(y)
            has = OptionalHasElement(o)
        }""")
    session = InferenceSession(model, backend=backend)
    instances = [{"s": [np.ones(2, np.float32), np.zeros(3, np.float32)]}, {"s": [np.arange(4, dtype=np.float32)]}]
    batched = assert_batched_equals_alone(session, instances)
    assert batched[0][0].shape == (5,) and bool(batched[1][1])


def test_types_of_sequences_and_optionals_print():
    graph = from_onnx(parse("""<ir_version: 8, opset_import: ["" : 18]>
        g (seq(float[N]) s) => (optional(seq(float[N])) o) { o = Optional(s) }"""))
    assert "seq(FLOAT[N])" in str(graph) and "optional(seq(FLOAT[N]))" in str(graph)


def test_an_opset_newer_than_onnx_is_refused():
    model = parse("""<ir_version: 8, opset_import: ["" : 17]>  g (float[2] x) => (float[2] y) { y = Relu(x) }""")
    model.opset_import[0].version = 999
    with pytest.raises(OnnxImportError, match="opset 999 of domain 'ai.onnx' is not one this onnx"):
        InferenceSession(model)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ArgMax", "ArgMin"])
def test_max_and_min_over_nan_agree_batched_alone_and_across_backends(op):
    """onnxruntime's kernels skip or keep a NaN by the shape and memory alignment of their input
    (ReduceMin over NaN disagreed batched and alone); ours let a NaN win, as NumPy does."""
    call = f"{op}<keepdims = 0>(x, axes)" if op.startswith("Reduce") else f"{op}<axis = 1, keepdims = 0>(x)"
    out = "float[N] y" if op.startswith("Reduce") else "int64[N] y"
    model = parse(f"""<ir_version: 8, opset_import: ["" : 18]>
        g (float[N, 37] x) => ({out}) <int64[1] axes = {{1}}> {{ y = {call} }}""")
    rng = np.random.default_rng(0)
    instances = []
    for _ in range(12):
        x = rng.standard_normal((3, 37)).astype(np.float32)
        x[rng.random(x.shape) < 0.1] = np.nan
        instances.append({"x": x})
    expected = {"ReduceMax": np.max, "ReduceMin": np.min, "ArgMax": np.argmax, "ArgMin": np.argmin}[op]
    for backend in BACKENDS:
        session = InferenceSession(model, backend=backend)
        batched = assert_batched_equals_alone(session, instances)
        for instance, outputs in zip(instances, batched):
            np.testing.assert_array_equal(outputs[0], expected(instance["x"], axis=1))
        buffer = np.empty(3 * 37 + 3, np.float32)[3:].reshape(3, 37)  # another alignment in memory
        buffer[...] = instances[0]["x"]
        np.testing.assert_array_equal(session.run(None, {"x": buffer})[0], expected(buffer, axis=1))


def test_recurrent_layers_over_nothing_do_not_abort_onnxruntime():
    """An LSTM over no sequences or a GRU over no steps aborted the process (SIGABRT) through
    ``run`` (and a template or segment); they run on the NumPy interpreter instead."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "tests" / "scripts" / "empty_recurrent_layers.py")],
                          capture_output=True, text=True, cwd=root, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_an_lstm_that_may_get_no_steps_leaves_the_rest_to_onnxruntime():
    """Fuzzer seed 5220: with an LSTM that might get no steps, ``run`` took the whole instance to
    the NumPy interpreter, whose ReduceMean over no rows is NaN, while a batch ran the mean on
    onnxruntime (0): alone and batched disagreed. Only the layer leaves onnxruntime now."""
    rng = np.random.default_rng(0)
    weights = {name: onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in {"W": (1, 12, 4), "R": (1, 12, 3)}.items()}
    model = parse("""<ir_version: 7, opset_import: ["" : 12]> g (float[N, 4] x) => (float[1, 4] m, float[N, 3] h) {
        m = ReduceMean<axes = [0], keepdims = 1>(x)
        seq = Unsqueeze<axes = [1]>(x)
        y = LSTM<hidden_size = 3>(seq, W, R)
        h = Squeeze<axes = [1, 2]>(y) }""")
    model.graph.initializer.extend(weights.values())
    session = InferenceSession(model, backend="onnxruntime")
    instances = [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (0, 2, 3)]
    batched = assert_batched_equals_alone(session, instances)
    np.testing.assert_array_equal(batched[0][0], np.zeros((1, 4), np.float32))  # onnxruntime's mean of no rows


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_normalizing_over_an_empty_axis_gives_an_empty_result(backend, op):
    """NumPy's Softmax over an axis of length 0 raised (the max of no values)."""
    model = parse(f"""<ir_version: 8, opset_import: ["" : 17]> g (float[A, B] x) => (float[A, B] y) {{ y = {op}<axis = 1>(x) }}""")
    session = InferenceSession(model, backend=backend)
    instances = [{"x": np.zeros((2, 0), np.float32)}, {"x": np.zeros((0, 3), np.float32)}, {"x": np.ones((2, 3), np.float32)}]
    batched = assert_batched_equals_alone(session, instances)
    assert batched[0][0].shape == (2, 0)


def test_argmax_over_an_empty_axis_is_a_clear_error():
    model = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[A, B] x) => (int64[A] y) { y = ArgMax<axis = 1, keepdims = 0>(x) }""")
    with pytest.raises(Exception, match="ArgMax over axis 1 of length 0: there is no index to give"):
        InferenceSession(model).run(None, {"x": np.zeros((2, 0), np.float32)})


def test_a_scan_of_no_iterations_puts_its_zero_on_the_output_axis():
    """Scan over 0 steps with scan_output_axes=[1] gave (0, 2) where the spec gives (2, 0)."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2] init, float[T, 2] xs) => (float[2] last, float[2, T] ys) {
            last, ys = Scan<num_scan_inputs = 1, scan_output_axes = [1],
                body = b (float[2] h, float[2] x) => (float[2] h2, float[2] y) { h2 = Add(h, x)  y = Identity(h2) }>(init, xs)
        }""")
    graph = from_onnx(model)
    last, ys = Interpreter(graph).run({"init": np.ones(2, np.float32), "xs": np.zeros((0, 2), np.float32)})
    assert ys.shape == (2, 0) and last.tolist() == [1, 1]
    last, ys = Interpreter(graph).run({"init": np.ones(2, np.float32), "xs": np.ones((3, 2), np.float32)})
    np.testing.assert_array_equal(ys, [[2, 3, 4], [2, 3, 4]])


def test_scan_8_with_rows_of_no_steps_and_with_no_rows():
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Scan", ["lengths", "init", "xs"], ["last", "ys"], num_scan_inputs=1,
                               body=onnx.helper.make_graph(
                                   [onnx.helper.make_node("Add", ["h", "x"], ["h2"]),
                                    onnx.helper.make_node("Identity", ["h2"], ["y"])], "b",
                                   [onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, [2]),
                                    onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                                   [onnx.helper.make_tensor_value_info("h2", onnx.TensorProto.FLOAT, [2]),
                                    onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])]))], "g",
        [onnx.helper.make_tensor_value_info("lengths", onnx.TensorProto.INT32, ["B"]),
         onnx.helper.make_tensor_value_info("init", onnx.TensorProto.FLOAT, ["B", 2]),
         onnx.helper.make_tensor_value_info("xs", onnx.TensorProto.FLOAT, ["B", "T", 2])],
        [onnx.helper.make_tensor_value_info("last", onnx.TensorProto.FLOAT, ["B", 2]),
         onnx.helper.make_tensor_value_info("ys", onnx.TensorProto.FLOAT, ["B", "T", 2])]),
        opset_imports=[onnx.helper.make_opsetid("", 8)], ir_version=4)
    run = Interpreter(from_onnx(model)).run
    last, ys = run({"lengths": np.array([0, 2], np.int32), "init": np.ones((2, 2), np.float32),
                    "xs": np.ones((2, 3, 2), np.float32)})
    np.testing.assert_array_equal(last, [[1, 1], [3, 3]])
    np.testing.assert_array_equal(ys, [np.zeros((3, 2)), [[2, 2], [3, 3], [0, 0]]])
    last, ys = run({"lengths": np.array([0], np.int32), "init": np.ones((1, 2), np.float32),
                    "xs": np.ones((1, 3, 2), np.float32)})
    assert ys.shape == (1, 3, 2) and not ys.any()
    last, ys = run({"lengths": np.zeros(0, np.int32), "init": np.zeros((0, 2), np.float32),
                    "xs": np.zeros((0, 3, 2), np.float32)})
    assert last.shape == (0, 2) and ys.shape == (0, 3, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_deadline_stops_a_loop_while_it_runs(backend):
    """The deadline inside a Loop's iterations came out as a NodeExecutionError, so a batch past
    its deadline was re-run instance by instance."""
    from autobatch.ir.limits import DeadlineExceeded, deadline

    session = InferenceSession(parse(LOOP_WITHOUT_CONDITION), backend=backend, max_unrolled_nodes=10**9)
    feeds = {"m": np.array(10**8, np.int64), "x": np.array([1, -1], np.float32)}
    session._control_flow = False  # as if unrolling could not bound it: the Loop itself must stop
    with pytest.raises(DeadlineExceeded), deadline(0.3):
        session.run(None, feeds)


def test_a_loop_counts_its_nodes_against_max_unrolled_nodes():
    session = InferenceSession(parse(LOOP_WITHOUT_CONDITION), max_unrolled_nodes=1_000)
    np.testing.assert_array_equal(session.run(None, {"m": np.array(100, np.int64), "x": np.ones(2, np.float32)})[0],
                                  np.full(2, 2.0**100, np.float32))
    with pytest.raises(FeedError, match="would run more than 1000 nodes"):
        session.run(None, {"m": np.array(10**6, np.int64), "x": np.ones(2, np.float32)})


def test_the_report_says_why_each_node_ran_alone():
    model = parse("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 3] x) => (float[2, 2] v, float[2, 3] y, float[2, 3] z) <int64[1] k = {2}> {
            v, i = TopK<axis = 1>(x, k)
            y = Relu(x)
            z = RandomUniformLike(x)
        }""")
    session = InferenceSession(model, alone_when_faster=False)
    session.run_batch(None, [{"x": np.ones((2, 3), np.float32)}] * 3)
    alone = session.stats.report.alone
    assert alone == {"TopK: no batching rule for TopK": 3, "RandomUniformLike: draws random numbers anew each run": 3}
    assert session.stats.report.fallback_nodes == 6
    assert "3 x TopK: no batching rule for TopK" in str(session.stats.report)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_value_folded_from_a_shape_is_keyed_by_its_value(backend):
    """``c`` is folded into a constant of each input signature's graph: the same name with
    another value in each. A plan of one mix taught later plans its first value (fuzzer seeds
    1000032 and 1000098: a template fed a [1, 8] constant where it declared [3, 8])."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[N, 4] x) => (float[N, 4] y) {
        s = Shape(x)
        c = ConstantOfShape<value = float[1] {2.0}>(s)
        y = Add(c, c) }""")  # an output stays computed: an Add of two constants, run once
    session = InferenceSession(model, backend=backend, alone_when_faster=False)  # four batches: each batched
    rng = np.random.default_rng(0)
    for lengths in ([3, 3], [1, 1], [3, 1], [2, 2, 2]):
        assert_batched_equals_alone(session, [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in lengths])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_constant_concatenated_to_stacked_rows(backend):
    """Fuzzer seed 4540: a Concat of a [0, 4] constant and each instance's row lifted the constant
    by Reshape to [1, 0, 4], whose 0 reads as "keep that dimension": [1, 4, 4], and the batch raised."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[N, 4] x) => (float[M, 4] y) <float[0, 4] e> {
        r = ReduceMax<axes = [0], keepdims = 1>(x)
        y = Concat<axis = 0>(e, r) }""")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((0, 4), np.float32), "e"))
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(0)
    batched = assert_batched_equals_alone(session, [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (2, 3, 1)])
    assert batched[0][0].shape == (1, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_own_constants_of_the_same_bytes_in_other_shapes_stay_apart(backend):
    """Review of the value-named own constants: a [2, 3] and a [3, 2] of ones folded from the
    shapes hold the same bytes; named by their bytes alone they shared one name, and the batch
    added a [3, 2] to a [2, 3]."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]> g (float[A, B] x) => (float[A, B] y) {
        s = Shape(x)
        z = ConstantOfShape<value = float[1] {1.0}>(s)
        y = Add(x, z) }""")
    session = InferenceSession(model, backend=backend)
    assert_batched_equals_alone(session, [{"x": np.arange(6, dtype=np.float32).reshape(shape)}
                                          for shape in ((2, 3), (3, 2), (1, 6))])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masked", [float(np.finfo(np.float32).min), float("-inf")])
def test_a_softmax_row_masked_whole_keeps_its_value_padded(backend, masked):
    """Review of padded attention: a row of scores all masked (the lowest float, as Hugging Face
    masks write it, or -inf) is uniform (or NaN) alone; padded with half the lowest float, the
    padding took its weight. Padded with -inf along the Softmax's axis it keeps its value."""
    model = parse("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x, bool[1, L, L] m) => (float[1, L, L] p) <float[4, 4] w, float low> {
        q = MatMul(x, w)
        k = Transpose<perm = [0, 2, 1]>(q)
        s = MatMul(q, k)
        t = Where(m, s, low)
        p = Softmax<axis = -1>(t) }""")
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w"),
                                    onnx.numpy_helper.from_array(np.array(masked, np.float32), "low")])
    session = InferenceSession(model, backend=backend)
    instances = []
    for n in (2, 3, 5, 5):
        mask = np.ones((1, n, n), bool)
        mask[0, 0, :] = False
        instances.append({"x": rng.standard_normal((1, n, 4)).astype(np.float32), "m": mask})
    with np.errstate(invalid="ignore"):  # a row of -inf alone is NaN, batched too
        assert_batched_equals_alone(session, instances)
    assert session.stats.report.launches_by_op["Softmax"] == 1  # padded: one launch for the 3 lengths


@pytest.mark.parametrize("backend", BACKENDS)
def test_nodes_of_one_signature_that_want_different_optional_outputs(backend):
    """Two RNNs of one signature, the first wanting only Y_h, the second Y too: a class's
    template made from its first record had no Y, and the batch raised KeyError 'i0/Y'."""
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 14]>
        g (float[T, 1, 2] x) => (float[1, 1, 3] h, float[T, 1, 1, 3] y, float[1, 1, 3] h2) {
            _, h = RNN<hidden_size = 3>(x, W, R)
            x2 = Tanh(x)
            y, h2 = RNN<hidden_size = 3>(x2, W, R)
        }""")
    model.graph.initializer.extend([onnx.numpy_helper.from_array(rng.standard_normal((1, 3, 2)).astype(np.float32), "W"),
                                    onnx.numpy_helper.from_array(rng.standard_normal((1, 3, 3)).astype(np.float32), "R")])
    session = InferenceSession(model, backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((t, 1, 2)).astype(np.float32)} for t in (2, 2, 3)])
