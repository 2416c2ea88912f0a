"""If, Loop and Scan on the NumPy interpreter: each body is a graph of its own (the values it
reads from the enclosing scope become its last inputs), prepared once per node as an
``Interpreter`` and run per iteration, as the ONNX spec says.

Ours rather than ``onnx.reference``'s, which ran zero iterations of a Loop given a trip count
but no condition, stacked scan outputs with an extra axis, and could not run Scan-8 without
sequence lengths. Every iteration checks the caller's deadline and charges its body's nodes to
the caller's work limit (``ir.limits``): a model given by a client cannot spin forever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from autobatch.ir import Graph, Node, ValueType, captured_names
from autobatch.ir.limits import check_deadline, spend
from autobatch.ir.onnx_io import subgraph_from_onnx

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})

Body = Any  # an Interpreter over a body graph (``Interpreter.run_trusted`` runs it)
NodeImpl = Callable[[list[Any], dict[str, Any]], list[Any]]


class ControlFlowError(RuntimeError):
    """Inputs a control-flow op cannot take."""


def implementation(node: Node, outer: Graph, interpreter: Callable[[Graph], Body]) -> NodeImpl:
    """How to run ``node`` (If, Loop or Scan of the default domain) inside ``outer``."""
    return {"If": _if, "Loop": _loop, "Scan": _scan}[node.op_type](node, outer, interpreter)


def _body(node: Node, name: str, outer: Graph, interpreter: Callable[[Graph], Body]) -> tuple[Body, list[str]]:
    """The body in attribute ``name`` prepared to run, and the outer values it reads."""
    proto = node.attr(name)
    probe = Node(-1, node.op_type, "", node.version, {name: node.attributes[name]}, [], [], None, "")
    captured = sorted(captured_names(probe))
    return interpreter(subgraph_from_onnx(proto, outer, captured)), captured


def _if(node: Node, outer: Graph, interpreter: Callable[[Graph], Body]) -> NodeImpl:
    branches = {flag: _body(node, name, outer, interpreter) for flag, name in ((True, "then_branch"),
                                                                              (False, "else_branch"))}

    def run(inputs: list[Any], env: dict[str, Any]) -> list[Any]:
        body, captured = branches[bool(np.asarray(inputs[0]).reshape(-1)[0])]
        return body.run_trusted(dict(zip(body.graph.inputs, [env[n] for n in captured])))

    return run


def _loop(node: Node, outer: Graph, interpreter: Callable[[Graph], Body]) -> NodeImpl:
    body, captured = _body(node, "body", outer, interpreter)
    carried_count = len(node.inputs) - 2
    scan_types = [body.graph.values[name].type for name in body.graph.outputs[1 + carried_count:]]

    def run(inputs: list[Any], env: dict[str, Any]) -> list[Any]:
        trip, cond, *carried = inputs
        # Without a trip count the loop runs while the body says so; without a condition input
        # the body's condition output is ignored (ONNX's "for" loop).
        limit = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
        going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        captures = [env[n] for n in captured]
        scans: list[list[np.ndarray]] = [[] for _ in scan_types]
        i = 0
        while going and (limit is None or i < limit):
            check_deadline()
            spend(len(body.order), str(node))
            feeds = [np.array(i, np.int64), np.array(going), *carried, *captures]
            outputs = body.run_trusted(dict(zip(body.graph.inputs, feeds)))
            if cond is not None:
                going = bool(np.asarray(outputs[0]).reshape(-1)[0])
            carried = outputs[1:1 + carried_count]
            for parts, value in zip(scans, outputs[1 + carried_count:]):
                parts.append(np.asarray(value))
            i += 1
        return [*carried, *(np.stack(parts) if parts else _no_iterations(vtype, 0) for parts, vtype in zip(scans, scan_types))]

    return run


def _no_iterations(vtype: ValueType | None, axis: int) -> np.ndarray:
    """A scan output of zero iterations: the body's element type with a 0 inserted at ``axis``
    (its dimensions as the body declares them, unknown ones 0)."""
    shape = [d if isinstance(d, int) else 0 for d in vtype.shape] if vtype is not None and vtype.shape else []
    dtype = vtype.dtype if vtype is not None and vtype.dtype is not None else np.float32
    shape.insert(axis % (len(shape) + 1), 0)
    return np.zeros(shape, dtype)


def _scan(node: Node, outer: Graph, interpreter: Callable[[Graph], Body]) -> NodeImpl:
    body, captured = _body(node, "body", outer, interpreter)
    scan_inputs = node.attr("num_scan_inputs")
    if node.version < 9:
        return _scan8(node, body, captured, scan_inputs)
    states = len(node.inputs) - scan_inputs
    outputs = len(body.graph.outputs) - states
    in_axes = node.attr("scan_input_axes") or [0] * scan_inputs
    in_reverse = node.attr("scan_input_directions") or [0] * scan_inputs
    out_axes = node.attr("scan_output_axes") or [0] * outputs
    out_reverse = node.attr("scan_output_directions") or [0] * outputs

    def run(inputs: list[Any], env: dict[str, Any]) -> list[Any]:
        state, sequences = list(inputs[:states]), inputs[states:]
        axes = [axis % x.ndim for axis, x in zip(in_axes, sequences)]
        length = sequences[0].shape[axes[0]]
        if any(x.shape[axis] != length for x, axis in zip(sequences, axes)):
            raise ControlFlowError(f"{node}: scan inputs of different lengths "
                                   f"{[x.shape[axis] for x, axis in zip(sequences, axes)]}")
        captures = [env[n] for n in captured]
        parts: list[list[np.ndarray]] = [[] for _ in range(outputs)]
        for t in range(length):
            check_deadline()
            spend(len(body.order), str(node))
            slices = [np.take(x, length - 1 - t if reverse else t, axis=axis)
                      for x, axis, reverse in zip(sequences, axes, in_reverse)]
            results = body.run_trusted(dict(zip(body.graph.inputs, [*state, *slices, *captures])))
            state = results[:states]
            for collected, value in zip(parts, results[states:]):
                collected.append(np.asarray(value))
        scanned = []
        for collected, axis, reverse, name in zip(parts, out_axes, out_reverse, body.graph.outputs[states:]):
            if not collected:
                scanned.append(_no_iterations(body.graph.values[name].type, axis))
                continue
            values = collected[::-1] if reverse else collected
            scanned.append(np.stack(values, axis=axis % (values[0].ndim + 1)))
        return [*state, *scanned]

    return run


def _scan8(node: Node, body: Body, captured: list[str], scan_inputs: int) -> NodeImpl:
    """Scan before opset 9: every input has a batch axis first, the sequences their time axis
    second, and optional lengths per batch row; shorter rows' scan outputs are zero-padded."""
    states = len(node.inputs) - 1 - scan_inputs
    reverse = node.attr("directions") or [0] * scan_inputs

    def run(inputs: list[Any], env: dict[str, Any]) -> list[Any]:
        lengths, initial, sequences = inputs[0], inputs[1:1 + states], inputs[1 + states:]
        batch, longest = sequences[0].shape[:2]
        captures = [env[n] for n in captured]
        finals: list[list[np.ndarray]] = [[] for _ in range(states)]
        rows: list[list[list[np.ndarray]]] = []  # per batch row, per scan output, its steps' values
        for b in range(batch):
            count = longest if lengths is None else int(lengths[b])
            if not 0 <= count <= longest:
                raise ControlFlowError(f"{node}: sequence length {count} of row {b} is outside 0..{longest}")
            state = [s[b] for s in initial]
            parts: list[list[np.ndarray]] = [[] for _ in body.graph.outputs[states:]]
            for t in range(count):
                check_deadline()
                spend(len(body.order), str(node))
                slices = [x[b, count - 1 - t if back else t] for x, back in zip(sequences, reverse)]
                results = body.run_trusted(dict(zip(body.graph.inputs, [*state, *slices, *captures])))
                state = results[:states]
                for collected, value in zip(parts, results[states:]):
                    collected.append(np.asarray(value))
            for final, value in zip(finals, state):
                final.append(np.asarray(value))
            rows.append(parts)
        scanned = []
        for k, name in enumerate(body.graph.outputs[states:]):
            element = next((row[k][0] for row in rows if row[k]), None)
            if element is None:  # no steps at all: the element as the body declares it
                empty = _no_iterations(body.graph.values[name].type, 0)
                element = np.zeros(empty.shape[1:], empty.dtype)
            scanned.append(np.stack([_padded(row[k], longest, element) for row in rows]) if rows
                           else np.zeros((0, longest, *element.shape), element.dtype))
        states_out = [np.stack(final) if final else np.zeros((0, *np.shape(s)[1:]), np.asarray(s).dtype)
                      for final, s in zip(finals, initial)]
        return [*states_out, *scanned]

    return run


def _padded(values: list[np.ndarray], length: int, like: np.ndarray) -> np.ndarray:
    """A row's scan output, zeros after its ``len(values)`` steps (``like``: one step's value)."""
    padded = np.zeros((length, *np.shape(like)), np.asarray(like).dtype)
    if values:
        padded[:len(values)] = np.stack(values)
    return padded
