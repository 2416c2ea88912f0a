"""The Ray Serve example end to end (slow: it starts a Ray cluster of one machine)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from tests.test_serving_cli import free_port  # noqa: E402


@pytest.mark.slow
def test_ray_serve_replicas_batch_their_requests(capsys):
    from autobatch.examples import ray_serve

    assert ray_serve.main(["--replicas", "2", "--requests", "48", "--port", str(free_port())]) == 0
    out = capsys.readouterr().out
    assert "48 requests answered" in out and "0 wrong or failed" in out
