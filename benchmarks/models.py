"""The benchmark workloads: the examples' Tree-LSTM and BiLSTM tagger over real data
(synthetic with the same statistics when ../shared/data is absent), traced into IR graphs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from autobatch.datasets import sst_trees, wikiner_sentences
from autobatch.examples import bilstm_tagger, tree_lstm
from autobatch.examples.common import Params
from autobatch.batch import Batch
from autobatch.ir import Graph
from autobatch.ir.onnx_io import choose_ir_version

Workload = tuple[Callable[[Any, Params], Any], Sequence[Any], Params, str]


def tree_lstm_workload(count: int, size: int = 256, form: str = "primitive") -> Workload:
    trees, source = sst_trees(limit=count)
    params = tree_lstm.make_params(tree_lstm.make_vocabulary(trees), size=size)
    return tree_lstm.LOSSES[form], trees, params, source


def bilstm_workload(count: int, size: int = 256, form: str = "primitive") -> Workload:
    sentences, source = wikiner_sentences(limit=count)
    params = bilstm_tagger.make_params(*bilstm_tagger.make_vocabularies(sentences), size=size)
    return bilstm_tagger.LOSSES[form], sentences, params, source


def traced_graph(workload: Workload) -> Graph:
    """The IR graph of every instance of the workload, as one batch would run it."""
    loss, instances, params, _ = workload
    batch = Batch()
    with batch:
        losses = [loss(x, params) for x in instances]
        graph = batch.graph_of(losses)
        batch.discard()  # nothing is to run
    return graph


def with_random_weights(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], seed: int = 0) -> onnx.ModelProto:
    """``model`` (parsed with its weights declared) given float32 weights of these shapes, drawn
    with the scale 1/sqrt(last dimension), at an IR version onnxruntime loads, checked."""
    rng = np.random.default_rng(seed)
    for name, shape in shapes.items():
        weight = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(weight, name))
    model.ir_version = choose_ir_version(model, None)
    onnx.checker.check_model(model, full_check=True)
    return model
