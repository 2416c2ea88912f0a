"""README.md stays true: CI runs the test command README gives."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_line = next(line.strip() for line in readme.splitlines() if "-m pytest" in line)
    test_command = test_line.split("&&")[-1].strip()
    assert test_command in ci, f"README's test command {test_command!r} is not what .ci/run runs"
