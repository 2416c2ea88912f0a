"""``autobatch serve`` as a real process: several models (an ONNX file and a program), names,
and a graceful SIGTERM that lets the request in flight finish."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("uvicorn")

from tests.test_serving import MODEL, infer_body, instance  # noqa: E402
from autobatch import InferenceSession  # noqa: E402

PROGRAM = '''
import time

async def slow_double(feeds):
    time.sleep(0.5)  # long enough for SIGTERM to arrive while it runs
    return {"y": feeds["x"] * 2}
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it exited as we read
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Whether the process is there and not a zombie (one that exited, waiting to be reaped: an
    orphan's reaper, PID 1, may be a container's shell that never reaps)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_serve_several_models_and_shut_down_gracefully(tmp_path, worker):
    onnx.save(MODEL, tmp_path / "tagger.onnx")
    (tmp_path / "programs.py").write_text(PROGRAM)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "autobatch", "serve", str(tmp_path / "tagger.onnx"), f"{tmp_path}/programs.py:slow_double",
         "--name", "tagger2", "--port", str(port), "--worker", worker], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if call(port, "GET", "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
            time.sleep(0.1)
        assert call(port, "GET", "/v2/models/tagger2")[0] == 200  # --name renames the first model
        assert call(port, "GET", "/v2/models/tagger")[0] == 404
        feeds = instance(3, 1)
        status, body = call(port, "POST", "/v2/models/tagger2/infer", infer_body(feeds))
        assert status == 200
        np.testing.assert_allclose(body["outputs"][0]["data"], InferenceSession(MODEL).run(["y"], feeds)[0].ravel(),
                                   rtol=1e-5, atol=1e-6)

        in_flight: list[tuple[int, dict]] = []
        x = {"x": np.arange(3, dtype=np.float32)}
        sender = threading.Thread(target=lambda: in_flight.append(
            call(port, "POST", "/v2/models/slow_double/infer", infer_body(x))))
        sender.start()
        time.sleep(0.2)  # the program is running now
        workers = children(process.pid)
        assert len(workers) >= (2 if worker == "process" else 0)  # a process a model (and multiprocessing's tracker)
        process.send_signal(signal.SIGTERM)
        sender.join(10)
        assert in_flight and in_flight[0][0] == 200, in_flight
        assert in_flight[0][1]["outputs"][0]["data"] == [0.0, 2.0, 4.0]
        assert process.wait(15) == 0  # drained and stopped (uvicorn alone re-raised the signal)
        assert "serving slow_double, tagger2 on http://127.0.0.1" in process.stdout.read()
        time.sleep(0.5)
        assert not [pid for pid in workers if running(pid)]  # the worker processes stopped too
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
