"""Traces a set of programs and prints what they recorded and computed, one line a fact, so that
two runs (the compiled recorder and AUTOBATCH_PURE_PYTHON=1) can be compared line by line
(tests/test_recorder.py). The first line says which recorder ran."""

from __future__ import annotations

import hashlib

import numpy as np

from autobatch import Batch, Parameter, TraceError, cell, ops
from autobatch.examples import bilstm_tagger, tree_lstm
from autobatch.datasets import sst_trees, wikiner_sentences
from autobatch.frontends import recorder
from autobatch.frontends.tracing import Tracer

RNG = np.random.default_rng(0)
W = Parameter(RNG.standard_normal((4, 4)).astype(np.float32), name="W")
B = Parameter(RNG.standard_normal(4).astype(np.float32), name="B")
E = Parameter(RNG.standard_normal((6, 4)).astype(np.float32), name="E")
# recurrent layers over x [n, 4], hidden 3: LSTM's 4 gates, GRU's 3, RNN's 1; one and two directions
LAYERS = {(op, dirs): [Parameter(RNG.standard_normal(shape).astype(np.float32) * 0.5, name=f"{op}{dirs}{part}")
                       for part, shape in zip("WRB", [(dirs, gates * 3, 4), (dirs, gates * 3, 3), (dirs, 2 * gates * 3)])]
          for op, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)) for dirs in (1, 2)}


@cell
def step(h, c):
    return ops.tanh(ops.affine(h, W, B)) * c, c + 1.0


@cell
def scaled(x, k):
    return x * k


@cell
def shifted(n, k):
    return n + k


def small_programs(batch: Tracer) -> list:
    global x, m  # read again by main's errors
    x = batch.constant(RNG.standard_normal(4).astype(np.float32))
    m = batch.constant(RNG.standard_normal((3, 4)).astype(np.float32))
    n = batch.constant(np.arange(6, dtype=np.int64).reshape(2, 3))
    shared = batch.parameter(B)  # a tensor whose entry is its name
    h, c = step(x, x)
    again, _ = step(x, x)  # reused: the same call on the same tensors
    outs = [
        h, again, c, ops.tanh(x), ops.tanh(x),  # reused
        x * 2.0, 3.0 - x, x + B, B + x, m + B, m * x,  # scalars, parameters, broadcasting
        ops.esum([x, h, c]), ops.concat([x, h]), ops.matmul(m, W), n + n, n * 2,
        scaled(x, 0.5), scaled(h, 2.0), step(m, m)[0],
        ops.sigmoid(ops.sub(x, h)), ops.div(h, ops.exp(x)), ops.neg(ops.log(ops.relu(x) + 1.0)),
        ops.square(x), -x, x[1],
        scaled(x, B), shifted(n, 3), shifted(n, 3), step(x, ops.lookup(E, 2))[0],  # a parameter, ints: the memo's
        ops.lookup(E, 2), ops.lookup(E, 2), ops.lookup(E, -1), ops.pick(E, np.int64(5)), ops.lookup(E, [1, 2]),
        ops.matmul(x, W), ops.matmul(x, W), ops.matmul(W, W), ops.matmul(B, W),
        ops.matmul(ops.stack([m, m]), W),  # batch axes: the Python's
        *ops.split(x, 2), *ops.split(x, 2), *ops.split(m, 3), ops.concat([m, m], axis=1), ops.concat([x, x, h]),
        *ops.split(m, 2, axis=1), *ops.split(m, 4, -1), *ops.split(x, np.int64(4)), *ops.split(n, 3, axis=1),
        m[2], m[-1], x[-4], n[1], ops.pick(x, 1), ops.pick(m, np.int64(0)), x[True],  # picks by int: each type's
        ops.concat([m, m, m], -1), ops.concat((m, m[1:2])), ops.concat([x]), ops.concat([x, B]), ops.concat([B, x]),
        ops.concat([x, np.ones(2, np.float32)]), ops.concat([n, n], axis=np.int64(1)),  # tuples, parameters, arrays
        shared + h, shared * shared, x - shared,  # a shared operand first, only shared ones: the result's type
    ]
    layers = {"LSTM": ops.lstm, "GRU": ops.gru, "RNN": ops.rnn}
    for (op, dirs), (w, r, b) in LAYERS.items():  # each layer met first (the Python checks it), then again
        for direction in (("forward", "reverse") if dirs == 1 else ("bidirectional",)):
            for seq, bias in ((m, b), (m, b), (m[1:], None), (m[:1], b), (m, layer_tensor(batch, b))):
                outs += layers[op](seq, w, r, bias, direction=direction)
            outs += layers[op](m, layer_tensor(batch, w), r, b, direction)
    outs += ops.gru(m, *LAYERS["GRU", 2], direction="bidirectional", linear_before_reset=True)
    outs += ops.lstm(m, *LAYERS["LSTM", 1])  # reused: the same call on the same tensors
    with batch.instance():
        outs.append(ops.affine(ops.tanh(x), W, B))
    return outs


