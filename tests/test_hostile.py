"""The hostile corpus (``tests/hostile.py``) through the API on both backends, the command line
and a real server: every case a clear one-line error or a correct result, none over 60 s, in a
process limited to 6 GB. Slow (about four minutes): ``pytest -m slow tests/test_hostile.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile import FEEDS, MODELS, REQUESTS, SECONDS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_every_hostile_input_gets_a_clear_error_or_a_right_answer():
    done = subprocess.run([sys.executable, "-m", "tests.hostile"], capture_output=True, text=True, cwd=ROOT,
                          timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    expected = 2 * (len(MODELS) + len(FEEDS)) + 2 * len(MODELS) + len(REQUESTS)
    assert len(results) == expected, f"{len(results)} of {expected} cases reported: the runner stopped early"
    failed = [r for r in results if r["outcome"] not in ("ok", "error") or r["seconds"] > SECONDS]
    assert not failed, "\n".join(f"{r['surface']} {r['case']}: {r['message']}" for r in failed)
    for r in results:
        if r["case"].startswith("feeds:") and r["outcome"] == "error":
            assert "FeedError" in r["message"], r  # feeds that do not fit are refused as such, not by a crash
