"""Batches planned once per node of the model (``batcher/instance_axis.py``,
``backends/instance_axis.py``, ``autobatch/axis_batches.py``): every new mix of lengths runs as
the model's own graph over all its instances' rows, with each instance's own results, and what
the node-level plan does not take is planned per mix as before, saying why."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest

import autobatch
from autobatch.batcher.sequences import CHUNK
from tests.oracle import assert_batched_equals_alone, assert_same
from tests.test_sequences import D, layer_model, sequences


@pytest.fixture(params=["numpy", "onnxruntime"])
def backend(request):
    return request.param


def assert_each_alone(session: autobatch.InferenceSession, batch: list[dict], got: list[list[np.ndarray]]) -> None:
    """Each instance's results equal its run alone (float32: rtol 1e-5, atol 1e-6; a layer's
    products over a chunk of sequences sum in the kernels' own order)."""
    for k, (feeds, outputs) in enumerate(zip(batch, got, strict=True)):
        for alone, value in zip(session.run(None, feeds), outputs, strict=True):
            assert value.shape == alone.shape
            assert_same(value, alone, rtol=1e-5, atol=1e-6, what=f"instance {k}")


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_every_new_mix_runs_as_one_graph_planned_once(backend, op, direction):
    rng = np.random.default_rng(len(op) + len(direction))
    session = autobatch.InferenceSession(layer_model(op, direction, 1, rng), backend=backend, alone_when_faster=False)
    runner = None
    for lengths in ([4, 9], *(rng.integers(1, 30, count) for count in (8, 19, 5))):  # new lengths every mix
        count = len(lengths)
        batch = sequences([int(n) for n in lengths], rng)
        got = session.run_batch(None, batch)
        report = session.stats.report
        assert report.scheduler == "instance axis" and report.launches_by_op == {op: math.ceil(count / CHUNK)}
        assert_each_alone(session, batch, got)
        runner = runner or session.axis_batches.runner
        assert session.axis_batches.runner is runner  # planned once, for every mix
        # The stats say so: kept from the first batch on; one onnxruntime session there, a graph NumPy runs here.
        assert session.stats.plan_cached == (count != 2) and session.stats.whole_plan == (backend == "onnxruntime")
    assert len(session._flat_plans) == 0  # no mix was planned record by record


def test_a_first_batch_of_one_row_waits_for_one_that_tells_the_axis(backend):
    rng = np.random.default_rng(6)
    session = autobatch.InferenceSession(layer_model("LSTM", "forward", 1, rng), backend=backend,
                                         alone_when_faster=False)
    for lengths, scheduler in (([1, 12], "level"), ([3, 1, 7], "instance axis")):
        batch = sequences(lengths, rng)
        assert_each_alone(session, batch, session.run_batch(None, batch))
        assert session.stats.report.scheduler == scheduler and session.axis_batches.refusal is None


def test_a_layer_whose_final_states_are_read_is_planned_per_mix(backend):
    rng = np.random.default_rng(3)
    session = autobatch.InferenceSession(layer_model("LSTM", "forward", 3, rng), backend=backend)
    batch = sequences([4, 7, 2, 9], rng)
    got = session.run_batch(None, batch)
    assert "its final states are read" in session.axis_batches.refusal
    assert session.stats.report.scheduler != "instance axis"
    assert_each_alone(session, batch, got)


