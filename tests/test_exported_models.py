"""Models as PyTorch and Hugging Face export them, for one instance (batch 1, dynamic length),
built here from small configs and random weights (``benchmarks.exports``): ``run_batch`` over
texts of different lengths equals onnxruntime run alone on each, on both backends, with nothing
left one at a time, each recurrent layer packed into one launch, and each row-wise layer
(embeddings, projections, layer norms, feed-forward) one launch for every length at once.
(.ci/run installs the CPU build of torch 2.13, transformers and onnxscript; without them these
tests skip.)"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autobatch import InferenceSession
from autobatch.batcher.padding import CHUNK
from tests.oracle import assert_same

torch = pytest.importorskip("torch")
exports = pytest.importorskip("benchmarks.exports")

LENGTHS = [5, 9, 3, 9, 12, 1, 7]
ROW_WISE = ("LayerNormalization", "Gemm", "Erf", "Tanh", "Relu", "LogSoftmax")  # each once for all lengths


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(name, size, dynamo)``: the model's export, made once for both backends."""
    made: dict[tuple, Path] = {}

    def export(name: str, size: int = 32, dynamo: bool = False) -> Path:
        key = (name, size, dynamo)
        if key not in made:
            made[key] = exports.export(exports.build(name, size),
                                       tmp_path_factory.mktemp("exports") / f"{name}.onnx", dynamo=dynamo)
        return made[key]

    return export


def run_and_compare(path: Path, backend: str, rtol: float = 1e-5, atol: float = 1e-6,
                    lengths: list[int] = LENGTHS, node_level: bool = True) -> InferenceSession:
    """``run_batch`` twice (planned, then the kept plan: on onnxruntime one session) equals
    onnxruntime alone on each instance."""
    rng = np.random.default_rng(0)
    batch = [{"ids": rng.integers(0, exports.VOCABULARY, (1, n))} for n in lengths]
    alone = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = InferenceSession(str(path), backend=backend, node_level=node_level)
    for _ in range(2):
        got = session.run_batch(None, batch)
        for k, feeds in enumerate(batch):
            assert_same(got[k][0], alone.run(None, feeds)[0], rtol=rtol, atol=atol, what=f"text {k}")
    return session


def assert_row_wise_once(session: InferenceSession, path: Path) -> Counter:
    report = session.stats.report
    assert report.alone == {}
    nodes = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
    for op in ROW_WISE:
        assert report.launches_by_op.get(op, 0) == nodes[op], op
    return nodes


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_an_exported_recurrent_tagger_batches_across_lengths(exported, cell, backend):
    """The exporter builds the zero initial states from the input's shape (Shape, Gather,
    Concat, ConstantOfShape): folded for each input signature, they leave the layer the plain
    case, packed across lengths; they ran one at a time per instance before. Its ids [1, L],
    embeddings [1, L, d] and tags run along axis 1, its layer's [L, 1, d] along axis 0: every
    op is one launch (33 for these 7 sentences before)."""
    path = exported(cell, 16)
    session = run_and_compare(path, backend)
    nodes = assert_row_wise_once(session, path)
    launches = dict(session.stats.report.launches_by_op)
    # The sentence of one word has two Transposes of one signature ([1, 1, d] -> [1, 1, d]): one
    # class, which joins the launch of one of them; the other is a view of its own.
    assert launches.pop("Transpose") <= nodes["Transpose"] + 1
    assert launches == {op: count for op, count in nodes.items()
                        if op not in ("Constant", "Shape", "Unsqueeze", "Concat", "ConstantOfShape", "Transpose")
                        } | {"Gather": 1}


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_an_exported_recurrent_tagger_batches_texts_of_one_length(exported, cell, backend):
    """Texts of one length share their folded zero initial states (alike constants are one):
    the layer repeats the shared state for each text and packs them in one launch; it ran once
    a text before ("a shared initial state")."""
    session = run_and_compare(exported(cell, 16), backend, lengths=[6] * 5)
    assert session.stats.report.alone == {}
    assert session.stats.report.launches_by_op[cell.upper()] == 1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("node_level", [True, False])
