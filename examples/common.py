"""What the example models share: parameters with a fixed seed, vocabularies, an LSTM written
once for one instance (primitive ops, or one cell per step), and the timing harness of the
``main()`` functions.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autobatch import arguments
from autobatch import Batch, Parameter, cell, ops
from autobatch.frontends.cells import Cell

UNK = "<unk>"
BACKENDS = ("numpy", "onnxruntime")
FORMS = ("primitive", "cells", "sequences", "fold")  # each example has some of them


# ----------------------------------------------------------------------------- parameters
class Params(dict):
    """Model parameters by name (``Parameter`` objects shared by every instance), plus the
    model's cells, made once per parameter set so that each is traced once per signature."""

    def __init__(self, seed: int = 0, **config: Any) -> None:
        super().__init__()
        self.rng = np.random.default_rng(seed)
        self.config = config
        self._cells: dict[str, Cell] = {}

    def add(self, name: str, *shape: int, scale: float | None = None) -> Parameter:
        """A random parameter, standard normal times ``scale`` (default ``1/sqrt(rows)``)."""
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        self[name] = Parameter((self.rng.standard_normal(shape) * scale).astype(np.float32), name=name)
        return self[name]

    def freeze(self) -> Params:
        """Every parameter read-only (``Parameter.freeze``): inference from here on."""
        for parameter in self.values():
            parameter.freeze()
        return self

    def cell(self, name: str, make: Callable[[], Cell]) -> Cell:
        """The cell ``name`` of this parameter set, made by ``make()`` the first time."""
        made = self._cells.get(name)
        if made is None:
            made = self._cells[name] = make()
        return made


def add_lstm(params: Params, prefix: str, inputs: int, hidden: int) -> None:
    """One LSTM layer: gates ``[i; f; o; g] = x @ W + h @ U + b``."""
    params.add(f"{prefix}_W", inputs, 4 * hidden)
    params.add(f"{prefix}_U", hidden, 4 * hidden)
    params.add(f"{prefix}_b", 4 * hidden, scale=0.1)


