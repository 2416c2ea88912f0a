"""NumPy interpreter vs onnxruntime, one instance at a time vs batched, primitive ops vs
cells: side by side in one run.

    python -m benchmarks.backends_throughput [--minibatch 64] [--size 256] [--providers auto|cpu|cuda]

Prints each backend's overhead per launch, then for the Tree-LSTM (SST trees) and the BiLSTM
tagger (WikiNER sentences) of ``autobatch.examples``: instances per second, tracing included,
for every (form, backend, one at a time | batched), and the ratio to NumPy one at a time with
primitive ops. Every variant's losses are checked against that baseline before timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from autobatch import arguments
from autobatch.backends import Interpreter
from autobatch.backends.ort_runtime import OrtSettings
from autobatch.batch import Batch
from autobatch.ir import from_onnx
from benchmarks.timing import timed
from benchmarks.models import Workload, bilstm_workload, tree_lstm_workload


def launch_overhead(repeats: int = 2000) -> None:
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "one",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
        opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    x = np.ones(4, np.float32)
    interpreter = Interpreter(from_onnx(model))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    print("overhead of one launch (a one-op graph):")
    for name, call in (("numpy interpreter", lambda: interpreter.run({"x": x})),
                       ("onnxruntime run()", lambda: session.run(None, {"x": x}))):
        call()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        print(f"  {name:<20} {(time.perf_counter() - start) / repeats * 1e6:6.1f} us")


def losses(workload: Workload, backend: str, batched: bool, providers: list[str]) -> list[np.ndarray]:
    loss, instances, params, _ = workload
    if batched:
        with Batch(backend=backend, threads=2, providers=providers) as batch:
            return batch.run([loss(x, params) for x in instances])
    results = []
    for x in instances:
        with Batch(backend=backend, threads=2, providers=providers) as batch:
            results.append(batch.run([loss(x, params)])[0])
    return results


def compare(name: str, make: Callable[[str], Workload], repeats: int, providers: list[str]) -> None:
    workloads = {form: make(form) for form in ("primitive", "cells")}
    count = len(workloads["primitive"][1])
    print(f"\n{name}: {count} instances from {workloads['primitive'][3]}")
    baseline_values, baseline = None, None
    for form, workload in workloads.items():
        for backend in ("numpy", "onnxruntime"):
            for batched in (False, True):
                values, seconds = timed(lambda: losses(workload, backend, batched, providers), repeats)
                if baseline_values is None:
                    baseline_values, baseline = values, seconds
                np.testing.assert_allclose(np.array(values), np.array(baseline_values), rtol=1e-4, atol=1e-4)
                label = f"{form}, {backend}, {'batched' if batched else 'one at a time'}"
                print(f"  {label:<40} {count / seconds:8.1f} instances/s   {baseline / seconds:5.1f}x")


def main() -> None:
    parser = arguments.parser("python -m benchmarks.backends_throughput", __doc__.split("\n\n")[0])
    parser.add_argument("--minibatch", type=arguments.integer(1), default=64)
    parser.add_argument("--size", type=arguments.integer(1), default=256)
    parser.add_argument("--repeats", type=arguments.integer(1), default=2, help="timed rounds after a warm-up (fastest kept)")
    arguments.add_providers(parser)
    args = parser.parse_args()
    providers = arguments.providers(args.providers)
    settings = OrtSettings(providers, threads=2)
    print(f"onnxruntime {ort.__version__} on {settings.providers[0]}")
    launch_overhead()
    compare(f"Tree-LSTM (size {args.size})", lambda form: tree_lstm_workload(args.minibatch, args.size, form),
            args.repeats, providers)
    compare(f"BiLSTM tagger (size {args.size})", lambda form: bilstm_workload(args.minibatch, args.size, form),
            args.repeats, providers)


if __name__ == "__main__":
    main()
