"""Every rule at the opsets where its op's form, defaults or element types changed
(``tests/opset_cases.py``): batched equals alone on both backends, planned per mix and planned
once per node, with no batch failing and re-run alone. The default suite runs every 16th case;
the slow one (``.ci/run``) every case."""

from __future__ import annotations

import logging
import warnings

import pytest

from autobatch import InferenceSession
from tests.fuzz import runs_elsewhere
from tests.opset_cases import CASES, Case, build
from tests.oracle import assert_batched_equals_alone

SAMPLED = 16


def _params(every: int) -> list:
    return [pytest.param(case, id=f"{k}:{case.name}") for k, case in enumerate(CASES) if k % every == 0]


def check(case: Case, backend: str, node_level: bool, caplog: pytest.LogCaptureFixture) -> None:
    model, feeds = build(case)
    if not runs_elsewhere(model, [feeds], backend):  # not a model the runtime our backend stands for runs
        pytest.skip(f"{'onnxruntime' if backend == 'onnxruntime' else 'ONNX reference'} cannot run it either")
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="autobatch"):
        warnings.simplefilter("ignore")  # (NumPy's over values the ops take: a log of a negative, say)
        session = InferenceSession(model, backend=backend, alone_when_faster=False, node_level=node_level)
        for _ in range(2):  # the second batch runs the plan the first one kept
            assert_batched_equals_alone(session, feeds, what=case.name)
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not failed, failed[0]


@pytest.mark.parametrize("node_level", [False, True], ids=["per mix", "per node"])
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("case", _params(SAMPLED))
def test_a_sample_of_the_cases(case, backend, node_level, caplog):
    check(case, backend, node_level, caplog)


@pytest.mark.slow
@pytest.mark.parametrize("node_level", [False, True], ids=["per mix", "per node"])
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("case", _params(1))
def test_every_case(case, backend, node_level, caplog):
    check(case, backend, node_level, caplog)
