"""The random-program fuzzer (``tests/fuzz.py``): a bounded run in the default suite, 10,000
programs a backend in the slow one (``pytest -m slow tests/test_fuzz.py``)."""

from __future__ import annotations

import pytest

from tests.fuzz import fuzz, report

BACKENDS = ["numpy", "onnxruntime"]


def _check(programs: int, seed: int) -> None:
    outcomes = fuzz(range(seed, seed + programs), BACKENDS)
    print(report(outcomes))
    for backend, outcome in outcomes.items():
        assert outcome.programs > 0.95 * programs, report(outcomes)  # nearly every program ran alone
        assert not outcome.mismatches and not outcome.errors, report(outcomes)


def test_random_programs_batched_equal_each_instance_alone():
    _check(programs=150, seed=1_000_000)


@pytest.mark.slow
def test_ten_thousand_random_programs_on_each_backend():
    _check(programs=10_000, seed=0)
