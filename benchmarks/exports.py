"""Models as PyTorch and Hugging Face export them, built from small configs with random weights
(no downloads): an embedding and a bidirectional LSTM or GRU tagger, ``nn.TransformerEncoder``,
BERT, RoBERTa, GPT-2, and a CNN over images of any size; BERT's, RoBERTa's and DistilBERT's
sequence classifiers (``"bert-cls"``: logits of 3 labels, from the first token) and BERT's and
RoBERTa's sentence embeddings (``"bert-mean"``: the mean of the real tokens' states). ``export`` writes one for ONE instance
(``ids [1, length]``; the CNN's ``ids`` are an image ``[1, 3, height, width]``), as most users
bring it; ``mask=True`` with the attention mask as an input too (``mask [1, length]``, as a
tokenizer gives it and Hugging Face's own exports take it); ``padded=True`` writes it for a
padded batch instead (``ids [batch, length]`` and ``mask [batch, length]``, 1 for a real token),
what a user would run to batch by padding.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.export_files import DYNAMO_ONLY, MASKED, MODELS, VOCABULARY

CLASSIFIER = "-cls"  # a model's sequence classifier: "bert-cls", "roberta-cls", "distilbert-cls"
MEAN = "-mean"  # a model's sentence embedding, the mean of its real tokens' states: "bert-mean"
__all__ = ["CLASSIFIER", "DYNAMO_ONLY", "MASKED", "MEAN", "MODELS", "VOCABULARY", "build", "deberta_config", "export"]


class Tagger(torch.nn.Module):
    def __init__(self, cell: str, size: int) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, size)
        self.rnn = getattr(torch.nn, cell)(size, size // 2, bidirectional=True, batch_first=True)
        self.out = torch.nn.Linear(size, 9)

    def forward(self, ids, mask=None):  # padding reaches the reverse direction: not exact
        states, _ = self.rnn(self.embedding(ids))
        return torch.log_softmax(self.out(states), -1)


class Encoder(torch.nn.Module):
    def __init__(self, size: int, layers: int) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, size)
        layer = torch.nn.TransformerEncoderLayer(size, 4, dim_feedforward=2 * size, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, ids, mask=None):
        padding = None if mask is None else mask == 0
        return self.encoder(self.embedding(ids), src_key_padding_mask=padding)


class Classifier(torch.nn.Module):
    """Two convolutions, a global average pool and a linear layer: images of any size."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, size // 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(size // 4, size // 2, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
        self.out = torch.nn.Linear(size // 2, 10)

    def forward(self, ids, mask=None):  # images padded with zeros are not the images: not exact
        return self.out(torch.flatten(self.features(ids), 1))


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, mask=None):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


class Logits(LastHidden):
    """A sequence classifier's logits (its pooler: the first token, then a dense layer)."""

    def forward(self, ids, mask=None):
        return self.model(input_ids=ids, attention_mask=mask).logits


