"""The random-program fuzzer (``tests/fuzz.py``): a bounded run in the default suite, 10,000
programs a backend in the slow one (``pytest -m slow tests/test_fuzz.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from autobatch import InferenceSession
from tests.fuzz import NODE_LEVEL, STEPS, fuzz, instances, random_program, report

BACKENDS = ["numpy", "onnxruntime"]


def _check(programs: int, seed: int, kinds: tuple[str, ...] | None = None) -> None:
    outcomes = fuzz(range(seed, seed + programs), BACKENDS, kinds=kinds)
    print(report(outcomes))
    for backend, outcome in outcomes.items():
        assert outcome.programs > 0.95 * programs, report(outcomes)  # nearly every program ran alone
        assert not outcome.mismatches and not outcome.errors, report(outcomes)


def test_random_programs_batched_equal_each_instance_alone():
    _check(programs=150, seed=1_000_000)


@pytest.mark.slow
def test_ten_thousand_random_programs_on_each_backend():
    _check(programs=10_000, seed=0)


def test_random_programs_of_the_steps_a_node_level_plan_takes():
    """Programs made of those steps alone (``--node-level``): most of their batches run planned
    once per node (``batcher.instance_axis``), the rest per mix, all equal to each instance alone."""
    outcomes = fuzz(range(2_000_000, 2_000_150), BACKENDS, kinds=NODE_LEVEL)
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)
        assert outcome.node_level > 0.5 * 3 * outcome.programs, report(outcomes)


def test_random_programs_with_heads_picked_after_a_transpose():
    """PyTorch's packed q, k, v (a Gather of one index after Unsqueeze, Transpose and Squeeze,
    moved first by ``ir.select_first`` as a session imports the model) among the steps a
    node-level plan takes: batched equal to alone, and alone equal to ONNX's reference running
    the model as written."""
    kinds = (*NODE_LEVEL, "select")
    outcomes = fuzz(range(5_000_000, 5_000_100), BACKENDS, kinds=kinds)
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)
        assert outcome.node_level > 0.5 * 3 * outcome.programs, report(outcomes)
    for seed in range(5_000_000, 5_000_030):
        model, _ = random_program(seed, kinds=("select", "matmul", "unary", "attention"))
        session = InferenceSession(model)
        for feeds in instances(np.random.default_rng(seed), [1, 3, 6]):
            for ours, standard in zip(session.run(None, feeds), ReferenceEvaluator(model).run(None, feeds)):
                np.testing.assert_allclose(ours, standard, rtol=1e-5, atol=1e-6)


def test_random_programs_with_attention_masks_picked_by_positions():
    """Key masks picked from a value by positions made from its length (a Gather, or a GatherND
    of (0, position) pairs, from the start or the end) and expanded to the scores, as Hugging
    Face's exports pick an attention mask, among the steps a node-level plan takes."""
    outcomes = fuzz(range(6_000_000, 6_000_100), BACKENDS, kinds=(*NODE_LEVEL, "mask_pick"))
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)
        assert outcome.node_level > 0.5 * 3 * outcome.programs, report(outcomes)
        assert outcome.ops["GatherND"] and outcome.ops["Expand"], report(outcomes)


def test_random_programs_with_pooled_rows():
    """A classifier's pooler (each instance's first or last row, then a dense layer: one row an
    instance) among the steps a node-level plan takes, its values read beside values of the
    length too (refused there, planned per mix): batched equal to alone."""
    outcomes = fuzz(range(7_000_000, 7_000_100), BACKENDS, kinds=(*NODE_LEVEL, "pool"))
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)
        assert outcome.node_level > 0.3 * 3 * outcome.programs, report(outcomes)


def test_random_programs_with_reductions_over_the_length():
    """Sums, means, maxima and minima over each instance's rows (one row an instance, run
    padded by a node-level plan) among the steps it takes: batched equal to alone."""
    outcomes = fuzz(range(8_000_000, 8_000_100), BACKENDS, kinds=(*NODE_LEVEL, "reduce", "pool"))
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)
        assert outcome.node_level > 0.3 * 3 * outcome.programs, report(outcomes)


def test_random_programs_with_rows_found_by_an_argmax():
    """GPT-2's classifier: each instance's row at the first max (or min) of one of its columns,
    picked by a Gather or a GatherND of (0, position), then a dense layer, among the steps a
    node-level plan takes: batched equal to alone, most batches planned once per node."""
    outcomes = fuzz(range(9_500_000, 9_500_100), BACKENDS, kinds=(*NODE_LEVEL, "found"))
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)
        assert outcome.node_level > 0.3 * 3 * outcome.programs, report(outcomes)
        assert outcome.ops["ArgMax"] and outcome.ops["ArgMin"] and outcome.ops["GatherND"], report(outcomes)


