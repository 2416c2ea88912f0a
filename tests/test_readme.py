"""README.md stays true: CI runs the test command README gives, and its first command does what
README says in a fresh clone (slow)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_line = next(line.strip() for line in readme.splitlines() if "-m pytest" in line)
    test_command = test_line.split("&&")[-1].strip()
    assert test_command in ci, f"README's test command {test_command!r} is not what .ci/run runs"


@pytest.mark.slow
def test_the_readme_main_command_in_a_fresh_clone(tmp_path):
    """README's first command, as a new user runs it in a fresh clone: it installs, runs the demo,
    and prints what README says it prints (both speeds, the batched one faster, losses agreeing)."""
    readme = (ROOT / "README.md").read_text()
    command = next(line.strip() for line in readme.splitlines() if line.strip().startswith("python3 -m venv")
                   and "autobatch demo" in line)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=300)
    done = subprocess.run(command, shell=True, cwd=clone, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    alone = re.search(r"one tree at a time +([\d.]+) +(\d+)\n", done.stdout)
    batched = re.search(r"batched +([\d.]+) +(\d+) +\(([\d.]+)x faster\)", done.stdout)
    assert alone and batched, done.stdout
    assert float(batched.group(3)) > 1 and int(batched.group(2)) > int(alone.group(2))
    assert "losses agree (rtol 1e-5, atol 1e-6): yes" in done.stdout
    stated = re.search(r"printed (\d+)-(\d+) trees/s one at a time, (\d+)-(\d+) batched, ([\d.]+)x-([\d.]+)x", readme)
    assert stated, "README states the demo's ranges in the form 'printed A-B trees/s one at a time, C-D batched, E-Fx'"
    print(f"this run: {alone.group(2)} trees/s alone, {batched.group(2)} batched, {batched.group(3)}x; README states "
          f"{stated.group(0)}")
