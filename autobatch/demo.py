"""``autobatch demo``: a Tree-LSTM (cells) over synthetic SST-like trees, run one tree at a
time and batched; checks that they agree, prints the speedup and the batch statistics, and
writes the batched graph as an ONNX model."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import onnx

from autobatch.batcher import BatchingPass
from autobatch.datasets import synthetic_tree
from autobatch.examples import tree_lstm
from autobatch.frontends import Batch
from autobatch.ir import to_onnx


def run_demo(trees: int = 64, size: int = 256, scheduler: str = "level", output: str = "autobatch-demo.onnx",
             seed: int = 0, backend: str = "numpy") -> dict[str, float]:
    rng = random.Random(seed)
    forest = [synthetic_tree(rng) for _ in range(trees)]
    params = tree_lstm.make_params(tree_lstm.make_vocabulary(forest), size=size)
    print(f"Tree-LSTM (size {size}, one cell a tree node) over {trees} synthetic SST-like trees, "
          f"{sum(len(t.leaves()) for t in forest) / trees:.1f} words a tree on average, backend {backend}")

    start = time.perf_counter()
    alone = []
    for tree in forest:
        with Batch(backend=backend, scheduler=scheduler) as batch:
            alone.append(batch.run([tree_lstm.loss_cells(tree, params)])[0])
    one_by_one = time.perf_counter() - start

    start = time.perf_counter()
    with Batch(backend=backend, scheduler=scheduler) as batch:
        losses = [tree_lstm.loss_cells(tree, params) for tree in forest]
        traced = time.perf_counter()
        graph = batch.graph_of(losses)  # the same batch as an IR graph, for the ONNX file (not timed)
        export_s = time.perf_counter() - traced
        batched = batch.run(losses)
    batched_time = time.perf_counter() - start - export_s

    agree = all(np.allclose(b, a, rtol=1e-5, atol=1e-6) for a, b in zip(alone, batched))
    worst = max(float(abs(a - b) / (abs(a) + 1e-6)) for a, b in zip(alone, batched))
    print(f"  one tree at a time: {one_by_one:.2f} s ({trees / one_by_one:.0f} trees/s)")
    print(f"  batched:            {batched_time:.2f} s ({trees / batched_time:.0f} trees/s), "
          f"speedup {one_by_one / batched_time:.1f}x")
    print(f"  {batch.reports[-1]}")
    print(f"  losses agree (rtol 1e-5, atol 1e-6): {'yes' if agree else 'NO'} (largest relative difference {worst:.1e})")
    onnx.save(to_onnx(BatchingPass(scheduler, as_rows=True)(graph).graph), output)
    print(f"  batched graph written to {output} ({Path(output).stat().st_size / 1e6:.1f} MB)")
    if not agree:
        raise SystemExit("batched losses differ from the per-tree losses")
    return {"one_by_one_s": one_by_one, "batched_s": batched_time}
