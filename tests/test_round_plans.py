"""A lockstep round of classes met before is planned without signing it as a problem
(``Classing.round_classes``), and a round shaped as one planned so is made from that one's
plan (``batcher.rounds``): each must be the plan signing makes, step for step."""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import numpy as np
import pytest
from onnx import helper

from autobatch import Batch, Parameter, ProgramFailure, cell, fold_tree, ops, run_programs
from autobatch.batcher.classing import Classing
from autobatch.batcher.rounds import RoundPlans
from autobatch.examples import parser
from autobatch.examples.common import lstm_step

RNG = np.random.default_rng(0)


def _facts(plan: Any) -> tuple:
    """What a plan does, comparable: its arenas, steps (template by identity, reads, writes),
    where each result lies, and its report's counts."""
    def rows(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return ("rows", value.tolist())
        if isinstance(value, (list, tuple)):
            return [rows(item) for item in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):  # Runs, Shaped, Copied, ...: arrays inside
            return type(value).__name__, [rows(getattr(value, f.name)) for f in dataclasses.fields(value)]
        return value

    steps = [(id(step.template), step.size, rows(step.reads), step.weights, rows(step.writes)) for step in plan.steps]
    report = plan.report
    return (plan.kinds, plan.rows, sorted(plan.blocks), rows(plan.literal_runs), steps, plan.locations,
            report.scheduler, report.nodes, report.launches, report.lower_bound, report.fallback_nodes, report.gathers,
            report.gathers_avoided, report.merged_duplicates, report.alone, report.launches_by_op, report.by_shape)


class _BothWays(Batch):
    """A batch that plans every round three ways, checks they agree and runs the first: as a
    batch plans it (made from an earlier round's plan where it can be), by the planner with
    ``round_classes``, and signed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rounds = {"reused": 0, "without signing": 0, "signed": 0, "two keys, one class": 0}

    def plan(self, wanted: Any) -> Any:
        reused = self.reused_rounds
        plan = super().plan(wanted)
        self.rounds["reused"] += self.reused_rounds - reused
        fast = self.rounds["without signing"]
        with mock.patch.object(Classing, "round_classes", _counted(self.rounds)), \
                mock.patch.object(self, "_rounds", RoundPlans()):  # one that learnt nothing: never reuses
            planned = super().plan(wanted)
        if self.rounds["without signing"] > fast:
            attributes = {id(record.attributes) for record in self._records}
            self.rounds["two keys, one class"] += {id(_ALONG_ROWS), id(_ALSO_ALONG_ROWS)} <= attributes
        with mock.patch.object(Classing, "round_classes", lambda *args: None), \
                mock.patch.object(self, "_rounds", RoundPlans()):
            signed = super().plan(wanted)
        assert _facts(plan) == _facts(signed)
        assert _facts(planned) == _facts(signed)
        return plan


def _counted(rounds: dict[str, int]) -> Any:
    real = Classing.round_classes

    def round_classes(self: Classing, *args: Any) -> Any:
        launches = real(self, *args)
        rounds["signed" if launches is None else "without signing"] += 1
        return launches

    return round_classes


def _checked_rounds(program: Any, inputs: list, backend: str, reused: int) -> _BothWays:
    """The programs run in a ``_BothWays`` batch (each round's plans compared), at least
    ``reused`` rounds made from a plan, each program's values equal to its run alone."""
    batch = _BothWays(backend)
    together = run_programs(program, inputs, batch=batch)
    assert not any(isinstance(got, ProgramFailure) for got in together), [str(got) for got in together]
    assert batch.rounds["reused"] >= reused, batch.rounds
    _each_as_alone(program, inputs, together, backend)
    return batch


def _each_as_alone(program: Any, inputs: list, together: list, backend: str) -> None:
    """Every program's values equal its run alone."""
    for x, got in zip(inputs, together, strict=True):
        alone = run_programs(program, [x], backend=backend)[0]
        for a, b in zip(got, alone, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# Two attribute dicts of one content: records under each have keys apart and one signature class.
_ALONG_ROWS, _ALSO_ALONG_ROWS = ({"axis": helper.make_attribute("axis", 0)} for _ in range(2))
_NO_ATTRIBUTES: dict = {}  # one dict for every call: their keys are alike


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("seed", range(4))
def test_rounds_of_mixed_ops_plan_as_signing_does(backend: str, seed: int) -> None:
    """Each round every program takes one op chosen by its last value: cells of two kinds over
    two widths, classes interleaved in trace order, Concats under two attribute dicts of one
    content (keys apart, one class); and in every sixth round a random op beside (run one at a
    time), in another a row-wise op (a ragged class: signed), in another two ops that read each
    other (signed). Each program's values equal its run alone."""
    rng = np.random.default_rng(seed)
    W = {(a, b): Parameter(rng.standard_normal((a, b)).astype(np.float32) * 0.5).freeze() for a in (3, 6) for b in (3, 6)}
    dense = cell(lambda x, w: ops.tanh(ops.matmul(x, w)))
    squash = cell(lambda x: ops.tanh(x) * np.float32(0.5))

    async def program(start: np.ndarray) -> list[np.ndarray]:
        x, seen = ops.add(start, np.float32(0.0)), []
        for step in range(16):
            value = await x
            seen.append(value)
            move = {3: 4 if value[0] > 0 else 1, 5: None}.get(step % 6, int(abs(value.sum()) * 1000 + step) % 4)
            before = x
            width = value.shape[0]
            if move == 0 or move in (2, 3) and width == 6:
                x = dense(x, W[width, 3 if value[0] > 0 else 6])
            elif move == 1:
                x = squash(x)
            elif move == 4:  # row-wise: a ragged class over both widths, in every sixth round
                x = ops.tanh(x)
            elif move in (2, 3):
                attributes = _ALONG_ROWS if move == 2 else _ALSO_ALONG_ROWS
                x = x.batch.record("Concat", [x, x], [(2 * width,)], [x.dtype], attributes)[0]
            else:  # every program, every sixth round
                x = ops.mul(x, np.float32(0.5)) + np.float32(1.0)  # the second op reads the first
            # a value no rule batches (each draws its own), held through the next round: a class
            # of members run one at a time, in rounds that skip signing too
            noise = x.batch.record("RandomUniformLike", [before], [(width,)], [x.dtype], _NO_ATTRIBUTES)[0] \
                if step % 6 == 2 else None
        seen.append(await x)
        del noise
        return seen

    starts = [rng.standard_normal(3 + 3 * (k % 2)).astype(np.float32) for k in range(12)]
    batch = _BothWays(backend)
    together = run_programs(program, starts, batch=batch)
    assert not any(isinstance(got, ProgramFailure) for got in together), [str(got) for got in together]
    assert batch.rounds["without signing"] >= 4 and batch.rounds["signed"] >= 2, batch.rounds
    assert batch.rounds["two keys, one class"] >= 2, batch.rounds
    for start, got in zip(starts, together):
        alone = run_programs(program, [start], backend=backend)[0]
        for a, b in zip(got, alone, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_parsers_rounds_plan_as_signing_does() -> None:
    """The parser of ``examples``: its BiLSTM round is signed, its scoring rounds (a cell call
    a sentence, reading the states of the first) are not, and both parse as before."""
    sentences = [["the", "cat", "sat"], ["a", "dog", "ran", "far", "away"], ["it", "rains"], ["yes"]]
    params = parser.make_params(parser.make_vocabulary(sentences), size=16).freeze()
    for form in ("cells", "sequences"):
        batch = _BothWays("onnxruntime")
        got = run_programs(lambda s, form=form: parser.PARSERS[form](s, params), sentences, batch=batch)
        want = run_programs(lambda s, form=form: parser.PARSERS[form](s, params), sentences, backend="onnxruntime")
        assert [p.heads for p in got] == [p.heads for p in want]
        assert batch.rounds["without signing"] >= len(batch.reports) - 2, (form, batch.rounds)
        assert batch.rounds["reused"] >= len(batch.reports) - 2, (form, batch.rounds)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_rounds_of_one_call_are_made_from_the_last_whatever_the_programs_left(backend: str) -> None:
    """Programs of different lengths (fewer left as they finish), each round one cell call a
    program over its last value and a value of its first round: the rounds after the first
    such are made from its plan for every number of programs left, step for step the plan
    signing makes. A round where one program also makes a call it drops (and holds another
    twice: as many values wanted as records), and one where a program's call reads another
    call of the round, are planned; every program's values equal its run alone."""
    W = Parameter(RNG.standard_normal((4, 4)).astype(np.float32) * 0.5).freeze()
    step_cell = cell(lambda x, base: ops.tanh(ops.matmul(x, W) + base))

    async def program(start: np.ndarray, steps: int, odd: bool) -> list[np.ndarray]:
        x = again = ops.add(start, np.float32(0.0))
        seen = [await x]
        base = x
        for step in range(steps):
            if odd and step == 3:
                step_cell(base, x)  # dropped: its record leads to no value wanted
                again = step_cell(x, base)  # traced once with the call below: one record, two tensors held
            if odd and step == 5:
                again = step_cell(x, base)  # held, and read by the round's other call
                x = again
            x = step_cell(x, base)
            seen.append(await x)
        del again
        return seen

    args = [(RNG.standard_normal(4).astype(np.float32), 6 + k, k == 2) for k in range(7)]
    batch = _BothWays(backend)
    together = run_programs(lambda a: program(*a), args, batch=batch)
    assert not any(isinstance(got, ProgramFailure) for got in together), [str(got) for got in together]
    assert batch.rounds["reused"] >= len(batch.reports) - 5 and batch.rounds["signed"] >= 1, batch.rounds
    sizes = [report.nodes for report in batch.reports]
    assert len(set(sizes)) >= 4, sizes  # rounds of every number of programs left
    _each_as_alone(lambda a: program(*a), args, together, backend)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_rounds_of_the_same_records_are_made_from_the_last_such_round(backend: str) -> None:
    """A decoder a program: each round an LSTM step cell (two outputs), an output cell reading
    its new state and a row-wise op over the scores. Rounds of the same records, as many of
    them, the same values wanted, are made from the plan of the last such round, step for step
    the plan signing makes: here while every program is left (programs of different lengths
    end one by one after that). Rounds alike but for what they read within the round (the
    fourth reads the last round's state, not this round's) or for the values they hold (the
    row-wise op's result every other round, else the scores twice) are planned; so are the rows
    of a stack of earlier values, re-bound by record and operand. Every program's values equal
    its run alone."""
    hidden, vocabulary = 6, 5
    E = Parameter(RNG.standard_normal((vocabulary, hidden)).astype(np.float32)).freeze()
    W, U = (Parameter(RNG.standard_normal((hidden, 4 * hidden)).astype(np.float32) * 0.3).freeze() for _ in range(2))
    b = Parameter(np.zeros(4 * hidden, np.float32)).freeze()
    O = Parameter(RNG.standard_normal((hidden, vocabulary)).astype(np.float32)).freeze()
    step = cell(lambda x, h, c: lstm_step(x, h, c, W, U, b))
    out = cell(lambda h: ops.matmul(h, O))

    async def decode(first: int, length: int) -> list[np.ndarray]:
        h = c = ops.zeros((hidden,))
        token, seen = first, []
        earlier = [ops.zeros((vocabulary,))] * 2  # the last two rounds' scores: values by this round
        for t in range(length):
            last = h
            h, c = step(ops.lookup(E, token), h, c)
            state = last if t == 3 else h  # in the fourth round: the last round's state, a value
            scores = out(state)
            squashed = ops.tanh(scores)
            held = squashed if t % 2 else out(state)  # else the scores again: one record, two tensors
            del squashed
            recent = ops.reduce_sum(ops.stack(earlier), 0)  # known rows stacked: a step's names not by member
            value = await scores
            seen += [value, await held, await recent]
            earlier = [earlier[1], scores]
            token = int(np.argmax(value))
        return seen

    _checked_rounds(lambda a: decode(*a), [(k % vocabulary, 8 + k % 3) for k in range(6)], backend, reused=3)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("seed", range(6))
def test_random_rounds_that_repeat_plan_as_signing_does(backend: str, seed: int) -> None:
    """Each round every program takes the same few ops, of one of two kinds drawn at random
    and taken in turn (so that rounds repeat, and some are made from an earlier one's plan):
    a two-output cell and a reader of either output, a split and a half by the program's
    value, a concat of a value of the round with one of the round before, a stack of earlier
    values, a row picked by a known index, a row-wise op. Programs of different lengths. Each
    round's plan equals signing's; each program's values its run alone."""
    rng = np.random.default_rng(100 + seed)
    W = Parameter(rng.standard_normal((4, 8)).astype(np.float32) * 0.5).freeze()
    V = Parameter(rng.standard_normal((8, 4)).astype(np.float32) * 0.5).freeze()
    pair = cell(lambda x, y: (ops.tanh(ops.matmul(x, W)), ops.sigmoid(ops.matmul(y, W))))
    shrink = cell(lambda z: ops.tanh(ops.matmul(z, V)))
    kinds = rng.integers(0, 6, size=2)

    async def program(start: np.ndarray, length: int) -> list[np.ndarray]:
        x = before = ops.add(start, np.float32(0.0))
        seen = [await x]
        for t in range(length):
            kind, value = kinds[t % 2], seen[-1]
            if kind == 0:  # a two-output cell, and a reader of the output the value says
                a, b = pair(x, before)
                x = shrink(a if value[0] > 0 else b)
            elif kind == 1:  # a split, and the half the value says
                left, right = ops.split(ops.concat([x, before]), 2)
                x = ops.tanh(right if value.sum() > 0 else left)
            elif kind == 2:  # a value of this round beside one of the round before
                x = ops.tanh(ops.split(ops.concat([ops.exp(x * np.float32(0.1)), before]), 2)[int(value[1] > 0)])
            elif kind == 3:  # earlier values stacked, a row picked by a known index
                x = ops.index(ops.tanh(ops.stack([x, before, x])), int(value[2] > 0))
            elif kind == 4:  # row-wise
                x = ops.sigmoid(ops.tanh(x) + before)
            else:
                x = shrink(pair(x, x)[1])
            before = x if t % 2 else before
            seen.append(await x)
        return seen

    args = [(rng.standard_normal(4).astype(np.float32), 8 + k % 4) for k in range(7)]
    _checked_rounds(lambda a: program(*a), args, backend, reused=int(3 not in kinds))  # (a pick's index: never)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_round_that_reads_another_output_of_the_same_record_is_planned(backend: str) -> None:
    """Each program splits its state in two and goes on with the half its value says: rounds
    of the same keys and predecessors that read another output of the same record (a review's
    reproducer: the plan of a round that read the left half read it again for the right)."""
    W = Parameter(RNG.standard_normal((4, 8)).astype(np.float32) * 0.7).freeze()
    grow = cell(lambda x: ops.tanh(ops.matmul(x, W)))

    async def program(start: np.ndarray) -> list[np.ndarray]:
        x, seen, choice = ops.add(start, np.float32(0.0)), [], 0
        for _ in range(8):
            left, right = ops.split(grow(x), 2)
            x = ops.tanh(right if choice else left)
            seen.append(await x)
            choice = int(seen[-1].sum() > 0)
        return seen

    def by_hand(start: np.ndarray) -> list[np.ndarray]:
        x, seen, choice = start, [], 0
        for _ in range(8):
            halves = np.split(np.tanh(x @ W.array), 2)
            x = np.tanh(halves[choice])
            seen.append(x)
            choice = int(x.sum() > 0)
        return seen

    starts = [RNG.standard_normal(4).astype(np.float32) for _ in range(4)]
    batch = _BothWays(backend)
    together = run_programs(program, starts, batch=batch)
    assert batch.rounds["reused"] >= 1, batch.rounds
    for start, got in zip(starts, together, strict=True):
        for a, b in zip(got, by_hand(start), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_program_alone_with_an_op_run_alone_in_its_rounds_runs(backend: str) -> None:
    """One program whose rounds each hold a batched op over a value of the round before and a
    random op no rule batches (a review's reproducer: learning such a round raised TypeError)."""
    async def program(start: np.ndarray) -> list[np.ndarray]:
        x, seen = ops.add(start, np.float32(0.0)), []
        for _ in range(4):
            before = await x
            x = ops.tanh(x)
            noise = x.batch.record("RandomUniformLike", [ops.add(before, np.float32(0.0))], [before.shape],
                                   [before.dtype], {})[0]
            seen.append(await x)
            del noise
        return seen

    start = RNG.standard_normal(3).astype(np.float32)
    got = run_programs(program, [start], backend=backend)[0]
    assert not isinstance(got, ProgramFailure), str(got)
    np.testing.assert_allclose(got, [np.tanh(start), np.tanh(np.tanh(start)), np.tanh(np.tanh(np.tanh(start))),
                                     np.tanh(np.tanh(np.tanh(np.tanh(start))))], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_ragged_step_that_stacks_literals_is_planned_every_round(backend: str) -> None:
    """A recurrent layer over sentences of several lengths (a ragged step: its members in the
    order of their lengths) from initial states that are values of the round before: learnt
    from rounds where every program read the same zeros, a plan re-bound the states in the
    programs' order (a review's reproducer). Such steps are not kept."""
    hidden, features = 4, 3
    weights = [Parameter(RNG.standard_normal(shape).astype(np.float32) * 0.5).freeze()
               for shape in ((1, 4 * hidden, features), (1, 4 * hidden, hidden), (1, 8 * hidden))]
    attributes = {"hidden_size": helper.make_attribute("hidden_size", hidden),
                  "direction": helper.make_attribute("direction", "forward")}

    async def program(sentence: np.ndarray) -> list[np.ndarray]:
        h = c = ops.zeros((1, 1, hidden))  # one value every program reads alike
        seen = []
        for t in range(5):
            x = ops.reshape(ops.tanh(ops.add(sentence, np.float32(0.1 * t))), (len(sentence), 1, features))
            batch = x.batch
            _, h_n, c_n = batch.record("LSTM", [x, *map(batch.parameter, weights), None, h, c],
                                       [(len(sentence), 1, 1, hidden), (1, 1, hidden), (1, 1, hidden)],
                                       [np.dtype(np.float32)] * 3, attributes)
            seen += [await h_n, await c_n]
            if t:  # the first two rounds from the shared zeros, the later ones from the last states
                h, c = h_n, c_n
        return seen

    sentences = [RNG.standard_normal((n, features)).astype(np.float32) for n in (5, 2, 3)]
    together = run_programs(program, sentences, batch=_BothWays(backend))
    _each_as_alone(program, sentences, together, backend)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_round_whose_plan_read_a_literals_value_is_planned_again(backend: str) -> None:
    """Rows picked where they lie by a known index (``Layout._picked_rows``): the plan holds
    for that index only, so a round of the same records picking another row is planned."""
    async def program(start: np.ndarray) -> list[np.ndarray]:
        vectors = [ops.tanh(ops.add(row, np.float32(0.0))) for row in start]
        await vectors[-1]
        seen = []
        for t in range(5):
            states = ops.stack(vectors)  # the rows known before the round, kept as a block
            row = ops.index(states, t % 2)
            del states
            seen.append(await row)
        return seen

    starts = [RNG.standard_normal((2 + k, 3)).astype(np.float32) for k in range(3)]
    batch = _BothWays(backend)
    together = run_programs(program, starts, batch=batch)
    assert all("Gather" not in report.launches_by_op for report in batch.reports)  # picked, not launched
    for start, got in zip(starts, together, strict=True):
        for t, value in enumerate(got):
            np.testing.assert_allclose(value, np.tanh(start[t % 2]), rtol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_rounds_of_tree_folds_are_planned_for_their_trees(backend: str) -> None:
    """A tree fold's plan holds for the trees it was made from (their children are literals'
    values): rounds that fold other trees of as many nodes are planned again."""
    W = Parameter(RNG.standard_normal((3, 3)).astype(np.float32) * 0.5).freeze()
    leaf = cell(lambda x: ops.tanh(ops.matmul(x, W)))
    node = cell(lambda left, right: ops.tanh(left + right * np.float32(2.0)))
    shapes = [[None, None, None, (0, 1), (3, 2)], [None, None, None, (1, 2), (0, 3)]]  # 3 leaves, 5 nodes each

    async def program(leaves: np.ndarray) -> list[np.ndarray]:
        # (leaves computed within the round: the fold's only literal is its tree)
        return [await fold_tree(leaf, node, ops.add(leaves, np.float32(0.0)), shapes[t % 2])[0] for t in range(4)]

    def alone(leaves: np.ndarray, children: list) -> np.ndarray:
        states: list[np.ndarray] = []
        for k, pair in enumerate(children):
            states.append(np.tanh(leaves[k] @ W.array) if pair is None
                          else np.tanh(states[pair[0]] + states[pair[1]] * np.float32(2.0)))
        return np.stack(states)

    starts = [RNG.standard_normal((3, 3)).astype(np.float32) for _ in range(3)]
    together = run_programs(program, starts, batch=_BothWays(backend))
    for start, got in zip(starts, together, strict=True):
        for t, value in enumerate(got):
            np.testing.assert_allclose(value, alone(start, shapes[t % 2]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_batch_traced_after_its_programs_reads_its_own_weights(backend: str) -> None:
    """The block of ``run_programs`` learnt rounds over a small weight named W; after it, the
    same batch traces the same call over another weight also named W (a block names its
    parameters anew). A review's reproducer got the first weight's products: plans learnt in a
    block are forgotten when it ends."""
    first, second = (Parameter(RNG.standard_normal((4, 4)).astype(np.float32), name="W").freeze() for _ in range(2))
    xs = [RNG.standard_normal(4).astype(np.float32) for _ in range(3)]

    async def program(x: np.ndarray) -> bool:
        for _ in range(3):
            await ops.matmul(x, first)
        return True

    batch = Batch(backend)
    run_programs(program, xs, batch=batch)
    assert batch.reused_rounds >= 1
    got = batch.run([ops.matmul(batch.constant(x), second) for x in xs])
    for value, x in zip(got, xs, strict=True):
        np.testing.assert_allclose(value, x @ second.array, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_round_whose_known_index_was_out_of_range_is_not_kept(backend: str) -> None:
    """A row of a stack picked by a known index out of range is a Gather step (it fails as the
    instance alone does); the plan holds for that index only, so a later round of the same
    records, its index in range, picks the row where it lies as the planner does (a review's
    reproducer reused the failing round's Gather)."""
    starts = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    batch = _BothWays(backend)
    with batch:
        for i in (7, -3, 1, 0):  # (below -2 is out of range too: -1 and -2 count from the end)
            rows = [ops.index(ops.stack([ops.tanh(batch.constant(row)) for row in start]), batch.constant(i, np.int64))
                    for start in starts]
            if not -2 <= i < 2:
                with pytest.raises(Exception, match="out of|index"):
                    batch.run(rows)
                continue
            for value, start in zip(batch.run(rows), starts, strict=True):
                np.testing.assert_allclose(value, np.tanh(start[i]), rtol=1e-6)
            assert "Gather" not in batch.reports[-1].launches_by_op


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("rows", [(2, 3), (3, 3)], ids=["two keys", "one key"])
def test_a_round_whose_learnt_key_now_says_another_axis_is_signed(backend: str, rows: tuple[int, int]) -> None:
    """One attributes dict told another axis between rounds (a traced key holds attributes by
    id): the key's learnt class no longer holds, and the round is planned as what it now says,
    a Softmax along rows (a ragged class, which only signing merges). With one key (values of
    one shape) the earlier rounds were one call a program, whose plan a later round would be
    made from but for the attributes."""
    axis = {"axis": helper.make_attribute("axis", 0)}

    async def program(start: np.ndarray) -> list[np.ndarray]:
        x, seen = ops.add(start, np.float32(0.0)), []
        for step in range(5):
            value = await x
            seen.append(value)
            if step == 3:
                axis["axis"] = helper.make_attribute("axis", 1)
            x = x.batch.record("Softmax", [x], [x.shape], [x.dtype], axis)[0]
        seen.append(await x)
        return seen

    starts = [RNG.standard_normal((rows[k % 2], 3)).astype(np.float32) for k in range(4)]
    batch = _BothWays(backend)
    together = run_programs(program, starts, batch=batch)
    assert batch.rounds["without signing"] >= 1, batch.rounds
    assert batch.rounds["reused"] >= (rows[0] == rows[1]), batch.rounds
    for start, got in zip(starts, together, strict=True):
        want = [start]
        for step in range(5):
            shifted = np.exp(want[-1] - want[-1].max(axis=0 if step < 3 else 1, keepdims=True))
            want.append(shifted / shifted.sum(axis=0 if step < 3 else 1, keepdims=True))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_round_after_its_weight_changed_is_not_made_from_the_plan_before(backend: str) -> None:
    """A small weight (a template may hold it by value) changed between rounds: in place, not
    frozen, between two rounds of one block; and given a new array, frozen again, between two
    blocks of one batch (which name it as the one before did), each of whose later rounds is
    made from an earlier one's plan. Each round computes with the weight as it is then."""
    W = Parameter(RNG.standard_normal((4, 4)).astype(np.float32))
    history: list[np.ndarray] = []

    async def program(start: np.ndarray) -> list[np.ndarray]:
        x, seen = ops.add(start, np.float32(0.0)), []
        for _ in range(5):
            x = ops.matmul(x, W)
            seen.append(await x)
        return seen

    class Changing(Batch):  # the weight as each round reads it, changed in place after the third
        def run_pending(self) -> None:
            history.append(W.array.copy())
            super().run_pending()
            if len(history) == 4 and W.array.flags.writeable:
                W.array *= -0.5

    def want(start: np.ndarray) -> list[np.ndarray]:
        values, x = [], start
        for weights in history[:5]:  # (the first round adds the 0 too)
            x = x @ weights
            values.append(x)
        return values

    starts = [RNG.standard_normal(4).astype(np.float32) for _ in range(3)]
    batch = Changing(backend)
    for block in range(3):  # changed in place; frozen; another array, frozen
        history.clear()
        got = run_programs(program, starts, batch=batch)
        for start, values in zip(starts, got, strict=True):
            for a, b in zip(values, want(start), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        if block:
            W.array = RNG.standard_normal((4, 4)).astype(np.float32)
        W.freeze()
    assert batch.reused_rounds >= 2
