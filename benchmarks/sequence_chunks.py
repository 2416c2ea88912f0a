"""How ``batcher.sequences`` cuts a layer's sequences into padded calls: onnxruntime's LSTM over
the first 64 WikiNER dev sentences (synthetic ones of the same statistics without the data), and
over the characters of the words the char tagger spells in them, padded in chunks of several
sizes and in the chunks the library's cost model picks, weights fed or baked in, side by side.

    python -m benchmarks.sequence_chunks [--size 256] [--sentences 64] [--repeats 7]

The words' LSTM is ``--size`` on ``--size``; the characters' is ``--size // 2`` on 64, as in the
char tagger. Each variant runs the whole minibatch (every chunk, the padding gathers included)
and keeps the fastest of ``--repeats`` runs; ratios are against the library's chunks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from autobatch import arguments
from autobatch.batcher.sequences import CHUNK, chunks, row_flops
from autobatch.datasets import wikiner_sentences
from autobatch.examples import char_tagger
from autobatch.ir.onnx_io import choose_ir_version
from benchmarks.tasks import CHAR_VOCABULARY_SENTENCES
from benchmarks.timing import timed

CHUNK_SIZES = (4, 8, 16, 32, 128)
THREADS = 2


def layer_session(direction: str, width: int, size: int, baked: bool, rng: np.random.Generator,
                  ) -> tuple[ort.InferenceSession, dict[str, np.ndarray]]:
    """An LSTM of ``size`` over ``X [T, B, width]`` with ``sequence_lens``; W, R, B
    initializers when ``baked``, else inputs (returned as feeds)."""
    dirs = 2 if direction == "bidirectional" else 1
    weights = {"W": rng.standard_normal((dirs, 4 * size, width)), "R": rng.standard_normal((dirs, 4 * size, size)),
               "B": np.zeros((dirs, 8 * size))}
    weights = {name: (value / np.sqrt(size)).astype(np.float32) for name, value in weights.items()}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", width]),
              helper.make_tensor_value_info("lengths", TensorProto.INT32, ["B"])]
    if not baked:
        inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, value.shape) for name, value in weights.items()]
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "lengths"], ["Y"], hidden_size=size, direction=direction)
    graph = helper.make_graph([node], "lstm", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, n) for n, v in weights.items()] if baked else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = choose_ir_version(model, None)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session, {} if baked else weights


def main(argv: list[str] | None = None) -> None:
    parser = arguments.parser("python -m benchmarks.sequence_chunks", __doc__.splitlines()[0])
    parser.add_argument("--size", type=arguments.integer(2), default=256, help="input = hidden size of the words' LSTM")
    parser.add_argument("--sentences", type=arguments.integer(1), default=64)
    parser.add_argument("--repeats", type=arguments.integer(1), default=7)
    args = parser.parse_args(argv)
    corpus, source = wikiner_sentences(limit=max(CHAR_VOCABULARY_SENTENCES, args.sentences))
    words = char_tagger.make_vocabularies(corpus)[0]
    sentences = corpus[:args.sentences]
    spelled = [len(w) + 2 for s in sentences for w, _ in s if char_tagger.is_spelled(w, words)]  # a pad each end
    rng = np.random.default_rng(0)
    print(f"{len(sentences)} sentences from {source}; onnxruntime {ort.__version__}, {THREADS} threads; "
          f"fastest of {args.repeats} runs")
    layers = [("words", [len(s) for s in sentences], args.size, args.size),
              ("characters", spelled, char_tagger.CHAR_EMBEDDING, args.size // 2)]
    for name, lengths, width, size in layers:
        print(f"\n{name}: {len(lengths)} sequences, {sum(lengths)} steps, lengths {min(lengths)}..{max(lengths)}; "
              f"LSTM of {size} on {width}")
        rows = rng.standard_normal((sum(lengths) + 1, width)).astype(np.float32)
        rows[-1] = 0  # the padding row

        def minibatch(session: ort.InferenceSession, feeds: dict[str, np.ndarray], chunk: int | None,
                      flops: float | None = None) -> Callable[[], None]:
            parts = [(part.source, len(part.members), part.lengths)
                     for part in chunks(lengths, chunk or len(lengths), flops)]

            def run() -> None:
                for source, members, part_lengths in parts:
                    x = rows.take(source, axis=0).reshape(-1, members, width)
                    session.run(None, {"X": x, "lengths": part_lengths, **feeds})
            return run

        for direction in ("forward", "bidirectional"):
            dirs = 2 if direction == "bidirectional" else 1
            flops = row_flops(dirs, 4 * size, width, size)
            session, _ = layer_session(direction, width, size, True, rng)
            fed_session, weights = layer_session(direction, width, size, False, rng)
            seconds = {"by cost (the library's), baked": timed(minibatch(session, {}, None, flops), args.repeats)[1]}
            seconds.update((f"chunks of {c}, baked", timed(minibatch(session, {}, c), args.repeats)[1]) for c in CHUNK_SIZES)
            seconds["one padded call, baked"] = timed(minibatch(session, {}, None), args.repeats)[1]
            seconds[f"chunks of {CHUNK}, fed"] = timed(minibatch(fed_session, weights, CHUNK), args.repeats)[1]
            calls = len(chunks(lengths, row_flops=flops))
            ours = seconds["by cost (the library's), baked"]
            print(f"  {direction} (the library's: {calls} calls):")
            for variant, value in seconds.items():
                print(f"    {variant:32} {value * 1e3:7.2f} ms   {value / ours:5.2f}x the library's")


if __name__ == "__main__":
    main()