def two_inputs_model() -> onnx.ModelProto:
    """Two per-instance inputs of one length each, added row by row after a projection."""
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, L, {D}] a, float[1, M, {D}] b) => (float[1, L, {D}] y) {{
        p = MatMul(a, w)
        y = Add(p, b)
    }}""")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.eye(D, dtype=np.float32) * 2, "w"))
    return model


def test_an_instance_that_does_not_fit_sends_its_batch_to_the_flat_planner(backend):
    """The plan is made from the first batch of two lengths; a later batch with an instance whose
    inputs differ in length (the model's Add then fails for it alone too) or of one that fits
    runs as each alone would."""
    rng = np.random.default_rng(4)
    session = autobatch.InferenceSession(two_inputs_model(), backend=backend, alone_when_faster=False)

    def instance(n: int) -> dict[str, np.ndarray]:
        return {name: rng.standard_normal((1, n, D)).astype(np.float32) for name in "ab"}

    batch = [instance(n) for n in (3, 6, 1, 6)]
    assert_each_alone(session, batch, session.run_batch(None, batch))
    assert session.stats.report.scheduler == "instance axis"
    assert session.stats.report.launches_by_op == {"MatMul": 1, "Add": 1}
    mixed = [instance(4), {"a": rng.standard_normal((1, 5, D)).astype(np.float32),
                           "b": rng.standard_normal((1, 1, D)).astype(np.float32)}]
    assert_each_alone(session, mixed, session.run_batch(None, mixed))  # b broadcasts over a's 5 rows
    assert session.stats.report.scheduler != "instance axis"
    assert session.axis_batches.refusal is None  # the model keeps its plan for batches that fit


def test_an_empty_sequence_in_a_mix_gets_its_own_results(backend):
    rng = np.random.default_rng(5)
    session = autobatch.InferenceSession(layer_model("GRU", "bidirectional", 1, rng), backend=backend,
                                         alone_when_faster=False)
    batch = sequences([5, 0, 3, 8], rng)
    got = session.run_batch(None, batch)
    assert got[1][0].shape == (0, 2, 1, 4)
    for k in (0, 2, 3):
        assert_same(got[k][0], session.run(None, batch[k])[0], rtol=1e-5, atol=1e-6, what=f"instance {k}")


LENGTHS = [3, 9, 1, 4, 4, 7, 2, 8, 5, 6, 12, 10, 17, 3, 6, 2, 11]  # 3 chunks of at most 8


@pytest.mark.parametrize("name", ["attention", "causal", "fraction", "heads"])
def test_attention_runs_padded_a_launch_a_chunk_with_each_instances_results(backend, name):
    """Attention's products of one instance with itself run padded, each chunk of 8 instances
    (sorted by length) to its longest, within the one graph; a mask folded for each length is
    given per mix, padded, whether or not it is the corner of a longer one's (``fraction`` is
    not); the heads split by a Gather and a Squeeze run padded too, on the batch axis before them."""
    from tests.test_padding import ATTENTION, CAUSAL, FRACTION, HEADS, _masked

    model = {"attention": ATTENTION, "causal": _masked(CAUSAL), "fraction": _masked(FRACTION), "heads": HEADS}[name]
    width = 6 if name == "heads" else 4
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(8)
    for lengths in (LENGTHS, [int(n) for n in rng.integers(1, 30, 9)]):  # the second: new lengths
        batch = [{"x": rng.standard_normal((1, n, width)).astype(np.float32)} for n in lengths]
        # summed over more (padded, zeroed) terms, a product may round otherwise: 1e-5 absolute more
        assert_batched_equals_alone(session, batch, atol=1e-5)
        report, chunks = session.stats.report, math.ceil(len(lengths) / CHUNK)
        assert report.scheduler == "instance axis"
        assert report.launches_by_op["Softmax"] == chunks and report.launches_by_op["MatMul"] == 2 * chunks


def test_a_padded_position_never_reaches_a_real_one(backend):
    """A value that is not finite at every padded position (the log of the zero rows, -inf)
    still leaves every real position its own: a Softmax over the length masks the padded ones,
    and a product over the length zeroes both sides' padded positions first."""
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] c) {
        a = Abs(x)
        v = Log(a)
        k = Transpose<perm = [0, 2, 1]>(v)
        s = MatMul(v, k)
        p = Softmax<axis = -1>(s)
        w = Log(p)
        c = MatMul(w, v) }""")
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(9)
    batch = [{"x": (rng.standard_normal((1, n, 4)) + 3).astype(np.float32)} for n in (2, 7, 3, 5)]
    assert_batched_equals_alone(session, batch, rtol=1e-4, atol=1e-5)
    assert session.stats.report.scheduler == "instance axis"


def test_a_reshape_of_a_padded_value_keeps_it_padded(backend):
    """Heads split and moved about (as the dynamo exporter writes ``nn.MultiheadAttention``'s):
    a reshape that keeps each position's elements together runs on the padded chunks, so the
    value moves from rows to padded once and back once (before, the Squeeze of a value with no
    rows stopped the model, and the last Reshape moved it back to rows first)."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 6] x) => (float[1, L, 6] y) {
        e = Exp(x)
        r = Reshape(e, heads)
        t = Transpose<perm = [0, 2, 1, 3]>(r)
        s = Squeeze(t, zero)
        u = Transpose<perm = [1, 0, 2]>(s)
        y = Reshape(u, rows) }""", heads=np.array([1, -1, 2, 3], np.int64), zero=_I["zero"],
                   rows=np.array([1, -1, 6], np.int64))
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(17)
    batch = [{"x": rng.standard_normal((1, n, 6)).astype(np.float32)} for n in LENGTHS]
    assert_batched_equals_alone(session, batch)
    chunks = math.ceil(len(LENGTHS) / CHUNK)
    assert session.stats.report.scheduler == "instance axis"
    assert session.stats.report.launches_by_op == {"Exp": 1, "Reshape": 1 + chunks, "Transpose": 2 * chunks,
                                                   "Squeeze": chunks}
    ops = [node.op_type for node in session.axis_batches.model(batch).graph.node]
    assert ops.count("Gather") == chunks + 1  # to padded a Gather a chunk, back one Gather


def test_values_picked_from_one_padded_tensor_keep_its_zeros(backend):
    """Q, K and V picked by a Gather from one tensor (as the dynamo exporter writes
    ``nn.MultiheadAttention``) keep the zeros of V's padded positions (its rows read the zero
    row): the product over the length needs no Where to zero them again, only the Softmax its mask."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 6] x) => (float[1, L, 2] y) {
        qkv = Reshape(x, packed)
        t = Transpose<perm = [2, 0, 1, 3]>(qkv)
        q = Gather<axis = 0>(t, i0)
        k = Gather<axis = 0>(t, i1)
        v = Gather<axis = 0>(t, i2)
        kt = Transpose<perm = [0, 2, 1]>(k)
        s = MatMul(q, kt)
        p = Softmax<axis = -1>(s)
        y = MatMul(p, v) }""", packed=np.array([1, -1, 3, 2], np.int64), i0=np.array(0, np.int64),
                   i1=np.array(1, np.int64), i2=np.array(2, np.int64))
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(18)
    batch = [{"x": rng.standard_normal((1, n, 6)).astype(np.float32)} for n in LENGTHS]
    assert_batched_equals_alone(session, batch, atol=1e-5)
    assert session.stats.report.scheduler == "instance axis"
    ops = [node.op_type for node in session.axis_batches.model(batch).graph.node]
    assert ops.count("Where") == math.ceil(len(LENGTHS) / CHUNK)  # the Softmax's masks only


@pytest.mark.parametrize("name", ["causal", "fraction"])
def test_a_new_length_is_checked_without_typing_the_model(backend, name, monkeypatch):
    """After the probe, a length new to the session is checked against the plan by evaluating
    the nodes that depend on shapes only and inferring the rest's shapes once
    (``autobatch/length_check.py``), not by typing the whole model for it; the masks it folds
    are each length's own."""
    from tests.test_padding import CAUSAL, FRACTION, _masked

    session = autobatch.InferenceSession(_masked(CAUSAL if name == "causal" else FRACTION), backend=backend,
                                         alone_when_faster=False)
    rng = np.random.default_rng(19)
    texts = lambda lengths: [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]  # noqa: E731
    assert_batched_equals_alone(session, texts([6, 9]), atol=1e-5)  # the probe types these two
    typed = []
    monkeypatch.setattr(session.axis_batches.instances, "records_of", lambda feeds: typed.append(feeds) or 1 / 0)
    batch = texts([3, 12, 7, 5, 17, 2, 11, 4, 13])  # every length new
    got = session.run_batch(None, batch)
    assert session.stats.report.scheduler == "instance axis" and typed == []
    monkeypatch.undo()
    for k, (feeds, outputs) in enumerate(zip(batch, got)):
        assert_same(outputs[0], session.run(None, feeds)[0], rtol=1e-5, atol=1e-5, what=f"instance {k}")


def test_a_length_where_a_shared_constant_differs_is_typed_and_refused(backend):
    """``min(L, 6)`` is 6 at both probe lengths (a constant the plan shares) and 4 at length 4:
    the check sees it differ, the model is typed for that length, which refuses it, and its
    batch is planned per mix, each instance's results its own."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        shape = Shape(x)
        n = Slice(shape, one, two)
        m = Min(n, six)
        scale = Cast<to = 1>(m)
        y = Mul(x, scale) }""", one=_I["one"], two=_I["two"], six=np.array([6], np.int64))
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(20)
    texts = lambda lengths: [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]  # noqa: E731
    assert_batched_equals_alone(session, texts([8, 10]))
    assert session.stats.report.scheduler == "instance axis"
    assert_batched_equals_alone(session, texts([9, 12, 7]))  # new lengths, min(L, 6) = 6: planned once
    assert session.stats.report.scheduler == "instance axis"
    assert_batched_equals_alone(session, texts([4, 9, 12]))
    assert session.stats.report.scheduler != "instance axis"


