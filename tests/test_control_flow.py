"""ONNX control flow unrolled per instance (frontends.onnx_control_flow), then batched.

Every check compares against onnxruntime on the ORIGINAL model for that instance.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime
import pytest

from autobatch.backends import Interpreter, evaluate
from autobatch.batcher import BatchReport
from autobatch.examples.loop_rnn import rnn_text
from autobatch.frontends.onnx_control_flow import unroll_instance
from autobatch.ir import Graph, from_onnx, to_onnx
from autobatch.ir.onnx_io import choose_ir_version
from autobatch.session import InferenceSession

D, H = 3, 4
RNG = np.random.default_rng(0)
W = RNG.standard_normal((D, H)).astype(np.float32) * 0.5
U = RNG.standard_normal((H, H)).astype(np.float32) * 0.5


def parse(text: str, **initializers: np.ndarray) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(a, n) for n, a in initializers.items())
    model.ir_version = choose_ir_version(model, None)
    onnx.checker.check_model(model, full_check=True)
    return model


def onnxruntime_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def ops_left(graph: Graph) -> set[str]:
    return {node.op_type for node in graph.nodes.values()}


def check_alone(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], interpreter: bool = True,
                **options) -> Graph:
    """Unroll for these feeds; the result alone, run by onnxruntime (as exported ONNX) and by the
    NumPy interpreter, must equal onnxruntime on the original."""
    unrolled = unroll_instance(from_onnx(model), feeds, evaluate, **options)
    want = onnxruntime_outputs(model, feeds)
    runs = [onnxruntime_outputs(to_onnx(unrolled), feeds)] + ([Interpreter(unrolled).run(feeds)] if interpreter else [])
    for got in runs:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return unrolled


def run_batched(model: onnx.ModelProto, instances: list[dict[str, np.ndarray]]) -> BatchReport:
    """Batch the instances (each unrolled for its values by the session); check every instance
    against onnxruntime on the original model; the batch's report."""
    session = InferenceSession(model, alone_when_faster=False)
    for inst, outputs in zip(instances, session.run_batch(None, instances), strict=True):
        for got, want in zip(outputs, onnxruntime_outputs(model, inst), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return session.stats.report


# An RNN as a Loop over the sequence length (the example's model, small).
RNN = rnn_text(D, H)
RNN_OPS_PER_STEP = 7  # Gather, MatMul, MatMul, Add, Tanh, Identity, Identity


def rnn_instance(length: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((length, D)).astype(np.float32),
            "h0": RNG.standard_normal(H).astype(np.float32)}


def test_loop_rnn_batched_over_lengths_equals_each_alone_with_fewer_launches():
    model = parse(RNN, W=W, U=U)
    lengths = [3, 1, 7, 5, 2]
    report = run_batched(model, [rnn_instance(t) for t in lengths])
    unbatched = sum(lengths) * RNN_OPS_PER_STEP
    print(f"\nLoop RNN, lengths {lengths}: {report.launches} launches, lower bound "
          f"{report.lower_bound}, instances x steps x ops = {unbatched}")
    assert report.launches < unbatched
    assert "Loop" not in report.launches_by_op and report.fallback_nodes == 0


def test_loop_unrolled_into_plain_ops_with_static_shapes():
    unrolled = check_alone(parse(RNN, W=W, U=U), rnn_instance(4))
    assert not ops_left(unrolled) & {"Loop", "If", "Scan"}
    assert sum(node.op_type == "Tanh" for node in unrolled.nodes.values()) == 4
    assert all(unrolled.values[o].type is not None and unrolled.values[o].type.is_static
               for node in unrolled.nodes.values() for o in node.outputs if o)


IF_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
choose (float[N] x, float[N] y) => (float[N] z) {
    s = ReduceSum <keepdims = 0> (x)
    zero = Constant <value = float {0}> ()
    positive = Greater (s, zero)
    twice = Add (x, x)
    z = If (positive) <
        then_branch = then_g () => (float[N] t) { t = Mul (twice, y) },
        else_branch = else_g () => (float[N] e) { m = Neg (y)  e = Sub (m, x) }
    >
}
"""


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_resolved_from_the_inputs_both_branches(sign: float):
    feeds = {"x": sign * np.abs(RNG.standard_normal(5)).astype(np.float32) + sign * 0.1,
             "y": RNG.standard_normal(5).astype(np.float32)}
    unrolled = check_alone(parse(IF_MODEL), feeds)
    assert "If" not in ops_left(unrolled)
    assert ("Mul" in ops_left(unrolled)) == (sign > 0) and ("Neg" in ops_left(unrolled)) == (sign < 0)


SCAN_MODEL = """
<ir_version: 8, opset_import: ["" : 16]>
cumulative (float[T, 2] x, float[2] s0) => (float[2] s_last, float[T, 2] sums) {
    s_last, sums = Scan <num_scan_inputs = 1, scan_input_directions = [DIR], scan_output_directions = [DIR],
                         body = acc (float[2] s, float[2] x_t) => (float[2] s_new, float[2] out) {
        s_new = Add (s, x_t)
        out = Mul (s_new, x_t)
    }> (s0, x)
}
"""


@pytest.mark.parametrize("direction", [0, 1])
def test_scan_unrolled_forward_and_reverse(direction: int):
    model = parse(SCAN_MODEL.replace("DIR", str(direction)))
    instances = [{"x": RNG.standard_normal((t, 2)).astype(np.float32), "s0": RNG.standard_normal(2).astype(np.float32)}
                 for t in (4, 2, 5)]
    unrolled = check_alone(model, instances[0])
    assert "Scan" not in ops_left(unrolled)
    run_batched(model, instances)


# Runs while the running sum of squares stays under a threshold: the body decides from data.
UNTIL_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
until (float[N] x, float limit) => (float total, int64 steps, float[K] partial) {
    start = Constant <value = float {0}> ()
    n0 = Constant <value = int64 {0}> ()
    go = Constant <value = bool {1}> ()
    total, steps, partial = Loop ("", go, start, n0) <body = b (int64 i, bool c, float acc, int64 n) => (bool more, float acc2, int64 n2, float p) {
        sq = Mul (x, x)
        ssum = ReduceSum <keepdims = 0> (sq)
        fi = Cast <to = 1> (i)
        scaled = Mul (ssum, fi)
        acc2 = Add (acc, scaled)
        one = Constant <value = int64 {1}> ()
        n2 = Add (n, one)
        more = Less (acc2, limit)
        p = Identity (acc2)
    }>
}
"""


def test_loop_ending_on_data_computed_in_the_body():
    model = parse(UNTIL_MODEL)
    instances = [{"x": RNG.standard_normal(4).astype(np.float32), "limit": np.array(limit, np.float32)}
                 for limit in (0.5, 10.0, 40.0)]
    steps = []
    for feeds in instances:
        unrolled = check_alone(model, feeds)
        assert "Loop" not in ops_left(unrolled)
        steps.append(int(Interpreter(unrolled).run(feeds)[1]))
    assert len(set(steps)) > 1, steps  # different trip counts per instance
    run_batched(model, instances)


def test_unresolved_control_flow_stays_opaque_and_correct():
    model = parse(RNN, W=W, U=U)
    instances = [rnn_instance(t) for t in (2, 5)]
    for instance in instances:  # x, read inside the body, goes in as state
        unrolled = check_alone(model, instance, resolve=False)
        assert "Loop" in ops_left(unrolled)


def test_node_budget_error_names_the_loop():
    with pytest.raises(ValueError, match=r"Loop 'h_last'.*max_unrolled_nodes=20"):
        unroll_instance(from_onnx(parse(RNN, W=W, U=U)), rnn_instance(10), evaluate, max_unrolled_nodes=20)


# A Loop whose body holds an If on the iteration number: even steps add x_t, odd steps subtract it.
NESTED_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
nested (float[T, 2] x) => (float[2] total) {
    shape = Shape <start = 0, end = 1> (x)
    trip = Squeeze (shape)
    zero = Constant <value = float[2] {0, 0}> ()
    total = Loop (trip, "", zero) <body = b (int64 i, bool c, float[2] acc) => (bool c2, float[2] acc2) {
        x_t = Gather <axis = 0> (x, i)
        two = Constant <value = int64 {2}> ()
        r = Mod (i, two)
        zero_i = Constant <value = int64 {0}> ()
        even = Equal (r, zero_i)
        acc2 = If (even) <
            then_branch = t () => (float[2] a) { a = Add (acc, x_t) },
            else_branch = e () => (float[2] s) { s = Sub (acc, x_t) }
        >
        c2 = Identity (c)
    }>
}
"""


def test_nested_if_inside_loop():
    model = parse(NESTED_MODEL)
    instances = [{"x": RNG.standard_normal((t, 2)).astype(np.float32)} for t in (1, 4, 3)]
    unrolled = check_alone(model, instances[1])
    assert not ops_left(unrolled) & {"Loop", "If"}
    run_batched(model, instances)
    # onnx.reference (so the interpreter) gets an If inside a Loop body wrong: onnxruntime only.
    opaque = check_alone(model, instances[2], interpreter=False, resolve=False)
    assert "Loop" in ops_left(opaque)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_inference_session_unrolls_loops_per_instance(backend):
    import autobatch

    model = parse(RNN, W=W, U=U)
    session = autobatch.InferenceSession(model, backend=backend)
    instances = [rnn_instance(n) for n in (4, 1, 6, 4)]
    batched = session.run_batch(None, instances)
    for instance, outputs in zip(instances, batched):
        for got, want in zip(outputs, onnxruntime_outputs(model, instance), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    report = session.stats.report
    assert report.launches == report.lower_bound < report.nodes
    # the next batch has other lengths: a new plan, never a stale one
    again = [rnn_instance(n) for n in (2, 3)]
    for instance, outputs in zip(again, session.run_batch(None, again)):
        np.testing.assert_allclose(outputs[1], onnxruntime_outputs(model, instance)[1], rtol=1e-5, atol=1e-6)
    assert not session.stats.plan_cached
