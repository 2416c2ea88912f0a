"""Traced batches on the one plan (``Batch``: ``batcher/flat.py`` plans straight
from the trace records, ``backends/flat_executor.py`` runs the plan).

Oracle: the batch and every instance traced alone and run unbatched (``tests.oracle.traced_alone``)
give equal results (DESIGN.md, correctness contract): exact for integers,
``rtol=1e-5, atol=1e-6`` for float32. Also: templates are cached across batches, duplicates run
once, batches the flat path does not cover fall back with a reason, errors stay clear, and
contiguous rows are read as views.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from autobatch import Batch, Parameter, TraceError, cell, ops
from autobatch.batcher import SCHEDULERS
from autobatch import batch as batch_module
from autobatch.batch import TRACED_TEMPLATES
from autobatch.batcher.plan import LITERALS, FlatPlan, Template, TemplateCache
from autobatch.datasets import Tree
from autobatch.frontends.cells import CELL_DOMAIN
from autobatch.frontends.tensors import attributes
from tests.cycles import no_cycles_left
from tests.example_models import model
from tests.oracle import assert_same, traced_alone

BACKENDS = ("numpy", "onnxruntime")


# ----------------------------------------------------------------------------- helpers
def assert_all_same(got, want, what=""):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        if isinstance(g, (list, tuple)):
            assert_all_same(g, w, f"{what} instance {k}")
        else:
            assert_same(g, w, what=f"{what} instance {k}")


def batched(fn, instances, backend="numpy", scheduler="level", reuse_calls=True):
    """``fn(batch, instance)`` -> a tensor or a list of tensors, for every instance in one
    batch. Returns (per-instance values as copies, the batch)."""
    with Batch(backend=backend, scheduler=scheduler, reuse_calls=reuse_calls) as batch:
        outs = [fn(batch, x) for x in instances]
        flat_outs = [t for o in outs for t in (o if isinstance(o, (list, tuple)) else [o])]
        values = [np.array(v) for v in batch.run(flat_outs)]
    result, k = [], 0
    for o in outs:
        n = len(o) if isinstance(o, (list, tuple)) else 1
        result.append(values[k:k + n] if isinstance(o, (list, tuple)) else values[k])
        k += n
    return result, batch


def alone(fn, instances):
    return [traced_alone(fn, x) for x in instances]


def assert_flat_ran(batch):
    assert isinstance(batch.last_plan, FlatPlan)
    assert batch.reports[-1] is batch.last_plan.report
    report = batch.last_plan.report
    assert set(report.seconds) == {"analyse", "schedule", "plan"}
    assert set(report.execution) == {"gather", "kernels", "scatter"}
    assert all(seconds >= 0 for seconds in report.execution.values())


# ----------------------------------------------------------------------------- 1. the examples
EXAMPLES = ("tree_lstm", "bilstm_tagger")
_alone: dict = {}


def example_alone(name, form):
    key = (name, form)
    if key not in _alone:
        module, instances, params = model(name)
        loss = module.LOSSES[form]
        _alone[key] = alone(lambda batch, x: loss(x, params), instances)
    return _alone[key]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["primitive", "cells"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_batched_equal_alone(name, form, backend):
    module, instances, params = model(name)
    loss = module.LOSSES[form]
    fn = lambda batch, x: loss(x, params)
    on_flat, flat_batch = batched(fn, instances, backend=backend)
    one_by_one = example_alone(name, form)

    assert_flat_ran(flat_batch)
    assert len({float(v) for v in one_by_one}) == len(one_by_one), "instances should differ"
    assert_all_same(on_flat, one_by_one, "flat vs alone")

    flat_report = flat_batch.last_plan.report
    assert flat_report.lower_bound <= flat_report.launches < flat_report.nodes
    assert flat_report.fallback_nodes == 0


@pytest.mark.parametrize("form", ["primitive", "cells", "fold"])
def test_a_traced_batchs_plan_as_one_onnx_model_computes_what_the_batch_does(form):
    """``Batch.plan_model``: the plan of pending tensors lowered to one ONNX model (the demo
    writes it), tree folds included; onnxruntime's run of it gives every tree's loss."""
    import onnx
    import onnxruntime

    module, trees, params = model("tree_lstm")
    loss = module.LOSSES[form]
    with Batch() as batch:
        losses = [loss(t, params) for t in trees]
        lowered = batch.plan_model(losses)
        got = batch.run(losses)
    onnx.checker.check_model(lowered, full_check=True)
    assert not lowered.graph.input and [o.name for o in lowered.graph.output] == [t.name for t in losses]
    session = onnxruntime.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_all_same(session.run(None, {}), got, "the lowered plan on onnxruntime vs the batch")
    assert_all_same(got, example_alone("tree_lstm", "cells" if form == "fold" else form))  # a fold computes the cells
    with Batch() as batch, pytest.raises(TraceError, match="pending tensors"):
        done = loss(trees[0], params)
        batch.run([done])
        batch.plan_model([done])


@pytest.mark.parametrize("task,form", [("tree_lstm", "primitive"), ("tree_lstm", "cells"), ("tree_lstm", "fold"),
                                       ("bilstm_tagger", "sequences")])
def test_a_traced_batch_asked_runs_its_plan_as_one_session_with_bound_values(task, form):
    """Asked for (``whole_plan``), a traced batch runs its plan lowered to one onnxruntime
    session, its feeds and outputs bound (IOBinding) so that on CUDA every value between steps
    stays on the device; here on the CPU provider. Each instance's result equals the batch run
    step by step and the instance traced alone."""
    module, instances, params = model(task)
    loss = module.LOSSES[form]
    assert not Batch(backend="onnxruntime").whole_plan and not Batch(whole_plan=True).whole_plan  # NumPy: steps
    with Batch(backend="onnxruntime", whole_plan=True) as whole:
        got = whole.run([loss(x, params) for x in instances])
    execution = whole.reports[-1].execution
    assert set(execution) == {"whole plan session", "whole plan run"}, execution
    with Batch(backend="onnxruntime") as stepwise:
        want = stepwise.run([loss(x, params) for x in instances])
    assert "whole plan run" not in stepwise.reports[-1].execution
    assert_all_same(got, want, "one session vs step by step")
    assert_all_same(got, example_alone(task, "cells" if form == "fold" else form))


def test_a_traced_batch_reading_a_call_traced_twice_runs_as_one_session():
    """A call traced again gives new tensors of its outputs' names: the lowered model names each
    output once, and both tensors get the value."""
    W = Parameter(np.eye(3, dtype=np.float32) * 2)
    with Batch(backend="onnxruntime", whole_plan=True) as batch:
        x = batch.constant(np.arange(3, dtype=np.float32))
        first, again = ops.matmul(x, W), ops.matmul(x, W)
        assert first.name == again.name and first is not again
        got = batch.run([first, again])
    assert batch.reused_calls == 1 and "whole plan run" in batch.reports[-1].execution
    assert_all_same(got, [np.arange(3, dtype=np.float32) * 2] * 2)


# ----------------------------------------------------------------------------- 2. random programs
D = 4  # width of every per-instance value
K = 3  # a small shared part (baked into templates)
KB = 70  # a large shared part (> flat.BAKED_SIZE: fed to templates at run time)
VOCAB = 6
_rng = np.random.default_rng(20240611)


def _f32(*shape, scale=1.0):
    return (_rng.uniform(-1, 1, shape) * scale).astype(np.float32)


F = {
    "W": Parameter(_f32(D, D, scale=0.6), name="flat_W"),
    "P": Parameter(_f32(K), name="flat_P"),
    "C": Parameter(_f32(D + K, D, scale=0.5), name="flat_C"),
    "PB": Parameter(_f32(KB, scale=0.3), name="flat_PB"),
    "CB": Parameter(_f32(D + KB, D, scale=0.15), name="flat_CB"),
    "E": Parameter(_f32(VOCAB, D), name="flat_E"),
    "S": Parameter(_f32(D), name="flat_S"),
}
I = {
    "W": Parameter(_rng.integers(-2, 3, (D, D)).astype(np.int64), name="int_W"),
    "P": Parameter(_rng.integers(-3, 4, K).astype(np.int64), name="int_P"),
    "C": Parameter(_rng.integers(-1, 2, (D + K, D)).astype(np.int64), name="int_C"),
    "PB": Parameter(_rng.integers(-3, 4, KB).astype(np.int64), name="int_PB"),
    "CB": Parameter(_rng.integers(-1, 2, (D + KB, D)).astype(np.int64), name="int_CB"),
    "E": Parameter(_rng.integers(-5, 6, (VOCAB, D)).astype(np.int64), name="int_E"),
    "S": Parameter(_rng.integers(-3, 4, D).astype(np.int64), name="int_S"),
}


@cell
def f_step(x, h):
    return ops.tanh(ops.matmul(x, F["W"]) + h)


@cell
def f_cat(x):  # Concat with a shared part inside a cell: the part is broadcast to N rows
    return ops.matmul(ops.concat([x, F["P"]]), F["C"])


@cell
def i_step(x, h):
    return ops.matmul(x, I["W"]) - h


@cell
def i_cat(x):
    return ops.matmul(ops.concat([x, I["P"]]), I["C"])


CELLS = {"float32": (f_step, f_cat), "int64": (i_step, i_cat)}
PARAMS = {"float32": F, "int64": I}
OPS = ("unary", "binary", "matmul", "concat", "concat_big", "esum", "esum_shared", "cell", "cell_cat",
       "dup", "scale", "lookup", "square", "force")


def trace_program(batch, program, dtype):
    """Trace one instance: ``program`` is (inputs, steps); returns every step's value."""
    inputs, steps = program
    p = PARAMS[dtype]
    step_cell, cat_cell = CELLS[dtype]
    values = [batch.constant(x) for x in inputs]
    for op, a, b, k in steps:
        x, y = values[a % len(values)], values[b % len(values)]
        if op == "unary":
            fns = [ops.neg] if dtype == "int64" else [ops.tanh, ops.sigmoid, ops.relu, ops.neg]
            v = fns[k % len(fns)](x)
        elif op == "binary":
            v = [ops.add, ops.mul, ops.sub][k % 3](x, y)
        elif op == "matmul":
            v = ops.matmul(x, p["W"])
        elif op == "concat":
            v = ops.matmul(ops.concat([x, p["P"]]) if k % 2 else ops.concat([p["P"], x]), p["C"])
        elif op == "concat_big":
            v = ops.matmul(ops.concat([x, p["PB"]]), p["CB"])
        elif op == "esum":  # a sum of a variable number of per-instance terms
            v = ops.esum([values[(a + j * (b % 2 + 1)) % len(values)] for j in range(2 + k % 4)])
        elif op == "esum_shared":  # a shared term: not the "sum of terms" class
            v = ops.esum([x, p["S"], y])
        elif op == "cell":
            v = step_cell(x, y)
        elif op == "cell_cat":
            v = cat_cell(x)
        elif op == "dup":  # all inputs shared: one op for every instance
            v = ops.mul(x, ops.neg(p["S"]) if dtype == "int64" else ops.tanh(p["S"]))
        elif op == "scale":  # a Python scalar: a literal of each instance
            v = ops.mul(x, (k % 3) + 2 if dtype == "int64" else 0.5 + 0.25 * (k % 3))
        elif op == "lookup":  # a shared table read at a per-instance index
            v = ops.lookup(p["E"], batch.constant((a + k) % VOCAB, dtype=np.int64))
        elif op == "force":  # a value needed mid-way: what is pending runs, later runs read it as data
            x.numpy()
            v = ops.add(x, y)
        else:
            assert op == "square"
            v = ops.square(x)
        values.append(v)
    return values[len(inputs):]


