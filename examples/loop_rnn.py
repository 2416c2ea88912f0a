"""An RNN written as an ONNX Loop over the sequence length, batched across instances of
different lengths step by step.

    python -m autobatch.examples.loop_rnn

Each instance's Loop is unrolled for its own length (``unroll_instance``, inside
``InferenceSession.run_batch``) and the instances are batched by one plan; every result is checked against onnxruntime on the original
model, and the time is compared with running each instance alone on the NumPy interpreter.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime

from autobatch import arguments
from autobatch.backends import Interpreter
from autobatch.ir import from_onnx
from autobatch.session import InferenceSession
from autobatch.ir.onnx_io import choose_ir_version

D, H, INSTANCES, MAX_LENGTH = 16, 32, 32, 40
OPS_PER_STEP = 5  # Gather, MatMul, MatMul, Add, Tanh

def rnn_text(d: int, h: int) -> str:
    """The model in ONNX text: h' = Tanh(x_t W + h U) for each row x_t of x, all states scanned out."""
    return f"""
<ir_version: 8, opset_import: ["" : 17]>
rnn (float[T, {d}] x, float[{h}] h0) => (float[{h}] h_last, float[T, {h}] hs) <float[{d}, {h}] W, float[{h}, {h}] U> {{
    shape = Shape <start = 0, end = 1> (x)
    trip = Squeeze (shape)
    cond = Constant <value = bool {{1}}> ()
    h_last, hs = Loop (trip, cond, h0) <body = step (int64 i, bool c, float[{h}] h) => (bool c_out, float[{h}] h_new, float[{h}] h_scan) {{
        x_t = Gather <axis = 0> (x, i)
        xw = MatMul (x_t, W)
        hu = MatMul (h, U)
        pre = Add (xw, hu)
        h_new = Tanh (pre)
        h_scan = Identity (h_new)
        c_out = Identity (c)
    }}>
}}
"""


def build_model(rng: np.random.Generator) -> onnx.ModelProto:
    model = onnx.parser.parse_model(rnn_text(D, H))
    for name, shape in (("W", (D, H)), ("U", (H, H))):
        weight = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(weight, name))
    model.ir_version = choose_ir_version(model, None)
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = arguments.parser("python -m autobatch.examples.loop_rnn", __doc__.split("\n\n")[0],
                              ["python -m autobatch.examples.loop_rnn --instances 64 --max-length 80"])
    parser.add_argument("--instances", type=arguments.integer(1), default=INSTANCES, help="sequences batched")
    parser.add_argument("--max-length", type=arguments.integer(1), default=MAX_LENGTH,
                        help="the longest sequence (the lengths spread evenly from 1)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    model = build_model(rng)
    graph = from_onnx(model)
    lengths = np.linspace(1, args.max_length, args.instances).astype(int).tolist()
    instances = [{"x": rng.standard_normal((t, D)).astype(np.float32), "h0": np.zeros(H, np.float32)}
                 for t in lengths]

    batching = InferenceSession(model, alone_when_faster=False)  # NumPy; each instance's Loop unrolled
    start = time.perf_counter()
    batched = batching.run_batch(None, instances)
    batched_seconds = time.perf_counter() - start
    timing = ", ".join(f"{name} {seconds * 1e3:.0f}" for name, seconds in batching.stats.seconds.items())

    start = time.perf_counter()
    alone = Interpreter(graph)  # the Loop runs on onnx.reference, one instance at a time
    for inst in instances:
        alone.run(inst)
    alone_seconds = time.perf_counter() - start

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for inst, outputs in zip(instances, batched):
        for got, want in zip(outputs, session.run(None, inst)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    report = batching.stats.report
    print(f"instances          {len(instances)} (lengths {min(lengths)}..{max(lengths)})")
    print(f"total steps        {sum(lengths)} ({sum(lengths) * OPS_PER_STEP} ops one by one)")
    print(f"launches           {report.launches}")
    print(f"lower bound        {report.lower_bound}")
    print(f"run_batch          {batched_seconds * 1e3:.1f} ms ({timing} ms)")
    print(f"each alone (NumPy) {alone_seconds * 1e3:.1f} ms")
    print("every instance equals onnxruntime on the original model")


if __name__ == "__main__":
    main()