class MeanPooled(LastHidden):
    """A sentence embedding: the mean of the real tokens' last states (sentence-transformers')."""

    def forward(self, ids, mask=None):
        states = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = (torch.ones_like(ids) if mask is None else mask).unsqueeze(-1).to(states.dtype)
        return (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def deberta_config(size: int, layers: int, buckets: int = 32) -> Any:
    """DeBERTa-v2's (and v3's) config of width ``size``: its relative embeddings ``[2 * buckets, size]``."""
    import transformers

    return transformers.DebertaV2Config(
        vocab_size=VOCABULARY, hidden_size=size, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=2 * size, max_position_embeddings=128, relative_attention=True, position_buckets=buckets,
        pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True, max_relative_positions=-1)


def build(name: str, size: int = 32, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """One of ``MODELS`` of width ``size``, in eval mode (``transformers`` needed for all but lstm, gru,
    encoder and cnn)."""
    torch.manual_seed(seed)
    if name in ("lstm", "gru"):
        return Tagger(name.upper(), size).eval()
    if name == "encoder":
        return Encoder(size, layers).eval()
    if name == "cnn":
        return Classifier(size).eval()
    import transformers

    classifier = name.endswith(CLASSIFIER)  # "bert-cls": its sequence classifier, 3 labels
    pooled = name.endswith(MEAN)  # "bert-mean": its sentence embedding
    name = name.removesuffix(CLASSIFIER).removesuffix(MEAN)
    if name in ("bert", "roberta"):  # (RoBERTa: position ids counted from the non-padding tokens, CumSum)
        kind, model = (transformers.BertConfig, transformers.BertModel) if name == "bert" else \
            (transformers.RobertaConfig, transformers.RobertaModel)
        if classifier:
            model = transformers.BertForSequenceClassification if name == "bert" else \
                transformers.RobertaForSequenceClassification
        config = kind(vocab_size=VOCABULARY, hidden_size=size, num_hidden_layers=layers, num_attention_heads=4,
                      intermediate_size=2 * size, max_position_embeddings=128, num_labels=3)
        return (Logits if classifier else MeanPooled if pooled else LastHidden)(model(config)).eval()
    if name == "llama":  # (rotary embeddings; two key and value heads for four queries)
        return LastHidden(transformers.LlamaModel(transformers.LlamaConfig(
            vocab_size=VOCABULARY, hidden_size=size, intermediate_size=2 * size, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))).eval()
    if name == "deberta":  # (disentangled attention: scores by relative position)
        return LastHidden(transformers.DebertaV2Model(deberta_config(size, layers))).eval()
    if name == "bloom":  # (ALiBi)
        return LastHidden(transformers.BloomModel(transformers.BloomConfig(
            vocab_size=VOCABULARY, hidden_size=size, n_layer=layers, n_head=4))).eval()
    if name == "distilbert" and classifier:
        config = transformers.DistilBertConfig(vocab_size=VOCABULARY, dim=size, n_layers=layers, n_heads=4,
                                               hidden_dim=2 * size, max_position_embeddings=128, num_labels=3)
        return Logits(transformers.DistilBertForSequenceClassification(config)).eval()
    # (its classifier reads the last token that is not padding, id 0: found by an ArgMax)
    config = transformers.GPT2Config(vocab_size=VOCABULARY, n_embd=size, n_layer=layers, n_head=4, n_positions=128,
                                     num_labels=3, pad_token_id=0)
    if classifier:
        return Logits(transformers.GPT2ForSequenceClassification(config)).eval()
    return LastHidden(transformers.GPT2Model(config)).eval()


def export(module: torch.nn.Module, path: Path, dynamo: bool = False, padded: bool = False, mask: bool = False,
           opset: int | None = None) -> Path:
    """``module`` written to ``path`` for one instance of any length (with its attention ``mask``
    as an input too), or (``padded``) for a padded batch of any size and length; at ``opset``
    (by default the exporter's: 18 for dynamo, else 17)."""
    image = isinstance(module, Classifier)
    ids = torch.randn(2 if padded else 1, 3, 16, 16) if image else torch.randint(0, VOCABULARY, (2 if padded else 1, 7))
    masked = padded or mask
    args = (ids, torch.ones(ids.shape[0], ids.shape[-1], dtype=torch.int64)) if masked else (ids,)
    names = ["ids", "mask"] if masked else ["ids"]
    axes = {0: "batch", 1: "length"} if padded else {1: "length"}
    if image:
        axes = {0: "batch", 2: "height", 3: "width"} if padded else {2: "height", 3: "width"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' deprecations and notes
        torch.onnx.export(module, args, str(path), dynamo=dynamo, opset_version=opset or (18 if dynamo else 17),
                          input_names=names, output_names=["y"],
                          dynamic_axes={"ids": axes, **({"mask": {0: "batch", 1: "length"} if padded else {1: "length"}}
                                                        if masked else {}),
                                        "y": ({0: "batch"} if padded else {}) if image else axes})
    return path
