"""A corpus of hostile inputs, and its runner: malformed and hostile model files, feeds that do
not fit, control flow sized to run away, allocations of terabytes, and broken requests to a
server. Every case must end in a clear one-line error of ours or a correct result (batched
equal to alone), within 60 s; the cases run one after the other in one process, limited to 6 GB
of address space.

    python -m tests.hostile  # one JSON line a case: surface, case, outcome, message, seconds
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import resource
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import onnx
from onnx import TensorProto, helper

SECONDS, MEMORY = 60, 6 << 30
BACKENDS = ("numpy", "onnxruntime")


def parse(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : 17]> {text}')


RELU = parse("g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }")


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def _edited(edit: Callable[[onnx.ModelProto], None], base: onnx.ModelProto = RELU) -> bytes:
    model = onnx.ModelProto()
    model.CopyFrom(base)
    edit(model)
    return _bytes(model)


def _chain(nodes: int) -> bytes:
    body = "\n".join(f"v{k + 1} = Relu(v{k})" for k in range(nodes))
    return _bytes(parse(f"g (float[N, 4] v0) => (float[N, 4] v{nodes}) {{ {body} }}"))


def _nested_if(depth: int) -> bytes:
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["y0"])], "leaf", [],
                             [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [4])])
    branch = leaf
    for level in range(depth):
        node = helper.make_node("If", ["c"], [f"y{level + 1}"], then_branch=branch, else_branch=leaf)
        branch = helper.make_graph([node], f"level{level}", [],
                                   [helper.make_tensor_value_info(f"y{level + 1}", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(list(branch.node), "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(f"y{depth}", TensorProto.FLOAT, [4])])
    return _bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def _nesting_bomb(levels: int) -> bytes:
    """A model nesting If bodies ``levels`` deep, written byte by byte (protobuf's Python
    objects cannot hold more than about 30 levels): its parser must refuse, not crash."""
    def field(number: int, payload: bytes) -> bytes:  # a length-delimited field
        key, size, length = bytes([number << 3 | 2]), bytearray(), len(payload)
        while True:
            size.append(length & 0x7F | (0x80 if length > 0x7F else 0))
            length >>= 7
            if not length:
                break
        return key + bytes(size) + payload

    graph = field(1, helper.make_node("Identity", ["x"], ["y"]).SerializeToString())
    for _ in range(levels):  # GraphProto.node -> NodeProto.attribute -> AttributeProto.g -> GraphProto
        attribute = field(1, b"then_branch") + bytes([20 << 3, 5]) + field(6, graph)
        graph = field(1, field(4, b"If") + field(1, b"c") + field(2, b"y") + field(5, attribute))
    return field(7, graph) + bytes([1 << 3, 8]) + field(8, helper.make_opsetid("", 17).SerializeToString())


def _recursive_function() -> bytes:
    body = helper.make_node("F", ["a"], ["b"], domain="local")
    function = helper.make_function("local", "F", ["a"], ["b"], [body], [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return _bytes(helper.make_model(graph, functions=[function], ir_version=8,
                                    opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]))


def _loop(trip: str, condition: str) -> bytes:
    return _bytes(parse(f"""g (int64 m, bool go, float[2] x) => (float[2] y) {{
        y = Loop({trip}, {condition}, x) <body = b (int64 i, bool c, float[2] h) => (bool c2, float[2] h2) {{
            c2 = Identity(c)
            h2 = Tanh(h)
        }}>
    }}"""))


def _huge_tensor(model: onnx.ModelProto) -> None:
    model.graph.initializer.append(TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**6, 10**6],
                                               float_data=[1.0]))


def _sparse(model: onnx.ModelProto) -> None:
    values = helper.make_tensor("s", TensorProto.FLOAT, [1], [1.0])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, helper.make_tensor("i", TensorProto.INT64,
                                                                                                 [1], [0]), [4]))


def _external(model: onnx.ModelProto) -> None:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4], [0.0] * 4)
    weight.ClearField("float_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "../../../../etc/passwd", "offset": "0", "length": "16"}.items():
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    model.graph.initializer.append(weight)


MODELS: dict[str, Callable[[], bytes]] = {
    "empty file": lambda: b"",
    "garbage bytes": lambda: bytes(range(256)) * 16,
    "truncated model": lambda: _bytes(RELU)[:-7],
    "no graph": lambda: _bytes(onnx.ModelProto(ir_version=8)),
    "tensor declaring 10^12 elements": lambda: _edited(_huge_tensor),
    "negative dimension": lambda: _edited(lambda m: m.graph.initializer.append(
        TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[-4], float_data=[1.0]))),
    "sparse initializer": lambda: _edited(_sparse),
    "external data outside the folder": lambda: _edited(_external),
    "a cycle": lambda: _bytes(parse("g (float[N, 4] x) => (float[N, 4] b) { a = Add(x, b)  b = Relu(a) }")),
    "unknown op": lambda: _edited(lambda m: setattr(m.graph.node[0], "op_type", "Frobnicate")),
    "op of a domain without functions": lambda: _edited(lambda m: setattr(m.graph.node[0], "domain", "evil")),
    "opset 999": lambda: _edited(lambda m: setattr(m.opset_import[0], "version", 999)),
    "IR version 999": lambda: _edited(lambda m: setattr(m, "ir_version", 999)),
    "an undefined input": lambda: _edited(lambda m: m.graph.node[0].input.__setitem__(0, "nowhere")),
    "an undefined output": lambda: _edited(lambda m: setattr(m.graph.output[0], "name", "nowhere")),
    "a value defined twice": lambda: _bytes(parse("g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x)  y = Neg(x) }")),
    "an attribute of the wrong type": lambda: _bytes(parse("g (float[N, 4] x) => (float[N, 4] y) { y = Transpose<perm = 1.5>(x) }")),
    "a function calling itself": _recursive_function,
    "If nested 30 deep": lambda: _nested_if(30),
    "If nested 10,000 deep": lambda: _nesting_bomb(10_000),
    "a chain of 20,000 nodes": lambda: _chain(20_000),
    "ConstantOfShape of 10^12 floats": lambda: _bytes(parse(
        "g (float[N, 4] x) => (float[A, B] y) <int64[2] s = {1000000, 1000000}> { y = ConstantOfShape(s) }")),
    "Expand to 10^12 floats": lambda: _bytes(parse(
        "g (float[N, 4] x) => (float[A, B] y) <int64[2] s = {1000000, 1000000}, float one = {1}> { y = Expand(one, s) }")),
    "Tile by 10^6 x 10^6": lambda: _bytes(parse(
        "g (float[N, 4] x) => (float[A, B] y) <int64[2] r = {1000000, 1000000}> { y = Tile(x, r) }")),
    "Loop of 10^12 iterations": lambda: _bytes(parse("""g (float[2] x) => (float[2] y) <int64 m = {1000000000000}> {
        y = Loop(m, , x) <body = b (int64 i, bool c, float[2] h) => (bool c2, float[2] h2) { c2 = Identity(c)  h2 = Tanh(h) }>
    }""")),
    "Loop without trip count or condition": lambda: _loop("", ""),
    "Loop whose condition never turns false": lambda: _loop("", "go"),
    "Loop of a trip count from the request": lambda: _loop("m", ""),
    "string tensors": lambda: _bytes(parse("g (string[N] x) => (string[N] y) { y = Identity(x) }")),
    "an input declaring 10^12 elements": lambda: _bytes(parse(
        "g (float[1000000, 1000000] x) => (float[1000000, 1000000] y) { y = Relu(x) }")),
    "integer division by zero": lambda: _bytes(parse("g (int32[N] x) => (int32[N] y) <int32 z = {0}> { y = Div(x, z) }")),
}

# Feeds of each model's own making: the usual random ones, and those a hostile client sends.
LOOP_FEEDS = {"m": np.array(10**9, np.int64), "go": np.array(True), "x": np.ones(2, np.float32)}
FEEDS: dict[str, dict] = {
    "float64 where float32 is declared": {"x": np.zeros((2, 4))},
    "rank 3 where rank 2 is declared": {"x": np.zeros((2, 4, 1), np.float32)},
    "a fixed dimension wrong": {"x": np.zeros((2, 5), np.float32)},
    "no inputs": {},
    "an unknown input": {"x": np.zeros((2, 4), np.float32), "z": np.zeros(1, np.float32)},
    "None": {"x": None},
    "a list of lists": {"x": [[1.0, 2.0, 3.0, 4.0]]},
    "strings": {"x": np.array([["a", "b", "c", "d"]])},
    "objects": {"x": np.array([[object()] * 4])},
    "a scalar": {"x": np.float32(1.0)},
    "NaN and infinities": {"x": np.array([[np.nan, np.inf, -np.inf, 0.0]], np.float32)},
    "no rows": {"x": np.zeros((0, 4), np.float32)},
}


def _random_feeds(model_bytes: bytes, seed: int) -> dict:
    from autobatch.ir import from_onnx
    from autobatch.tools import random_feeds

    graph = from_onnx(model_bytes)
    if any(name in graph.inputs for name in ("m", "go")):
        return dict(LOOP_FEEDS)
    if graph.values[graph.inputs[0]].type.elem_type == TensorProto.STRING:
        return {"x": np.array(["a", "bc", ""][: 1 + seed % 3], dtype=object)}
    return random_feeds(graph, np.random.default_rng(seed))


def _ours(error: BaseException) -> bool:
    """An error of ours, that names what is wrong (not a bug's KeyError or AttributeError)."""
    from autobatch.backends import FeedError, NodeExecutionError
    from autobatch.backends.ort_runtime import UnsupportedByOnnxruntime
    from autobatch.frontends.onnx_control_flow import UnrollError
    from autobatch.ir import IRError
    from autobatch.ir.limits import DeadlineExceeded, WorkLimit

    return isinstance(error, (FeedError, NodeExecutionError, UnsupportedByOnnxruntime, UnrollError, IRError,
                              DeadlineExceeded, WorkLimit, CliError))


def _one_line(error: BaseException) -> str:
    if not _ours(error):
        raise AssertionError(f"not one of our errors: {type(error).__name__}: {error}"[:400])
    text = f"{type(error).__name__}: {error}"
    if "\n" in str(error).strip() or len(text) > 600:
        raise AssertionError(f"an error of {len(text)} characters over {text.count(chr(10)) + 1} lines: {text[:300]}")
    return text


def _api_cases() -> Iterator[tuple[str, str, Callable[[], str]]]:
    from autobatch import InferenceSession
    from tests.oracle import assert_same

    def model_case(build: Callable[[], bytes], backend: str) -> Callable[[], str]:
        def run() -> str:
            data = build()
            session = InferenceSession(data, backend=backend)
            instances = [_random_feeds(data, seed) for seed in range(3)]
            batched = session.run_batch(None, instances)
            for feeds, outputs in zip(instances, batched):
                for got, alone in zip(outputs, session.run(None, feeds)):
                    assert_same(got, alone, rtol=1e-5, atol=1e-6)
            return "batched equal alone"
        return run

    def feeds_case(feeds: dict, backend: str) -> Callable[[], str]:
        def run() -> str:
            session = InferenceSession(RELU, backend=backend)
            alone = session.run(None, feeds)
            for got, want in zip(session.run_batch(None, [feeds, feeds])[1], alone):
                assert_same(got, want)
            np.testing.assert_array_equal(alone[0], np.maximum(np.asarray(feeds["x"]), 0))
            return "batched equal alone, equal to NumPy"
        return run

    for backend in BACKENDS:
        for name, build in MODELS.items():
            yield f"API ({backend})", f"model: {name}", model_case(build, backend)
        for name, feeds in FEEDS.items():
            yield f"API ({backend})", f"feeds: {name}", feeds_case(feeds, backend)


def _cli_cases(folder: Path) -> Iterator[tuple[str, str, Callable[[], str]]]:
    from autobatch.cli import main

    def cli(*args: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse's refusal: usage, then one line
                code = exit.code
            except Exception as error:  # noqa: BLE001 - it would be a traceback: what the corpus looks for
                raise AssertionError(f"escaped autobatch's main: {type(error).__name__}: {error}") from None
        errors = err.getvalue().strip()
        if code not in (0, 2):  # 2: `run` with instances that failed, each recorded in the results
            if errors.count("\n") or not errors or "Traceback" in errors:
                raise AssertionError(f"exit {code} without one line of error: {errors[:300]!r}")
            raise CliError(errors)
        return f"exit {code}"

    for name, build in MODELS.items():
        path = folder / f"{len(name)}-{abs(hash(name))}.onnx"
        path.write_bytes(build())
        inputs = folder / "inputs.jsonl"
        yield "CLI inspect", f"model: {name}", lambda p=path: cli("inspect", str(p), "--instances", "2")
        yield "CLI run", f"model: {name}", lambda p=path: _cli_run(cli, p, inputs)


class CliError(Exception):
    """The command line refused, in the one line it printed."""


def _cli_run(cli: Callable[..., str], path: Path, inputs: Path) -> str:
    try:
        feeds = _random_feeds(path.read_bytes(), 0)
    except Exception:  # noqa: BLE001 - the model does not load: `run` must say so itself
        feeds = {"x": np.zeros((1, 4), np.float32)}
    inputs.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in feeds.items()}) + "\n")
    return cli("run", str(path), "--inputs", str(inputs), "-o", str(inputs.with_suffix(".out.jsonl")), "--no-progress")


