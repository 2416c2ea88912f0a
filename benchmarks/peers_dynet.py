"""DyNet 2.2 (``pip install dynet38``) versions of the four tasks with the examples' weights,
run in a subprocess per autobatch setting (DyNet reads ``autobatch`` once, at import):

    python -m benchmarks.peers_dynet --autobatch 1 --tasks treelstm,bilstm --count 64 --size 256

prints one JSON object: for each task and strategy, seconds (fastest of ``--repeats`` after a
warm-up) and the per-instance results (losses, or the parser's heads) for the checks.

Strategies: ``autobatch`` (DyNet's on-the-fly batching of the whole minibatch's graph; with
``--autobatch 0`` it is the minibatch's graph run node by node) and, for the BiLSTM tagger,
``hand-padded`` (``lookup_batch`` over padded sentences, masks for the backward LSTM). The
parser runs in lockstep: each transition step builds every unfinished sentence's scores, then
one ``forward`` computes them (batched by DyNet's autobatching).

DyNet is column-vector: our ``x @ W + b`` is ``W^T x + b``; the LSTM is written out with the
examples' gate order ``[i; f; o; g]`` (``affine_transform`` + ``pickrange``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def available() -> str | None:
    """None when DyNet can be imported (checked in a subprocess: importing it fixes its config)."""
    import importlib.util

    if importlib.util.find_spec("dynet") is None or importlib.util.find_spec("dynet_config") is None:
        return "DyNet is not installed (pip install dynet38)"
    return None


def run_subprocess(autobatch: int, tasks: Sequence[str], count: int, size: int, repeats: int,
                   sizes: Sequence[int] = (), timeout: float = 900) -> dict[str, Any]:
    """Run this module in a fresh interpreter; its JSON result (or {'error': ...})."""
    import subprocess

    command = [sys.executable, "-m", "benchmarks.peers_dynet", "--autobatch", str(autobatch), "--tasks",
               ",".join(tasks), "--count", str(count), "--size", str(size), "--repeats", str(repeats),
               "--sizes", ",".join(map(str, sizes))]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=root, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------- in the subprocess
class Models:
    def __init__(self, dy: Any, task: Any) -> None:
        self.dy, self.task = dy, task
        self.S = task.size
        self.m = dy.ParameterCollection()
        self.p: dict[str, Any] = {}
        for name, param in task.params.items():
            if "_onnx_" in name:  # the examples' copies of LSTM weights in ONNX's layout (for ops.lstm)
                continue
            a = param.array
            if name in ("E", "C"):
                self.p[name] = self.m.lookup_parameters_from_numpy(a)  # rows are the vectors
            elif a.ndim == 2:
                self.p[name] = self.m.parameters_from_numpy(np.ascontiguousarray(a.T))  # x @ W == W^T x
            else:
                self.p[name] = self.m.parameters_from_numpy(a)

    # -- shared pieces
    def lstm_step(self, prefix: str, x: Any, h: Any, c: Any) -> tuple[Any, Any]:
        dy, p = self.dy, self.p
        n = p[f"{prefix}_U"].shape()[1]
        gates = dy.affine_transform([p[f"{prefix}_b"], p[f"{prefix}_W"], x, p[f"{prefix}_U"], h])
        i = dy.logistic(dy.pickrange(gates, 0, n))
        f = dy.logistic(dy.pickrange(gates, n, 2 * n))
        o = dy.logistic(dy.pickrange(gates, 2 * n, 3 * n))
        g = dy.tanh(dy.pickrange(gates, 3 * n, 4 * n))
        c = dy.cmult(f, c) + dy.cmult(i, g)
        return dy.cmult(o, dy.tanh(c)), c

    def lstm(self, prefix: str, xs: Sequence[Any]) -> list[Any]:
        n = self.p[f"{prefix}_U"].shape()[1]
        h = c = self.dy.zeros(n)
        out = []
        for x in xs:
            h, c = self.lstm_step(prefix, x, h, c)
            out.append(h)
        return out

    def bilstm(self, xs: Sequence[Any], prefix: str = "w") -> list[Any]:
        forward = self.lstm(prefix + "f", xs)
        backward = self.lstm(prefix + "b", xs[::-1])[::-1]
        return [self.dy.concatenate([f, b]) for f, b in zip(forward, backward)]

    # -- Tree-LSTM
    def tree_loss(self, tree: Any) -> Any:
        dy, p, S = self.dy, self.p, self.S
        vocabulary = self.task.params.config["vocabulary"]
        state: dict[int, tuple[Any, Any]] = {}
        losses = []
        for n in tree.nodes():
            if n.is_leaf:
                iou = dy.affine_transform([p["b_iou"], p["W_iou"], dy.lookup(p["E"], vocabulary[n.word])])
                c = dy.cmult(dy.logistic(dy.pickrange(iou, 0, S)), dy.tanh(dy.pickrange(iou, 2 * S, 3 * S)))
            else:
                (hl, cl), (hr, cr) = state.pop(id(n.left)), state.pop(id(n.right))
                iou = dy.affine_transform([p["b_iou"], p["U_iou"], dy.concatenate([hl, hr])])
                fl = dy.logistic(dy.affine_transform([p["b_f"], p["Uf1"], hl]))
                fr = dy.logistic(dy.affine_transform([p["b_f"], p["Uf2"], hr]))
                c = (dy.cmult(dy.logistic(dy.pickrange(iou, 0, S)), dy.tanh(dy.pickrange(iou, 2 * S, 3 * S)))
                     + dy.cmult(fl, cl) + dy.cmult(fr, cr))
            h = dy.cmult(dy.logistic(dy.pickrange(iou, S, 2 * S)), dy.tanh(c))
            state[id(n)] = (h, c)
            losses.append(dy.pickneglogsoftmax(p["W_out"] * h, n.label))
        return dy.esum(losses)

    # -- taggers
    def word_vector(self, word: str) -> Any:
        from autobatch.examples import char_tagger

        dy, p, config = self.dy, self.p, self.task.params.config
        if self.task.name == "bilstm" or not char_tagger.is_spelled(word, config["words"]):
            return dy.lookup(p["E"], config["words"][word])
        chars = config["chars"]
        embedded = [dy.lookup(p["C"], chars[ch]) for ch in [char_tagger.PAD, *word, char_tagger.PAD]]
        return dy.concatenate([self.lstm("cf", embedded)[-1], self.lstm("cb", embedded[::-1])[-1]])

    def tagger_loss(self, sentence: Any) -> Any:
        dy, p, tags = self.dy, self.p, self.task.params.config["tags"]
        states = self.bilstm([self.word_vector(w) for w, _ in sentence])
        return dy.esum([dy.pickneglogsoftmax(p["O"] * dy.tanh(p["H"] * s), tags[t])
                        for s, (_, t) in zip(states, sentence)])

    def tagger_padded(self, sentences: Sequence[Any]) -> Any:
        """One batched expression over padded sentences: a loss per batch element."""
        dy, p, S = self.dy, self.p, self.S
        words, tags = self.task.params.config["words"], self.task.params.config["tags"]
        B, T = len(sentences), max(len(s) for s in sentences)
        ids = np.zeros((T, B), dtype=np.int64)
        gold = np.zeros((T, B), dtype=np.int64)
        mask = np.zeros((T, B), dtype=np.float32)
        for k, s in enumerate(sentences):
            for t, (w, tag) in enumerate(s):
                ids[t, k], gold[t, k], mask[t, k] = words[w], tags[tag], 1.0
        def batched(array: np.ndarray) -> Any:  # (rows, B); DyNet refuses batched=True with B = 1
            return dy.inputTensor(array, batched=True) if B > 1 else dy.inputTensor(array[:, 0])

        xs = [dy.lookup_batch(p["E"], ids[t].tolist()) for t in range(T)]
        h = c = dy.zeros(S, batch_size=B)
        forward = []
        for t in range(T):  # pads come last: the forward states of real tokens never see them
            h, c = self.lstm_step("wf", xs[t], h, c)
            forward.append(h)
        h = c = dy.zeros(S, batch_size=B)
        backward = [None] * T
        for t in reversed(range(T)):  # pads come first here: masked, the state stays zero through them
            keep = np.repeat(mask[t][None, :], S, 0)
            m, m_off = batched(keep), batched(1 - keep)
            h_new, c_new = self.lstm_step("wb", xs[t], h, c)
            h = dy.cmult(m, h_new) + dy.cmult(m_off, h)
            c = dy.cmult(m, c_new) + dy.cmult(m_off, c)
            backward[t] = h
        losses = []
        for t in range(T):
            score = p["O"] * dy.tanh(p["H"] * dy.concatenate([forward[t], backward[t]]))
            nll = dy.pickneglogsoftmax_batch(score, gold[t].tolist())
            losses.append(dy.cmult(nll, batched(mask[t][None, :])))
        return dy.esum(losses)

    # -- parser
    def parse_lockstep(self, sentences: Sequence[Any]) -> list[list[int]]:
        from benchmarks.peers_torch import _ParseState  # plain Python, no torch needed

        dy, p = self.dy, self.p
        words = self.task.params.config["words"]
        from autobatch.examples.parser import ROOT

        tables = [self.bilstm([dy.lookup(p["E"], words[w]) for w in [ROOT, *s]]) for s in sentences]
        pad = p["PAD"]
        states = [_ParseState(len(s)) for s in sentences]
        active = list(range(len(sentences)))
        while active:
            scores = []
            for k in active:
                features = dy.concatenate([tables[k][i] if i >= 0 else pad for i in states[k].features()])
                scores.append(p["W2"] * dy.tanh(dy.affine_transform([p["b1"], p["W1"], features])) + p["b2"])
            dy.forward(scores)
            for k, s in zip(active, scores):
                states[k].apply(s.npvalue().tolist())
            active = [k for k in active if not states[k].done]
        return [s.heads for s in states]

    # -- one minibatch
    def run(self, strategy: str, instances: Sequence[Any]) -> list[Any]:
        dy = self.dy
        dy.renew_cg()
        name = self.task.name
        if name == "parser":
            return self.parse_lockstep(instances)
        if strategy == "hand-padded":
            return np.asarray(self.tagger_padded(instances).npvalue()).reshape(-1).tolist()
        loss = self.tree_loss if name == "treelstm" else self.tagger_loss
        losses = [loss(x) for x in instances]
        dy.esum(losses).value()  # one forward over the whole minibatch (autobatched)
        return [l.value() for l in losses]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers_dynet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--autobatch", type=int, required=True)
    parser.add_argument("--tasks", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sizes", default="", help="also time minibatches of these sizes (first instances)")
    args = parser.parse_args()
    import dynet_config

    dynet_config.set(autobatch=args.autobatch, mem="2048", random_seed=1)
    import dynet as dy

    from benchmarks.tasks import build

    out: dict[str, Any] = {"version": "2.2", "autobatch": args.autobatch, "results": {}}
    for name in args.tasks.split(","):
        task = build(name, args.count, args.size)
        models = Models(dy, task)
        strategies = ["autobatch"] + (["hand-padded"] if name == "bilstm" and args.autobatch == 0 else [])
        for strategy in strategies:
            start = time.perf_counter()
            values = models.run(strategy, task.instances)  # warm-up (timed only when --repeats 0)
            best = time.perf_counter() - start if args.repeats == 0 else float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                models.run(strategy, task.instances)
                best = min(best, time.perf_counter() - start)
            record: dict[str, Any] = {"seconds": best, "values": values, "count": len(task.instances)}
            sweep = {}
            for size in (int(s) for s in args.sizes.split(",") if s):  # warm-up, then the fastest of --repeats
                subset = task.instances[:size]
                models.run(strategy, subset)
                sweep[size] = float("inf")
                for _ in range(max(args.repeats, 1)):
                    start = time.perf_counter()
                    models.run(strategy, subset)
                    sweep[size] = min(sweep[size], time.perf_counter() - start)
            record["sweep"] = sweep
            out["results"][f"{name}/{strategy}"] = record
    print(json.dumps(out))


if __name__ == "__main__":
    main()
