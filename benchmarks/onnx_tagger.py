"""An ONNX model of ONE sentence with a bidirectional LSTM, run for many sentences of different
lengths: onnxruntime one sentence at a time (the model as exported) versus
``InferenceSession.run_batch`` (the layer's calls packed into one launch, ``batcher/sequences.py``;
the plan run as one onnxruntime session from its second use, or step by step), side by side.

    python -m benchmarks.onnx_tagger [--sentences 64] [--size 256] [--repeats 5]

The model: word ids ``int64[N]`` -> Gather (embeddings) -> LSTM (bidirectional, over ``[N, 1, d]``)
-> ``tanh(states @ H) @ O`` -> LogSoftmax: ``[N, tags]``. Sentences: the first WikiNER dev
sentences (synthetic ones of the same statistics without the data). Every batched result is
checked against onnxruntime's for that sentence first.
"""

from __future__ import annotations


import numpy as np
import onnx

from autobatch import arguments
from autobatch import InferenceSession
from autobatch.datasets import wikiner_sentences
from benchmarks.models import with_random_weights
from benchmarks.timing import onnxruntime_alone, print_against, timed

TAGS = 9
THREADS = 2


def build_model(words: int, size: int, seed: int = 0) -> onnx.ModelProto:
    model = onnx.parser.parse_model(f"""
    <ir_version: 9, opset_import: ["" : 18]>
    tagger (int64[N] ids) => (float[N, {TAGS}] scores)
        <float[{words}, {size}] E, float[2, {4 * size}, {size}] W, float[2, {4 * size}, {size}] R,
         float[2, {8 * size}] B, float[{2 * size}, {size}] H, float[{size}, {TAGS}] O, int64[1] one = {{1}}> {{
        x = Gather<axis=0>(E, ids)
        sequence = Unsqueeze(x, one)
        states = LSTM<hidden_size={size}, direction="bidirectional">(sequence, W, R, B)
        rows = Flatten<axis=1>(states)
        projected = MatMul(rows, H)
        hidden = Tanh(projected)
        logits = MatMul(hidden, O)
        scores = LogSoftmax<axis=1>(logits)
    }}""")
    shapes = {"E": (words, size), "W": (2, 4 * size, size), "R": (2, 4 * size, size), "B": (2, 8 * size),
              "H": (2 * size, size), "O": (size, TAGS)}
    return with_random_weights(model, shapes, seed)


def main(argv: list[str] | None = None) -> None:
    parser = arguments.parser("python -m benchmarks.onnx_tagger", __doc__.splitlines()[0])
    parser.add_argument("--sentences", type=arguments.integer(1), default=64)
    parser.add_argument("--size", type=arguments.integer(1), default=256, help="embedding = LSTM hidden = MLP hidden size")
    parser.add_argument("--repeats", type=arguments.integer(1), default=5)
    args = parser.parse_args(argv)
    sentences, source = wikiner_sentences(limit=args.sentences)
    vocabulary = {w: k for k, w in enumerate(sorted({w for s in sentences for w, _ in s}))}
    instances = [{"ids": np.array([vocabulary[w] for w, _ in s], dtype=np.int64)} for s in sentences]
    model = build_model(len(vocabulary), args.size)
    lengths = [len(s) for s in sentences]
    print(f"{len(sentences)} sentences from {source}: lengths {min(lengths)}..{max(lengths)}, size {args.size}, "
          f"{THREADS} threads; fastest of {args.repeats} runs")

    alone = onnxruntime_alone(model, THREADS)
    # Always batched: these time the plan (a session's default may run a mix alone, ``autobatch.ways``).
    ours = {backend: InferenceSession(model, backend=backend, threads=THREADS, alone_when_faster=False)
            for backend in ("onnxruntime", "numpy")}
    ours["onnxruntime, step by step"] = InferenceSession(model, backend="onnxruntime", threads=THREADS, whole_plans=0,
                                                         alone_when_faster=False)

    expected = [alone.run(None, instance)[0] for instance in instances]
    for backend, session in ours.items():
        for want, got in zip(expected, session.run_batch(None, instances), strict=True):
            np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5, err_msg=f"{backend} batched")
    print("every batched result equals onnxruntime's for its sentence alone")

    seconds = {"onnxruntime, one sentence at a time": timed(lambda: [alone.run(None, i) for i in instances],
                                                              args.repeats)[1]}
    for backend, session in ours.items():
        if "step by step" not in backend:  # its one-instance runs are the onnxruntime variant's
            seconds[f"ours ({backend}), one at a time"] = timed(lambda: [session.run(None, i) for i in instances],
                                                                args.repeats)[1]
        seconds[f"ours ({backend}), run_batch"] = timed(lambda: session.run_batch(None, instances), args.repeats)[1]
    print_against(seconds, "onnxruntime, one sentence at a time", lambda value: f"{len(instances) / value:8.1f} sentences/s")
    print(f"  run_batch on onnxruntime: {ours['onnxruntime'].stats}")


if __name__ == "__main__":
    main()