def layer_tensor(batch: Tracer, parameter: Parameter) -> object:
    """A weight as a traced value of the batch (not a parameter): the layer's operands every kind."""
    return ops.add(batch.constant(parameter.array.copy()), 0.0)


def digest(value: np.ndarray) -> str:
    value = np.asarray(value)
    return f"{value.dtype}{value.shape}:{hashlib.sha256(value.tobytes()).hexdigest()[:16]}"


def records(batch: Tracer) -> list[str]:
    keys: dict = {}
    lines = []
    for r in batch._records:
        key = keys.setdefault(id(r.key) if not isinstance(r.key, tuple) else repr(r.key[:2]) + repr(r.key[3:]),
                              len(keys))
        lines.append(" ".join(map(str, (r.op_type, r.domain, r.inputs, r.outputs, sorted(r.attributes),
                                        [str(t) for t in r.types], [str(e) for e in r.entries], key, r.preds,
                                        r.instance, r.captured))))
    return lines


def main() -> None:
    print("compiled" if recorder.COMPILED else "python")
    with Batch(backend="numpy") as batch:
        outs = small_programs(batch)
        print("\n".join(records(batch)))
        print("reused", batch.reused_calls)
        for value in batch.run(outs):
            print(digest(value))
        other = Batch()
        try:
            ops.add(outs[0], other.constant(np.zeros(4, np.float32)))
        except TraceError as error:
            print("error:", error)
        for bad in (lambda: x[4], lambda: m[-4], lambda: ops.split(x, 3), lambda: ops.split(x, 0),
                    lambda: ops.split(m, 2, axis=2), lambda: ops.split(x, 2.0), lambda: ops.pick(x, 2**70),
                    lambda: ops.concat([m, x]), lambda: ops.concat([m, m[1:3]], axis=1), lambda: ops.concat([m], 2),
                    lambda: ops.concat([m, ops.transpose(m)]), lambda: ops.lstm(m, *LAYERS["LSTM", 2]),
                    lambda: ops.lstm(m[:0], *LAYERS["LSTM", 1]), lambda: ops.lstm(x, *LAYERS["LSTM", 1]),
                    lambda: ops.rnn(m, *LAYERS["RNN", 1], direction="sideways"),
                    lambda: ops.gru(m, *LAYERS["LSTM", 1])):
            try:
                bad()
            except TraceError as error:
                print("error:", error)
        lost = ops.tanh(outs[0])
        batch.discard()
        try:
            ops.tanh(lost)
        except TraceError as error:
            print("error:", error)
    trees, _ = sst_trees(limit=4)
    tree_params = tree_lstm.make_params(tree_lstm.make_vocabulary(trees), size=8)
    sentences, _ = wikiner_sentences(limit=4)
    tagger_params = bilstm_tagger.make_params(*bilstm_tagger.make_vocabularies(sentences), size=8)
    for name, loss, examples, params in (
            ("tree primitive", tree_lstm.loss_primitive, trees, tree_params),
            ("tree cells", tree_lstm.loss_cells, trees, tree_params),
            ("tree fold", tree_lstm.loss_fold, trees, tree_params),
            ("tagger primitive", bilstm_tagger.LOSSES["primitive"], sentences, tagger_params),
            ("tagger cells", bilstm_tagger.LOSSES["cells"], sentences, tagger_params)):
        with Batch(backend="numpy") as batch:
            losses = [loss(example, params) for example in examples]
            lines = records(batch)
            print(name, len(lines), "records", hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16],
                  "reused", batch.reused_calls)
            print(name, [digest(value) for value in batch.run(losses)])


if __name__ == "__main__":
    main()