def test_the_length_check_folds_what_typing_folds():
    """Typing leaves a value over ``FOLD_LIMIT`` elements computed (the graph then has other
    nodes, and the length is refused): the check says so too, rather than accept the length.
    ``n x n`` ones summed: folded at lengths 8 and 10, not at 300. And a plan with a node of
    constant inputs left computed at the probe (a ``[1, L, L]`` mask at lengths 300 and 310,
    which typing would fold at 100) has its new lengths typed."""
    from autobatch.batcher.constants import FOLD_LIMIT

    summed = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        sh = Shape(x)
        n = Slice(sh, one, two)
        nn = Concat<axis = 0>(n, n)
        big = ConstantOfShape<value = float[1] {1.0}>(nn)
        r = ReduceSum<keepdims = 0>(big, zero)
        c = Reshape(r, column)
        y = Mul(x, c) }""", **_I, column=np.array([1, -1, 1], np.int64))
    masked = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        sh = Shape(x)
        n = Gather<axis = 0>(sh, one0)
        r = Range(zero0, n, one0)
        r0 = Unsqueeze(r, a01)
        r1 = Unsqueeze(r, a02)
        mask = LessOrEqual(r0, r1)
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        w = Where(mask, s, low)
        p = Softmax<axis = -1>(w)
        y = MatMul(p, x) }""", zero0=np.array(0, np.int64), one0=np.array(1, np.int64), a01=np.array([0, 1], np.int64),
                    a02=np.array([0, 2], np.int64), low=np.array(-1e4, np.float32))
    rng = np.random.default_rng(22)
    texts = lambda lengths: [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]  # noqa: E731
    session = autobatch.InferenceSession(summed, backend="numpy", alone_when_faster=False)
    assert_batched_equals_alone(session, texts([8, 10]))
    long = int(np.sqrt(FOLD_LIMIT)) + 1
    assert session.axis_batches.lengths.constants(9, {"x": np.dtype(np.float32)}) is not None
    assert session.axis_batches.lengths.constants(long, {"x": np.dtype(np.float32)}) is None
    assert_batched_equals_alone(session, texts([long, 9]))
    session = autobatch.InferenceSession(masked, backend="numpy", alone_when_faster=False)
    assert_batched_equals_alone(session, texts([long + 40, long + 50]), atol=1e-5)
    assert session.stats.report.scheduler == "instance axis" and session.axis_batches.lengths is None


def test_a_scalar_made_by_constant_of_shape_is_folded(backend):
    """Hugging Face's exports make a mask's scalar True as ``ConstantOfShape`` of the empty
    shape: a constant, folded (a guard against folding reductions of nothing had kept it, and
    the node-level plan refused the model)."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        t = ConstantOfShape<value = bool[1] {1}>(scalar)
        p = Greater(x, zero)
        m = And(t, p)
        y = Where(m, x, zero) }""", scalar=np.zeros(0, np.int64), zero=np.array(0, np.float32))
    rng = np.random.default_rng(23)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    batch = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (3, 7, 5)]
    assert_batched_equals_alone(session, batch)
    assert session.stats.report.scheduler == "instance axis", session.axis_batches.refusal
    assert "ConstantOfShape" not in {node.op_type for node in session.instances.graph_of(batch[0]).nodes.values()}


def _masked_attention(pick: str) -> onnx.ModelProto:
    """Attention whose key mask is picked from the ``mask`` input by positions computed from
    its length, as Hugging Face's exports pick it (``pick``: the nodes making ``picked [1, 1,
    1, L]`` from ``flat [L]``, ``rows [1, 1, 1, L]`` and ``n``), then expanded to ``[1, 1, L, L]``."""
    return _model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x, int64[1, L] mask) => (float[1, L, 4] y) {{
        sh = Shape(mask)
        n = Gather<axis = 0>(sh, one0)
        r = Range(zero0, n, one0)
        rows = Unsqueeze(r, a012)
        flat = Reshape(mask, minus)
        {pick}
        b = Cast<to = 9>(picked)
        nn = Unsqueeze(n, zero)
        shape = Concat<axis = 0>(one, one, nn, nn)
        e = Expand(b, shape)
        x4 = Unsqueeze(x, one)
        k = Transpose<perm = [0, 1, 3, 2]>(x4)
        s = MatMul(x4, k)
        w = Where(e, s, low)
        p = Softmax<axis = -1>(w)
        y4 = MatMul(p, x4)
        y = Squeeze(y4, one) }}""", **_I, zero0=np.array(0, np.int64), one0=np.array(1, np.int64),
                  a012=np.array([0, 1, 2], np.int64), minus=np.array([-1], np.int64), low=np.array(-1e4, np.float32))


MASK_PICKS = {  # a Gather by positions (reversed, and from the end), a GatherND by (0, position) pairs
    "Gather": "picked = Gather<axis = 0>(flat, rows)",
    "Gather from the end": "back = Sub(minus1, rows)\n picked = Gather<axis = 0>(flat, back)",
    "GatherND": "pairs0 = Unsqueeze(rows, minus)\n zeros = Mul(pairs0, zero0)\n pairs = Concat<axis = -1>(zeros, pairs0)\n "
                "mask2 = Reshape(flat, one_minus)\n picked = GatherND(mask2, pairs)",
}


@pytest.mark.parametrize("pick", MASK_PICKS)
def test_a_mask_picked_by_positions_of_each_length_runs_planned_once(backend, pick):
    """A Gather (or GatherND) along the length by positions computed from it runs over every
    instance's rows, its positions given per mix offset to each instance's rows; the mask then
    expanded to the attention's ``[1, 1, L, L]`` runs padded. Each instance's own results, mixes
    of new lengths included (checked without typing)."""
    model = _masked_attention(MASK_PICKS[pick])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(-1, np.int64), "minus1"),
                                    onnx.numpy_helper.from_array(np.array([1, -1], np.int64), "one_minus")])
    rng = np.random.default_rng(24)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    for lengths in ([3, 7, 5], [9, 2, 11, 4, 6, 13, 8, 10, 3]):
        batch = []
        for n in lengths:
            mask = (rng.random((1, n)) < 0.7).astype(np.int64)
            mask[0, 0] = 1
            batch.append({"x": rng.standard_normal((1, n, 4)).astype(np.float32), "mask": mask})
        assert_batched_equals_alone(session, batch, atol=1e-5)
        report = session.stats.report
        assert report.scheduler == "instance axis", session.axis_batches.refusal
    assert report.launches_by_op[pick.split()[0]] == 1  # one pick over every instance's rows
    assert report.launches_by_op["Expand"] == report.launches_by_op["Softmax"] == math.ceil(len(lengths) / 8)
    assert session.axis_batches.lengths is not None


@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("exclusive", [0, 1])
def test_a_count_along_the_length_runs_padded_and_picks_from_a_table_by_rows(backend, reverse, exclusive):
    """RoBERTa's position ids: a CumSum along the length of each instance's flags runs padded (a
    reversed one with its padded positions zeroed first: here it reads another CumSum's padded
    result, whose padding holds the total), and a GatherElements from a shared table by those
    counts runs over every instance's rows."""
    model = _model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x, int64[1, L] ids) => (float[1, L, 4] y, int64[1, L] c) {{
        less = Less(ids, three)
        m = Cast<to = 7>(less)
        counts = CumSum(m, one0)
        c = CumSum<reverse = {reverse}, exclusive = {exclusive}>(counts, one0)
        picks = Min(c, last)
        t = GatherElements<axis = 1>(table, picks)
        t3 = Unsqueeze(t, two)
        y = Mul(x, t3) }}""", **_I, one0=np.array(1, np.int64), three=np.array(3, np.int64),
                   last=np.array(63, np.int64), table=np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32))
    rng = np.random.default_rng(25)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    for lengths in ([3, 7, 5], [9, 2, 11, 4, 6, 13, 8, 10, 3]):
        batch = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32), "ids": rng.integers(0, 6, (1, n))}
                 for n in lengths]
        assert_batched_equals_alone(session, batch)
        report = session.stats.report
        assert report.scheduler == "instance axis", session.axis_batches.refusal
    assert report.launches_by_op["CumSum"] == 2 * math.ceil(len(lengths) / 8) and report.launches_by_op["GatherElements"] == 1


@pytest.mark.parametrize("position", [0, -1, 2])
def test_a_pooled_token_and_its_head_run_one_row_an_instance(backend, position):
    """A classifier's pooler: one position of each instance (the first token, the last, the
    third) picked along the length, then a dense layer and a head over one row an instance
    (``[1, d]`` each, ``[n, d]`` for the mix), beside an output of the length."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, 3] logits, float[1, L, 4] h) {
        h = Tanh(x)
        pooled = Gather<axis = 1>(h, at)
        dense = Gemm<transB = 1>(pooled, w, b)
        act = Tanh(dense)
        logits = MatMul(act, head) }""", at=np.array(position, np.int64),
                   w=np.random.default_rng(4).standard_normal((4, 4)).astype(np.float32), b=np.ones(4, np.float32),
                   head=np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32))
    rng = np.random.default_rng(26)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    for lengths in ([3, 7, 5], [9, 4, 11, 4, 6, 13, 8, 10, 3]):
        batch = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]
        assert_batched_equals_alone(session, batch)
        report = session.stats.report
        assert report.scheduler == "instance axis", session.axis_batches.refusal
    assert report.launches_by_op == {"Tanh": 2, "Gather": 1, "Gemm": 1, "MatMul": 1}


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
def test_a_reduction_over_the_length_runs_padded_into_one_row_an_instance(backend, op, opset):
    """Mean (or sum, max, min) pooling over each instance's tokens: padded chunks with their
    padded positions 0 (a mean over each instance's own count) or -inf and +inf, put back in
    the instances' order as one row an instance, then a head over those rows. A batch with an
    empty instance (a reduction over nothing: backends differ) is planned per mix, and the
    node-level plan stays for the next."""
    pooled = f"pooled = {op}<keepdims = 1>(h, one)" if opset == 18 or op == "ReduceSum" else \
        f"pooled = {op}<keepdims = 1, axes = [1]>(h)"
    model = _model(f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g (float[1, L, 4] x, float[1, L, 1] m) => (float[1, 1, 3] y, float[1, L, 4] h) {{
        t = Tanh(x)
        h = Mul(t, m)
        {pooled}
        y = MatMul(pooled, head) }}""", **_I, head=np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32))
    rng = np.random.default_rng(28)
    texts = lambda lengths: [{"x": rng.standard_normal((1, n, 4)).astype(np.float32),  # noqa: E731
                              "m": (rng.random((1, n, 1)) < 0.7).astype(np.float32)} for n in lengths]
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    for lengths, scheduler in (([3, 7, 5], "instance axis"), ([9, 4, 11, 1, 6, 13, 8, 10, 3, 2], "instance axis"),
                               ([4, 0, 6], "level"), ([5, 2, 8], "instance axis")):
        assert_batched_equals_alone(session, texts(lengths))
        assert session.stats.report.scheduler == scheduler, (lengths, session.axis_batches.refusal)
        if scheduler == "instance axis":
            assert session.stats.report.launches_by_op[op] == math.ceil(len(lengths) / 8)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_a_float16_sum_or_mean_over_the_length_is_not_pooled_padded(backend, op):
    """A float16 mean pooled padded divided a float16 sum by the count, rounding twice where the
    instance alone rounds once (an ulp off): float16 sums and means run as the flat planner runs
    them, equal to alone."""
    model = onnx.parser.parse_model(f"""<ir_version: 7, opset_import: ["" : 12]>
        g (float16[L, 4] x) => (float16[1, 4] y) {{ y = {op}<axes = [0]>(x) }}""")
    rng = np.random.default_rng(0)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False, node_level=True)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((n, 4)).astype(np.float16)} for n in (2, 7, 30, 100)])
    assert session.stats.report.scheduler != "instance axis"


