"""Scheduling's loops, compiled (batcher/_scheduling.c) and in Python (batcher/schedulers.py,
batcher/problem.py): built where a compiler is, and the same levels and the same schedules
either way, on random dependency graphs and on the examples' traced minibatches."""

from __future__ import annotations

import numpy as np
import pytest

from autobatch import Batch
from autobatch.batcher import flat
from autobatch.batcher import problem as problem_module
from autobatch.batcher import schedulers
from autobatch.batcher.problem import UNBATCHABLE, Problem, problem_from
from autobatch.examples import bilstm_tagger, tree_lstm
from autobatch.ir.records import Record
from autobatch.datasets import sst_trees, wikiner_sentences
from tests.compiling import builds_extensions

COMPILED_ONLY = pytest.mark.skipif(problem_module.SCHEDULING is None, reason="the compiled loops are not built here")


def test_the_scheduling_loops_are_compiled_where_a_compiler_and_python_headers_are():
    if not builds_extensions():
        pytest.skip("no C compiler or Python headers here (or the Python twins asked for): scheduling runs in Python")
    assert problem_module.SCHEDULING is not None, "a compiler is here but batcher/_scheduling.c was not built: reinstall"


def _random_problem(rng: np.random.Generator, n: int, classes: int, parted: bool) -> Problem:
    """Nodes reading up to three earlier ones (repeats included), a fifth or so unbatchable,
    half the classes of an expensive op; ``parted``: in three parts that no edge joins."""
    parts = rng.integers(0, 3, n) if parted else None
    preds = []
    for i in range(n):
        read = rng.integers(max(0, i - 30), i, rng.integers(0, 4)).tolist() if i else []
        preds.append(sorted(p for p in read if parts is None or parts[p] == parts[i]))
    sig = np.where(rng.random(n) < 0.2, UNBATCHABLE, rng.integers(0, classes, n)).astype(np.int64)
    signatures = [("", "MatMul" if k % 2 else "Tanh", k) for k in range(classes)]
    return problem_from(list(range(n)), sig, preds, signatures, parts)


def _everything(make: object) -> list:
    """Levels, late levels and every scheduler's schedule (and each tie-break's, also cut short)."""
    problem = make()  # type: ignore[operator]
    found: list = [problem.level.tolist(), problem.late_level.tolist(), problem.lower_bound()]
    for scheduler in schedulers.SCHEDULERS.values():
        found.append(scheduler(make()))  # type: ignore[operator]
    for tie_break in schedulers.LEVEL_TIE_BREAKS:
        found.append(schedulers._level_schedule(make(), tie_break))  # type: ignore[operator]
        found.append(schedulers._level_schedule(make(), tie_break, limit=4))  # type: ignore[operator]
    return found


def _in_python(monkeypatch: pytest.MonkeyPatch, make: object) -> list:
    with monkeypatch.context() as patch:
        patch.setattr(problem_module, "SCHEDULING", None)
        patch.setattr(schedulers, "SCHEDULING", None)
        return _everything(make)


@COMPILED_ONLY
@pytest.mark.parametrize("seed", range(12))
def test_compiled_and_python_give_the_same_levels_and_schedules(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(25):
        n = int(rng.integers(0, 2_000 if trial == 0 else 120))
        classes = int(rng.integers(1, 7))
        problem = _random_problem(rng, n, classes, parted=trial % 3 == 0)

        def make(problem: Problem = problem) -> Problem:  # a fresh problem: levels and lists are cached on it
            return Problem(problem.node_ids, problem.sig, problem.preds, problem.depth, problem.classes,
                           parts=problem.parts)

        compiled = _everything(make)
        assert compiled == _in_python(monkeypatch, make), (seed, trial, n, classes)


@COMPILED_ONLY
def test_compiled_and_python_give_the_same_depths_and_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.integers(0, 400))
        preds = [rng.integers(max(0, i - 20), i, rng.integers(0, 4)).tolist() if i else [] for i in range(n)]
        sig = rng.integers(-1, 3, n)
        compiled = problem_from(list(range(n)), sig, preds, [])
        with monkeypatch.context() as patch:
            patch.setattr(problem_module, "SCHEDULING", None)
            python = problem_from(list(range(n)), sig, preds, [])
        assert compiled.depth.tolist() == python.depth.tolist(), trial
        assert [edge.tolist() for edge in compiled.edges] == [edge.tolist() for edge in python.edges], trial
    with pytest.raises(ValueError, match="node 1 reads 1"):  # not in topological order
        problem_from([0, 1], np.zeros(2, dtype=np.int64), [[], [1]], [])


