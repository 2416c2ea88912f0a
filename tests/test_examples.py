"""The seed paper's four models in examples/: batched results equal each instance run alone,
the primitive, cell and sequence forms agree, and the parser's lockstep parses are the ones each
sentence gets alone (and are complete, legal parses). Real data from ../shared/data when
present (else the synthetic stand-ins), small sizes."""

from __future__ import annotations

import numpy as np
import pytest

from autobatch import Batch, ProgramFailure, run_programs
from autobatch.datasets import wikiner_sentences
from autobatch.examples import bilstm_tagger, char_tagger, parser, tree_lstm
from autobatch.examples.common import FORMS
from tests.example_models import MODELS, model

RTOL, ATOL = 1e-5, 1e-6
MODULES = {"tree_lstm": tree_lstm, "bilstm_tagger": bilstm_tagger, "char_tagger": char_tagger}
CASES = [(name, form) for name in MODELS for form in MODULES[name].LOSSES]  # each model's own forms


def batched(loss, instances, params, backend="numpy"):
    """Every instance in one Batch: the losses and the batch's report."""
    with Batch(backend=backend) as batch:
        losses = [loss(x, params) for x in instances]
        values = batch.run(losses)
    return [np.array(v) for v in values], batch.reports[-1]


def alone(loss, instances, params, backend="numpy"):
    """Each instance in its own Batch: the losses and the reports."""
    values, reports = [], []
    for x in instances:
        with Batch(backend=backend) as batch:
            values.append(np.array(batch.run([loss(x, params)])[0]))
        reports.append(batch.reports[-1])
    return values, reports


_cache: dict = {}


def results(name: str, form: str):
    key = (name, form)
    if key not in _cache:
        module, instances, params = model(name)
        loss = module.LOSSES[form]
        _cache[key] = (batched(loss, instances, params), alone(loss, instances, params))
    return _cache[key]


def assert_close(got, expected):
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"instance {k}")


# ----------------------------------------------------------------------------- losses
@pytest.mark.parametrize("name,form", CASES)
def test_batched_equals_alone(name, form):
    (together, _), (one_by_one, _) = results(name, form)
    assert all(v.shape == () and np.isfinite(v) and v > 0 for v in one_by_one)
    assert len({float(v) for v in one_by_one}) == len(one_by_one), "instances should have different losses"
    assert_close(together, one_by_one)


@pytest.mark.parametrize("name,form", [(name, form) for name, form in CASES if form != "primitive"])
def test_forms_equal_primitive_ops(name, form):
    (primitive, _), _ = results(name, "primitive")
    (other, _), _ = results(name, form)
    np.testing.assert_allclose(other, primitive, rtol=1e-4, atol=1e-5)  # sums in another order


def test_every_form_has_its_example_function():
    assert set(tree_lstm.LOSSES) == {"primitive", "cells", "fold"}
    for functions in (bilstm_tagger.LOSSES, char_tagger.LOSSES, parser.PARSERS):
        assert set(functions) == {"primitive", "cells", "sequences"}
    assert set(FORMS) == {"primitive", "cells", "sequences", "fold"}


@pytest.mark.parametrize("module", [tree_lstm, bilstm_tagger, char_tagger, parser])
def test_example_command_runs_every_form(module, capsys):
    """``python -m autobatch.examples.NAME`` at a tiny size: a line per form and backend."""
    module.main(["--instances", "3", "--size", "8", "--backends", "numpy"])
    printed = capsys.readouterr().out
    forms = module.PARSERS if module is parser else module.LOSSES
    for form in forms:
        assert f"{form:9} numpy" in printed


@pytest.mark.parametrize("form", list(tree_lstm.LOSSES))
def test_tree_lstm_batching_saves_launches(form):
    (_, report), (_, reports) = results("tree_lstm", form)
    assert report.launches < report.nodes
    assert report.launches < sum(r.launches for r in reports)  # fewer than running the trees one by one
    assert report.launches >= report.lower_bound
    assert report.fallback_nodes == 0


