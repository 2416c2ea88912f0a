"""Models as PyTorch and Hugging Face export them, for one instance (batch 1, dynamic length),
built here from small configs and random weights: ``run_batch`` over sentences of different
lengths equals onnxruntime run alone on each, on both backends, with nothing left one at a time,
each recurrent layer packed into one launch, and each row-wise layer (embeddings, projections,
layer norms, feed-forward) one launch for every length at once. (.ci/run installs the CPU build
of torch 2.13, transformers and onnxscript; without them these tests skip.)"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autobatch import InferenceSession
from tests.oracle import assert_same

torch = pytest.importorskip("torch")

LENGTHS = [5, 9, 3, 9, 12, 1, 7]


class Tagger(torch.nn.Module):
    def __init__(self, cell: str) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 16)
        self.rnn = getattr(torch.nn, cell)(16, 12, bidirectional=True, batch_first=True)
        self.out = torch.nn.Linear(24, 5)

    def forward(self, ids):
        states, _ = self.rnn(self.embedding(ids))
        return torch.log_softmax(self.out(states), -1)


def export(cell: str, path: Path) -> Path:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation
        torch.onnx.export(Tagger(cell).eval(), (torch.randint(0, 50, (1, 7)),), str(path), dynamo=False,
                          opset_version=17, input_names=["ids"], output_names=["tags"],
                          dynamic_axes={"ids": {1: "length"}, "tags": {1: "length"}})
    return path


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_an_exported_recurrent_tagger_batches_across_lengths(tmp_path, cell, backend):
    """The exporter builds the zero initial states from the input's shape (Shape, Gather,
    Concat, ConstantOfShape): folded for each input signature, they leave the layer the plain
    case, packed across lengths; they ran one at a time per instance before."""
    path = export(cell, tmp_path / f"{cell}.onnx")
    rng = np.random.default_rng(0)
    batch = [{"ids": rng.integers(0, 50, (1, n))} for n in LENGTHS]
    alone = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = InferenceSession(str(path), backend=backend)
    for _ in range(2):  # planned, then the kept plan (on onnxruntime: one session)
        got = session.run_batch(None, batch)
        for k, feeds in enumerate(batch):
            assert_same(got[k][0], alone.run(None, feeds)[0], what=f"sentence {k}")
    report = session.stats.report
    assert report.alone == {}
    assert report.launches_by_op[cell] == 1


def run_and_compare(path: Path, backend: str, lengths: list[int], vocabulary: int) -> InferenceSession:
    """``run_batch`` twice (planned, then the kept plan) equals onnxruntime alone on each instance."""
    rng = np.random.default_rng(0)
    batch = [{"ids": rng.integers(0, vocabulary, (1, n))} for n in lengths]
    alone = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = InferenceSession(str(path), backend=backend)
    for _ in range(2):
        got = session.run_batch(None, batch)
        for k, feeds in enumerate(batch):
            # A projection of every instance's rows at once sums in another order than of one
            # instance's (the kernels block by the number of rows): float32, so 1e-4 relative.
            assert_same(got[k][0], alone.run(None, feeds)[0], rtol=1e-4, atol=1e-5, what=f"text {k}")
    return session


def export_one(module: torch.nn.Module, path: Path, vocabulary: int, dynamo: bool) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' deprecations and notes
        torch.onnx.export(module.eval(), (torch.randint(0, vocabulary, (1, 7)),), str(path), dynamo=dynamo,
                          opset_version=18 if dynamo else 17, input_names=["ids"], output_names=["y"],
                          dynamic_axes={"ids": {1: "length"}, "y": {1: "length"}})
    return path


class Encoder(torch.nn.Module):
    """nn.TransformerEncoder over embeddings, batch first."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 32)
        layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, ids):
        return self.encoder(self.embedding(ids))


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def hugging_face(name: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "bert":
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=64)
        return LastHidden(transformers.BertModel(config))
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return LastHidden(transformers.GPT2Model(config))


ROW_WISE = ("LayerNormalization", "Gemm", "Erf", "Tanh", "Relu")  # each once for all lengths


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("name, dynamo", [("encoder", True), ("bert", False), ("bert", True), ("gpt2", False),
                                          ("gpt2", True)])
def test_an_exported_transformer_batches_its_row_wise_layers_across_lengths(tmp_path, name, dynamo, backend):
    """Exports of one text carry its rows as [1, L, d] (or [L, 1, d]): every projection, layer
    norm and feed-forward layer is one launch over the rows of every text, whatever their
    lengths; only the attention products of one text with itself stay a launch a length.
    (The legacy exporter writes nn.TransformerEncoder's head split for the traced length only.)"""
    if name == "encoder":
        torch.manual_seed(0)
        module, vocabulary = Encoder(), 50
    else:
        module, vocabulary = hugging_face(name), 100
    path = export_one(module, tmp_path / f"{name}.onnx", vocabulary, dynamo)
    session = run_and_compare(path, backend, LENGTHS, vocabulary)
    report = session.stats.report
    assert report.alone == {}
    nodes = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
    for op in ROW_WISE:
        assert report.launches_by_op.get(op, 0) == nodes[op], op
    distinct = len(set(LENGTHS))
    assert report.launches_by_op["Softmax"] == distinct * nodes["Softmax"]  # attention: a launch a length