def _reshape_chain(layers: int) -> onnx.ModelProto:
    """``layers`` of Shape -> Reshape -> Relu at opset 13: onnx types each Reshape only once its
    target is folded, a layer a round of typing."""
    from onnx import TensorProto, helper
    nodes, previous = [], "x"
    for k in range(layers):
        nodes += [helper.make_node("Shape", [previous], [f"s{k}"]), helper.make_node("Reshape", [previous, f"s{k}"], [f"r{k}"]),
                  helper.make_node("Relu", [f"r{k}"], [f"y{k}"])]
        previous = f"y{k}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["L", 4])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["L", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def test_typing_goes_a_layer_a_round_within_a_bound_on_its_work(backend, monkeypatch):
    """Typing folds and infers again while folding finds more (20 layers, 20 rounds: planned once
    per node), but no more rounds than ``FOLD_WORK`` nodes inferred again allow (at least 8): a
    chain of thousands of layers costs seconds, not hours, the layers past it planned per mix,
    with the same results."""
    from autobatch import typed_instances
    rng = np.random.default_rng(30)
    batch = [{"x": rng.standard_normal((n, 4)).astype(np.float32)} for n in (2, 3, 5)]
    session = autobatch.InferenceSession(_reshape_chain(20), backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, batch)
    assert session.stats.report.scheduler == "instance axis", session.axis_batches.refusal
    monkeypatch.setattr(typed_instances, "FOLD_WORK", 1)  # 8 rounds, whatever the graph's size
    session = autobatch.InferenceSession(_reshape_chain(20), backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, batch)
    assert session.stats.report.scheduler != "instance axis"


def test_a_batch_with_an_instance_too_short_for_a_picked_position_is_planned_per_mix(backend):
    """The third token of an instance of two: alone it fails, and so does the batch, run again
    instance by instance; the node-level plan stays for the next batch."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, 4] y) {
        y = Gather<axis = 1>(x, at) }""", at=np.array(2, np.int64))
    rng = np.random.default_rng(29)
    texts = lambda lengths: [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]  # noqa: E731
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, texts([3, 7, 5]))
    assert session.axis_batches.runner.plan.takes(2) is not None and session.axis_batches.runner.plan.takes(3) is None
    with pytest.raises(Exception):  # noqa: B017 - the instance's own error, whichever its backend raises
        session.run_batch(None, texts([4, 2, 6]))
    assert_batched_equals_alone(session, texts([5, 3, 9]))
    assert session.stats.report.scheduler == "instance axis" and session.axis_batches.refusal is None


