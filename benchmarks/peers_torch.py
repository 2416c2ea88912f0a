"""PyTorch (eager, CPU, inference) versions of the four tasks with the examples' weights:
one instance at a time, and batched by hand (level by level for the Tree-LSTM, packed
sequences for the taggers and the parser's BiLSTM, one MLP call per lockstep transition for
the parser).

Conventions copied from ``autobatch.examples``: row vectors, ``x @ W + b``; LSTM gates
``[i; f; o; g] = x @ W + h @ U + b``. ``torch.nn.LSTM`` orders its gates ``i, f, g, o`` and
keeps ``W`` transposed, so its weights are ``W[:, perm].T`` with ``perm`` swapping the last two
blocks, and ``bias_hh = 0``.

Each ``run_*`` returns per-instance results: a loss (float) or a parser's heads (list of int).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import torch
    from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence
except ImportError:  # the driver reports the peer as skipped
    torch = None  # type: ignore[assignment]

from autobatch.examples import char_tagger
from autobatch.examples.parser import LEFT_ARC, RIGHT_ARC, ROOT, SHIFT, legal
from benchmarks.tasks import Task

THREADS = 2


def available() -> str | None:
    """None when PyTorch can run, else why not."""
    return None if torch is not None else "PyTorch is not installed (pip install torch)"


def _t(array: np.ndarray) -> Any:
    return torch.from_numpy(np.array(array))  # a writable copy: ours are frozen


def _lstm(W: np.ndarray, U: np.ndarray, b: np.ndarray, Wr: np.ndarray, Ur: np.ndarray, br: np.ndarray) -> Any:
    """A bidirectional ``nn.LSTM`` holding two of the examples' LSTM layers (forward, backward)."""
    hidden = U.shape[0]
    perm = np.concatenate([np.arange(0, 2 * hidden), np.arange(3 * hidden, 4 * hidden), np.arange(2 * hidden, 3 * hidden)])
    module = torch.nn.LSTM(W.shape[0], hidden, bidirectional=True)
    with torch.no_grad():
        for suffix, (w, u, bias) in (("", (W, U, b)), ("_reverse", (Wr, Ur, br))):
            getattr(module, f"weight_ih_l0{suffix}").copy_(_t(w[:, perm].T))
            getattr(module, f"weight_hh_l0{suffix}").copy_(_t(u[:, perm].T))
            getattr(module, f"bias_ih_l0{suffix}").copy_(_t(bias[perm]))
            getattr(module, f"bias_hh_l0{suffix}").zero_()
    return module.eval()


