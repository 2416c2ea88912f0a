"""Models as PyTorch exports them, for one instance (batch 1, dynamic length), built here from
random weights: ``run_batch`` over sentences of different lengths equals onnxruntime run alone
on each, on both backends, with nothing left one at a time and each layer packed into one launch.
(.ci/run installs the CPU build of torch 2.13; without it these tests skip.)"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
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
