"""Per-instance graphs of the seed paper's models, built directly in the IR with primitive
ONNX ops: a binary Tree-LSTM (dynet-benchmark's treenn) and a BiLSTM tagger.

Every instance graph reads the same parameter arrays, so a union of instances shares them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autobatch.datasets import Tree
from autobatch.ir import Graph, ValueType

OPSET = {"": 18}
F32, I64 = np.float32, np.int64


class GraphBuilder:
    """Adds typed ops with fresh value names to one instance graph."""

    def __init__(self, name: str, params: dict[str, np.ndarray]) -> None:
        self.graph = Graph(name, OPSET)
        self.params = params
        self.count = 0

    def param(self, name: str) -> str:
        if name not in self.graph.values:
            self.graph.add_initializer(name, self.params[name])
        return name

    def const(self, array: np.ndarray) -> str:
        """A literal of this instance (a word index, a label)."""
        self.count += 1
        name = f"v{self.count}"
        self.graph.add_initializer(name, array, literal=True)
        return name

    def op(self, op_type: str, inputs: Sequence[str], shape: Sequence[int], attributes: dict | None = None,
           dtype: type = F32) -> str:
        self.count += 1
        name = f"v{self.count}"
        self.graph.add_node(op_type, inputs, [name], attributes,
                            output_types=[ValueType.tensor(np.dtype(dtype), list(shape))])
        return name

    def split(self, value: str, parts: int, size: int) -> list[str]:
        names = [f"v{self.count + k + 1}" for k in range(parts)]
        self.count += parts
        self.graph.add_node("Split", [value], names, {"axis": 0, "num_outputs": parts},
                            output_types=[ValueType.tensor(F32, [size])] * parts)
        return names

    def affine(self, x: str, weight: str, bias: str, width: int) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.param(weight)], [width]), self.param(bias)], [width])


def init_params(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(F32) for name, shape in shapes.items()}


# ----------------------------------------------------------------------------- Tree-LSTM
def tree_lstm_params(vocabulary: int, size: int = 256, classes: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    return init_params({
        "E": (vocabulary, size), "W_iou": (size, 3 * size), "b_iou": (3 * size,),
        "U_iou": (2 * size, 3 * size), "U_f": (2 * size, 2 * size), "b_f": (2 * size,),
        "W_out": (size, classes),
    }, seed)


def tree_lstm_graph(tree: Tree, word_ids: dict[str, int], params: dict[str, np.ndarray], name: str = "tree") -> Graph:
    """Binary Tree-LSTM with two forget gates and a 5-way log-softmax NLL at every node;
    output ``loss``: the summed NLL of the tree."""
    size = params["E"].shape[1]
    b = GraphBuilder(name, params)
    losses: list[str] = []
    state: dict[int, tuple[str, str]] = {}
    for node in tree.nodes():
        if node.is_leaf:
            index = b.const(np.array(word_ids.get(node.word, 0), dtype=I64))
            x = b.op("Gather", [b.param("E"), index], [size])
            i, o, u = b.split(b.affine(x, "W_iou", "b_iou", 3 * size), 3, size)
            c = b.op("Mul", [b.op("Sigmoid", [i], [size]), b.op("Tanh", [u], [size])], [size])
        else:
            (hl, cl), (hr, cr) = state[id(node.left)], state[id(node.right)]
            hcat = b.op("Concat", [hl, hr], [2 * size], {"axis": 0})
            i, o, u = b.split(b.op("MatMul", [hcat, b.param("U_iou")], [3 * size]), 3, size)
            fl, fr = b.split(b.affine(hcat, "U_f", "b_f", 2 * size), 2, size)
            c = b.op("Add", [
                b.op("Mul", [b.op("Sigmoid", [i], [size]), b.op("Tanh", [u], [size])], [size]),
                b.op("Add", [b.op("Mul", [b.op("Sigmoid", [fl], [size]), cl], [size]),
                             b.op("Mul", [b.op("Sigmoid", [fr], [size]), cr], [size])], [size]),
            ], [size])
        h = b.op("Mul", [b.op("Sigmoid", [o], [size]), b.op("Tanh", [c], [size])], [size])
        state[id(node)] = (h, c)
        scores = b.op("LogSoftmax", [b.op("MatMul", [h, b.param("W_out")], [5])], [5], {"axis": -1})
        losses.append(b.op("Neg", [b.op("Gather", [scores, b.const(np.array(node.label, dtype=I64))], [])], []))
    return _rename_output(b.graph, b.op("Sum", losses, []), "loss")


def _rename_output(graph: Graph, value: str, name: str) -> Graph:
    graph.add_node("Identity", [value], [name], output_types=[graph.values[value].type])
    graph.add_output(name)
    return graph


# ----------------------------------------------------------------------------- BiLSTM tagger
def bilstm_params(vocabulary: int, tags: int, size: int = 256, seed: int = 0) -> dict[str, np.ndarray]:
    return init_params({
        "E": (vocabulary, size),
        "Wf": (size, 4 * size), "Uf": (size, 4 * size), "bf": (4 * size,),
        "Wb": (size, 4 * size), "Ub": (size, 4 * size), "bb": (4 * size,),
        "H": (2 * size, size), "O": (size, tags),
    }, seed)


def bilstm_tagger_graph(words: Sequence[int], tags: Sequence[int], params: dict[str, np.ndarray],
                        name: str = "sentence") -> Graph:
    """BiLSTM tagger: embeddings, forward and backward LSTMs, ``O * tanh(H * [f; b])`` without
    biases, NLL per token; output ``loss``: the summed NLL."""
    size = params["E"].shape[1]
    n_tags = params["O"].shape[1]
    b = GraphBuilder(name, params)
    xs = [b.op("Gather", [b.param("E"), b.const(np.array(w, dtype=I64))], [size]) for w in words]

    def lstm(inputs: list[str], suffix: str) -> list[str]:
        h = c = b.const(np.zeros(size, dtype=F32))
        outputs = []
        for x in inputs:
            gates = b.op("Add", [b.affine(x, "W" + suffix, "b" + suffix, 4 * size),
                                 b.op("MatMul", [h, b.param("U" + suffix)], [4 * size])], [4 * size])
            i, f, o, g = b.split(gates, 4, size)
            c = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [f], [size]), c], [size]),
                             b.op("Mul", [b.op("Sigmoid", [i], [size]), b.op("Tanh", [g], [size])], [size])], [size])
            h = b.op("Mul", [b.op("Sigmoid", [o], [size]), b.op("Tanh", [c], [size])], [size])
            outputs.append(h)
        return outputs

    forward = lstm(xs, "f")
    backward = lstm(xs[::-1], "b")[::-1]
    losses = []
    for f, bw, tag in zip(forward, backward, tags):
        hidden = b.op("Tanh", [b.op("MatMul", [b.op("Concat", [f, bw], [2 * size], {"axis": 0}), b.param("H")], [size])], [size])
        scores = b.op("LogSoftmax", [b.op("MatMul", [hidden, b.param("O")], [n_tags])], [n_tags], {"axis": -1})
        losses.append(b.op("Neg", [b.op("Gather", [scores, b.const(np.array(tag, dtype=I64))], [])], []))
    return _rename_output(b.graph, b.op("Sum", losses, []), "loss")