def test_random_programs_with_convolutions_and_regrouped_scores():
    """A text CNN's convolution along the rows (Conv1d over ``[1, cols, rows]``, as long as its
    input) and attention scores regrouped with their two axes of rows (``[1, L, L]``; a product
    over the queries' rows too, ``P^T P``), among the steps a node-level plan takes: batched
    equal to alone, most batches planned once per node."""
    outcomes = fuzz(range(9_600_000, 9_600_100), BACKENDS, kinds=(*NODE_LEVEL, "conv", "regrouped"))
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)
        assert outcome.node_level > 0.3 * 3 * outcome.programs, report(outcomes)
        assert outcome.ops["Conv"] and outcome.ops["Squeeze"], report(outcomes)


def test_random_programs_with_rows_by_a_column_of_their_own():
    """Each row by one column of its own (``[rows, cols]`` op ``[rows, 1]``, a masked mean's sum
    by its count), among every step and among the steps a node-level plan takes."""
    for kinds in ((*STEPS, "column"), (*NODE_LEVEL, "column", "reduce")):
        outcomes = fuzz(range(9_000_000, 9_000_080), BACKENDS, kinds=kinds)
        for outcome in outcomes.values():
            assert not outcome.mismatches and not outcome.errors, report(outcomes)
            assert outcome.ops["Gather"], report(outcomes)


@pytest.mark.parametrize("seed", [920155, 920432, 920519])
def test_programs_whose_pooled_rows_feed_a_recurrent_layer(seed: int) -> None:
    """A pooled value (one row an instance) read by an LSTM as a sequence of one step: the
    node-level plan ran its chunks over each instance's length and failed; refused now."""
    outcomes = fuzz(range(seed, seed + 1), BACKENDS, kinds=(*NODE_LEVEL, "pool", "mask_pick"))
    for outcome in outcomes.values():
        assert not outcome.mismatches and not outcome.errors, report(outcomes)


@pytest.mark.slow
def test_three_thousand_random_node_level_programs_on_each_backend():
    _check(programs=3_000, seed=3_000_000, kinds=NODE_LEVEL)


@pytest.mark.parametrize(("seed", "backend", "runs"), [
    (5350, "numpy", False),  # a Concat of an empty value of another width: the standard refuses it
    (5350, "onnxruntime", True),  # onnxruntime runs it, so our one-instance run must too
    (2020, "onnxruntime", False),  # a Gemm over a row sliced out of no rows: nothing runs it
])
def test_a_program_is_set_aside_only_where_what_a_backend_stands_for_refuses_it(seed: int, backend: str,
                                                                                  runs: bool) -> None:
    """A program whose one-instance run raises is left out of the comparison only where the
    backend's oracle (ONNX's reference for NumPy, onnxruntime's own session) cannot run every
    instance either; anywhere else it is an error of ours."""
    outcomes = fuzz(range(seed, seed + 1), [backend])
    outcome = outcomes[backend]
    assert not outcome.errors and not outcome.mismatches, report(outcomes)
    assert (outcome.programs, outcome.alone_failed) == ((1, 0) if runs else (0, 1)), report(outcomes)


@pytest.mark.parametrize("seed", [8765, 9699])
def test_programs_the_node_level_plan_once_failed_on(seed: int) -> None:
    """A Softmax of a constant given per mix (8765) and a program the slow run raised on (9699):
    planned once per node or refused, never failing."""
    _check(programs=1, seed=seed)


@pytest.mark.parametrize("seed", [97161, 163532])
def test_programs_whose_declared_shapes_do_not_hold_run_alone_on_onnxruntime(seed: int) -> None:
    """Their outputs declare one length for values of different lengths (``[R, C]`` for a row
    sliced out, ``[1, 4]``, and for all rows, ``[N, 4]``): our one-instance run on onnxruntime
    raised ("Shape mismatch attempting to re-use buffer") where onnxruntime's own session ran.
    Declared shapes are hints: onnxruntime's session now infers its own (``OrtBackendRep``)."""
    outcomes = fuzz(range(seed, seed + 1), ["onnxruntime"])
    assert not outcomes["onnxruntime"].errors and outcomes["onnxruntime"].programs == 1, report(outcomes)


def test_an_output_onnxruntime_leaves_unwritten_is_not_compared() -> None:
    """Seed 190270 concatenates a row sliced out of an empty instance (``[0, 4]``) with a
    ``[1, 4]`` along axis 1: the standard refuses it, onnxruntime makes a ``[1, 8]`` whose half
    for the empty value it never writes (other bits each run). That instance's outputs are set
    aside as undefined; any other instance's difference is still a mismatch."""
    outcomes = fuzz(range(190270, 190271), ["onnxruntime"])
    outcome = outcomes["onnxruntime"]
    assert outcome.programs == 1 and outcome.undefined == 1, report(outcomes)
    assert not outcome.mismatches and not outcome.errors, report(outcomes)


def test_a_reduction_of_nothing_is_left_to_the_backend_that_runs_it() -> None:
    """Seed 313440 averages the rows of a value computed from an empty instance's shape
    (``[0, 2]``): typing folded it to the standard's NaN (NumPy), while onnxruntime run alone
    gives 0. A node reading an empty constant is no longer folded (``batcher.constants``)."""
    outcomes = fuzz(range(313440, 313441), ["numpy", "onnxruntime"])
    for outcome in outcomes.values():
        assert outcome.programs == 1 and not outcome.mismatches and not outcome.errors, report(outcomes)