def add_bilstm(params: Params, prefix: str, inputs: int, hidden: int) -> None:
    """Layers ``{prefix}f`` and ``{prefix}b`` (``add_lstm``), and the same weights in the layout
    of ONNX's bidirectional LSTM (``ops.lstm``), copied here: ``{prefix}_onnx_W``, ``_R``, ``_B``."""
    add_lstm(params, prefix + "f", inputs, hidden)
    add_lstm(params, prefix + "b", inputs, hidden)
    i, f, o, g = (slice(k * hidden, (k + 1) * hidden) for k in range(4))
    onnx_order = np.r_[i, o, f, g]  # ONNX's gates: i, o, f, c

    def both(make: Callable[[str], np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(np.stack([make(prefix + way) for way in "fb"]))

    onnx_layout = {
        "W": both(lambda layer: params[f"{layer}_W"].array[:, onnx_order].T),
        "R": both(lambda layer: params[f"{layer}_U"].array[:, onnx_order].T),
        "B": both(lambda layer: np.concatenate([params[f"{layer}_b"].array[onnx_order], np.zeros(4 * hidden, np.float32)])),
    }
    for name, value in onnx_layout.items():
        params[f"{prefix}_onnx_{name}"] = Parameter(value, name=f"{prefix}_onnx_{name}")


@dataclass
class Vocabulary:
    """Symbols to row indices; index 0 is the unknown symbol."""

    index: dict[str, int]
    counts: Counter = field(default_factory=Counter)

    @classmethod
    def build(cls, symbols: Iterable[str]) -> Vocabulary:
        counts = Counter(symbols)
        return cls({UNK: 0, **{s: k + 1 for k, s in enumerate(sorted(counts))}}, counts)

    def __getitem__(self, symbol: str) -> int:
        return self.index.get(symbol, 0)

    def __len__(self) -> int:
        return len(self.index)


# ----------------------------------------------------------------------------- LSTM for one instance
def lstm_step(x: Any, h: Any, c: Any, W: Parameter, U: Parameter, b: Parameter) -> tuple[Any, Any]:
    """One LSTM step in primitive ops."""
    i, f, o, g = ops.split(ops.matmul(x, W) + ops.matmul(h, U) + b, 4)
    c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
    return ops.sigmoid(o) * ops.tanh(c), c


def lstm_cell(params: Params, prefix: str) -> Cell:
    """The LSTM step of layer ``prefix`` as a cell: one IR node per step."""
    W, U, b = params[f"{prefix}_W"], params[f"{prefix}_U"], params[f"{prefix}_b"]

    def make() -> Cell:
        def step(x: Any, h: Any, c: Any) -> tuple[Any, Any]:
            return lstm_step(x, h, c, W, U, b)

        step.__name__ = f"{prefix}_step"
        return cell(step)

    return params.cell(f"{prefix}_step", make)


def lstm(xs: Sequence[Any], params: Params, prefix: str, cells: bool) -> list[Any]:
    """The hidden states of one LSTM layer over ``xs`` (one instance)."""
    hidden = params[f"{prefix}_U"].shape[0]
    h = c = ops.zeros((hidden,))
    step = lstm_cell(params, prefix) if cells else None
    outputs = []
    for x in xs:
        if step is None:
            h, c = lstm_step(x, h, c, params[f"{prefix}_W"], params[f"{prefix}_U"], params[f"{prefix}_b"])
        else:
            h, c = step(x, h, c)
        outputs.append(h)
    return outputs


def bilstm_rows(x: Any, params: Params, prefix: str) -> tuple[Any, Any]:
    """Layers ``{prefix}f`` and ``{prefix}b`` over the rows of ``x [n, d]`` as one bidirectional
    ``ops.lstm``: ``[forward; backward]`` states ``[n, 2h]``, and the last of each ``[2h]``
    (the backward layer's at position 0)."""
    return ops.lstm(x, *(params[f"{prefix}_onnx_{name}"] for name in "WRB"), direction="bidirectional")


def bilstm(xs: Sequence[Any], params: Params, prefix: str, cells: bool) -> list[tuple[Any, Any]]:
    """``(forward_t, backward_t)`` for every position (layers ``{prefix}f`` and ``{prefix}b``)."""
    forward = lstm(xs, params, prefix + "f", cells)
    backward = lstm(xs[::-1], params, prefix + "b", cells)[::-1]
    return list(zip(forward, backward))


# ----------------------------------------------------------------------------- timing harness
@dataclass
class Measurement:
    form: str
    backend: str
    instances: int
    ops: int  # calls traced (a cell call is one), reused ones included
    trace_s: float
    run_s: float
    launches: int
    lower_bound: int
    report: str

    def lines(self) -> list[str]:
        total = self.trace_s + self.run_s
        return [
            f"{self.form:9} {self.backend:11} {self.instances} instances, {self.ops} traced calls "
            f"({self.ops / self.instances:.0f} an instance)",
            f"    tracing {self.trace_s * 1e3:.1f} ms: {self.trace_s / self.instances * 1e6:.0f} us an instance, "
            f"{self.trace_s / max(self.ops, 1) * 1e6:.2f} us a traced call",
            f"    batched run {self.run_s * 1e3:.1f} ms; launches {self.launches} vs lower bound {self.lower_bound}",
            f"    {self.instances / total:.0f} instances/s (tracing + run)",
            f"    report: {self.report}",
        ]


def measure_losses(loss: Callable[[Any, Params], Any], instances: Sequence[Any], params: Params, form: str,
                   backend: str, repeats: int = 1) -> Measurement:
    """Trace ``loss(instance, params)`` for every instance in one Batch (timed), then run it
    batched (timed separately). One warm-up round first (cells are traced there, sessions
    made); the fastest of ``repeats`` rounds is kept."""
    best: Measurement | None = None
    for round_ in range(repeats + 1):
        with Batch(backend=backend) as batch:
            start = time.perf_counter()
            losses = [loss(x, params) for x in instances]
            traced = time.perf_counter()
            batch.run(losses)
            done = time.perf_counter()
        report = batch.reports[-1]
        m = Measurement(form, backend, len(instances), report.nodes + batch.reused_calls, traced - start, done - traced,
                        report.launches, report.lower_bound, str(report))
        if round_ and (best is None or m.trace_s + m.run_s < best.trace_s + best.run_s):
            best = m
    assert best is not None
    return best


def argument_parser(example: str, description: str, forms: Sequence[str], instances: int = 32, size: int = 64,
                    ) -> argparse.ArgumentParser:
    """The options of ``python -m autobatch.examples.<example>``; ``forms``: those it is written in."""
    parser = arguments.parser(f"python -m autobatch.examples.{example}", description,
                              [f"python -m autobatch.examples.{example}",
                               f"python -m autobatch.examples.{example} --instances 64 --size 256 --backends numpy "
                               f"--forms {forms[-1]} --repeats 3"])
    parser.add_argument("--instances", "-n", type=arguments.integer(1), default=instances, help="minibatch size")
    parser.add_argument("--size", type=arguments.integer(1), default=size, help="embedding = hidden size")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: numpy,onnxruntime")
    parser.add_argument("--forms", default=",".join(forms), help=f"comma-separated: {','.join(forms)}")
    parser.set_defaults(known_forms=tuple(forms))
    parser.add_argument("--repeats", type=arguments.integer(1), default=1,
                        help="timed rounds after one warm-up (fastest kept)")
    return parser


def run_all(measure: Callable[[str, str], Measurement], args: argparse.Namespace) -> list[Measurement]:
    """Measure every (form, backend) asked for and print the results."""
    results = []
    for form in args.forms.split(","):
        if form not in args.known_forms:
            raise SystemExit(f"unknown form {form!r}; choose from {', '.join(args.known_forms)}")
        for backend in args.backends.split(","):
            m = measure(form, backend)
            print("\n".join(m.lines()), flush=True)
            results.append(m)
    return results
