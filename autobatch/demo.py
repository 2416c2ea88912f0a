"""``autobatch demo``: a Tree-LSTM over synthetic SST-like trees, run one tree at a time and
batched; checks that they agree, prints the speedup and the batch statistics, and writes the
batched graph as an ONNX model."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import onnx

from autobatch.backends import Interpreter
from autobatch.batcher import BatchingPass
from autobatch.datasets import synthetic_tree
from autobatch.ir import Graph, to_onnx
from autobatch.zoo import tree_lstm_graph, tree_lstm_params


def run_demo(trees: int = 64, size: int = 256, scheduler: str = "level", output: str = "autobatch-demo.onnx",
             seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)
    forest = [synthetic_tree(rng) for _ in range(trees)]
    vocabulary = {w: i for i, w in enumerate(sorted({leaf.word for t in forest for leaf in t.leaves()}))}
    params = tree_lstm_params(len(vocabulary), size)
    graphs = [tree_lstm_graph(t, vocabulary, params, name=f"tree{k}") for k, t in enumerate(forest)]
    print(f"Tree-LSTM (size {size}) over {trees} synthetic SST-like trees, "
          f"{sum(len(t.leaves()) for t in forest) / trees:.1f} words a tree on average")

    start = time.perf_counter()
    alone = [Interpreter(g).run({})[0] for g in graphs]
    one_by_one = time.perf_counter() - start

    start = time.perf_counter()
    union = Graph.union(graphs)
    result = BatchingPass(scheduler)(union)
    batched = Interpreter(result.graph).run({})
    batched_time = time.perf_counter() - start

    worst = max(float(np.max(np.abs(a - b) / (np.abs(a) + 1e-6))) for a, b in zip(alone, batched))
    agree = all(np.allclose(b, a, rtol=1e-5, atol=1e-6) for a, b in zip(alone, batched))
    print(f"  one tree at a time: {one_by_one:.2f} s ({trees / one_by_one:.0f} trees/s), {len(union)} ops")
    print(f"  batched:            {batched_time:.2f} s ({trees / batched_time:.0f} trees/s), "
          f"speedup {one_by_one / batched_time:.1f}x")
    print(f"  {result.report}")
    print(f"  outputs agree (rtol 1e-5, atol 1e-6): {'yes' if agree else 'NO'} (largest relative difference {worst:.1e})")
    onnx.save(to_onnx(result.graph), output)
    print(f"  batched graph written to {output} ({Path(output).stat().st_size / 1e6:.1f} MB)")
    if not agree:
        raise SystemExit("batched outputs differ from the per-tree outputs")
    return {"one_by_one_s": one_by_one, "batched_s": batched_time}