@pytest.mark.parametrize("dtype", ["float", "int64"])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_a_token_found_by_an_argmax_is_picked_from_each_instances_own_rows(backend, op, dtype):
    """GPT-2's classifier: the position of each text's last real token by an ArgMax over its
    length (padded chunks whose padded positions never win, ties to the first), then its row
    picked by a Gather (the legacy exporter) or a GatherND of ``[0, position]`` (dynamo's: a
    shared 0 beside each text's position, broadcast to every text), then a head: every text's
    own results, every mix planned once. Values are drawn from few so that ties are common, and
    of one sign so that a padded 0 would often win."""
    model = _model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g ({dtype}[1, L] s, float[1, L, 4] x) => (float[1, 3] a, float[1, 3] b) {{
        at = {op}<axis = 1, keepdims = 0>(s)
        row = Gather<axis = 1>(x, at)
        first = Squeeze(row, one)
        a = MatMul(first, head)
        lifted = Unsqueeze(at, one)
        pair = Concat<axis = 1>(zero2, lifted)
        picked = GatherND(x, pair)
        b = MatMul(picked, head) }}""", one=_I["one"], zero2=np.zeros((1, 1), np.int64),
                   head=np.random.default_rng(5).standard_normal((4, 3)).astype(np.float32))
    rng = np.random.default_rng(30)
    kind = np.float32 if dtype == "float" else np.int64
    low, high = (-3, 1) if op == "ArgMax" else (0, 4)  # (a padded 0 would win where every real one loses to it)
    texts = lambda lengths: [{"s": rng.integers(low, high, (1, n)).astype(kind),  # noqa: E731
                              "x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    for lengths in ([3, 7, 5], [9, 4, 11, 1, 6, 13, 8, 10, 3, 2], [1, 2, 1, 3, 2, 6]):
        assert_batched_equals_alone(session, texts(lengths))
        report = session.stats.report
        assert report.scheduler == "instance axis", session.axis_batches.refusal
        assert report.launches_by_op[op] == math.ceil(len(lengths) / 8)
        assert report.launches_by_op["Gather"] == report.launches_by_op["GatherND"] == 1


def test_a_position_past_its_instances_length_fails_that_instance_alone_and_keeps_the_plan(backend):
    """A position the graph computes (here a sum of the input, counted from the end where
    negative) reads the instance's own row; one past its instance never reads another's: the
    batch goes to the flat planner, where that instance fails alone, and the node-level plan
    stays for the next batch."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (int64[1, L] s, float[1, L, 4] x) => (float[1, 1, 4] y) {
        at = ReduceSum<keepdims = 0>(s, one)
        y = Gather<axis = 1>(x, at) }""", one=_I["one"])
    rng = np.random.default_rng(31)

    def texts(sums):
        return [{"s": np.array([[total] + [0] * (n - 1)], np.int64), "x": rng.standard_normal((1, n, 4)).astype(np.float32)}
                for n, total in sums]

    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, texts([(3, 2), (7, -1), (5, -5), (4, 0)]))
    assert session.stats.report.scheduler == "instance axis", session.axis_batches.refusal
    for past in ((3, 3), (3, -4)):  # past its end, or before its start: the rows of its neighbours
        with pytest.raises(Exception):  # noqa: B017 - the instance's own error, whichever its backend raises
            session.run_batch(None, texts([(6, 1), past, (5, 4)]))
        assert session.axis_batches.refusal is None
    assert_batched_equals_alone(session, texts([(2, 1), (6, -6), (9, 8)]))
    assert session.stats.report.scheduler == "instance axis"


def test_a_value_of_the_length_beside_one_of_one_row_an_instance_is_refused(backend):
    """Each token plus its text's first token: rows of the length and one row an instance do
    not line up (``[1, N, d]`` against ``[n, d]``): refused, and planned per mix."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        first = Gather<axis = 1>(x, at)
        lifted = Unsqueeze(first, one)
        y = Add(x, lifted) }""", **_I, at=np.array(0, np.int64))
    rng = np.random.default_rng(27)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    batch = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (3, 7, 5)]
    assert_batched_equals_alone(session, batch)
    assert session.stats.report.scheduler != "instance axis"
    assert "one row an instance" in session.axis_batches.refusal


def test_positions_past_an_instances_length_are_an_error_not_another_instances_row():
    from autobatch.backends.axis_feeds import _positions

    np.testing.assert_array_equal(_positions(np.array([[0, 2, -1]]), None, 3, 10, "i"), [[10, 12, 12]])
    with pytest.raises(IndexError, match="past an instance's length 3"):
        _positions(np.array([0, 3]), None, 3, 10, "i")
    pairs = np.array([[0, 1, 5], [-1, -3, 6]])  # (size-1 axis, position, an index past it)
    np.testing.assert_array_equal(_positions(pairs, 1, 3, 10, "i"), [[0, 11, 5], [0, 10, 6]])
    with pytest.raises(IndexError, match="axis of size 1"):
        _positions(np.array([[1, 0]]), 1, 3, 10, "i")


def test_a_node_no_rule_takes_is_named_and_its_model_planned_per_mix(backend):
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, L, {D}] x) => (float[1, 1, {D}] y) {{
        y = ReduceL2<axes = [1]>(x) }}""")
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(10)
    batch = [{"x": rng.standard_normal((1, n, D)).astype(np.float32)} for n in (3, 5, 2)]
    assert_batched_equals_alone(session, batch)
    assert session.axis_batches.refusal == "ReduceL2 'y': not row-wise, and no padded rule"
    assert session.stats.report.scheduler != "instance axis"


def test_a_batch_that_did_work_for_later_ones_is_not_timed_for_the_choice_of_way():
    """Its first batches check new input signatures and make a session: timed, they would make
    batching look slower than it is, and the session would run its batches alone
    (``autobatch.ways``)."""
    rng = np.random.default_rng(11)
    session = autobatch.InferenceSession(layer_model("LSTM", "forward", 1, rng), backend="onnxruntime")
    for first in range(10, 90, 10):  # every batch of lengths new to the session
        batch = sequences(list(range(first, first + 8)), rng)
        session.run_batch(None, batch)
        assert session.axis_batches.fresh and session.stats.alone == 0
    assert not any(kind.recent for kind in session._ways.kinds.values())
    for _ in range(2):  # nothing new: counted, then timed (the first run of a way is never timed)
        session.run_batch(None, batch)
    assert not session.axis_batches.fresh and any(kind.recent for kind in session._ways.kinds.values())


def test_a_node_level_run_that_fails_is_said_and_its_batch_planned_per_mix(backend, caplog, monkeypatch):
    """A failure of the one graph (here made to fail: no real case is known) loses no batch: it
    is said at WARNING, the batch and every later one are planned per mix."""
    from autobatch.backends.instance_axis import InstanceAxisRunner

    rng = np.random.default_rng(12)
    session = autobatch.InferenceSession(layer_model("GRU", "forward", 1, rng), backend=backend, alone_when_faster=False)
    batch = sequences([4, 9, 2], rng)
    session.run_batch(None, batch)
    assert session.stats.report.scheduler == "instance axis"

    def fail(*_args, **_kwargs):
        raise RuntimeError("a kernel refused its shapes")

    monkeypatch.setattr(InstanceAxisRunner, "run", fail)
    with caplog.at_level("WARNING", logger="autobatch"):
        assert_batched_equals_alone(session, sequences([5, 3, 8], rng))
    assert session.stats.report.scheduler != "instance axis"
    assert session.axis_batches.refusal == "its node-level plan failed (RuntimeError: a kernel refused its shapes)"
    assert any("its node-level plan failed" in record.message for record in caplog.records)


