"""Shared fixtures, and the conformance count printed at the end of every run."""

from __future__ import annotations

import pytest

CONFORMANCE_MODULE = "test_onnx_conformance.py"
_conformance = {"passed": 0, "failed": 0}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--poison-arenas", action="store_true",
                     help="fill every arena with garbage before a plan runs (tests/poison.py)")


@pytest.fixture(scope="session", autouse=True)
def _arenas_poisoned_when_asked(request: pytest.FixtureRequest):
    if not request.config.getoption("--poison-arenas"):
        yield
        return
    from tests.poison import poisoned_arenas

    with poisoned_arenas():
        yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and CONFORMANCE_MODULE in report.nodeid and report.nodeid.endswith("_cpu"):
        if report.passed or report.failed:  # excluded cases are reported as skipped
            _conformance["passed" if report.passed else "failed"] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _conformance["passed"] or _conformance["failed"]:
        from tests.test_onnx_conformance import TOTAL_CASES

        terminalreporter.write_line(
            f"ONNX backend node conformance (NumpyBackend): {_conformance['passed']} passed of "
            f"{TOTAL_CASES} cases ({_conformance['failed']} failed, the rest excluded)"
        )
