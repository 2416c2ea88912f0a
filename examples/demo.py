"""``autobatch demo``: a Tree-LSTM (cells) over synthetic SST-like trees, run one tree at a
time and batched; checks that they agree, prints both speeds and what the batch did in plain
words, and writes the batch's plan as one ONNX model.

BLAS runs on one thread (``threadpoolctl``): OpenBLAS's own threads fight ours for the cores of
a small machine, which made the demo's numbers swing by a factor of five between runs. Each way
is timed ``repeats`` times after a warm-up, and the median is printed.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from threadpoolctl import threadpool_limits

from autobatch.datasets import synthetic_tree
from autobatch.examples import tree_lstm
from autobatch.batch import Batch
from autobatch.tools import plan_view


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up: templates, sessions and caches are made once
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_demo(trees: int = 64, size: int = 256, scheduler: str = "level", output: str = "autobatch-demo.onnx",
             seed: int = 0, backend: str = "numpy", repeats: int = 5, draw: str | None = None) -> dict[str, float]:
    """``draw``: also draw the batch plan of the trees to this .png, .svg or .dot file."""
    rng = random.Random(seed)
    forest = [synthetic_tree(rng) for _ in range(trees)]
    params = tree_lstm.make_params(tree_lstm.make_vocabulary(forest), size=size)
    print(f"Tree-LSTM (size {size}, one cell a tree node) over {trees} synthetic SST-like trees, "
          f"{sum(len(t.leaves()) for t in forest) / trees:.1f} words a tree on average, backend {backend}.")
    print(f"BLAS on one thread; the median of {repeats} timed runs of each way, after a warm-up.\n")

    def one_by_one() -> list[np.ndarray]:
        losses = []
        for tree in forest:
            with Batch(backend=backend, scheduler=scheduler) as batch:
                losses.append(batch.run([tree_lstm.loss_cells(tree, params)])[0])
        return losses

    def batched() -> tuple[Batch, list[np.ndarray]]:
        with Batch(backend=backend, scheduler=scheduler) as batch:
            return batch, batch.run([tree_lstm.loss_cells(tree, params) for tree in forest])

    with threadpool_limits(limits=1, user_api="blas"):
        alone_s = _median_seconds(one_by_one, repeats)
        batched_s = _median_seconds(batched, repeats)
        alone = one_by_one()
        batch, together = batched()
    report = batch.reports[-1]
    agree = all(np.allclose(b, a, rtol=1e-5, atol=1e-6) for a, b in zip(alone, together))
    worst = max(float(abs(a - b) / (abs(a) + 1e-6)) for a, b in zip(alone, together))
    print(f"  {'':<22}{'seconds':>9}{'trees/s':>10}")
    print(f"  {'one tree at a time':<22}{alone_s:>9.3f}{trees / alone_s:>10.0f}")
    print(f"  {'batched':<22}{batched_s:>9.3f}{trees / batched_s:>10.0f}   ({alone_s / batched_s:.1f}x faster)\n")
    explain(report, trees)
    print(f"\n  losses agree (rtol 1e-5, atol 1e-6): {'yes' if agree else 'NO'} (largest relative difference {worst:.1e})")
    with Batch(backend=backend, scheduler=scheduler) as export:
        pending = [tree_lstm.loss_cells(tree, params) for tree in forest]
        graph = export.graph_of(pending)
        onnx.save(export.plan_model(pending), output)
        export.discard()
    print(f"  the batch's plan as one ONNX model: {output} ({Path(output).stat().st_size / 1e6:.1f} MB)")
    if draw:
        graph.draw(draw, plan_view(graph, scheduler))
        print(f"  its plan drawn: {draw}")
    if not agree:
        raise SystemExit("batched losses differ from the per-tree losses")
    return {"one_by_one_s": alone_s, "batched_s": batched_s}


def explain(report, instances: int) -> None:  # noqa: ANN001 - a BatchReport
    """What one batched run did, a line a figure, in plain words."""
    phases = {**report.seconds, **report.execution}
    planning = sum(report.seconds.values())
    lines = [
        ("operations", f"{report.nodes}", f"cell calls and ops of all {instances} instances"),
        ("launches", f"{report.launches}", f"batched runs of a kernel or cell; at least {report.lower_bound} "
         f"are needed ({report.scheduler} scheduler)"),
        ("run alone", f"{report.fallback_nodes}", "operations no rule batches (or random ones), one at a time"),
        ("gathers", f"{report.gathers}", f"copies of rows into a launch's inputs; {report.gathers_avoided} more "
         "were read in place"),
        ("duplicates", f"{report.merged_duplicates}", "repeated operations on the same inputs, run once"),
        ("planning", f"{planning * 1e3:.1f} ms", "signing, scheduling and laying out the launches"),
        ("kernels", f"{phases.get('kernels', 0) * 1e3:.1f} ms", "the launches themselves"),
        ("moving rows", f"{(phases.get('gather', 0) + phases.get('scatter', 0)) * 1e3:.1f} ms",
         "gathers into launches and writes of their results"),
    ]
    print("  how the batch ran:")
    for name, value, meaning in lines:
        print(f"    {name:<12}{value:>10}  {meaning}")
