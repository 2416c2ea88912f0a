"""The table of what the batcher can do with each op (``batcher.capabilities``): it says what the
rules do, the ways it names hold when run, and ``autobatch ops`` prints it."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.defs
import pytest

from autobatch import InferenceSession
from autobatch.batcher.capabilities import WAYS, capabilities, capability_table, known_op_types
from autobatch.batcher.padding import CHUNK
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
    """A unary op of one float input that needs no attribute, known at ``OPSET`` (not one over an
    axis by default 0, an ArgMax: over ``[1, L, 3]``, the leading 1, not row-wise; its case is
    ``RAGGED_CASES``')."""
    try:
        schema = onnx.defs.get_schema(op_type, OPSET)
    except onnx.defs.SchemaError:
        return False
    required = [a for a in schema.attributes.values() if a.required]
    axis = schema.attributes.get("axis")
    first = axis is not None and onnx.helper.get_attribute_value(axis.default_value) == 0
    return schema.min_input == schema.max_input == 1 and not required and not first \
        and "tensor(float)" in schema.inputs[0].types


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


# op -> (body over x [1, L, 4], its output, weights): the ops of more than one operand that the
# table calls ragged, each in the case its "when" names
RAGGED_CASES = {
    "MatMul": ("y = MatMul(x, W)", "float[1, L, 3] y", "float[4, 3] W = {1.0, -2.0, 0.5, 0.25, 1.0, -1.0, 0.0, 0.5, 2.0, -1.0, 0.75, 1.5}"),
    "Gemm": ("r = Reshape(x, s)\n y = Gemm(r, W, c)", "float[L, 3] y",
             "float[4, 3] W = {1.0, -2.0, 0.5, 0.25, 1.0, -1.0, 0.0, 0.5, 2.0, -1.0, 0.75, 1.5}, float[3] c = {0.1, 0.2, 0.3}, "
             "int64[2] s = {-1, 4}"),
    "Gather": ("i = Cast<to = 7>(x)\n y = Gather(T, i)", "float[1, L, 4, 2] y",
               "float[3, 2] T = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}"),
    "LayerNormalization": ("y = LayerNormalization<axis = -1>(x, g, b)", "float[1, L, 4] y",
                           "float[4] g = {1.0, 2.0, 0.5, 1.0}, float[4] b = {0.0, 0.1, 0.2, 0.3}"),
    "Concat": ("y = Concat<axis = -1>(x, x)", "float[1, L, 8] y", ""),
    "Split": ("a, y = Split<axis = -1, num_outputs = 2>(x)", "float[1, L, 2] y", ""),
    "ReduceSum": ("y = ReduceSum<keepdims = 1>(x, k)", "float[1, L, 1] y", "int64[1] k = {-1}"),
    "ArgMax": ("y = ArgMax<axis = -1>(x)", "int64[1, L, 1] y", ""),
    "Slice": ("y = Slice(x, a, b, k)", "float[1, L, 2] y", "int64[1] a = {1}, int64[1] b = {3}, int64[1] k = {-1}"),
    "ArgMin": ("y = ArgMin<axis = 2, keepdims = 0>(x)", "int64[1, L] y", ""),
}


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("op_type", sorted(RAGGED_CASES))
def test_each_op_of_several_operands_the_table_calls_ragged_runs_one_launch_across_lengths(op_type, backend):
    assert capabilities(op_type).ragged is not None
    body, output, weights = RAGGED_CASES[op_type]
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : {OPSET}]>
        g (float[1, L, 4] x) => ({output}) {('<' + weights + '>') if weights else ''} {{ {body} }}""")
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(5)
    # integers in 0..2 (Gather's indices once cast), as floats for the others
    assert_batched_equals_alone(session, [{"x": rng.integers(0, 3, (1, n, 4)).astype(np.float32)}
                                          for n in [2, 5, 1, 4, 4]])
    assert session.stats.report.launches_by_op[op_type] == 1, session.stats.report.launches_by_op


# op -> (its lines over x [1, L, 4] in (0.1, 0.9), its output's element type): the elementwise
# ops and reductions of more than one operand (or with attributes) that the ragged table takes
HALF = "float half = {0.5}, float low = {0.2}, float[4] slope = {0.1, 0.2, 0.3, 0.4}, int64[1] last = {-1}"
RAGGED_ELEMENTWISE = {
    **{op: (f"y = {op}(x, x)", "float[1, L, 4]") for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean")},
    "Sum": ("y = Sum(x, half)", "float[1, L, 4]"),  # (of per-instance terms alone: a sum of terms, a class per shape)
    "Mod": ("y = Mod<fmod = 1>(x, half)", "float[1, L, 4]"),
    **{op: (f"y = {op}(x, half)", "bool[1, L, 4]") for op in ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")},
    "Not": ("g = Greater(x, half)\n y = Not(g)", "bool[1, L, 4]"),
    **{op: (f"g = Greater(x, half)\n h = Less(x, low)\n y = {op}(g, h)", "bool[1, L, 4]") for op in ("And", "Or", "Xor")},
    "Cast": ("y = Cast<to = 7>(x)", "int64[1, L, 4]"),
    "Clip": ("y = Clip(x, low, half)", "float[1, L, 4]"),
    "PRelu": ("n = Sub(low, x)\n y = PRelu(n, slope)", "float[1, L, 4]"),
    "Where": ("g = Greater(x, half)\n y = Where(g, x, low)", "float[1, L, 4]"),
    "Gelu": ("y = Gelu(x)", "float[1, L, 4]"),  # opset 20
    **{op: (f"y = {op}<keepdims = 1>(x, last)", "float[1, L, 1]")
       for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp")},
}


def test_every_row_of_the_ragged_table_has_its_case_here():
    from autobatch.batcher.ragged import ROW_WISE

    assert set(ROW_WISE) == set(RAGGED_UNARY) | set(RAGGED_CASES) | set(RAGGED_ELEMENTWISE)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("op_type", sorted(RAGGED_ELEMENTWISE))
def test_each_elementwise_op_and_reduction_the_table_calls_ragged_runs_one_launch_across_lengths(op_type, backend):
    body, output = RAGGED_ELEMENTWISE[op_type]
    model = onnx.parser.parse_model(f"""<ir_version: 9, opset_import: ["" : {20 if op_type == "Gelu" else OPSET}]>
        g (float[1, L, 4] x) => ({output} y) <{HALF}> {{ {body} }}""")
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(11)
    assert_batched_equals_alone(session, [{"x": rng.uniform(0.1, 0.9, (1, n, 4)).astype(np.float32)}
                                          for n in [2, 5, 1, 4, 4]])
    assert session.stats.report.launches_by_op[op_type] == 1, session.stats.report.launches_by_op


# op -> (its line over attention-like scores s [1, L, L] of each instance's own length, its
# output's element type): the elementwise ops the padding table takes
PADDED_ELEMENTWISE = {
    **{op: (f"y = {op}(s)", "float") for op in ("Abs", "Erf", "Exp", "Identity", "Neg", "Relu", "Sigmoid", "Tanh")},
    **{op: (f"y = {op}(s, s)", "float") for op in ("Add", "Sub", "Mul")},
    "Div": ("y = Div(s, two)", "float"),
    **{op: (f"y = {op}(s, zero)", "bool") for op in ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")},
    **{op: (f"y = {op}(s)", "bool") for op in ("IsNaN", "IsInf")},
    "Not": ("g = Greater(s, zero)\n y = Not(g)", "bool"),
    **{op: (f"g = Greater(s, zero)\n h = Less(s, two)\n y = {op}(g, h)", "bool") for op in ("And", "Or")},
    "Cast": ("y = Cast<to = 7>(s)", "int64"),
    "Where": ("g = Greater(s, zero)\n y = Where(g, s, two)", "float"),
}


# ... and the others, each in the case its row names
PADDED_OTHERS = {
    "MatMul": ("y = MatMul(s, s)", "float[1, L, L]"),
    "Transpose": ("y = Transpose<perm = [0, 2, 1]>(s)", "float[1, L, L]"),
    "Reshape": ("y = Reshape(s, square)", "float[L, L]"),
    "Unsqueeze": ("y = Unsqueeze(s, one)", "float[1, 1, L, L]"),
    "Squeeze": ("u = Unsqueeze(s, one)\n y = Squeeze(u, one)", "float[1, L, L]"),
    "Flatten": ("y = Flatten<axis = 2>(s)", "float[L, L]"),
    "Gather": ("y = Gather<axis = 0>(s, first)", "float[1, L, L]"),
    "Concat": ("y = Concat<axis = 0>(s, s)", "float[2, L, L]"),
    "Softmax": ("y = Softmax<axis = -1>(s)", "float[1, L, L]"),
    "LogSoftmax": ("y = LogSoftmax<axis = -1>(s)", "float[1, L, L]"),
}


def test_every_row_of_the_padding_table_has_its_case_here():
    from autobatch.batcher.padding import PADDED

    assert set(PADDED_ELEMENTWISE) == {op for op, row in PADDED.items() if row.own_constants}
    assert set(PADDED) == set(PADDED_ELEMENTWISE) | set(PADDED_OTHERS)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("op_type", sorted({**PADDED_ELEMENTWISE, **PADDED_OTHERS}))
def test_each_op_the_padding_table_takes_runs_a_launch_a_chunk(op_type, backend):
    body, output = PADDED_ELEMENTWISE.get(op_type) or PADDED_OTHERS[op_type]
    if op_type in PADDED_ELEMENTWISE:
        output = f"{output}[1, L, L]"
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : {OPSET}]>
        g (float[1, L, 4] x) => ({output} y) <float zero = {{0.0}}, float two = {{2.0}}, int64[2] square = {{-1, 0}},
                                             int64[1] one = {{1}}, int64[1] first = {{0}}> {{
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        {body} }}""")
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(7)
    # (Known: with an Identity or a second Transpose of the scores, an instance of length 1 runs its
    # Transposes and that op as reshapes of its one row, a launch of their own; the others' run padded.)
    lengths = [3, 9, 1 if op_type not in ("Identity", "Transpose") else 2, 4, 4, 7, 2, 8, 5, 6, 12, 10]
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths],
                                atol=1e-5)  # the padded MatMul sums more (zero) terms
    chunks = -(-len(lengths) // CHUNK)
    nodes = sum(node.op_type == op_type for node in model.graph.node)  # MatMul and Transpose: the scores' too
    assert session.stats.report.launches_by_op[op_type] == nodes * chunks, session.stats.report.launches_by_op
    assert not session.stats.report.by_shape


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


OLD_OPSET_MODELS = {  # a rule's batched form needs an op the model's opset lacks
    "Where": ("Gather", """<ir_version: 4, opset_import: ["" : 8]>
        g (float[3, 4] x, int64[2] i) => (float[2, 4] z) {
        y = Gather<axis = 0>(x, i)
        z = Relu(y) }"""),
    "Expand": ("Concat", """<ir_version: 4, opset_import: ["" : 7]>
        g (float[3, 4] x) => (float[3, 6] z) {
        w = Constant<value = float[3, 2] {1, 2, 3, 4, 5, 6}>()
        y = Concat<axis = 1>(x, w)
        z = Relu(y) }"""),
}


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("needed", sorted(OLD_OPSET_MODELS))
def test_a_rule_needing_an_op_the_models_opset_lacks_runs_its_members_alone_and_says_why(needed, backend):
    """Rules are written for recent opsets: an old model's node whose batched form needs a newer
    op runs one member at a time (the batch would else fail), the reason in the report."""
    op_type, text = OLD_OPSET_MODELS[needed]
    model = onnx.parser.parse_model(text)
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((3, 4)).astype(np.float32), "i": np.array([k % 3, -1], dtype=np.int64)}
             for k in range(4)]
    feeds = [{name: f[name] for name in ("x", "i") if name in {v.name for v in model.graph.input}} for f in feeds]
    assert_batched_equals_alone(session, feeds)
    opset = model.opset_import[0].version
    report = session.stats.report
    assert report.alone == {f"{op_type}: its batched form needs {needed}, which opset {opset} lacks": 4}, report.alone
    assert report.launches_by_op[op_type] == 4 and report.launches_by_op["Relu"] == 1


