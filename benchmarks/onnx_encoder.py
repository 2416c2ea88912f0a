"""An ONNX encoder of ONE text (``x [N, d]``: self-attention, one head, and a feed-forward layer
a block; scores scaled by 1/sqrt(size)), run for many texts of different lengths: onnxruntime one text at a time versus
``InferenceSession.run_batch``, its plan run as one onnxruntime session (from its second use)
and step by step, side by side.

    python -m benchmarks.onnx_encoder [--texts 64] [--size 64] [--layers 2] [--repeats 5]

Lengths: the first WikiNER dev sentences (synthetic ones of the same statistics without the
data). The projections run as ragged launches over every text's rows; the ``[N, N]`` attention
products, one shape a length, run one launch a length. Every batched result is checked against
onnxruntime's for that text first (float32, with an added absolute error of 1e-5 times the
text's largest output: a ragged launch puts every text's rows through one larger product).
"""

from __future__ import annotations

import numpy as np
import onnx

from autobatch import InferenceSession, arguments
from autobatch.datasets import wikiner_sentences
from benchmarks.models import with_random_weights
from benchmarks.timing import onnxruntime_alone, print_against, timed

THREADS = 2
BLOCK = ["q = MatMul(x, Q)", "k = MatMul(x, K)", "v = MatMul(x, V)", "kt = Transpose<perm = [1, 0]>(k)",
         "a = MatMul(q, kt)", "z = Mul(a, scale)", "p = Softmax<axis = -1>(z)", "c = MatMul(p, v)", "r = Add(x, c)", "u = MatMul(r, F)",
         "t = Relu(u)", "y = Add(r, t)"]


def build_model(size: int, layers: int, seed: int = 0) -> onnx.ModelProto:
    lines = []
    for layer in range(layers):  # every value of block ``layer`` is suffixed with it; x is the last block's y
        rename = {name: f"{name}{layer}" for name in ("q", "k", "v", "kt", "a", "z", "p", "c", "r", "u", "t", "y")}
        rename["x"] = f"y{layer - 1}" if layer else "x"
        for line in BLOCK:
            out, op = line.split(" = ", 1)
            name, args = op.split("(", 1)
            args = ", ".join(rename.get(a, a) for a in args.rstrip(")").split(", "))
            lines.append(f"{rename[out]} = {name}({args})")
    weights = [f"float[{size}, {size}] {name}" for name in "QKVF"]
    model = onnx.parser.parse_model(f"""<ir_version: 9, opset_import: ["" : 18]>
    encoder (float[N, {size}] x) => (float[N, {size}] y{layers - 1}) <{", ".join(weights)}> {{
    scale = Constant<value = float {{{1 / np.sqrt(size)}}}>()
    {chr(10).join(lines)}
    }}""")
    return with_random_weights(model, {name: (size, size) for name in "QKVF"}, seed)


def main(argv: list[str] | None = None) -> None:
    parser = arguments.parser("python -m benchmarks.onnx_encoder", __doc__.splitlines()[0])
    parser.add_argument("--texts", type=arguments.integer(1), default=64)
    parser.add_argument("--size", type=arguments.integer(1), default=64, help="model width")
    parser.add_argument("--layers", type=arguments.integer(1), default=2)
    parser.add_argument("--repeats", type=arguments.integer(1), default=5)
    args = parser.parse_args(argv)
    sentences, source = wikiner_sentences(limit=args.texts)
    rng = np.random.default_rng(0)
    texts = [{"x": rng.standard_normal((len(s), args.size)).astype(np.float32)} for s in sentences]
    model = build_model(args.size, args.layers)
    lengths = [len(s) for s in sentences]
    print(f"{len(texts)} texts, lengths {min(lengths)}..{max(lengths)} from {source}; size {args.size}, "
          f"{args.layers} layers, {THREADS} threads; fastest of {args.repeats} runs")

    alone = onnxruntime_alone(model, THREADS)
    # Always batched: these time the plan (a session's default may run a mix alone, ``autobatch.ways``).
    ours = {"one onnxruntime session": InferenceSession(model, backend="onnxruntime", threads=THREADS,
                                                        alone_when_faster=False),
            "step by step": InferenceSession(model, backend="onnxruntime", threads=THREADS, whole_plans=0,
                                             alone_when_faster=False)}
    expected = [alone.run(None, text)[0] for text in texts]
    for name, session in ours.items():
        for _ in range(2):  # planned, then the kept plan
            for want, got in zip(expected, session.run_batch(None, texts), strict=True):
                # a ragged launch sums each row in a larger product: the fuzzer's tolerance (README)
                np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6 + 1e-5 * float(np.abs(want).max()),
                                           err_msg=name)
    print("every batched result equals onnxruntime's for its text alone")

    seconds = {"onnxruntime, one text at a time": timed(lambda: [alone.run(None, t) for t in texts], args.repeats)[1]}
    for name, session in ours.items():
        seconds[f"ours, run_batch ({name})"] = timed(lambda: session.run_batch(None, texts), args.repeats)[1]
    print_against(seconds, "onnxruntime, one text at a time", lambda value: f"{value * 1e3:8.2f} ms")
    print(f"  run_batch: {ours['one onnxruntime session'].stats}")


if __name__ == "__main__":
    main()
