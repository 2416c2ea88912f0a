"""What tracing and planning cost, beside the least a Python tracer can do (issue 19's measure).

    python -m benchmarks.tracing_cost [--steps 5000] [--size 64] [--instances 64] [--repeats 15]

The computation is an Elman step, ``h = tanh(h @ W + b)``, repeated: three primitive ops a step.
It is traced three ways into a tracer that only records (nothing runs): with primitive ops (a
record an op), as one cell call a step (a record a step), and into a bare recorder (``__slots__``
tensors whose operators append a tuple to a list: Python's floor for a recorder that keeps
shapes). Then planning: ``--instances`` chains of such steps of different lengths traced into
one ``Batch`` and planned as it runs them, microseconds a record (the plan's own phases,
``BatchReport.seconds``), and the same for a minibatch of ``--instances`` examples of the
Tree-LSTM and the BiLSTM tagger (``python -m benchmarks``' tasks at ``--size``), written with
primitive ops and with cells. The fastest of ``--repeats`` runs of each.
"""

from __future__ import annotations

import time

import numpy as np

from autobatch import Batch, Parameter, arguments, cell, ops
from autobatch.batcher.plan import BatchReport
from autobatch.frontends import recorder
from autobatch.frontends.tracing import Tracer
from benchmarks.tasks import build


class _Bare:
    """A recorder's least: a tensor with a shape whose operators append a tuple."""

    __slots__ = ("records", "shape")

    def __init__(self, records: list, shape: tuple[int, ...]) -> None:
        self.records, self.shape = records, shape

    def _op(self, op: str, *operands: _Bare) -> _Bare:
        self.records.append((op, operands))
        return _Bare(self.records, self.shape)

    def __matmul__(self, other: _Bare) -> _Bare:
        return self._op("MatMul", self, other)

    def __add__(self, other: _Bare) -> _Bare:
        return self._op("Add", self, other)

    def tanh(self) -> _Bare:
        return self._op("Tanh", self)


def _fastest(run, repeats: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up (a cell is traced once)
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = arguments.parser("python -m benchmarks.tracing_cost", __doc__.splitlines()[0])
    parser.add_argument("--steps", type=arguments.integer(1), default=5000, help="steps traced a run")
    parser.add_argument("--size", type=arguments.integer(1), default=64, help="hidden size")
    parser.add_argument("--instances", type=arguments.integer(1), default=64, help="chains planned together")
    parser.add_argument("--repeats", type=arguments.integer(1), default=15)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    W = Parameter((rng.standard_normal((args.size, args.size)) / args.size).astype(np.float32))
    b = Parameter(np.zeros(args.size, np.float32))
    x0 = rng.standard_normal(args.size).astype(np.float32)
    step = cell(lambda h: ops.tanh(ops.add(ops.matmul(h, W), b)))

    def primitive() -> None:
        with Tracer() as tracer:
            h = tracer.constant(x0)
            for _ in range(args.steps):
                h = ops.tanh(ops.add(ops.matmul(h, W), b))
            tracer.discard()

    def cells() -> None:
        with Tracer() as tracer:
            h = tracer.constant(x0)
            for _ in range(args.steps):
                h = step(h)
            tracer.discard()

    def bare() -> None:
        records: list = []
        h, w, bias = _Bare(records, (args.size,)), _Bare(records, W.shape), _Bare(records, b.shape)
        for _ in range(args.steps):
            h = (h @ w + bias).tanh()

    lengths = rng.integers(1, 2 * args.steps // args.instances + 1, args.instances)

    def planned() -> tuple[int, float]:
        with Batch() as batch:
            ends = []
            for n in lengths:
                h = batch.constant(rng.standard_normal(args.size).astype(np.float32))
                for _ in range(int(n)):
                    h = ops.tanh(ops.add(ops.matmul(h, W), b))
                ends.append(h)
            batch.run(ends)
        report = batch.reports[-1]
        return report.nodes, sum(report.seconds[phase] for phase in ("analyse", "schedule", "plan"))

    us = {
        "primitive op, traced": _fastest(primitive, args.repeats) / (3 * args.steps) * 1e6,
        "cell call, traced": _fastest(cells, args.repeats) / args.steps * 1e6,
        "bare recorder, an op": _fastest(bare, args.repeats) / (3 * args.steps) * 1e6,
    }
    planned()  # a warm-up: templates made once
    records, seconds = min((planned() for _ in range(args.repeats)), key=lambda run: run[1])
    us["planning, a primitive record"] = seconds / records * 1e6
    print(f"size {args.size}; {args.steps} steps traced a run; {args.instances} chains, {records} records planned; "
          f"fastest of {args.repeats}; the {'compiled' if recorder.COMPILED else 'Python'} recorder "
          f"(AUTOBATCH_PURE_PYTHON=1 runs the Python one)")
    for name, value in us.items():
        floor = us["bare recorder, an op"]
        versus = f"{value / floor:6.1f}x the bare recorder" if "planning" not in name else ""
        print(f"  {name:32} {value:8.2f} us   {versus}")
    print(f"planning a minibatch of {args.instances} examples (size {args.size}; fastest of {args.repeats}):")
    for task in ("treelstm", "bilstm"):
        for form in ("primitive", "cells"):
            report = _planned_task(task, form, args.instances, args.size, args.repeats)
            seconds = sum(report.seconds[phase] for phase in ("analyse", "schedule", "plan"))
            us[f"planning {task} {form}, a record"] = seconds / report.nodes * 1e6
            print(f"  {task} {form:10} {report.nodes:7,} records {seconds * 1e3:8.1f} ms {seconds / report.nodes * 1e6:6.2f} us "
                  f"a record; {report.launches} launches, lower bound {report.lower_bound}")
    return us


def _planned_task(name: str, form: str, count: int, size: int, repeats: int) -> BatchReport:
    """The report of the fastest-planned of ``repeats`` minibatches (after a warm-up) of a task."""
    task = build(name, count, size)
    loss = task.functions()[form]
    reports = []
    for _ in range(repeats + 1):
        with Batch() as batch:
            batch.run([loss(example, task.params) for example in task.instances])
        reports.append(batch.reports[-1])
    return min(reports[1:], key=lambda report: sum(report.seconds[p] for p in ("analyse", "schedule", "plan")))


if __name__ == "__main__":
    main()