def test_a_runner_keeps_a_bounded_number_of_sessions():
    from autobatch.backends.instance_axis import SESSIONS_KEPT

    rng = np.random.default_rng(13)
    session = autobatch.InferenceSession(layer_model("RNN", "forward", 1, rng), backend="onnxruntime",
                                         alone_when_faster=False)
    for chunks in range(1, SESSIONS_KEPT + 3):  # a number of chunks new each batch
        batch = sequences([int(n) for n in rng.integers(2, 9, CHUNK * chunks)], rng)
        assert_batched_equals_alone(session, batch)
    runner = session.axis_batches.runner
    assert runner.made == SESSIONS_KEPT + 2 and len(runner.runs) == SESSIONS_KEPT


def _model(text: str, **constants: np.ndarray) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(value, name) for name, value in constants.items())
    return model


_P = np.random.default_rng(2).standard_normal((16, 4)).astype(np.float32)
_I = {"zero": np.array([0], np.int64), "one": np.array([1], np.int64), "two": np.array([2], np.int64)}
# Cases a review found wrong or failing (each now runs planned once, or is refused saying why).
REVIEWED = {
    "Gather, axis by default": (_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[L, 4] c) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        i = Constant<value = int64 {0}>()
        t = Gather(s, i)
        x2 = Squeeze(x, zero)
        c = MatMul(t, x2) }""", zero=_I["zero"]), None),
    "Split, axis by default": (_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] c) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        e = Exp(s)
        s2 = Concat<axis = 0>(s, e)
        a, b = Split(s2)
        c = MatMul(b, x) }"""), None),
    "Softmax of opset 12, axis given": (_model("""<ir_version: 7, opset_import: ["" : 12]>
        g (float[1, L, 4] x) => (float[1, L, 4] c) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        p = Softmax<axis = 2>(s)
        c = MatMul(p, x) }"""), None),
    "a product of ranks 2 and 3": (_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] c) {
        x2 = Squeeze(x, zero)
        k2 = Transpose<perm = [1, 0]>(x2)
        s2 = MatMul(x2, k2)
        c = MatMul(s2, x) }""", zero=_I["zero"]), "a product of operands of other ranks"),
    "a shared constant of a higher rank": (_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] c) {
        x2 = Squeeze(x, zero)
        k2 = Transpose<perm = [1, 0]>(x2)
        s2 = MatMul(x2, k2)
        e = Mul(s2, w)
        c = MatMul(e, x) }""", zero=_I["zero"], w=np.full((1, 1, 1), 2.0, np.float32)), "operands of other ranks"),
    "a constant per length read at two ranks": (_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] a, float[1, 1, L, 4] b) {
        sh = Shape(x)
        n = Slice(sh, one, two)
        nf = Cast<to = 1>(n)
        pe0 = Slice(P, zero, n)
        pe = Div(pe0, nf)
        a = Add(x, pe)
        t = Unsqueeze(x, zero)
        b = Add(t, pe) }""", P=_P, **_I), "another node reads otherwise"),
    "a constant per length read as rows and padded": (_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] h, float[1, 1, L, 4] e) {
        sh = Shape(x)
        n = Slice(sh, one, two)
        pe0 = Slice(P, zero, n)
        pe = Unsqueeze(pe0, zero)
        h = Add(x, pe)
        t = Unsqueeze(x, zero)
        e = Add(t, pe) }""", P=_P, **_I), None),  # (refused once; now a feed in each layout)
    "a reshape of two length axes keeps each one's zeros (a review found its key axis's taken for the query's)": (
        _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        s2 = Squeeze(s, zero)
        p2 = Softmax(s2)
        p = Unsqueeze(p2, zero)
        pt = Transpose<perm = [0, 2, 1]>(p)
        q = MatMul(pt, p)
        y = MatMul(q, x) }""", **_I), None),
    "a Conv by a weight of each length's own": (_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        sh = Shape(x)
        n = Slice(sh, one, two)
        ws = Concat<axis = 0>(six, n, one)
        w = Expand(ones3, ws)
        c = Conv<kernel_shape = [1]>(s, w)
        c6 = Slice(c, zero, one, one)
        ct = Transpose<perm = [0, 2, 1]>(c6)
        y = Mul(x, ct) }""", **_I, six=np.array([6], np.int64), ones3=np.ones((6, 1, 1), np.float32)), "by shared weights"),
    "a weight named as a constant the lowering makes (a review found it replaced: wrong results)": (_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        a = Add(x, "y/zero0")
        kt = Transpose<perm = [0, 2, 1]>(a)
        s = MatMul(a, kt)
        e = Exp(s)
        y = MatMul(e, x) }""", **{"y/zero0": np.array(0.5, np.float32)}), None),
    "a bool reduced over the length (opset 20)": (_model("""<ir_version: 9, opset_import: ["" : 20]>
        g (float[1, L, 4] x) => (bool[1, 4] y, float[1, L, 4] z) {
        b = Greater(x, zero)
        y = ReduceMax<keepdims = 0>(b, one)
        z = Relu(x) }""", zero=np.array(0.0, np.float32), one=_I["one"]), "no padded rule"),
}


@pytest.mark.parametrize("case", list(REVIEWED))
def test_what_a_review_found_runs_planned_once_or_is_refused_with_each_instances_results(backend, case):
    model, refused = REVIEWED[case]
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(14)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)}
                                          for n in (3, 5, 1, 7, 2, 9, 4, 6, 8, 2)], atol=1e-5)
    if refused is None:
        assert session.stats.report.scheduler == "instance axis"
    else:
        assert session.stats.report.scheduler != "instance axis" and refused in session.axis_batches.refusal


def test_a_gather_by_indices_of_each_length_own_is_not_padded(backend):
    """``Gather(x, min(L, 8) - 1)`` along an axis of the instance's own: its index, folded for
    each length, would be given per mix padded to a chunk, and one Gather over the chunk reads
    one set of indices for all its instances (a review found it gave other values): refused."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 8] x) => (float[1, L, 1] y) {
        sh = Shape(x)
        n = Slice(sh, one, two)
        k = Min(n, cap)
        i = Sub(k, one)
        y = Gather<axis = 2>(x, i) }""", one=_I["one"], two=_I["two"], cap=np.array([8], np.int64))
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(21)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 8)).astype(np.float32)} for n in (5, 6, 3, 7)])
    assert "a Gather by indices or sizes of each length's own" in session.axis_batches.refusal


def test_an_integer_division_is_not_padded(backend):
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (int32[1, L, 4] x) => (int32[1, L, 4] c) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        d = Div(s, s)
        c = MatMul(d, x) }""")
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(15)
    assert_batched_equals_alone(session, [{"x": rng.integers(1, 5, (1, n, 4)).astype(np.int32)} for n in (3, 5, 1, 7)])
    assert "an integer Div" in session.axis_batches.refusal


