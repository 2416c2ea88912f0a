"""How ``batcher.sequences`` cuts a layer's sequences into padded calls: onnxruntime's LSTM over
the first 64 WikiNER dev sentences (synthetic ones of the same statistics without the data),
padded in chunks of several sizes, and with its weights fed or baked in, side by side.

    python -m benchmarks.sequence_chunks [--size 256] [--sentences 64] [--repeats 7]

Each variant runs the whole minibatch (every chunk, the padding gathers included) and keeps
the fastest of ``--repeats`` runs; ratios are against the chunk size the library uses.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from autobatch import arguments
from autobatch.batcher.sequences import CHUNK, chunks
from autobatch.datasets import wikiner_sentences
from autobatch.ir.onnx_io import choose_ir_version
from benchmarks.timing import timed

CHUNK_SIZES = (4, 8, 16, 32)
THREADS = 2


def layer_session(direction: str, size: int, baked: bool, rng: np.random.Generator,
                  ) -> tuple[ort.InferenceSession, dict[str, np.ndarray]]:
    """An LSTM over ``X [T, B, size]`` with ``sequence_lens``; W, R, B initializers when
    ``baked``, else inputs (returned as feeds)."""
    dirs = 2 if direction == "bidirectional" else 1
    weights = {"W": rng.standard_normal((dirs, 4 * size, size)), "R": rng.standard_normal((dirs, 4 * size, size)),
               "B": np.zeros((dirs, 8 * size))}
    weights = {name: (value / np.sqrt(size)).astype(np.float32) for name, value in weights.items()}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", size]),
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
    parser.add_argument("--size", type=arguments.integer(1), default=256, help="input = hidden size")
    parser.add_argument("--sentences", type=arguments.integer(1), default=64)
    parser.add_argument("--repeats", type=arguments.integer(1), default=7)
    args = parser.parse_args(argv)
    sentences, source = wikiner_sentences(limit=args.sentences)
    lengths = [len(s) for s in sentences]
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((sum(lengths) + 1, args.size)).astype(np.float32)
    rows[-1] = 0  # the padding row
    print(f"{len(lengths)} sentences from {source}: {sum(lengths)} tokens, lengths {min(lengths)}..{max(lengths)}; "
          f"LSTM of {args.size} on {args.size}, onnxruntime {ort.__version__}, {THREADS} threads; "
          f"fastest of {args.repeats} runs")

    def minibatch(session: ort.InferenceSession, feeds: dict[str, np.ndarray], size: int) -> Callable[[], None]:
        parts = [(part.source, len(part.members), part.lengths) for part in chunks(lengths, size)]

        def run() -> None:
            for source, members, part_lengths in parts:
                x = rows.take(source, axis=0).reshape(-1, members, args.size)
                session.run(None, {"X": x, "lengths": part_lengths, **feeds})
        return run

    for direction in ("forward", "bidirectional"):
        session, _ = layer_session(direction, args.size, True, rng)
        fed_session, weights = layer_session(direction, args.size, False, rng)
        seconds = {f"chunks of {c}, baked": timed(minibatch(session, {}, c), args.repeats)[1] for c in CHUNK_SIZES}
        seconds["one padded call, baked"] = timed(minibatch(session, {}, len(lengths)), args.repeats)[1]
        seconds[f"chunks of {CHUNK}, fed"] = timed(minibatch(fed_session, weights, CHUNK), args.repeats)[1]
        ours = seconds[f"chunks of {CHUNK}, baked"]
        print(f"\n{direction}:")
        for name, value in seconds.items():
            print(f"  {name:24} {value * 1e3:7.2f} ms   {value / ours:5.2f}x the library's (chunks of {CHUNK}, baked)")


if __name__ == "__main__":
    main()
