"""``autobatch rewrite`` on branches of different lengths: onnxruntime on the input graph vs on
the rewritten one, side by side. A branch a WikiNER dev sentence (synthetic ones of the same
statistics without the data), either an LSTM tagger (two LSTM layers and a tag layer) or an
encoder layer (one self-attention head and a feed-forward layer).

    python -m benchmarks.rewrite_branches [--branches 8] [--size 64] [--repeats 50]

The rewrite packs each LSTM layer's branches into one launch and runs every projection of the
encoder as one ragged MatMul over all branches' rows. Then the same with every branch of one
symbolic length ``L`` (the rewritten graph reads L from its inputs), run at the median length. Both graphs run in one onnxruntime session
each, on ``THREADS`` threads; the fastest of ``--repeats`` runs is kept.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort

from autobatch.backends.ort_runtime import CPU, new_session, session_options
from autobatch.datasets import wikiner_sentences
from autobatch.ir import from_onnx, to_onnx
from autobatch.tools import batch_one_graph, compute_ops, random_feeds
from benchmarks.models import with_random_weights
from benchmarks.timing import timed

THREADS = 2


def branches_model(body: list[str], inputs: list[str], outputs: list[str],
                   weights: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    shared = ", ".join(f"float[{', '.join(map(str, shape))}] {name}" for name, shape in weights.items())
    text = (f'<ir_version: 9, opset_import: ["" : 18]>\nbranches ({", ".join(inputs)}) => ({", ".join(outputs)})\n'
            f"<{shared}> {{\n" + "\n".join(body) + "\n}")
    return with_random_weights(onnx.parser.parse_model(text), weights)


def lstm_tagger_branches(lengths: list[int], d: int, h: int, tags: int = 9) -> onnx.ModelProto:
    """A branch a sentence: two LSTM layers over its own length, then a tag layer."""
    inputs, outputs = [], []
    body = [f"shape = Constant <value = int64[3] {{-1, 1, {h}}}> ()", f"rows = Constant <value = int64[2] {{-1, {h}}}> ()"]
    for k, n in enumerate(lengths):
        inputs.append(f"float[{n}, 1, {d}] x{k}")
        outputs.append(f"float[{n}, {tags}] tags{k}")
        body += [f"y{k}, h{k} = LSTM <hidden_size = {h}> (x{k}, W1, R1)", f"s{k} = Reshape(y{k}, shape)",
                 f"z{k}, g{k} = LSTM <hidden_size = {h}> (s{k}, W2, R2)", f"f{k} = Reshape(z{k}, rows)",
                 f"tags{k} = MatMul(f{k}, O)"]
    return branches_model(body, inputs, outputs, {"W1": (1, 4 * h, d), "R1": (1, 4 * h, h), "W2": (1, 4 * h, h),
                                                  "R2": (1, 4 * h, h), "O": (h, tags)})


def encoder_branches(lengths: list[int], d: int) -> onnx.ModelProto:
    """A branch a text: one self-attention head and a feed-forward layer over its own length."""
    inputs, outputs, body = [], [], []
    for k, n in enumerate(lengths):
        inputs.append(f"float[{n}, {d}] x{k}")
        outputs.append(f"float[{n}, {d}] y{k}")
        body += [f"q{k} = MatMul(x{k}, Q)", f"kk{k} = MatMul(x{k}, K)", f"v{k} = MatMul(x{k}, V)",
                 f"kt{k} = Transpose <perm = [1, 0]> (kk{k})", f"a{k} = MatMul(q{k}, kt{k})",
                 f"p{k} = Softmax <axis = -1> (a{k})", f"c{k} = MatMul(p{k}, v{k})", f"r{k} = Add(x{k}, c{k})",
                 f"u{k} = MatMul(r{k}, F)", f"t{k} = Relu(u{k})", f"y{k} = Add(r{k}, t{k})"]
    return branches_model(body, inputs, outputs, {name: (d, d) for name in "QKVF"})


def one_symbolic_length(model: onnx.ModelProto) -> onnx.ModelProto:
    """The branches' inputs and outputs with their length as the symbol ``L`` (every branch one
    length, known only at run time)."""
    for info in [*model.graph.input, *model.graph.output]:
        info.type.tensor_type.shape.dim[0].dim_param = "L"
    return model


def compare(name: str, model: onnx.ModelProto, repeats: int, length: int | None = None) -> None:
    graph = from_onnx(model)
    rewritten = batch_one_graph(graph)
    feeds = random_feeds(graph, np.random.default_rng(0), {"L": length} if length else None)
    options = session_options(threads=THREADS)
    times, results = [], []
    for version in (to_onnx(graph), to_onnx(rewritten)):
        session: ort.InferenceSession = new_session(version, options, [CPU])
        outputs, seconds = timed(lambda s=session: s.run(None, feeds), repeats)
        times.append(seconds)
        results.append(outputs)
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(*results))
    for want, got in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name}: the rewritten graph differs")
    print(f"{name:<14}{compute_ops(graph):>9}{compute_ops(rewritten):>9}{times[0] * 1e3:>12.3f}{times[1] * 1e3:>12.3f}"
          f"{times[0] / times[1]:>8.2f}x{difference:>12.2g}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rewrite_branches", description=__doc__.split("\n\n")[0])
    parser.add_argument("--branches", type=int, default=8, help="branches, one a sentence (default 8)")
    parser.add_argument("--size", type=int, default=64, help="input and hidden size (default 64)")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs, the fastest kept (default 50)")
    args = parser.parse_args(argv)
    sentences, source = wikiner_sentences(args.branches)
    lengths = [len(sentence) for sentence in sentences]
    print(f"{args.branches} branches of lengths {lengths} ({source}); size {args.size}; onnxruntime, {THREADS} threads")
    print(f"{'model':<14}{'ops in':>9}{'ops out':>9}{'input ms':>12}{'rewrite ms':>12}{'speedup':>9}{'max diff':>12}")
    compare("LSTM tagger", lstm_tagger_branches(lengths, args.size, args.size), args.repeats)
    compare("encoder", encoder_branches(lengths, args.size), args.repeats)
    median = sorted(lengths)[len(lengths) // 2]
    print(f"the same, every branch of one symbolic length L, run at L = {median}")
    compare("LSTM tagger, L", one_symbolic_length(lstm_tagger_branches([median] * len(lengths), args.size, args.size)),
            args.repeats, median)
    compare("encoder, L", one_symbolic_length(encoder_branches([median] * len(lengths), args.size)), args.repeats, median)


if __name__ == "__main__":
    main()