@pytest.mark.parametrize("states", ["per length", "the instance's own"])
def test_a_recurrent_layer_with_initial_states_of_its_own_is_refused(backend, states):
    """The lowered layer starts from zeros: states that are not shared zeros are refused."""
    from tests.test_sequences import stated_model

    rng = np.random.default_rng(16)
    if states == "per length":
        model = _model("""<ir_version: 8, opset_import: ["" : 17]>
            g (float[L, 1, 3] x) => (float[L, 1, 1, 2] y) {
            sh = Shape(x)
            n = Slice(sh, zero, one)
            nf = Cast<to = 1>(n)
            h0 = Mul(ones, nf)
            y = LSTM<hidden_size = 2>(x, W, R, "", "", h0) }""",
                       W=rng.standard_normal((1, 8, 3)).astype(np.float32), R=rng.standard_normal((1, 8, 2)).astype(np.float32),
                       ones=np.ones((1, 1, 2), np.float32), zero=_I["zero"], one=_I["one"])
        batch = [{"x": rng.standard_normal((n, 1, 3)).astype(np.float32)} for n in (3, 5, 1, 7)]
    else:
        model = stated_model("GRU", "forward", rng)
        batch = [{"x": rng.standard_normal((n, 1, D)).astype(np.float32), "h0": rng.standard_normal((1, 1, 4)).astype(np.float32)}
                 for n in (3, 5, 1, 7)]
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, batch)
    assert session.stats.report.scheduler != "instance axis" and session.axis_batches.refusal


@pytest.mark.parametrize("body, folded", [
    ("normed = LayerNormalization<axis = -1>(table, scale, bias)\n        tied = Transpose<perm = [1, 0]>(normed)", True),
    ("wide = Add(column, row)\n        tied = Slice(wide, zero, four, zero)", False),  # ([V, 1] + [1, V]: not folded)
])
def test_what_the_model_computes_of_its_weights_alone_is_folded_unless_it_grows(backend, body, folded):
    """A LayerNorm of a weight (DeBERTa's relative embeddings) over ``FOLD_LIMIT``: folded, and
    the product by it a rows step (within 1e-5 of onnxruntime alone, which normalizes the weight
    in its own summation order). A sum that broadcasts two weights to a far bigger value is
    left computed (typing does not build it), and the model planned per mix: right results."""
    from autobatch.batcher.constants import FOLD_LIMIT

    words = FOLD_LIMIT // 4 + 1
    rng = np.random.default_rng(11)
    model = _model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, V] y) {{
        {body}
        y = MatMul(x, tied) }}""", table=rng.standard_normal((words, 4)).astype(np.float32),
                   scale=np.ones(4, np.float32), bias=np.zeros(4, np.float32),
                   column=rng.standard_normal((words, 1)).astype(np.float32)[:4],
                   row=rng.standard_normal((1, words)).astype(np.float32), zero=_I["zero"], four=np.array([4], np.int64))
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    # (the weight normalized once by NumPy; onnxruntime alone normalizes it in its own order)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (3, 7, 5)],
                                atol=1e-5)
    assert (session.stats.report.scheduler == "instance axis") == folded, session.axis_batches.refusal


def test_a_big_weight_rearranged_by_the_model_is_folded_once_and_read_as_a_weight(backend, monkeypatch):
    """A Transpose of a weight (dynamo's tied output projection) bigger than what typing folds
    from shapes: folded once for the model (every length's graph holds the same array), and
    the product by it a rows step, every mix planned once; a new length is checked without
    typing the model (the weight known, as the model's own, not evaluated again per length)."""
    from autobatch.batcher.constants import FOLD_LIMIT

    words = FOLD_LIMIT // 4 + 1
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, V] y) {
        tied = Transpose<perm = [1, 0]>(table)
        y = MatMul(x, tied) }""", table=np.random.default_rng(6).standard_normal((words, 4)).astype(np.float32))
    rng = np.random.default_rng(32)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    for lengths in ([3, 7, 5], [2, 6, 4, 1]):
        batch = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]
        assert_batched_equals_alone(session, batch)
        assert session.stats.report.scheduler == "instance axis", session.axis_batches.refusal
        assert session.stats.report.launches_by_op == {"MatMul": 1}
    typed = [session.instances.graph_of({"x": np.zeros((1, n, 4), np.float32)}) for n in (3, 7)]
    assert typed[0].values["tied"].const is typed[1].values["tied"].const
    monkeypatch.setattr(session.axis_batches.instances, "records_of", lambda feeds: 1 / 0)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (8, 9, 11)])
    assert session.stats.report.scheduler == "instance axis"


@pytest.mark.parametrize("node_level", [True, False])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_a_taggers_best_tag_of_each_row_is_row_wise(backend, op, node_level):
    """An ArgMax over the tags of each token (a tagger that returns its tags, int64): row-wise,
    one launch for every length, node-level or planned per mix; ties (tags drawn from few
    values) to the first, as alone."""
    model = _model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (int64[1, L] tags, int64[1, L, 1] kept) {{
        h = Floor(x)
        tags = {op}<axis = -1, keepdims = 0>(h)
        kept = {op}<axis = 2, select_last_index = 1>(h) }}""")
    rng = np.random.default_rng(33)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False, node_level=node_level)
    for lengths in ([3, 7, 5], [2, 6, 4, 1, 9]):
        batch = [{"x": rng.integers(-1, 2, (1, n, 4)).astype(np.float32)} for n in lengths]
        assert_batched_equals_alone(session, batch)
        report = session.stats.report
        assert (report.scheduler == "instance axis") == node_level, session.axis_batches.refusal
        assert report.launches_by_op[op] == 2


def _two_mixes_planned_once(model: onnx.ModelProto, backend: str, width: int) -> list[tuple[int, Any]]:
    """Two mixes of ``x [1, L, width]`` (the second of lengths never seen), each instance's own
    results, each mix run by the node-level plan: its chunks and its report, a mix each."""
    rng = np.random.default_rng(34)
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    reports = []
    for lengths in ([3, 7, 5], [9, 4, 11, 1, 6, 13, 8, 10, 3, 2]):
        assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, width)).astype(np.float32)}
                                              for n in lengths])
        assert session.stats.report.scheduler == "instance axis", session.axis_batches.refusal
        reports.append((math.ceil(len(lengths) / CHUNK), session.stats.report))
    return reports