def test_compiled_and_python_find_the_same_live_records(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    for trial in range(40):
        n = int(rng.integers(1, 300))
        records = [Record("Op", "", [], [], {}, [], (), None, rng.integers(max(0, i - 20), i, rng.integers(0, 3)).tolist()
                          if i else []) for i in range(n)]
        producers = sorted(set(rng.integers(0, n, rng.integers(1, 4)).tolist()))
        compiled = flat._live(records, producers)
        with monkeypatch.context() as patch:
            patch.setattr(flat, "SCHEDULING", None)
            python = flat._live(records, producers)
        assert compiled == python, trial
        kept, preds, places = compiled
        if len(kept) < n:  # renumbered among the live ones, every one of them leading to a producer
            assert all(p < k for k, ps in enumerate(preds) for p in ps)
            assert [records[i] for i in places] == kept  # and where each was
        else:
            assert places is None
        assert {id(r) for r in kept} >= {id(records[p]) for p in producers}
    if problem_module.SCHEDULING is not None:
        with pytest.raises(ValueError, match="node 1 reads 1"):
            problem_module.SCHEDULING.alive([[], [1]], [1], bytearray(2))
        with pytest.raises(ValueError, match="producer 2"):
            problem_module.SCHEDULING.alive([[], []], [2], bytearray(2))


@COMPILED_ONLY
def test_compiled_and_python_give_records_the_same_classes() -> None:
    """``_scheduling.classes`` looks keys up by the objects they are made of first (ints by
    value), then by value: equal keys of other objects, ints past 64 bits, keys that are no
    tuples and nested ones all get the class the Python loop gives, each new key made once."""
    from autobatch.batcher.classing import classes_of
    rng = np.random.default_rng(12)
    shared = ("a", "b", (1, 2))
    for trial in range(30):
        keys = []
        for _ in range(int(rng.integers(1, 400))):
            kind = int(rng.integers(0, 6))
            if kind == 0:
                keys.append(shared)  # the same object
            elif kind == 1:
                keys.append(("", "Add", int(rng.integers(0, 3)) + 10**6, ("x", "y")))  # an own int, equal by value
            elif kind == 2:
                keys.append(("", "Big", 2**70 + int(rng.integers(0, 2)), ()))  # past 64 bits
            elif kind == 3:
                keys.append(int(rng.integers(0, 4)))  # not a tuple
            elif kind == 4:
                keys.append(("n", (("deep", int(rng.integers(0, 2))),)))  # a tuple in a tuple in a tuple
            else:
                keys.append(("s", "".join(["ab", "c"][: int(rng.integers(1, 3))])))  # equal strings, other objects
        records = [Record("Op", "", [], [], {}, [], (), key, []) for key in keys]
        results = []
        for classes in (problem_module.SCHEDULING.classes, classes_of):  # type: ignore[union-attr]
            made: list[object] = []
            class_of: dict = {}
            out: list[int] = []
            classes(records, class_of, lambda record: made.append(record.key) or len(made) - 1, out)
            results.append((out, made, class_of))
        (compiled, made_c, of_c), (python, made_p, of_p) = results
        assert compiled == python and made_c == made_p and of_c == of_p, trial
        assert len(made_c) == len(set(made_c))
    with pytest.raises(TypeError, match="a record must be a Record"):
        problem_module.SCHEDULING.classes([("short",)], {}, len, [])  # type: ignore[union-attr]


def _traced_problem(monkeypatch: pytest.MonkeyPatch, loss: object, instances: list, params: object) -> Problem:
    """The problem a traced minibatch's plan schedules."""
    problems: list[Problem] = []
    scheduler = schedulers.get_scheduler("depth")

    def keep(name: str) -> object:
        return lambda problem: problems.append(problem) or scheduler(problem)

    with monkeypatch.context() as patch:
        patch.setattr("autobatch.batcher.flat.get_scheduler", keep)
        with Batch() as batch:
            batch.run([loss(example, params) for example in instances])  # type: ignore[operator]
    return problems[-1]


@COMPILED_ONLY
@pytest.mark.parametrize("example", ["tree_lstm", "bilstm_tagger"])
def test_the_examples_primitive_minibatches_schedule_the_same_compiled(monkeypatch: pytest.MonkeyPatch,
                                                                       example: str) -> None:
    if example == "tree_lstm":
        trees, _ = sst_trees("dev", limit=8)
        params = tree_lstm.make_params(tree_lstm.make_vocabulary(trees), size=8)
        problem = _traced_problem(monkeypatch, tree_lstm.loss_primitive, trees, params)
    else:
        sentences, _ = wikiner_sentences(limit=8)
        params = bilstm_tagger.make_params(*bilstm_tagger.make_vocabularies(sentences), size=8)
        problem = _traced_problem(monkeypatch, bilstm_tagger.loss_primitive, sentences, params)
    assert problem.size > 500

    def make() -> Problem:
        return Problem(problem.node_ids, problem.sig, problem.preds, problem.depth, problem.classes)

    compiled = _everything(make)
    assert compiled == _in_python(monkeypatch, make)
    assert len(compiled[3 + list(schedulers.SCHEDULERS).index("level")]) <= len(compiled[3])  # level <= depth


def _depth_schedule_as_written_before(problem: Problem) -> list[list[int]]:
    """The depth scheduler as a loop over nodes (before it sorted with NumPy): the reference."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (depth, cls) in enumerate(zip(problem.depth.tolist(), problem.sig.tolist())):
        groups.setdefault((depth, cls if cls != UNBATCHABLE else -1 - i), []).append(i)
    return [groups[key] for key in sorted(groups)]


def test_the_depth_schedule_is_the_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    for trial in range(60):
        problem = _random_problem(rng, int(rng.integers(0, 300)), int(rng.integers(1, 6)), parted=False)
        assert schedulers.depth_schedule(problem) == _depth_schedule_as_written_before(problem), trial
    # One class at one depth (a lockstep round's calls) takes a shortcut; the cases beside it don't.
    for sig, preds in (([3] * 5, [[]] * 5), ([3] * 3, [[], [0], [1]]), ([UNBATCHABLE] * 3, [[]] * 3), ([0], [[]]),
                       ([2, 2, 1], [[]] * 3), ([], [])):
        problem = problem_from(list(range(len(sig))), np.array(sig, dtype=np.int64), preds, [])
        assert schedulers.depth_schedule(problem) == _depth_schedule_as_written_before(problem), sig


@COMPILED_ONLY
def test_the_compiled_loops_refuse_what_does_not_fit_with_an_error() -> None:
    search, levels = problem_module.SCHEDULING.search, problem_module.SCHEDULING.levels  # type: ignore[union-attr]
    ints = lambda *values: np.array(values, dtype=np.int64)  # noqa: E731
    none, average, expensive = ints(), np.zeros(1), np.zeros(1, dtype=np.uint8)
    with pytest.raises(ValueError, match="adjacency"):  # a reader out of range
        search(ints(0, 0), ints(0, 1, 1), ints(5), ints(0, 1), average, expensive, none, none, none, none, 0, -1)
    with pytest.raises(ValueError, match="nothing ready"):  # a node waits for a reader that never comes
        search(ints(0, 0), ints(0, 0, 0), none, ints(0, 1), average, expensive, none, none, none, none, 0, -1)
    with pytest.raises(ValueError, match="sig"):  # a class past the classes
        search(ints(3), ints(0, 0), none, ints(0), average, expensive, none, none, none, none, 0, -1)
    with pytest.raises(TypeError, match="8-byte"):
        search(np.zeros(2, np.int32), ints(0, 0, 0), none, ints(0, 0), average, expensive, none, none, none, none, 0, -1)
    with pytest.raises(ValueError, match="mode"):
        search(ints(0), ints(0, 0), none, ints(0), average, expensive, none, none, none, none, 9, -1)
    with pytest.raises(ValueError, match="output"):
        levels(ints(0, 0), none, ints(0), 1, False, np.zeros(3, dtype=np.int64))
    assert search(ints(0, 0), ints(0, 1, 1), ints(1), ints(0, 1), average, expensive, none, none, none, none, 0, -1) \
        == [[0], [1]]
    assert search(ints(0, 0), ints(0, 1, 1), ints(1), ints(0, 1), average, expensive, none, none, none, none, 0, 1) is None


@pytest.mark.parametrize("seed", range(6))
def test_keys_counted_are_what_sorting_gives(seed: int) -> None:
    """``batcher.int_keys`` counts small keys where NumPy sorts them: the same numbering, order and
    runs, on keys dense and sparse in their range (the sparse ones take the sorting fallback)."""
    from autobatch.batcher import int_keys

    rng = np.random.default_rng(seed)
    for bound in (1, 7, 255, 256, 257, 65_536, 65_537, 10**7):
        keys = rng.integers(0, bound, int(rng.integers(1, 3000)))
        values, inverse, counts = int_keys.unique_keys(keys, bound)
        expected = np.unique(keys, return_inverse=True, return_counts=True)
        for got, want in zip((values, inverse, counts), expected):
            assert got.tolist() == want.tolist()
        assert int_keys.distinct_keys(keys, bound).tolist() == expected[0].tolist()
        assert int_keys.stable_order(keys, bound).tolist() == np.argsort(keys, kind="stable").tolist()
        assert int_keys.bucket_starts(np.sort(keys), bound).tolist() == \
            np.searchsorted(np.sort(keys), np.arange(bound + 1)).tolist()


def _sorted_launches(problem: Problem, level: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``launches_by_level`` with NumPy's sorts, as it was first written: the oracle."""
    levels = int(level.max()) + 1
    key = np.where(problem.sig != UNBATCHABLE, problem.sig * levels + level,
                   (len(problem.classes) + np.arange(problem.size)) * levels)
    _, group, counts = np.unique(key, return_inverse=True, return_counts=True)
    src, dst = problem.edges
    return group, counts, np.unique(group[src] * len(counts) + group[dst])


@pytest.mark.parametrize("seed", range(8))
def test_level_groups_counted_are_the_sorted_ones(seed: int) -> None:
    """The same launches, numbered alike, as with NumPy's sorts, on random problems with
    unbatchable nodes and on chains (whose levels line up), at first and at last levels."""
    rng = np.random.default_rng(100 + seed)
    problems = [_random_problem(rng, int(rng.integers(20, 400)), int(rng.integers(1, 8)), parted=bool(seed % 2)),
                _chains(rng)]
    for problem in problems:
        for level in (problem.level, problem.late_level):
            counted, expected = schedulers.launches_by_level(problem, level), _sorted_launches(problem, level)
            assert [a.tolist() for a in counted] == [a.tolist() for a in expected]
    assert schedulers.level_groups(problems[1], problems[1].level) is not None, "chains line up: an order is found"


def test_a_problem_of_unbatchable_nodes_only_is_scheduled_a_node_a_launch() -> None:
    """No class at all (every op run alone): no level to be late in, and each scheduler gives
    each node its own launch, readers after what they read."""
    preds = [[], [0], [0], [1, 2]]
    problem = problem_from(list(range(4)), np.full(4, UNBATCHABLE, dtype=np.int64), preds, [])
    assert problem.late_level.tolist() == [0, 0, 0, 0]
    for name in ("depth", "agenda", "level"):
        launches = schedulers.get_scheduler(name)(problem)
        assert sorted(map(len, launches)) == [1, 1, 1, 1], name
        order = [node for launch in launches for node in launch]
        assert order.index(3) > max(order.index(1), order.index(2)) > order.index(0), name


def _chains(rng: np.random.Generator) -> Problem:
    """Instances as chains of steps (a tagger's LSTM steps, each reading the last), a class a
    step in a repeating pattern, an unbatchable node after some steps, and a final node reading
    every chain's last step: their levels line up, so ``level_groups`` finds an order."""
    pattern = rng.integers(0, 4, int(rng.integers(1, 5)))
    sig, preds = [], []
    ends = []
    for _ in range(int(rng.integers(2, 12))):
        previous = None
        for j in range(int(rng.integers(1, 30))):
            for cls in [int(pattern[j % len(pattern)])] + ([UNBATCHABLE] if rng.random() < 0.2 else []):
                sig.append(cls)
                preds.append([] if previous is None else [previous])
                previous = len(sig) - 1
        ends.append(previous)
    sig.append(UNBATCHABLE)
    preds.append(ends)
    signatures = [("", "Tanh", k) for k in range(4)]
    return problem_from(list(range(len(sig))), np.array(sig, dtype=np.int64), preds, signatures)