class Models:
    """The task's PyTorch model; ``per_instance(xs)`` and ``batched(xs)`` (None where no hand
    batching is written) give per-instance results."""

    def __init__(self, task: Task) -> None:
        torch.set_num_threads(THREADS)
        self.task = task
        self.p = {name: _t(param.array) for name, param in task.params.items()}
        a = {name: param.array for name, param in task.params.items()}
        if "wf_W" in a:
            self.word_lstm = _lstm(a["wf_W"], a["wf_U"], a["wf_b"], a["wb_W"], a["wb_U"], a["wb_b"])
        if "cf_W" in a:
            self.char_lstm = _lstm(a["cf_W"], a["cf_U"], a["cf_b"], a["cb_W"], a["cb_U"], a["cb_b"])

    def runners(self) -> dict[str, Callable[[Sequence[Any]], list[Any]]]:
        name = self.task.name
        per, hand = {"treelstm": (self._tree_one, self._tree_levels),
                     "bilstm": (self._tagger_one, self._tagger_packed),
                     "chartagger": (self._tagger_one, self._tagger_packed),
                     "parser": (self._parse_one, self._parse_lockstep)}[name]

        def one_at_a_time(xs: Sequence[Any]) -> list[Any]:
            with torch.inference_mode():
                return [per(x) for x in xs]

        def batched(xs: Sequence[Any]) -> list[Any]:
            with torch.inference_mode():
                return hand(xs)

        return {"per-instance": one_at_a_time, "hand-batched": batched}

    # ------------------------------------------------------------------ Tree-LSTM
    def _tree_one(self, tree: Any) -> float:
        p, S, vocabulary = self.p, self.task.size, self.task.params.config["vocabulary"]
        state: dict[int, tuple[Any, Any]] = {}
        total = 0.0
        losses = []
        for n in tree.nodes():
            if n.is_leaf:
                i, o, u = (p["E"][vocabulary[n.word]] @ p["W_iou"] + p["b_iou"]).split(S)
                c = torch.sigmoid(i) * torch.tanh(u)
            else:
                (hl, cl), (hr, cr) = state.pop(id(n.left)), state.pop(id(n.right))
                i, o, u = (torch.cat([hl, hr]) @ p["U_iou"] + p["b_iou"]).split(S)
                fl = torch.sigmoid(hl @ p["Uf1"] + p["b_f"])
                fr = torch.sigmoid(hr @ p["Uf2"] + p["b_f"])
                c = torch.sigmoid(i) * torch.tanh(u) + fl * cl + fr * cr
            h = torch.sigmoid(o) * torch.tanh(c)
            state[id(n)] = (h, c)
            losses.append(-torch.log_softmax(h @ p["W_out"], 0)[n.label])
        total = torch.stack(losses).sum()
        return float(total)

    def _tree_levels(self, trees: Sequence[Any]) -> list[float]:
        """Every node of every tree by height: all leaves in one product, then one level of
        internal nodes at a time (gathering the children's states), the outputs in one product."""
        p, S, vocabulary = self.p, self.task.size, self.task.params.config["vocabulary"]
        index: dict[int, int] = {}
        heights: list[int] = []
        words, labels, owner, levels = [], [], [], {}
        leaves: list[int] = []
        for k, tree in enumerate(trees):
            for n in tree.nodes():
                j = index[id(n)] = len(heights)
                labels.append(n.label)
                owner.append(k)
                if n.is_leaf:
                    heights.append(0)
                    leaves.append(j)
                    words.append(vocabulary[n.word])
                else:
                    l, r = index[id(n.left)], index[id(n.right)]
                    height = 1 + max(heights[l], heights[r])
                    heights.append(height)
                    levels.setdefault(height, ([], [], []))
                    levels[height][0].append(j)
                    levels[height][1].append(l)
                    levels[height][2].append(r)
        count = len(heights)
        H = torch.empty(count, S)
        C = torch.empty(count, S)
        rows = torch.tensor(leaves)
        i, o, u = (p["E"][torch.tensor(words)] @ p["W_iou"] + p["b_iou"]).split(S, dim=1)
        c = torch.sigmoid(i) * torch.tanh(u)
        C[rows] = c
        H[rows] = torch.sigmoid(o) * torch.tanh(c)
        for height in sorted(levels):
            at, left, right = (torch.tensor(v) for v in levels[height])
            hl, hr, cl, cr = H[left], H[right], C[left], C[right]
            i, o, u = (torch.cat([hl, hr], 1) @ p["U_iou"] + p["b_iou"]).split(S, dim=1)
            fl = torch.sigmoid(hl @ p["Uf1"] + p["b_f"])
            fr = torch.sigmoid(hr @ p["Uf2"] + p["b_f"])
            c = torch.sigmoid(i) * torch.tanh(u) + fl * cl + fr * cr
            C[at] = c
            H[at] = torch.sigmoid(o) * torch.tanh(c)
        nll = -torch.log_softmax(H @ p["W_out"], 1)[torch.arange(count), torch.tensor(labels)]
        totals = torch.zeros(len(trees)).index_add_(0, torch.tensor(owner), nll)
        return totals.tolist()

    # ------------------------------------------------------------------ taggers
    def _word_vectors_one(self, sentence: Any) -> Any:
        p, config = self.p, self.task.params.config
        words = config["words"]
        if self.task.name == "bilstm":
            return p["E"][torch.tensor([words[w] for w, _ in sentence])]
        chars = config["chars"]
        vectors = []
        for w, _ in sentence:
            if char_tagger.is_spelled(w, words):
                ids = torch.tensor([chars[ch] for ch in [char_tagger.PAD, *w, char_tagger.PAD]])
                _, (h_n, _) = self.char_lstm(p["C"][ids].unsqueeze(1))
                vectors.append(torch.cat([h_n[0, 0], h_n[1, 0]]))
            else:
                vectors.append(p["E"][words[w]])
        return torch.stack(vectors)

    def _scores(self, states: Any) -> Any:
        return torch.tanh(states @ self.p["H"]) @ self.p["O"]

    def _tagger_one(self, sentence: Any) -> float:
        tags = self.task.params.config["tags"]
        out, _ = self.word_lstm(self._word_vectors_one(sentence).unsqueeze(1))
        scores = self._scores(out[:, 0])
        gold = torch.tensor([tags[t] for _, t in sentence])
        return float(-torch.log_softmax(scores, 1)[torch.arange(len(sentence)), gold].sum())

    def _word_vectors_packed(self, sentences: Sequence[Any]) -> list[Any]:
        p, config = self.p, self.task.params.config
        words = config["words"]
        ids = [torch.tensor([words[w] for w, _ in s]) for s in sentences]
        if self.task.name == "bilstm":
            return [p["E"][x] for x in ids]
        chars = config["chars"]
        spelled = [(k, t, w) for k, s in enumerate(sentences) for t, (w, _) in enumerate(s)
                   if char_tagger.is_spelled(w, words)]
        vectors = [p["E"][x] for x in ids]
        if spelled:
            sequences = [p["C"][torch.tensor([chars[ch] for ch in [char_tagger.PAD, *w, char_tagger.PAD]])]
                         for _, _, w in spelled]
            _, (h_n, _) = self.char_lstm(pack_sequence(sequences, enforce_sorted=False))
            spelled_vectors = torch.cat([h_n[0], h_n[1]], 1)
            for row, (k, t, _) in enumerate(spelled):
                vectors[k][t] = spelled_vectors[row]  # vectors[k] is a fresh copy (advanced indexing)
        return vectors

    def _tagger_packed(self, sentences: Sequence[Any]) -> list[float]:
        """Packed sequences through the BiLSTM; the MLP and the losses over the packed rows."""
        tags = self.task.params.config["tags"]
        packed = pack_sequence(self._word_vectors_packed(sentences), enforce_sorted=False)
        out, _ = self.word_lstm(packed)
        gold = pack_sequence([torch.tensor([tags[t] for _, t in s]) for s in sentences], enforce_sorted=False).data
        owner = pack_sequence([torch.full((len(s),), k) for k, s in enumerate(sentences)], enforce_sorted=False).data
        nll = -torch.log_softmax(self._scores(out.data), 1)[torch.arange(len(gold)), gold]
        return torch.zeros(len(sentences)).index_add_(0, owner, nll).tolist()

    # ------------------------------------------------------------------ parser
    def _mlp(self, features: Any) -> Any:
        p = self.p
        return torch.tanh(features @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]

    def _parse_one(self, sentence: Any) -> list[int]:
        words = self.task.params.config["words"]
        ids = torch.tensor([words[w] for w in [ROOT, *sentence]])
        vectors, _ = self.word_lstm(self.p["E"][ids].unsqueeze(1))
        vectors = vectors[:, 0]
        state = _ParseState(len(sentence))
        while not state.done:
            features = torch.cat([vectors[i] if i >= 0 else self.p["PAD"] for i in state.features()])
            state.apply(self._mlp(features).tolist())
        return state.heads

    def _parse_lockstep(self, sentences: Sequence[Any]) -> list[list[int]]:
        """Packed BiLSTM over every sentence; then each transition step scores every unfinished
        sentence with one MLP call over a gathered feature matrix."""
        words = self.task.params.config["words"]
        embedded = [self.p["E"][torch.tensor([words[w] for w in [ROOT, *s]])] for s in sentences]
        out, _ = self.word_lstm(pack_sequence(embedded, enforce_sorted=False))
        padded, _ = pad_packed_sequence(out)  # (T, B, 2S)
        T, B = padded.shape[:2]
        table = torch.cat([padded.transpose(0, 1).reshape(T * B, -1), self.p["PAD"].unsqueeze(0)])
        pad_row = T * B
        states = [_ParseState(len(s)) for s in sentences]
        active = list(range(B))
        while active:
            rows = torch.tensor([[k * T + i if i >= 0 else pad_row for i in states[k].features()] for k in active])
            scores = self._mlp(table[rows].reshape(len(active), -1)).tolist()
            for k, s in zip(active, scores):
                states[k].apply(s)
            active = [k for k in active if not states[k].done]
        return [s.heads for s in states]


class _ParseState:
    """The arc-hybrid configuration of examples/parser.py (same moves, same tie-break)."""

    def __init__(self, n: int) -> None:
        self.stack, self.buffer = [0], list(range(1, n + 1))
        self.heads = [-1] * n

    @property
    def done(self) -> bool:
        return not self.buffer and len(self.stack) <= 1

    def features(self) -> list[int]:
        """Positions of s2, s1, s0, b0 (-1 where missing: the PAD vector)."""
        top = self.stack[::-1]
        return [top[k] if k < len(top) else -1 for k in (2, 1, 0)] + [self.buffer[0] if self.buffer else -1]

    def apply(self, scores: Sequence[float]) -> None:
        move = max(legal(self.stack, self.buffer), key=lambda m: scores[m])
        if move == SHIFT:
            self.stack.append(self.buffer.pop(0))
        elif move == LEFT_ARC:
            self.heads[self.stack.pop() - 1] = self.buffer[0]
        else:
            assert move == RIGHT_ARC
            dependent = self.stack.pop()
            self.heads[dependent - 1] = self.stack[-1]