def test_slices_of_each_rows_own_axes_run_on_rows_and_padded(backend):
    """Rotary embeddings' halves: a Slice along a row's own axis is row-wise (on rows), and one
    of a padded value (after the heads' Transpose: ``[1, H, L, d]``) slices the same axes one
    further right (given, negative, or by default from the first; a step of 2): every mix
    planned once. A Slice along the length is refused and planned per mix."""
    model = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 8] x) => (float[1, L, 8] y) {
        first = Slice(x, zero, four, two)
        second = Slice(x, four, eight, last)
        turned = Concat<axis = -1>(second, first)
        heads = Reshape(turned, split)
        t = Transpose<perm = [0, 2, 1, 3]>(heads)
        half = Slice(t, two, four, last)
        other = Slice(t, zero, two, last)
        both = Concat<axis = -1>(half, other)
        z = Slice(t, zero, big, last, two)
        w = Slice(t, zero2, big2)
        zz = Concat<axis = -1>(z, z)
        m = Add(w, zz)
        k = Transpose<perm = [0, 1, 3, 2]>(both)
        s = MatMul(both, k)
        p = Softmax(s)
        a = MatMul(p, m)
        back = Transpose<perm = [0, 2, 1, 3]>(a)
        y = Reshape(back, flat) }""", zero=_I["zero"], two=_I["two"], four=np.array([4], np.int64),
                   eight=np.array([8], np.int64), last=np.array([-1], np.int64), big=np.array([99], np.int64),
                   zero2=np.zeros(1, np.int64), big2=np.array([99], np.int64), split=np.array([1, -1, 2, 4], np.int64),
                   flat=np.array([1, -1, 8], np.int64))
    for chunks, report in _two_mixes_planned_once(model, backend, 8):
        assert report.launches_by_op["Slice"] == 2 + 4 * chunks
    rng = np.random.default_rng(34)
    along = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        first = Slice(s, zero, one, two)
        y = Mul(x, first) }""", zero=_I["zero"], one=_I["one"], two=_I["two"])
    session = autobatch.InferenceSession(along, backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (3, 7, 5)])
    assert session.stats.report.scheduler != "instance axis" and "Slice" in session.axis_batches.refusal


def _relative_scores(rest: str, top: int) -> onnx.ModelProto:
    """Attention scores plus scores by relative position (DeBERTa's): a table of each row, picked
    by indices made from the length (``i - j + 3`` clipped to ``0..top``), then ``rest``."""
    return _model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {{
        sh = Shape(x)
        n = Gather(sh, one0)
        r = Range(zero0, n, one0)
        a = Unsqueeze(r, one)
        b = Unsqueeze(r, zero)
        d = Sub(a, b)
        d3 = Add(d, three)
        c = Clip(d3, zero0, top)
        idx = Unsqueeze(c, zero)
        rel = MatMul(x, R)
        picked = GatherElements<axis = 2>(rel, idx)
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        scores = Add(s, picked){rest} }}""", one0=np.array(1, np.int64), zero0=np.array(0, np.int64),
                  three=np.array(3, np.int64), top=np.array(top, np.int64), ones2=np.ones(2, np.int64), **_I,
                  R=np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32))


def test_relative_positions_and_a_reshape_of_two_length_axes_run_padded(backend):
    """DeBERTa's disentangled attention: scores by relative position picked from a per-row table
    by indices made from the length (a GatherElements along the table's own axis, its indices
    given per mix, padded with 0); BLOOM's ALiBi: scores ``[1, L, L]`` reshaped to ``[1, 1, L, L]``
    (two length axes, the axes before them regrouped). Every mix planned once; a
    GatherElements along the length is refused, planned per mix."""
    model = _relative_scores("""
        n1 = Unsqueeze(n, zero)
        four_d = Concat<axis = 0>(ones2, n1, n1)
        s4 = Reshape(scores, four_d)
        p = Softmax(s4)
        x4 = Unsqueeze(x, zero)
        y4 = MatMul(p, x4)
        y = Squeeze(y4, zero)""", top=5)
    for chunks, report in _two_mixes_planned_once(model, backend, 4):
        assert report.launches_by_op["GatherElements"] == report.launches_by_op["Reshape"] == chunks
    rng = np.random.default_rng(35)
    along = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, L, 4] y) {
        k = Transpose<perm = [0, 2, 1]>(x)
        s = MatMul(x, k)
        i = Cast<to = 7>(s)
        z = Mul(i, zero0)
        picked = GatherElements<axis = 1>(s, z)
        y = MatMul(picked, x) }""", zero0=np.array(0, np.int64))
    session = autobatch.InferenceSession(along, backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (3, 7, 5)])
    assert session.stats.report.scheduler != "instance axis" and "GatherElements" in session.axis_batches.refusal


@pytest.mark.parametrize("dilation", [1, 2])
def test_a_convolution_along_the_length_runs_padded(backend, dilation):
    """A text CNN: a Conv along the length of ``[1, C, L]`` (as long as its input; its padded
    positions zeroed first, as the instance's own padding), on each chunk with the chunk as its
    batch, then a max over the length: every mix planned once. A Conv of stride 2 (its output
    not of the instance's length) is planned per mix."""
    model = _model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, 3] y, float[1, L, 6] h) {{
        t = Transpose<perm = [0, 2, 1]>(x)
        shifted = Add(t, half)
        c = Conv<kernel_shape = [3], pads = [{dilation}, {dilation}], dilations = [{dilation}]>(shifted, W, B)
        r = Relu(c)
        h = Transpose<perm = [0, 2, 1]>(r)
        m = ReduceMax<keepdims = 0, axes = [-1]>(r)
        y = MatMul(m, head) }}""", half=np.array(0.5, np.float32),
                   W=np.random.default_rng(8).standard_normal((6, 4, 3)).astype(np.float32),
                   B=np.random.default_rng(9).standard_normal(6).astype(np.float32),
                   head=np.random.default_rng(10).standard_normal((6, 3)).astype(np.float32))
    for chunks, report in _two_mixes_planned_once(model, backend, 4):
        assert report.launches_by_op["Conv"] == report.launches_by_op["ReduceMax"] == chunks
    strided = _model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 4] x) => (float[1, 6] y) {
        t = Transpose<perm = [0, 2, 1]>(x)
        c = Conv<kernel_shape = [3], pads = [1, 1], strides = [2]>(t, W)
        y = ReduceMax<keepdims = 0, axes = [-1]>(c) }""", W=np.random.default_rng(8).standard_normal((6, 4, 3)).astype(np.float32))
    session = autobatch.InferenceSession(strided, backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(36)
    assert_batched_equals_alone(session, [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (3, 7, 5)])
    assert session.stats.report.scheduler != "instance axis"


def test_gather_elements_indices_past_their_axis_fail_that_instance_alone_and_keep_the_plan(backend):
    """Relative positions clipped to 0..9 index a table of 6: in range up to length 3, past it
    at 5. The batch with a text of 5 fails (that text alone fails too) and is planned per mix;
    the node-level plan stays for the next batch (a review found it dropped for the session)."""
    model = _relative_scores("""
        p = Softmax(scores)
        y = MatMul(p, x)""", top=9)
    rng = np.random.default_rng(37)
    texts = lambda lengths: [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in lengths]  # noqa: E731
    session = autobatch.InferenceSession(model, backend=backend, alone_when_faster=False)
    assert_batched_equals_alone(session, texts([3, 2]))
    with pytest.raises(Exception):  # noqa: B017 - the instance's own error, whichever its backend raises
        session.run_batch(None, texts([2, 3, 5]))
    assert session.axis_batches.refusal is None
    assert_batched_equals_alone(session, texts([3, 2, 3, 1]))
    assert session.stats.report.scheduler == "instance axis"
