"""NumPy interpreter vs onnxruntime, one instance at a time vs batched, side by side.

    python -m benchmarks.backends_throughput [--minibatch 64] [--size 256] [--batches 2]

Prints the per-launch overhead of each backend, then for Tree-LSTM (SST trees) and the BiLSTM
tagger (WikiNER sentences), built from primitive ops, instances per second for each variant
and its ratio to one-at-a-time NumPy. Every variant's outputs are checked against running
each instance alone before anything is timed. Graph building is not timed; batching
(union, schedule, rewrite) is, as part of "batched".
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from autobatch.backends import Interpreter, OrtExecutor, SessionCache
from autobatch.backends.ort_runtime import CPU, CUDA
from autobatch.batcher import BatchingPass
from autobatch.ir import Graph, from_onnx
from benchmarks.batcher_launches import sentence_graphs, tree_graphs


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
    for name, call in (("numpy interpreter", lambda: interpreter.run({"x": x})),
                       ("onnxruntime run()", lambda: session.run(None, {"x": x}))):
        call()
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        print(f"  {name:<20} {(time.perf_counter() - start) / repeats * 1e6:6.1f} us per one-op graph")


def timed(run: Callable[[], list], repeats: int) -> float:
    run()  # warm: sessions created, caches filled
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats


def compare(name: str, graphs: list[Graph], threads: int, repeats: int, providers: list[str] | None) -> None:
    n = len(graphs)
    alone = [Interpreter(g).run({})[0] for g in graphs]
    cache = SessionCache(providers, threads=threads)
    interpreters = [Interpreter(g) for g in graphs]
    executors = [OrtExecutor(g, cache, whole=False) for g in graphs]

    def batched(backend: str, whole: bool = False) -> Callable[[], list]:
        def run() -> list:
            plan = BatchingPass("level")(Graph.union(graphs)).graph
            runner = Interpreter(plan) if backend == "numpy" else OrtExecutor(plan, cache, whole=whole)
            return runner.run({})
        return run

    plan = BatchingPass("level")(Graph.union(graphs)).graph
    whole_plan = OrtExecutor(plan, cache, whole=True)
    variants = {
        "numpy, one at a time": lambda: [i.run({})[0] for i in interpreters],
        "onnxruntime segments, one at a time": lambda: [e.run({})[0] for e in executors],
        "numpy, batched": batched("numpy"),
        "onnxruntime segments, batched": batched("onnxruntime"),
        "onnxruntime whole plan (repeated plan)": lambda: whole_plan.run({}),
    }
    print(f"\n{name}: {n} instances, {sum(len(g) for g in graphs)} ops")
    baseline = None
    for label, run in variants.items():
        outputs = run()
        for a, b in zip(alone, outputs, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
        seconds = timed(run, repeats)
        baseline = baseline or seconds
        print(f"  {label:<40} {n / seconds:8.1f} instances/s   {baseline / seconds:5.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minibatch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--providers", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: CUDA when it loads, else the CPU")
    args = parser.parse_args()
    providers = {"auto": None, "cpu": [CPU], "cuda": [CUDA, CPU]}[args.providers]
    cache = SessionCache(providers)
    if args.providers == "cuda" and not cache.on_cuda:
        raise SystemExit("the CUDA execution provider is not available here")
    print(f"onnxruntime {ort.__version__} on {cache.providers[0]}, {args.threads} threads")
    launch_overhead()
    for name, graphs in (("Tree-LSTM (size 256)", tree_graphs(args.minibatch)[0]),
                         ("BiLSTM tagger (size 256)", sentence_graphs(args.minibatch)[0])):
        compare(name, graphs, args.threads, args.repeats, providers)


if __name__ == "__main__":
    main()