def test_char_tagger_uses_both_word_representations():
    module, sentences, params = model("char_tagger")
    words = [w for s in sentences for w, _ in s]
    spelled = [module.is_spelled(w, params.config["words"]) for w in words]
    assert any(spelled) and not all(spelled)


@pytest.mark.parametrize("name,form", CASES)
def test_batched_on_onnxruntime_equals_alone_on_numpy(name, form):
    module, instances, params = model(name)
    together, report = batched(module.LOSSES[form], instances, params, backend="onnxruntime")
    (_, _), (one_by_one, _) = results(name, form)
    assert_close(together, one_by_one)
    assert report.launches < report.nodes


# ----------------------------------------------------------------------------- parser
def _sentences():
    tagged, _ = wikiner_sentences(limit=40)
    return [[w for w, _ in s] for s in tagged if len(s) <= 25][:6]


def _parser_params(sentences):
    return parser.make_params(parser.make_vocabulary(sentences), size=16)


def check_parse(sentence, parse):
    """Replays the transitions: each legal when taken, the parse complete, every word a head."""
    assert isinstance(parse, parser.Parse), parse
    n = len(sentence)
    stack, buffer, heads = [0], list(range(1, n + 1)), [None] * n
    for name in parse.transitions:
        move = parser.TRANSITIONS.index(name)
        assert move in parser.legal(stack, buffer), (name, stack, buffer)
        if move == parser.SHIFT:
            stack.append(buffer.pop(0))
        elif move == parser.LEFT_ARC:
            heads[stack.pop() - 1] = buffer[0]
        else:
            dependent = stack.pop()
            heads[dependent - 1] = stack[-1]
    assert stack == [0] and not buffer
    assert len(parse.transitions) == 2 * n
    assert heads == parse.heads
    assert all(0 <= h <= n and h != d for d, h in enumerate(heads, 1))


@pytest.fixture(scope="module")
def parses():
    sentences = _sentences()
    params = _parser_params(sentences)
    out = {"sentences": sentences}
    for form, fn in parser.PARSERS.items():
        out[form, "batched"] = run_programs(lambda s: fn(s, params), sentences)
        out[form, "alone"] = [run_programs(lambda s: fn(s, params), [s])[0] for s in sentences]
    return out


@pytest.mark.parametrize("form", list(parser.PARSERS))
def test_parser_on_onnxruntime_parses_as_on_numpy(parses, form):
    params = _parser_params(parses["sentences"])
    fn = parser.PARSERS[form]
    on_onnxruntime = run_programs(lambda s: fn(s, params), parses["sentences"], backend="onnxruntime")
    assert on_onnxruntime == parses[form, "alone"]


@pytest.mark.parametrize("form", list(parser.PARSERS))
def test_parser_batched_equals_alone(parses, form):
    together, one_by_one = parses[form, "batched"], parses[form, "alone"]
    assert not any(isinstance(r, ProgramFailure) for r in together + one_by_one), [str(r) for r in together]
    for sentence, a, b in zip(parses["sentences"], together, one_by_one):
        check_parse(sentence, a)
        check_parse(sentence, b)
        assert a == b
    # random weights still give different decisions: not every parse is the same shape
    assert len({tuple(p.transitions) for p in together}) > 1 or len({len(s) for s in parses["sentences"]}) == 1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("form", list(parser.PARSERS))
def test_parser_with_frozen_weights_parses_as_alone(parses, form, backend):
    """Frozen weights let each lockstep round plan with what the rounds before it learnt
    (``Batch.plan``): the parses stay those of each sentence alone."""
    params = _parser_params(parses["sentences"]).freeze()
    fn = parser.PARSERS[form]
    assert run_programs(lambda s: fn(s, params), parses["sentences"], backend=backend) == parses[form, "alone"]


def test_parser_forms_parse_alike(parses):
    assert parses["primitive", "batched"] == parses["cells", "batched"] == parses["sequences", "batched"]


def test_check_parse_rejects_an_illegal_parse(parses):
    sentence, good = parses["sentences"][0], parses["cells", "batched"][0]
    bad = parser.Parse(["LEFT-ARC", *good.transitions[1:]], list(good.heads))
    with pytest.raises(AssertionError):
        check_parse(sentence, bad)