@st.composite
def programs(draw):
    """(dtype, scheduler, one program per instance): structures differ per instance."""
    dtype = draw(st.sampled_from(["float32", "int64"]))
    scheduler = draw(st.sampled_from(sorted(SCHEDULERS)))
    count = draw(st.integers(2, 5))
    same_structure = draw(st.booleans())  # then every instance batches with every other
    result = []
    for _ in range(count):
        n_inputs = draw(st.integers(1, 2))
        seed = draw(st.integers(0, 2**16))
        rng = np.random.default_rng(seed)
        if dtype == "float32":
            inputs = [rng.uniform(-1, 1, D).astype(np.float32) for _ in range(n_inputs)]
        else:
            inputs = [rng.integers(-4, 5, D).astype(np.int64) for _ in range(n_inputs)]
        if same_structure and result:
            steps = result[0][1]
        else:
            steps = draw(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.integers(0, 7),
                                            st.integers(0, 11)), min_size=1, max_size=7))
        result.append((inputs, steps))
    return dtype, scheduler, result


# AUTOBATCH_PROPERTY_EXAMPLES=1000 for a longer hunt.
@settings(max_examples=int(os.environ.get("AUTOBATCH_PROPERTY_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_batched_equal_alone(case):
    dtype, scheduler, instances = case
    fn = lambda batch, program: trace_program(batch, program, dtype)
    one_by_one = alone(fn, instances)
    # Two batches of different sizes: a template made for one N (Concat broadcasts a shared
    # part to N rows) must also be right for another.
    for subset in (instances, instances[1:]):
        want = one_by_one[len(instances) - len(subset):]
        for backend in BACKENDS:
            if backend == "onnxruntime" and dtype == "int64" and any(
                    op.startswith("esum") for _, steps in subset for op, *_ in steps):
                continue  # onnxruntime has no int64 Sum kernel (on either path)
            on_flat, batch = batched(fn, subset, backend=backend, scheduler=scheduler)
            assert_flat_ran(batch)
            assert_all_same(on_flat, want, f"flat on {backend} vs alone ({len(subset)} instances)")


def _pick_cell_opset10():
    """An ONNX cell whose body is a Gather at opset 10: picking from per-instance data at a
    per-instance index, a rule that reads N (templates are kept per N)."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "index"], ["picked"], axis=0)], "pick10",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [D]),
         helper.make_tensor_value_info("index", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [])])
    return cell.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)]))


PICK10 = _pick_cell_opset10()


def test_shared_parts_and_per_size_templates_at_several_sizes():
    """Concat of a per-instance value with a shared Parameter (small: baked; large: fed), in a
    cell too, and a rule that reads N, in batches of 1..5 instances, alternating sizes so that
    a template kept for the wrong N would be used."""
    def fn(batch, x):
        return [ops.concat([batch.constant(x), F["P"]]), ops.concat([F["PB"], ops.tanh(batch.constant(x))]),
                f_cat(batch.constant(x)), PICK10(batch.constant(x), batch.constant(int(x[0] > 0) + 1))]

    data = [_f32(D) for _ in range(5)]
    for n in (3, 5, 1, 3, 2, 5):
        for backend in BACKENDS:
            got, batch = batched(fn, data[:n], backend=backend)
            assert_flat_ran(batch)
            for k, (c1, c2, c3, c4) in enumerate(got):
                assert_same(c1, np.concatenate([data[k], F["P"].array]), what=f"n={n} {k}")
                assert_same(c2, np.concatenate([F["PB"].array, np.tanh(data[k])]), what=f"n={n} {k}")
                want = np.concatenate([data[k], F["P"].array]) @ F["C"].array
                assert_same(c3, want, what=f"n={n} {k}")
                assert_same(c4, data[k][int(data[k][0] > 0) + 1], what=f"n={n} {k}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sums_of_a_variable_number_of_terms(backend):
    """One launch sums every instance's terms, whatever their number; terms made by several
    earlier steps, literals, repeated terms. Float sums only: integer sums are not this class."""
    counts = [2, 5, 3, 2, 4]
    data = [[_f32(D) for _ in range(n)] for n in counts]

    def fn(batch, xs):
        terms = [batch.constant(x) for x in xs]
        computed = [ops.tanh(t) if j % 2 else ops.matmul(t, F["W"]) for j, t in enumerate(terms)]
        return [ops.esum(computed), ops.esum(terms), ops.esum([computed[0], terms[-1], computed[0]])]

    def reference(xs):
        computed = [np.tanh(x) if j % 2 else x @ F["W"].array for j, x in enumerate(xs)]
        return [sum(computed[1:], computed[0]), sum(xs[1:], xs[0]), computed[0] + xs[-1] + computed[0]]

    got, batch = batched(fn, data, backend=backend)
    assert_flat_ran(batch)
    sums = [s for s in batch.last_plan.steps if s.template is None]
    # one class, however many terms: at most a launch per dependency level, 15 sums in all
    assert 1 <= len(sums) <= 2 and sum(s.size for s in sums) == 3 * len(data)
    assert any(len(set(np.diff(s.offsets))) > 1 for s in sums)  # members of different term counts
    for values, xs in zip(got, data):
        assert_all_same(values, reference(xs))
    assert_all_same(got, alone(fn, data))


# ----------------------------------------------------------------------------- 3. template cache
RW = Parameter(_f32(D, D, scale=0.5), name="rnn_W")
RU = Parameter(_f32(D, D, scale=0.5), name="rnn_U")
RB = Parameter(_f32(D, scale=0.2), name="rnn_b")


def rnn(batch, sequence):
    """An LSTM-like chain over one sequence (primitive ops)."""
    h = batch.constant(np.zeros(D, np.float32))
    for x in sequence:
        h = ops.tanh(ops.matmul(h, RW) + ops.affine(batch.constant(x), RU, RB))
    return h


def rnn_reference(sequence):
    h = np.zeros(D, np.float32)
    for x in sequence:
        h = np.tanh(h @ RW.array + (x @ RU.array + RB.array))
    return h


def sequences(lengths, seed):
    rng = np.random.default_rng(seed)
    return [[rng.uniform(-1, 1, D).astype(np.float32) for _ in range(n)] for n in lengths]


def _template_state():
    """Every cached template and its prepared runners, by identity."""
    return {k: (id(t), {b: id(r) for b, r in t.runners.items()})
            for k, t in TRACED_TEMPLATES.templates.items() if isinstance(t, Template)}


def _plan_templates(batch):
    return {id(s.template) for s in batch.last_plan.steps if s.template is not None}


@pytest.mark.parametrize("backend", BACKENDS)
def test_templates_are_cached_across_batches(backend):
    batched(rnn, sequences([2, 3, 1], seed=1), backend=backend)  # warm: whatever ran before
    second, batch2 = batched(rnn, sequences([4, 1, 3, 3], seed=2), backend=backend)
    assert_flat_ran(batch2)
    assert_all_same(second, [rnn_reference(s) for s in sequences([4, 1, 3, 3], seed=2)])
    size, state = len(TRACED_TEMPLATES.templates), _template_state()
    third_data = sequences([5, 2, 2, 6, 1], seed=3)  # other instances, another N, other lengths
    third, batch3 = batched(rnn, third_data, backend=backend)
    assert_flat_ran(batch3)
    assert len(TRACED_TEMPLATES.templates) == size, "a later batch of the same model built a template"
    assert _template_state() == state, "a later batch replaced a template or prepared a runner again"
    live = {id_ for id_, _ in state.values()}
    assert _plan_templates(batch3) <= live and _plan_templates(batch3) == _plan_templates(batch2)
    for value, sequence in zip(third, third_data):
        assert_same(value, rnn_reference(sequence))
    for step in batch3.last_plan.steps:
        assert step.template is None or len(step.template.runners) >= 1


def test_cached_templates_keep_the_functions_their_keys_name_alive():
    """A template key holds a cell function's id: the cache keeps that function alive, so a new
    function can never be given the id of one whose entries are still cached."""
    module, trees, params = model("tree_lstm")
    _, batch = batched(lambda batch, t: module.loss_cells(t, params), trees)
    assert_flat_ran(batch)
    cell_keys = [key for key in TRACED_TEMPLATES.templates if key[0] == CELL_DOMAIN]
    assert cell_keys
    for key in cell_keys:
        assert id(TRACED_TEMPLATES.functions[key[4]]) == key[4]


def _relabelled(tree: Tree, words: dict[str, str]) -> Tree:
    """Another instance of the same shape: other labels and words."""
    if tree.is_leaf:
        return dataclasses.replace(tree, label=(tree.label + 1) % 5, word=words[tree.word])
    return dataclasses.replace(tree, label=(tree.label + 2) % 5, left=_relabelled(tree.left, words),
                               right=_relabelled(tree.right, words))


@pytest.mark.parametrize("form", ["primitive", "cells"])
def test_tree_lstm_templates_are_cached_across_batches(form):
    module, trees, params = model("tree_lstm")
    loss = module.LOSSES[form]
    fn = lambda batch, t: loss(t, params)
    words = sorted({leaf.word for t in trees for leaf in t.leaves()})
    other = [_relabelled(t, dict(zip(words, words[1:] + words[:1]))) for t in trees]
    batched(fn, trees)  # warm
    first, batch = batched(fn, other)
    assert_flat_ran(batch)
    size, state = len(TRACED_TEMPLATES.templates), _template_state()
    again, batch = batched(fn, trees)  # different instances of the same shapes
    assert_flat_ran(batch)
    assert len(TRACED_TEMPLATES.templates) == size and _template_state() == state
    assert_all_same(again, example_alone("tree_lstm", form))
    assert any(not np.allclose(a, b) for a, b in zip(first, again)), "relabelled trees should differ"


# ----------------------------------------------------------------------------- 4. duplicates
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("instances", [1, 2, 5])
@pytest.mark.parametrize("reuse_calls", [True, False])
def test_ops_on_shared_values_only_run_once(backend, instances, reuse_calls):
    S, W = F["S"], F["W"]
    data = [_f32(D) for _ in range(instances)]

    def fn(batch, x):
        shared = ops.tanh(S)  # traced by every instance, the same value
        return [ops.matmul(batch.constant(x) * shared, W), shared]

    got, batch = batched(fn, data, backend=backend, reuse_calls=reuse_calls)
    assert_flat_ran(batch)
    report = batch.last_plan.report
    assert report.launches == 3
    once = [s for s in batch.last_plan.steps if s.template is not None and s.template.once]
    if reuse_calls:  # traced once: the later calls returned the first call's tensor
        assert batch.reused_calls == instances - 1 and report.nodes == 2 * instances + 1
        assert report.merged_duplicates == 0
    else:  # traced by every instance, and merged by the planner: one launch that writes one row
        assert batch.reused_calls == 0 and report.nodes == 3 * instances
        assert report.merged_duplicates == instances - 1
        assert len(once) == 1 and once[0].size == instances and len(once[0].writes) == 1
    for (value, shared), x in zip(got, data):
        assert_same(shared, np.tanh(S.array))
        assert_same(value, (x * np.tanh(S.array)) @ W.array)
    assert_all_same(got, alone(fn, data))


@pytest.mark.parametrize("reuse_calls", [True, False])
def test_duplicate_cells_and_multi_output_ops_on_shared_values(reuse_calls):
    """A cell and a Slice whose inputs are all shared run once; a Split of that Slice's value
    and the per-instance ops reading these values get every instance's right values."""
    data = [_f32(D) for _ in range(4)]

    def fn(batch, x):
        a, b, c = ops.split(ops.index(F["PB"], slice(0, 6)), 3)  # Slice + Split of a shared weight
        return [f_step(F["S"], F["S"]), ops.concat([a, batch.constant(x), c]), b]

    got, batch = batched(fn, data, reuse_calls=reuse_calls)
    assert_flat_ran(batch)
    if reuse_calls:  # the cell, the Slice and the Split are traced once, by the first instance
        assert batch.reused_calls == 3 * (len(data) - 1) and batch.last_plan.report.merged_duplicates == 0
    else:
        # the cell and the Slice merge; the Split reads the Slice's output, which counts as a
        # value of each instance, so it is batched over copies of one row
        assert batch.last_plan.report.merged_duplicates == 2 * (len(data) - 1)
    assert_all_same(got, alone(fn, data))


# ----------------------------------------------------------------------------- 5. fallback
@pytest.mark.parametrize("backend", BACKENDS)
def test_op_without_a_rule_runs_alone_on_the_flat_path(backend):
    data = [np.arange(D, dtype=np.float32) + k for k in range(3)]

    def fn(batch, x):
        t = batch.constant(x)
        summed = batch.record("CumSum", [t, batch.shared_constant(0)], [(D,)], [np.dtype(np.float32)])[0]
        return [summed, ops.tanh(summed)]

    for _ in range(2):  # the second time the rule's absence comes from the template cache
        got, batch = batched(fn, data, backend=backend)
        assert_flat_ran(batch)
        report = batch.reports[-1]
        assert report.fallback_nodes == len(data) and report.launches == len(data) + 1  # CumSums, one Tanh
        for (summed, tanh), x in zip(got, data):
            assert_same(summed, np.cumsum(x))
            assert_same(tanh, np.tanh(np.cumsum(x)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nondeterministic_op_runs_alone_on_the_flat_path(backend):
    data = [_f32(D) for _ in range(3)]
    with Batch(backend=backend) as batch:
        outs = []
        shared = batch.parameter(F["S"])  # identical inputs: merged, were the op deterministic
        for x in data:
            noise = batch.record("RandomNormalLike", [shared], [(D,)], [np.dtype(np.float32)])[0]
            outs.append([noise, ops.matmul(batch.constant(x), F["W"])])
        values = batch.run([o for pair in outs for o in pair])
        assert_flat_ran(batch)
        assert batch.reports[-1].fallback_nodes == len(data) and batch.reports[-1].merged_duplicates == 0
        noises = [values[2 * k] for k in range(len(data))]
        assert all(n.shape == (D,) and n.dtype == np.float32 and np.all(np.isfinite(n)) for n in noises)
        assert len({n.tobytes() for n in noises}) == len(data)  # a draw each
        for k, x in enumerate(data):
            assert_same(values[2 * k + 1], x @ F["W"].array)


def test_values_without_an_arena_are_loose_on_the_flat_path():  # NumPy: onnxruntime's CPU Cast takes no float8
    backend = "numpy"
    ml_dtypes = pytest.importorskip("ml_dtypes")
    float8 = np.dtype(ml_dtypes.float8_e4m3fn)
    data = [np.array([0.5, 1.0, 1.5, 2.0], np.float32) * (k + 1) for k in range(3)]
    with Batch(backend=backend) as batch:
        outs = []
        for x in data:
            low = batch.record("Cast", [batch.constant(x)], [(D,)], [float8], attributes(to=TensorProto.FLOAT8E4M3FN))[0]
            outs.append(batch.record("Cast", [low], [(D,)], [np.dtype(np.float32)], attributes(to=TensorProto.FLOAT))[0])
        values = batch.run(outs)
        assert_flat_ran(batch)
        # float8 values are kept one by one (NumPy holds them only through ml_dtypes): each Cast
        # that makes or reads one runs alone, and the report says why.
        assert batch.reports[-1].alone == {"Cast: FLOAT8E4M3FN[4] values are not stacked": 6}
        for value, x in zip(values, data):
            assert_same(value, x.astype(float8).astype(np.float32))


# ----------------------------------------------------------------------------- 6. errors
@pytest.mark.parametrize("backend", BACKENDS)
def test_trace_errors_are_clear_and_the_batch_stays_usable(backend):
    x = _f32(D)
    with Batch(backend=backend) as batch:
        h = ops.tanh(batch.constant(x))
        with pytest.raises(TraceError, match=r"MatMul.*\(4,\).*\(3,\)"):
            ops.matmul(h, batch.constant(_f32(3)))
        with pytest.raises(TraceError, match=r"Add.*do not broadcast"):
            ops.add(h, batch.constant(_f32(3)))
        with pytest.raises(TraceError, match="Concat"):
            ops.concat([h, batch.constant(_f32(2, 2))])
        with pytest.raises(TraceError, match="dtypes"):
            ops.add(h, batch.constant(np.arange(D)))
        with pytest.raises(TraceError, match="out of range"):
            ops.pick(h, 7)
        out = ops.matmul(h, F["W"])
        assert_same(out.numpy(), np.tanh(x) @ F["W"].array)
        assert_flat_ran(batch)
        again = ops.relu(out)  # a known value as data of a later run
        assert_same(again.numpy(), np.maximum(np.tanh(x) @ F["W"].array, 0))
        assert_flat_ran(batch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_run_names_the_op_and_leaves_the_batch_usable(backend):
    with Batch(backend=backend) as batch:
        bad = ops.lookup(F["E"], batch.constant(VOCAB + 3, dtype=np.int64))  # out of range at run time
        good = ops.tanh(batch.constant(_f32(D)))
        with pytest.raises(Exception, match="Gather") as error:
            batch.run([bad, good])
        assert "out of" in str(error.value) or "bounds" in str(error.value)
        assert not batch.reports  # a failed run reports nothing
        with pytest.raises(TraceError, match="discarded"):  # what was pending is gone, and says so
            ops.tanh(good)
        x = _f32(D)
        out = ops.tanh(batch.constant(x))
        assert_same(out.numpy(), np.tanh(x))
        assert_flat_ran(batch)


# ----------------------------------------------------------------------------- 7. views
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_contiguous_rows_are_read_as_views(scheduler):
    data = sequences([4, 4, 4, 4, 4], seed=7)  # equal lengths: each step reads the last one's rows
    got, batch = batched(rnn, data, scheduler=scheduler)
    assert_flat_ran(batch)
    plan = batch.last_plan
    report = plan.report
    assert report.gathers_avoided > 0
    reads = [rows for step in plan.steps for _, rows in step.reads]
    assert report.gathers_avoided == sum(isinstance(r, slice) for r in reads)
    assert report.gathers == len(reads) - report.gathers_avoided
    # contiguous rows in order are never gathered (a list names literals, stacked from their values)
    for step in plan.steps:
        for _, rows in step.reads:
            if isinstance(rows, np.ndarray):
                assert not np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows))), rows
    # the chain reads the rows the step before wrote: Tanh reads Add's (4 steps), MatMul(h, W)
    # reads Tanh's (3 steps), as views
    written = {(arena, start, step.size) for step in plan.steps for arena, start in step.writes}
    chained = [rows for step in plan.steps for arena, rows in step.reads
               if isinstance(rows, slice) and (arena, rows.start, rows.stop - rows.start) in written]
    assert len(chained) >= 2 * 4 - 1
    for value, sequence in zip(got, data):
        assert_same(value, rnn_reference(sequence))


def test_gathered_rows_are_right_when_not_contiguous():
    """Reading the instances' values in another order than they were written is a gather
    (one ``take``), and results stay right."""
    data = [_f32(D) for _ in range(4)]
    with Batch() as batch:
        hs = [ops.tanh(batch.constant(x)) for x in data]
        mixed = [ops.mul(hs[k], hs[len(hs) - 1 - k]) for k in range(len(hs))]
        values = batch.run(mixed)
    assert_flat_ran(batch)
    assert batch.last_plan.report.gathers >= 1
    for k, value in enumerate(values):
        assert_same(value, np.tanh(data[k]) * np.tanh(data[len(data) - 1 - k]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_literals_are_stacked_from_their_values_and_placed_only_beside_computed_values(backend):
    """An operand whose members all read known values stacks them straight from those values
    (no arena rows); one that mixes known and computed values reads them from an arena, where
    the known ones get rows of their own."""
    data = [_f32(D) for _ in range(4)]
    with Batch(backend=backend) as batch:
        known = [batch.constant(x) for x in data]
        squares = [ops.mul(x, x) for x in known]  # reads literals only
        mixed = [ops.add(squares[k] if k % 2 else known[k], known[3 - k]) for k in range(4)]  # both kinds
        values = batch.run(mixed)
    assert_flat_ran(batch)
    plan = batch.last_plan
    square_step = next(step for step in plan.steps if step.template is not None and step.template.graph.name.endswith("Mul"))
    assert all(arena == LITERALS for arena, _ in square_step.reads)
    placed = {name for _, _, names in plan.literal_runs for name in names}
    assert placed == {known[k].name for k in (0, 2)}  # the ones read beside computed values
    for k, value in enumerate(values):
        first = data[k] * data[k] if k % 2 else data[k]
        assert_same(value, first + data[3 - k])


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_and_boolean_values_are_exact(backend):
    """Integer arithmetic, comparisons to booleans and casts back, batched = alone, exactly."""
    data = [np.arange(D, dtype=np.int64) * (k - 2) for k in range(5)]

    def fn(batch, x):
        t = batch.constant(x)
        product = ops.matmul(t * 3 - 1, I["W"])
        big = batch.record("Greater", [product, batch.constant(np.zeros(D, np.int64))], [(D,)],
                           [np.dtype(bool)])[0]
        flipped = batch.record("Not", [big], [(D,)], [np.dtype(bool)])[0]
        back = batch.record("Cast", [flipped], [(D,)], [np.dtype(np.int64)], attributes(to=TensorProto.INT64))[0]
        return [product, big, flipped, back + product]

    got, batch = batched(fn, data, backend=backend)
    assert_flat_ran(batch)
    for values, x in zip(got, data):
        product = (x * 3 - 1) @ I["W"].array
        assert_all_same(values, [product, product > 0, product <= 0, (product <= 0).astype(np.int64) + product])
    assert_all_same(got, alone(fn, data))


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_values(backend):
    W64 = Parameter(_rng.standard_normal((D, D)), name="W64")
    data = [[_rng.standard_normal(D) for _ in range(n)] for n in (1, 3, 2)]

    def fn(batch, xs):
        terms = [ops.tanh(ops.matmul(batch.constant(x, dtype=np.float64), W64)) for x in xs]
        return ops.esum(terms) if len(terms) > 1 else terms[0]

    got, batch = batched(fn, data, backend=backend)
    assert_flat_ran(batch)
    for value, xs in zip(got, data):
        assert value.dtype == np.float64
        np.testing.assert_allclose(value, sum(np.tanh(x @ W64.array) for x in xs), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- regressions
# A rank-0 value came back as a NumPy scalar copied out of its arena, not a 0-d array.
@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_0_values_are_arrays(backend):
    def fn(batch, x):
        return ops.reduce_sum(batch.constant(x))

    data = [_f32(D) for _ in range(3)]
    with Batch(backend=backend) as batch:
        flat_values = batch.run([fn(batch, x) for x in data])
    assert_flat_ran(batch)
    assert all(type(v) is np.ndarray and v.shape == () for v in flat_values), [type(v) for v in flat_values]


# A cache overflow between signing a class whose rule reads N and planning its step stored the
# template built for one N under the size-less key; a later batch of another N reused it.
def test_per_size_template_survives_a_cache_overflow(monkeypatch):
    # An overflow on every new template (and no template made for the wrong N left to later tests).
    monkeypatch.setattr(batch_module, "TRACED_TEMPLATES", TemplateCache(size=1))

    def fn(batch, x):  # a class whose rule reads N, then another class
        return ops.tanh(PICK10(batch.constant(x), batch.constant(2)))

    data = [_f32(D) for _ in range(6)]
    for n in (4, 6):
        got, batch = batched(fn, data[:n])
        assert_flat_ran(batch)
        for k, value in enumerate(got):
            assert_same(value, np.tanh(data[k][2]))


# ----------------------------------------------------------------------------- pruning, discarded values
@pytest.mark.parametrize("backend", BACKENDS)
def test_records_leading_to_no_held_value_are_not_run(backend):
    W = F["W"]
    with Batch(backend=backend) as batch:
        kept = [ops.tanh(ops.matmul(batch.constant(_f32(D)), W)) for _ in range(3)]
        for _ in range(5):  # computed, then dropped by the caller before the run
            ops.sigmoid(ops.matmul(batch.constant(_f32(D)), W))
        values = batch.run(kept)
    assert_flat_ran(batch)
    assert batch.reports[-1].nodes == 2 * len(kept)  # MatMul and Tanh of each kept value only
    assert all(v.shape == (D,) for v in values)


def test_reading_a_discarded_value_is_a_clear_error_and_the_batch_stays_usable():
    with Batch() as batch:
        lost = ops.tanh(batch.constant(_f32(D)))
        batch.discard()
        with pytest.raises(TraceError, match="discarded"):
            ops.sigmoid(lost)
        x = _f32(D)
        assert_same(batch.run([ops.tanh(batch.constant(x))])[0], np.tanh(x))


@cell
def noisy(x):  # a cell calling a random op: every call must draw anew
    from autobatch.frontends import current_batch

    return current_batch().record("RandomNormalLike", [x], [x.shape], [x.dtype])[0] + x


def test_a_cell_calling_a_random_op_is_neither_batched_nor_merged():
    with Batch() as batch:
        shared = batch.parameter(F["S"])  # the same input for every instance: duplicates, if random were ignored
        draws = batch.run([noisy(shared) for _ in range(4)])
    report = batch.reports[-1]
    assert report.merged_duplicates == 0 and report.launches == 4 == report.fallback_nodes
    assert len({v.tobytes() for v in draws}) == 4  # four independent draws


def test_a_full_template_cache_keeps_its_most_recently_used_half():
    """A server's templates (each with its prepared onnxruntime session) must not all go at once:
    a full cache keeps the half used last; seen functions past its size empty it (a function's id
    may be reused once it is gone, and keys hold ids)."""
    cache = TemplateCache(size=4)
    for k in range(4):
        cache.templates[("op", k)] = f"template {k}"
    assert cache.templates[("op", 0)] == "template 0" and cache.templates.get(("op", 1)) == "template 1"
    cache.make_room()
    assert list(cache.templates) == [("op", 0), ("op", 1)]  # read last; 2 and 3 went
    cache.make_room()  # not full: nothing goes
    assert len(cache.templates) == 2
    cache.functions.update({k: object() for k in range(4)})
    cache.make_room()
    assert not cache.templates and not cache.functions


@pytest.mark.parametrize("form", ["primitive", "cells"])
def test_a_traced_batch_leaves_no_reference_cycles(form):
    """A batch, its records and its plan are freed when the last tensor goes, not by the
    collector's next pass (its memos of parameters' tensors, which refer back to it, go at the
    end of its block)."""
    module, instances, params = model("tree_lstm")
    loss = module.LOSSES[form]
    batched(lambda batch, x: loss(x, params), instances)  # templates made once
    with no_cycles_left():
        values, batch = batched(lambda batch, x: loss(x, params), instances)
        assert batch.last_plan is not None and values
        del values, batch


# ----------------------------------------------------------------------------- arena memory kept between runs
@pytest.mark.parametrize("backend", BACKENDS)
def test_results_keep_their_values_while_later_batches_reuse_the_arenas_memory(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's arenas go back to the pool (``backends.arena_pool``) but those its results are read
    from (views), and the next runs write into that memory: a result kept from an earlier batch
    keeps its values."""
    rng = np.random.default_rng(7)
    W = Parameter(rng.standard_normal((8, 8)).astype(np.float32)).freeze()
    V = Parameter(rng.standard_normal((8, 3)).astype(np.float32)).freeze()
    from autobatch.backends.arena_pool import ArenaPool

    from autobatch.backends import flat_executor

    pool = ArenaPool()
    monkeypatch.setattr(batch_module, "TRACED_ARENAS", pool)
    monkeypatch.setattr(flat_executor, "MIN_POOLED_BYTES", 1)  # these arenas are small: pooled all the same
    kept, expected = [], []
    for round_ in range(4):
        xs = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(5)]
        with Batch(backend=backend) as batch:
            hs = (ops.tanh(ops.matmul(batch.constant(x), W)) for x in xs)  # rows [8], none held: their arena given back
            ys = [ops.matmul(ops.sigmoid(h) + h, V) for h in hs]  # rows [3]: the results' arena, kept
            kept += batch.run(ys)
        assert pool.kept_bytes >= 4 * 8 * 4 * len(xs), "the run gave its arena of [8] rows back"
        hs_alone = [np.tanh(x @ W.array) for x in xs]
        expected += [(1 / (1 + np.exp(-h)) + h) @ V.array for h in hs_alone]
    for got, want in zip(kept, expected):  # later rounds wrote into the memory earlier rounds used
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_arena_pool_reuses_the_best_fit_and_keeps_at_most_its_bytes() -> None:
    from autobatch.backends.arena_pool import ArenaPool

    pool = ArenaPool(max_bytes=10_000)
    small, large = pool.take(1000), pool.take(6000)
    pool.give([small, large])
    assert pool.kept_bytes == 7000
    assert pool.take(900) is small  # the smallest that holds it
    assert pool.take(100_000).nbytes == 100_000  # none holds it: a new buffer
    assert pool.take(500).nbytes == 500  # the large one is more than twice as big: kept for a larger arena
    pool.give([small, np.empty(5000, dtype=np.uint8)])
    assert pool.kept_bytes == 1000 + 5000  # the largest (6000) dropped: all three exceed the bound


def test_release_keeps_the_memory_a_kept_value_is_a_view_of_whichever_arena_read_it() -> None:
    """A block may be a view of another arena (a row reshape's output, an interpreter's
    Identity): a result read from the block keeps the other arena's memory out of the pool."""
    from autobatch.backends.arena_pool import ArenaPool
    from autobatch.backends.flat_executor import Loose, Values

    pool = ArenaPool()
    first, second = pool.take(4096), pool.take(4096)
    arena = first.view(np.float32).reshape(64, 16)
    block = arena.reshape(128, 8)  # "its own arena", a view of the first's memory
    values = Values([arena, second.view(np.float32).reshape(64, 16), block], Loose({}, {}), pool,
                    [first, second])
    kept = values[(2, slice(4, 6))]
    values.release(kept=[kept])
    assert pool.take(4096) is second and pool.kept_bytes == 0, "only the memory nothing kept reads went back"
    # A view whose chain of bases ends in no array (``as_strided``'s): found by its address.
    first, second = pool.take(4096), pool.take(4096)
    values = Values([first.view(np.float32).reshape(64, 16)], Loose({}, {}), pool, [first, second])
    strided = np.lib.stride_tricks.as_strided(values[(0, slice(0, 2))], shape=(2, 16), strides=(64, 4))
    values.release(kept=[strided])
    assert pool.take(4096) is second and pool.kept_bytes == 0


def test_a_released_runs_values_cannot_be_read() -> None:
    with Batch(backend="numpy") as batch:
        y = ops.tanh(batch.constant(np.ones((1, 4), np.float32)))
        plan = batch.plan([y])
        values = batch._executor.run(plan, batch._weights, batch._literals, pool=batch_module.TRACED_ARENAS)
        assert float(values[plan.locations[y.name]][0, 0]) == pytest.approx(np.tanh(1.0))
        values.release()
        with pytest.raises(IndexError):
            values[plan.locations[y.name]]