MODELS_OF_OLD_WAYS = {  # each batched once wrongly or not at all (an audit of rules at old opsets)
    "Slice by int32 starts": """<ir_version: 7, opset_import: ["" : 13]>
        g (float[3, 4] x) => (float[3, 2] y) <int32[1] s = {1}, int32[1] e = {3}, int32[1] a = {1}> {
        y = Slice(x, s, e, a) }""",
    "ReduceMax at opset 8": """<ir_version: 4, opset_import: ["" : 8]>
        g (float[3, 4] x) => (float[3, 1] y) { y = ReduceMax<axes = [1]>(x) }""",
    "ArgMax at opset 7": """<ir_version: 4, opset_import: ["" : 7]>
        g (float[3, 4] x) => (int64[3, 1] y) { y = ArgMax<axis = 1>(x) }""",
}


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("case", sorted(MODELS_OF_OLD_WAYS))
def test_models_of_older_opsets_and_int32_indices_load_and_batch(case, backend):
    """A Slice's axes were int64 beside int32 starts (onnxruntime refused the batch); the NaN
    rewrite of ReduceMax and ArgMax wrote IsNaN into opsets before 9 (the model did not load)."""
    session = InferenceSession(onnx.parser.parse_model(MODELS_OF_OLD_WAYS[case]), backend=backend)
    rng = np.random.default_rng(6)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((3, 4)).astype(np.float32)} for _ in range(4)])
    assert not session.stats.report.alone and sum(session.stats.report.launches_by_op.values()) == 1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_prelu_of_a_shared_value_by_each_instances_slope_broadcasts_the_slope_one_way(backend):
    """PRelu's slope broadcasts to X only: with X shared and the slope each instance's own, the
    batched PRelu reads X repeated for every instance (``[N, 3, 4]``), never a slope larger
    than X (which both runtimes here took, and the standard does not)."""
    from autobatch.ir import to_onnx
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 16]>
        g (float[4] s) => (float[3, 4] y) <float[3, 4] x = {-1, 2, -3, 4, -5, 6, -7, 8, -9, 10, -11, 12}> {
        y = PRelu(x, s) }""")
    session = InferenceSession(model, backend=backend)
    rng = np.random.default_rng(8)
    assert_batched_equals_alone(session, [{"s": rng.standard_normal(4).astype(np.float32)} for _ in range(3)])
    (template,) = [t for t in session.templates.templates.values() if getattr(t, "graph", None) is not None
                   and any(n.op_type == "PRelu" for n in t.graph.nodes.values())]
    typed = onnx.shape_inference.infer_shapes(to_onnx(template.graph, check=False))
    prelu = next(n for n in typed.graph.node if n.op_type == "PRelu")
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*typed.graph.value_info, *typed.graph.input,
                                                                   *typed.graph.output, *typed.graph.initializer]
             if hasattr(v, "type")}
    assert ranks[prelu.input[0]] == 3, ranks


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_function_calling_another_on_shared_values_batches_in_one_launch(backend):
    """Inside a batched function call, a call of another function on shared values runs once,
    in its own domain (it was emitted as a standard op of that name, then refused)."""
    from tests.test_interpreter import NESTED_FUNCTIONS
    session = InferenceSession(NESTED_FUNCTIONS, backend=backend)
    rng = np.random.default_rng(9)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((2, 4)).astype(np.float32)} for _ in range(3)])
    assert session.stats.report.launches_by_op == {"F": 1} and not session.stats.report.alone


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