@pytest.mark.parametrize("name, dynamo", [("encoder", True), ("bert", False), ("bert", True), ("gpt2", False),
                                          ("gpt2", True)])
def test_an_exported_transformer_batches_its_row_wise_layers_across_lengths(exported, name, dynamo, node_level, backend):
    """Every projection, layer norm and feed-forward layer is one launch over the rows of every
    text, whatever their lengths; the attention products of one text with itself run padded, a
    launch for every 8 texts, no longer a launch a length: planned once for every mix where
    ``node_level`` (``batcher.instance_axis``), else per mix (``batcher.padding``)."""
    if name in ("bert", "gpt2"):
        pytest.importorskip("transformers")
    path = exported(name, dynamo=dynamo)
    # A projection of every text's rows at once sums in another order than of one text's (the
    # kernels block by the number of rows): float32 within 1e-4 relative.
    session = run_and_compare(path, backend, rtol=1e-4, atol=1e-5, node_level=node_level)
    nodes = assert_row_wise_once(session, path)
    assert session.stats.report.launches_by_op["Softmax"] == math.ceil(len(LENGTHS) / CHUNK) * nodes["Softmax"]
    assert (session.stats.report.scheduler == "instance axis") == node_level


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_an_exported_transformer_batches_texts_of_one_length(exported, backend):
    """Texts of one length stack (``[N, 1, L, d]``): each layer norm is one launch over them,
    its axis one further right; they ran once a text before ("no batching rule")."""
    pytest.importorskip("transformers")
    path = exported("bert")
    session = run_and_compare(path, backend, rtol=1e-4, atol=1e-5, lengths=[7] * 5)
    nodes = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
    assert session.stats.report.alone == {}
    assert session.stats.report.launches_by_op["LayerNormalization"] == nodes["LayerNormalization"]


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_an_exported_cnn_batches_images_of_each_size_and_its_head_across_sizes(exported, backend):
    """Convolutions run a launch per image size; once pooled to [1, C, 1, 1], every image's
    head is one launch."""
    path = exported("cnn", 16)
    rng = np.random.default_rng(0)
    sizes = [(16, 16), (24, 20), (16, 16), (33, 17), (24, 20), (18, 40)]
    batch = [{"ids": rng.standard_normal((1, 3, h, w)).astype(np.float32)} for h, w in sizes]
    alone = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = InferenceSession(str(path), backend=backend)
    for _ in range(2):
        for k, (got, feeds) in enumerate(zip(session.run_batch(None, batch), batch, strict=True)):
            # a convolution of several images at once may sum in another order: 1e-4 relative
            assert_same(got[0], alone.run(None, feeds)[0], rtol=1e-4, atol=1e-5, what=f"image {k}")
    launches = session.stats.report.launches_by_op
    assert session.stats.report.alone == {}
    assert launches["Conv"] == 2 * len(set(sizes)) and launches["Gemm"] == 1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_an_exported_tagger_runs_every_new_mix_as_one_graph_of_its_nodes(exported, cell, backend):
    """Every node of the tagger batches along the texts' length axis, so its batches run as its
    own graph over every text's rows (``autobatch/axis_batches.py``): planned once, from the first
    batch, for every later mix of new lengths; its layer runs a call per chunk of 8 texts."""
    from autobatch.batcher.sequences import CHUNK as SEQUENCES

    path = exported(cell, 16)  # (torch 2.13's dynamo export of it holds for its traced length only)
    alone = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = InferenceSession(str(path), backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(7)
    runner = None
    for lengths in ([5, 9, 3, 9, 12, 1, 7], *(rng.integers(1, 40, n) for n in (20, 3, 9))):
        batch = [{"ids": rng.integers(0, exports.VOCABULARY, (1, int(n)))} for n in lengths]
        got = session.run_batch(None, batch)
        for k, feeds in enumerate(batch):
            assert_same(got[k][0], alone.run(None, feeds)[0], rtol=1e-5, atol=1e-6, what=f"text {k}")
        report = session.stats.report
        assert report.scheduler == "instance axis"
        assert report.launches_by_op[cell.upper()] == math.ceil(len(lengths) / SEQUENCES)
        runner = runner or session.axis_batches.runner
        assert session.axis_batches.runner is runner
    assert len(session._flat_plans) == 0


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("name, opset", [("gpt2", 13), ("bert", 11)])
def test_an_export_at_an_older_opset_runs_every_mix_as_the_newer_does(tmp_path, name, opset, backend):
    """Before opset 14 onnx infers a Reshape's shape only from a constant target: typing went a
    layer of Shape -> ... -> Reshape a round, and stopped after 8, so a 2-layer GPT-2 at opset 13
    left values of unknown shapes and planned per mix, 775 launches for 8 texts (129 at opset 14).
    Typing now goes on while folding finds more: the same launches as at opset 14."""
    pytest.importorskip("transformers")
    module = exports.build(name, 32)
    module.model.set_attn_implementation("eager")  # (scaled dot-product attention exports from opset 14 only)
    launches = []
    for version in (opset, 14):
        path = exports.export(module, tmp_path / f"{name}-{version}.onnx", opset=version)
        assert onnx.load(str(path)).opset_import[0].version == version
        session = run_and_compare(path, backend)
        report = session.stats.report
        assert report.scheduler == "instance axis" and not report.alone, (version, session.axis_batches.refusal)
        launches.append(report.launches)
    assert launches[0] == launches[1]


def assert_masked_mixes_run_as_one_graph(path: Path, backend: str) -> InferenceSession:
    """Two mixes (the second of lengths never seen) of texts with their attention masks (about a
    third of each text's tokens masked, the first kept: a text of no tokens is another matter):
    each text's results its own, every mix run as one graph of the model's nodes."""
    alone = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = InferenceSession(str(path), backend=backend, alone_when_faster=False)
    rng = np.random.default_rng(9)
    for lengths in (LENGTHS, [4, 17, 2, 11, 30, 6, 9, 13, 21]):
        batch = []
        for n in lengths:
            mask = np.ones((1, n), np.int64)
            mask[0, 1:][rng.random(n - 1) < 0.3] = 0
            batch.append({"ids": rng.integers(0, exports.VOCABULARY, (1, n)), "mask": mask})
        got = session.run_batch(None, batch)
        for k, feeds in enumerate(batch):
            want = alone.run(None, feeds)[0]
            assert got[k][0].shape == want.shape
            assert_same(got[k][0], want, rtol=1e-4, atol=1e-5, what=f"text {k}")
        assert session.stats.report.scheduler == "instance axis", session.axis_batches.refusal
    assert len(session._flat_plans) == 0 and session.axis_batches.lengths is not None  # (new lengths not typed)
    return session


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("name, dynamo", [("bert", False), ("bert", True), ("gpt2", False), ("gpt2", True),
                                          ("roberta", False), ("roberta", True)])
def test_an_export_that_takes_its_attention_mask_runs_every_mix_as_one_graph(tmp_path, name, dynamo, backend):
    """Exported with ``attention_mask`` as an input (as a tokenizer gives it): the exporters pick
    the mask's positions by a Gather (legacy) or a GatherND (dynamo) of indices made from the
    length, and expand it to ``[1, 1, L, L]``; RoBERTa counts its position ids with a CumSum and
    picks its token types by a GatherElements."""
    pytest.importorskip("transformers")
    assert_masked_mixes_run_as_one_graph(
        exports.export(exports.build(name), tmp_path / f"{name}.onnx", dynamo=dynamo, mask=True), backend)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", ["bert-cls", "roberta-cls", "distilbert-cls", "gpt2-cls", "bert-mean", "roberta-mean"])
def test_an_exported_sequence_classifier_runs_every_mix_as_one_graph(tmp_path, name, dynamo, backend):
    """A classifier's logits ``[1, 3]`` come from its first token: picked from every text's rows
    at each text's own first row, then the pooler and the head over one row a text (GPT-2's from
    its last token that is not padding: an ArgMax over the length, then each text's row at it). A sentence
    embedding ``[1, d]``, the mean of the real tokens' states, sums each text's masked states
    over its length (padded chunks) and divides by its count of real tokens (one row a text)."""
    pytest.importorskip("transformers")
    assert_masked_mixes_run_as_one_graph(
        exports.export(exports.build(name), tmp_path / f"{name}.onnx", dynamo=dynamo, mask=True), backend)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", ["gpt2-lm", "albert"])
def test_a_weight_the_export_rearranges_is_read_as_a_weight_whatever_its_size(tmp_path, name, dynamo, backend):
    """A language model's output projection tied to its embeddings (legacy: an Identity of the
    weight; dynamo: a Transpose of it), ALBERT's layers that share weights: values of the weights
    alone, bigger than what typing folds from shapes (``FOLD_LIMIT``); folded once for the model,
    every mix runs as one graph (they were refused as not row-wise, and planned per mix)."""
    transformers = pytest.importorskip("transformers")
    from autobatch.batcher.constants import FOLD_LIMIT

    if name == "gpt2-lm":
        config = transformers.GPT2Config(vocab_size=FOLD_LIMIT // 32 + 100, n_embd=32, n_layer=1, n_head=4, n_positions=128)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.AlbertConfig(vocab_size=exports.VOCABULARY, hidden_size=272, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=272, embedding_size=32)
        model = transformers.AlbertModel(config)
    module = (exports.Logits if name == "gpt2-lm" else exports.LastHidden)(model).eval()
    assert_masked_mixes_run_as_one_graph(exports.export(module, tmp_path / f"{name}.onnx", dynamo=dynamo, mask=True),
                                         backend)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", ["llama", "gpt-neox", "falcon", "modernbert"])
def test_a_decoder_with_rotary_embeddings_runs_every_mix_as_one_graph(tmp_path, name, dynamo, backend):
    """Llama's (and GPT-NeoX's, on a quarter of each head) rotary embeddings turn each head's
    halves (Slices along the head's axis, on the padded layout after the heads' Transpose, on
    rows before it) by a cosine and sine of each length's own (given per mix; Falcon's read in
    both layouts, a feed each); ModernBERT unbinds
    its packed q, k, v by Slices of an axis of each row: every mix runs as one graph."""
    transformers = pytest.importorskip("transformers")
    sizes = dict(vocab_size=exports.VOCABULARY, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=128)
    if name == "llama":
        model = transformers.LlamaModel(transformers.LlamaConfig(**sizes, num_key_value_heads=2))
    elif name == "gpt-neox":
        model = transformers.GPTNeoXModel(transformers.GPTNeoXConfig(**sizes, rotary_pct=0.25))
    elif name == "falcon":  # (its rotary tables are read by rows and by padded steps: given per mix each way)
        model = transformers.FalconModel(transformers.FalconConfig(
            vocab_size=exports.VOCABULARY, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128))
    else:
        model = transformers.ModernBertModel(transformers.ModernBertConfig(
            **sizes, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
            local_attention=16, global_attn_every_n_layers=2))
    assert_masked_mixes_run_as_one_graph(
        exports.export(exports.LastHidden(model).eval(), tmp_path / f"{name}.onnx", dynamo=dynamo, mask=True), backend)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("name", ["deberta", "deberta-big", "bloom"])
def test_attention_by_relative_positions_or_alibi_runs_every_mix_as_one_graph(tmp_path, name, dynamo, backend):
    """DeBERTa-v2 (and v3) adds scores picked by relative position (GatherElements of a table of
    each row by indices made from the length, given per mix, padded with 0; -big: its relative
    embeddings over ``FOLD_LIMIT``, as at full size, normalized, projected and expanded, folded
    once); BLOOM adds ALiBi biases and reshapes its scores ``[H, L, L]`` to ``[1, H, L, L]``:
    every mix runs as one graph (the benchmark's builds, width 32)."""
    transformers = pytest.importorskip("transformers")
    model = exports.LastHidden(transformers.DebertaV2Model(exports.deberta_config(32, 2, buckets=1100))).eval() \
        if name == "deberta-big" else exports.build(name)
    assert_masked_mixes_run_as_one_graph(exports.export(model, tmp_path / f"{name}.onnx", dynamo=dynamo, mask=True),
                                         backend)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("dynamo", [False, True])
def test_a_text_cnn_runs_every_mix_as_one_graph(tmp_path, dynamo, backend):
    """A text CNN (Kim's: embeddings, a Conv1d along the length, a max over it, a linear layer):
    the convolution runs padded, a chunk its batch, its padded positions zeros as the text's own
    padding; every mix one graph."""

    class TextCNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(exports.VOCABULARY, 16)
            self.conv = torch.nn.Conv1d(16, 24, 3, padding=1)
            self.out = torch.nn.Linear(24, 4)

        def forward(self, ids):
            return self.out(torch.relu(self.conv(self.embedding(ids).transpose(1, 2))).max(-1).values)

    torch.manual_seed(0)
    path = exports.export(TextCNN().eval(), tmp_path / "textcnn.onnx", dynamo=dynamo)
    session = run_and_compare(path, backend)
    assert session.stats.report.scheduler == "instance axis", session.axis_batches.refusal
    assert session.stats.report.launches_by_op["Conv"] == 1


@pytest.mark.parametrize("name", ["lstm", "cnn"])
def test_the_benchmarks_padded_export_runs_a_padded_batch(tmp_path, name):
    """The other system of ``benchmarks.exported_models``: the model exported for a padded batch
    (``ids`` and ``mask``, a batch axis) runs two padded instances (the images' export once
    gave its mask the image's axes and failed)."""
    path = exports.export(exports.build(name, 8), tmp_path / f"{name}.onnx", padded=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.zeros((2, 3, 16, 20), np.float32) if name == "cnn" else np.zeros((2, 6), np.int64)
    feeds = {"ids": ids, "mask": np.ones((2, ids.shape[-1]), np.int64)}
    names = {info.name for info in session.get_inputs()}
    assert session.run(None, {k: v for k, v in feeds.items() if k in names})[0].shape[0] == 2


@pytest.mark.parametrize("name, dynamo", [("encoder", True), ("bert", False), ("bert", True), ("gpt2", False),
                                          ("gpt2", True)])
def test_a_new_length_of_an_export_is_checked_without_typing_and_gets_the_constants_typing_gives(exported, name, dynamo):
    """``autobatch/length_check.py`` against typing the model for the length
    (``ModelInstances.records_of``): the same constants given per mix, at lengths never seen."""
    if name in ("bert", "gpt2"):
        pytest.importorskip("transformers")
    session = run_and_compare(exported(name, dynamo=dynamo), "onnxruntime", rtol=1e-4, atol=1e-5)
    check, instances = session.axis_batches.lengths, session.axis_batches.instances
    assert check is not None
    for length in (2, 4, 15, 33):
        feeds = {"ids": np.zeros((1, length), np.int64)}
        constants = check.constants(length, {"ids": np.dtype(np.int64)})
        assert constants is not None, length
        typed = instances.records_of(feeds).weights
        assert set(constants) == set(session.axis_batches.runner.plan.fed)
        for constant, value in constants.items():
            np.testing.assert_array_equal(value, typed[constant], err_msg=f"{constant} at length {length}")
