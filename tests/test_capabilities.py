"""The table of what the batcher can do with each op (``batcher.capabilities``): it says what the
rules do, the ways it names hold when run, and ``autobatch ops`` prints it."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.defs
import pytest

from autobatch import InferenceSession
from autobatch.batcher.capabilities import WAYS, capabilities, capability_table, known_op_types
from tests.oracle import assert_batched_equals_alone
from tests.test_cli import autobatch_cli

OPSET = 18


def test_every_op_in_the_table_is_onnx_and_batches_at_one_shape_too():
    """An op that batches across lengths (ragged or padded) must batch members of one length too."""
    for row in capability_table():
        assert onnx.defs.has(row.op_type), row.op_type
        if row.ragged is not None or row.padded is not None:
            assert row.stacked is not None, f"{row.op_type}: across lengths but not at one shape"
    assert capabilities("NonZero").ways == dict.fromkeys(WAYS)  # no way: it runs one member at a time


def _float_unary(op_type: str) -> bool:
    """A unary op of one float input that needs no attribute, known at ``OPSET``."""
    try:
        schema = onnx.defs.get_schema(op_type, OPSET)
    except onnx.defs.SchemaError:
        return False
    required = [a for a in schema.attributes.values() if a.required]
    return schema.min_input == schema.max_input == 1 and not required and "tensor(float)" in schema.inputs[0].types


RAGGED_UNARY = [row.op_type for row in capability_table() if row.ragged is not None and _float_unary(row.op_type)]


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("op_type", RAGGED_UNARY)
def test_each_op_the_table_calls_ragged_runs_one_launch_across_lengths(op_type, backend):
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : {OPSET}]>
        g (float[1, L, 3] x) => (float[1, L, 3] y) {{ y = {op_type}(x) }}""")
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(3)
    lengths = [2, 5, 1, 4, 4]
    # inside (0.1, 0.9): in every op's domain (Acos, Log, Sqrt, ...)
    assert_batched_equals_alone(session, [{"x": rng.uniform(0.1, 0.9, (1, n, 3)).astype(np.float32)} for n in lengths])
    assert session.stats.report.launches_by_op == {op_type: 1}


def test_the_ragged_unary_ops_tested_are_many():
    assert len(RAGGED_UNARY) >= 25 and {"Tanh", "Relu", "Exp", "Sqrt"} <= set(RAGGED_UNARY)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_division_by_each_instances_own_padded_values_is_refused_and_says_why(backend):
    """Padded with zeros, a per-instance divisor would divide by 0: a launch a length, the reason
    from the Div row of the padding table."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, L] y) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        e = Exp(s)
        y = Div(s, e) }""")
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(2)
    lengths = [2, 3, 5, 5, 7]
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths],
                                atol=1e-5)  # the padded MatMul sums more (zero) terms
    assert session.stats.report.launches_by_op["Div"] == len(set(lengths))
    assert session.stats.report.by_shape == {
        "Div: not ragged (rows of different shapes); not padded (a divisor of each instance's own, whose padding "
        "would divide by 0)": 1}


def test_autobatch_ops_prints_the_table_and_when_each_way_applies():
    everything = autobatch_cli("ops")
    assert everything.returncode == 0, everything.stderr
    lines = {line.split()[0]: line for line in everything.stdout.splitlines()[:-1]}
    assert set(lines) == set(known_op_types())
    assert lines["LSTM"].split(None, 1)[1] == "stacked, packed"
    assert lines["SoftmaxCrossEntropyLoss"].split(None, 1)[1] == "per-member reduction"
    some = autobatch_cli("ops", "MatMul", "NonZero")
    assert some.returncode == 0, some.stderr
    assert some.stdout.splitlines() == [
        "MatMul: stacked, ragged, padded", "  stacked: yes", "  ragged: yes, a per-instance [..., n, k] by a shared [k, m]",
        "  reshape of rows: no", "  per-member reduction: no", "  packed: no",
        "  padded: yes, a product of matrices, operands broadcast alike (a padded axis adds zeros)",
        "NonZero: alone", *[f"  {way}: no" for way in WAYS]]
    wrong = autobatch_cli("ops", "MatMul", "Frobnicate")
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr == "autobatch ops: error: not an op of ONNX's default domain: Frobnicate\n"