_BINARY_HEADER = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 1600}}]}).encode()
REQUESTS: dict[str, tuple[str, str, bytes, dict]] = {
    "garbage body": ("POST", "/v2/models/relu/infer", bytes(range(256)), {}),
    "JSON nested 100,000 deep": ("POST", "/v2/models/relu/infer", b"[" * 100_000 + b"]" * 100_000, {}),
    "data nested 50,000 deep": ("POST", "/v2/models/relu/infer", (
        '{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ' + "[" * 50_000 + "1"
        + "]" * 50_000 + "}]}").encode(), {}),
    "a shape of 2^64 elements": ("POST", "/v2/models/relu/infer",
                                 b'{"inputs": [{"name": "x", "shape": [4294967296, 4294967296], "datatype": "FP32", '
                                 b'"data": [1]}]}', {}),
    "a binary size past the body": ("POST", "/v2/models/relu/infer", _BINARY_HEADER + b"\0" * 16,
                                    {"Inference-Header-Content-Length": str(len(_BINARY_HEADER))}),
    "a header length past the body": ("POST", "/v2/models/relu/infer", b"{}", {"Inference-Header-Content-Length": "99999"}),
    "a negative header length": ("POST", "/v2/models/relu/infer", b"{}", {"Inference-Header-Content-Length": "-5"}),
    "strings as data": ("POST", "/v2/models/relu/infer",
                        b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ["a", "b", "c", "d"]}]}', {}),
    "an unknown datatype": ("POST", "/v2/models/relu/infer",
                            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP128", "data": [1, 2, 3, 4]}]}', {}),
    "a trip count of 10^9": ("POST", "/v2/models/loop/infer", json.dumps({"inputs": [
        {"name": "m", "shape": [], "datatype": "INT64", "data": [10**9]},
        {"name": "go", "shape": [], "datatype": "BOOL", "data": [True]},
        {"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}).encode(), {}),
    "an unknown model": ("POST", "/v2/models/nope/infer", b"{}", {}),
    "GET on infer": ("GET", "/v2/models/relu/infer", b"", {}),
}


def _server_cases() -> Iterator[tuple[str, str, Callable[[], str]]]:
    from autobatch.serving import Engine, ModelRegistry
    from autobatch.serving.server import serve_in_thread

    registry = ModelRegistry([Engine(RELU, name="relu"), Engine(_loop("m", ""), name="loop", max_unrolled_nodes=10_000)])
    stack = contextlib.ExitStack()
    server = stack.enter_context(serve_in_thread(registry))

    def send(method: str, path: str, body: bytes, headers: dict) -> str:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=SECONDS)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        if not 400 <= response.status < 500:
            raise AssertionError(f"status {response.status} for a broken request: {data[:200]!r}")
        try:
            error = json.loads(data)["error"]
        except (ValueError, KeyError, TypeError):
            raise AssertionError(f"status {response.status} without a JSON error: {data[:200]!r}") from None
        answer = send_valid()
        return f"{response.status}: {error[:200]} (then a valid request: {answer})"

    def send_valid() -> str:
        x = [[1.0, -2.0, 3.0, -4.0]]
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": sum(x, [])}]})
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=SECONDS)
        try:
            connection.request("POST", "/v2/models/relu/infer", body=body)
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
        assert response.status == 200 and answer["outputs"][0]["data"] == [1.0, 0.0, 3.0, 0.0], answer
        return "right"

    try:
        for name, (method, path, body, headers) in REQUESTS.items():
            yield "server", f"request: {name}", lambda m=method, p=path, b=body, h=headers: send(m, p, b, h)
    finally:
        stack.close()


class Timeout(BaseException):  # not an Exception: nothing on the way may take it for a failure of its own
    pass


def _alarm(signum, frame):  # noqa: ANN001
    raise Timeout(f"over {SECONDS} s")


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    signal.signal(signal.SIGALRM, _alarm)
    warnings.simplefilter("ignore")
    with TemporaryDirectory() as folder:
        for cases in (_api_cases(), _cli_cases(Path(folder)), _server_cases()):
            for surface, case, run in cases:
                start = time.perf_counter()
                signal.alarm(SECONDS)
                try:
                    outcome, message = "ok", run()
                except (Timeout, AssertionError) as error:
                    outcome, message = "FAILED", f"{type(error).__name__}: {error}"[:800]
                except Exception as error:  # noqa: BLE001 - an error is the expected answer to most cases
                    try:
                        outcome, message = "error", _one_line(error)
                    except AssertionError as unclear:
                        outcome, message = "FAILED", str(unclear)
                except BaseException:  # RecursionError is an Exception; this is what must never escape
                    outcome, message = "FAILED", traceback.format_exc(limit=4)[-800:]
                finally:
                    signal.alarm(0)
                print(json.dumps({"surface": surface, "case": case, "outcome": outcome, "message": message,
                                  "seconds": round(time.perf_counter() - start, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
