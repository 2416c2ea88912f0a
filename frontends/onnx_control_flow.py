"""ONNX control flow, resolved per instance: ``unroll_instance(graph, feeds) -> Graph``.

One instance's inputs are known, so its ``If`` conditions and ``Loop``/``Scan`` trip counts
are known too. This frontend inlines the branch taken and every iteration run, so that the
batcher sees plain ops it can group across instances step by step (an RNN written as a Loop
becomes T copies of its cell). Values that decide control flow are computed on just the part
of the graph that produces them, by the evaluator the caller gives (the NumPy interpreter). What cannot be resolved (an
evaluation that fails, ``resolve=False``) stays as one opaque node that runs per instance.
"""

from __future__ import annotations

import hashlib
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from onnx import AttributeProto, GraphProto, NodeProto, helper, numpy_helper

from autobatch.ir import Graph, Node, attribute_value, captured_names
from autobatch.ir.limits import WorkLimit, check_deadline
from autobatch.ir.types import type_of_value

Scope = ChainMap  # name in the source (graph or body) -> name in the unrolled graph


MAX_UNROLLED_NODES = 100_000


class UnrollError(ValueError):
    """This instance's control flow cannot be unrolled (its condition cannot be evaluated)."""


# Runs a graph on feeds: its outputs, or None where it cannot (a backend's interpreter; frontends
# sit left of backends in the data flow, so the caller hands one over).
Evaluate = Callable[[Graph, dict[str, Any]], list[Any] | None]


def unroll_instance(graph: Graph, feeds: Mapping[str, Any], evaluate: Evaluate,
                    max_unrolled_nodes: int = MAX_UNROLLED_NODES, resolve: bool = True) -> Graph:
    """The graph of one instance with its control flow resolved for these feeds.

    Same input and output names as ``graph``; input types are the feeds' concrete types and
    every other value's type is inferred. The values that decide control flow are computed by
    ``evaluate`` (``backends.evaluate``: the NumPy interpreter). ``resolve=False`` keeps every
    If/Loop/Scan opaque. Raises ``WorkLimit``, naming the node being unrolled, past
    ``max_unrolled_nodes`` nodes, and ``DeadlineExceeded`` past the caller's deadline.
    """
    return _Unroller(graph, feeds, evaluate, max_unrolled_nodes, resolve).run()


class _Unroller:
    """Copies nodes into ``out``, inlining resolved control flow. ``known`` holds every value
    of ``out`` computed so far (feeds included), so repeated evaluations never redo work."""

    def __init__(self, graph: Graph, feeds: Mapping[str, Any], evaluate: Evaluate, budget: int, resolve: bool) -> None:
        missing = [name for name in graph.inputs if name not in feeds]
        if missing:
            raise ValueError(f"missing feed(s) {missing} for graph {graph.name!r}")
        self.source = graph
        self.run_graph = evaluate
        self.budget = budget
        self.resolve = resolve
        self.out = Graph(graph.name, graph.opset_imports)
        self.out.functions = dict(graph.functions)
        self.out.meta = dict(graph.meta)
        self.known: dict[str, np.ndarray] = {}
        self.taken = set(graph.values)  # fresh names must not collide with names still to come
        self.node_names = {node.name for node in graph.nodes.values() if node.name}
        self.unrolling: list[str] = []  # control-flow nodes being unrolled, for error messages
        for name in graph.inputs:
            value = feeds[name]
            self.known[name] = value if value is None or isinstance(value, list) else np.asarray(value)
            self.out.add_input(name, type_of_value(self.known[name]))
        for name, array in graph.initializers().items():
            self.out.add_initializer(name, array)

    def run(self) -> Graph:
        scope: Scope = ChainMap({})
        for node in self.source.topological_order():
            self.emit(_node_proto(node), scope, tag="")
        for name in self.source.outputs:
            if scope.get(name, name) != name:  # an inlined value stands for this output
                self.add("Identity", [scope[name]], [name], name=f"{name}/output")
            self.out.add_output(name)
        self.remove_dead_nodes()
        self.out.infer_shapes()
        for name, value in self.out.values.items():  # what inference missed (opaque nodes' outputs)
            if value.type is None or not value.type.is_static:
                known = self.evaluate(name)
                if known is not None:
                    value.type = type_of_value(known)
        return self.out

    def remove_dead_nodes(self) -> None:
        """Drop what only decided control flow (trip counts, conditions): it would cost launches."""
        outputs = set(self.out.outputs)
        for node in reversed(self.out.topological_order()):
            if not any(o in outputs or self.out.consumer_count(o) for o in node.outputs if o):
                self.out.remove_nodes([node.id])
        self.out.prune_unused_constants()

    # ----------------------------------------------------------------- emitting
    def emit(self, node: NodeProto, scope: Scope, tag: str) -> None:
        """Add ``node`` (of the top graph when ``tag`` is empty, else of an inlined body)."""
        inputs = [scope.get(name, name) if name else "" for name in node.input]
        if self.resolve and node.domain in ("", "ai.onnx"):
            unroll = {"If": self.unroll_if, "Loop": self.unroll_loop, "Scan": self.unroll_scan}.get(node.op_type)
            if unroll is not None:
                label = f"{node.op_type} {node.name or node.output[0]!r}"
                self.unrolling.append(label)
                try:
                    if unroll(node, inputs, scope, tag):
                        return
                finally:
                    self.unrolling.pop()
        constant = _constant_value(node)
        if tag and constant is not None:  # one shared value instead of a node per iteration
            scope[node.output[0]] = self.constant(constant, node.output[0])
            return
        if tag and node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            scope[node.output[0]] = inputs[0]  # a body passing a value on: no launch for it
            return
        self.copy(node, inputs, scope, tag)

    def copy(self, node: NodeProto, inputs: list[str], scope: Scope, tag: str) -> None:
        """Add the node as it is (opaque if it holds control flow)."""
        attributes = {a.name: a for a in node.attribute}
        outputs = [self.define(name, scope, tag) if name else "" for name in node.output]
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            attributes = _rename_captures(attributes, scope)
            if node.op_type in ("Loop", "Scan") and node.domain in ("", "ai.onnx"):
                self.explicit_captures(node.op_type, attributes, inputs, outputs)
        self.add(node.op_type, inputs, outputs, attributes, domain=node.domain,
                 name=_suffixed(node.name or f"{node.op_type}:{node.output[0]}", tag))

    def explicit_captures(self, op_type: str, attributes: dict[str, AttributeProto], inputs: list[str],
                          outputs: list[str]) -> None:
        """Turn the per-instance values an opaque Loop/Scan body reads from outside into state
        the body passes through unchanged: ``Graph.union`` renames per-instance values, which it
        cannot do inside a subgraph (shared weights keep their names and may stay captured)."""
        probe = Node(-1, op_type, "", 0, attributes, [], [], None, "")
        captured = sorted(n for n in captured_names(probe)
                          if n in self.out.values and not self.out.values[n].is_shared)
        if not captured:
            return
        body = GraphProto()
        body.CopyFrom(attributes["body"].g)
        if op_type == "Loop":  # (M, cond, state...) -> (state..., scans...); body (i, cond, state...)
            state = len(inputs) - 2
            at_input, at_body_input, at_body_output, at_output = len(inputs), len(body.input), 1 + state, state
        else:  # (state..., scan inputs...) -> (state..., scans...); body (state..., slices...)
            state = len(inputs) - attribute_value(attributes["num_scan_inputs"])
            at_input, at_body_input, at_body_output, at_output = state, state, state, state
        for k, name in enumerate(captured):
            passed = f"{name}/passed"
            vtype = self.out.values[name].type
            info = (helper.make_value_info(name, vtype.proto) if vtype is not None
                    else helper.make_empty_tensor_value_info(name))
            inputs.insert(at_input + k, name)
            body.input.insert(at_body_input + k, info)
            body.node.append(helper.make_node("Identity", [name], [passed]))
            body.output.insert(at_body_output + k, helper.make_empty_tensor_value_info(passed))
            outputs.insert(at_output + k, self.fresh(passed))
        attributes["body"] = helper.make_attribute("body", body)

    def inline(self, body: GraphProto, scope: Scope, tag: str) -> list[str]:
        """Emit a body whose inputs ``scope`` already binds; returns its outputs' names."""
        for tensor in body.initializer:
            scope[tensor.name] = self.constant(numpy_helper.to_array(tensor), tensor.name)
        for node in body.node:
            self.emit(node, scope, tag)
        return [scope.get(o.name, o.name) for o in body.output]

    def add(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str],
            attributes: Mapping[str, Any] | None = None, domain: str = "", name: str = "") -> list[str]:
        if len(self.out.nodes) >= self.budget:
            where = " inside ".join(reversed(self.unrolling)) or f"graph {self.source.name!r}"
            raise WorkLimit(f"unrolling {where} exceeds max_unrolled_nodes={self.budget}")
        check_deadline()
        if name:  # onnxruntime refuses a model with two nodes of the same name
            name = self.fresh(name, self.node_names)
        self.out.add_node(op_type, inputs, outputs, attributes, domain=domain, name=name)
        return list(outputs)

    def op(self, op_type: str, inputs: Sequence[str], tag: str, attributes: Mapping[str, Any] | None = None,
           output: str | None = None) -> str:
        """Add a one-output helper node (a slice, a stack) and return its output's name."""
        output = output or self.fresh(f"{op_type.lower()}/{tag}")
        return self.add(op_type, inputs, [output], attributes, name=_suffixed(op_type, tag))[0]

    def define(self, name: str, scope: Scope, tag: str) -> str:
        """The name of a value an emitted node defines: its own at top level, else a fresh one."""
        if not tag:
            return name
        scope[name] = self.fresh(f"{name}/{tag}")
        return scope[name]

    def fresh(self, base: str, taken: set[str] | None = None) -> str:
        """``base``, or ``base~k`` if a value (or a name in ``taken``) already has it."""
        taken = self.taken if taken is None else taken
        name, k = base, 0
        while name in taken or (taken is self.taken and name in self.out.values):
            k += 1
            name = f"{base}~{k}"
        taken.add(name)
        return name

    def constant(self, array: np.ndarray, hint: str) -> str:
        """A shared value named by its contents: every iteration and every instance reading the
        same constant reads the same name (so ``Graph.union`` keeps it one value)."""
        array = np.asarray(array)
        digest = hashlib.sha1(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()[:10]
        name = f"{hint.split('/')[0]}#{digest}"
        if name not in self.out.values:
            self.out.add_initializer(name, array)
        return name

    # ----------------------------------------------------------------- control flow
    def unroll_if(self, node: NodeProto, inputs: list[str], scope: Scope, tag: str) -> bool:
        cond = self.evaluate(inputs[0])
        if cond is None:
            return False
        branch = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
        body = next(a.g for a in node.attribute if a.name == branch)
        results = self.inline(body, scope.new_child(), _suffixed(f"{_label(node)}.{branch[:4]}", tag))
        scope.update((name, result) for name, result in zip(node.output, results) if name)
        return True

    def unroll_loop(self, node: NodeProto, inputs: list[str], scope: Scope, tag: str) -> bool:
        inputs = inputs + [""] * (2 - len(inputs))
        trip = self.evaluate(inputs[0]) if inputs[0] else None
        cond = self.evaluate(inputs[1]) if inputs[1] else np.array(True)
        if (inputs[0] and trip is None) or cond is None or (trip is None and not inputs[1]):
            return False  # undecidable here, or a loop without end: stays opaque
        limit = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
        body = next(a.g for a in node.attribute if a.name == "body")
        carried = inputs[2:]
        scans: list[list[str]] = [[] for _ in body.output[1 + len(carried):]]
        if scans and (limit == 0 or not bool(cond)):
            return False  # zero iterations: the empty scan outputs' shapes are not known here
        cond_name = inputs[1] or self.constant(np.array(True), "true")
        i = 0
        while (limit is None or i < limit) and bool(cond):
            if i >= self.budget:
                raise WorkLimit(f"unrolling {' inside '.join(reversed(self.unrolling))} exceeds "
                                f"max_unrolled_nodes={self.budget} iterations")
            inner = scope.new_child()
            inner[body.input[0].name] = self.constant(np.array(i, np.int64), "iter")
            inner[body.input[1].name] = cond_name
            inner.update(zip((v.name for v in body.input[2:]), carried))
            results = self.inline(body, inner, _suffixed(f"{_label(node)}.{i}", tag))
            cond_name, carried = results[0], results[1:1 + len(carried)]
            for parts, name in zip(scans, results[1 + len(carried):]):
                parts.append(name)
            if inputs[1]:  # the body decides whether to go on, maybe from data: evaluate it
                cond = self.evaluate(cond_name)
                if cond is None:
                    raise UnrollError(f"{self.unrolling[-1]}: cannot evaluate its condition at iteration {i}")
            i += 1
        scope.update((name, value) for name, value in zip(node.output, carried) if name)
        for name, parts in zip(node.output[len(carried):], scans):
            if name:
                self.stack(parts, 0, name, scope, tag)
        return True

    def unroll_scan(self, node: NodeProto, inputs: list[str], scope: Scope, tag: str) -> bool:
        if self.out.opset_imports.get("", 1) < 9:
            return False  # Scan-8 has a batch axis and sequence lengths: left opaque
        attrs = {a.name: attribute_value(a) for a in node.attribute}
        body: GraphProto = attrs["body"]
        n_scan = attrs["num_scan_inputs"]
        n_state = len(inputs) - n_scan
        n_out = len(body.output) - n_state
        in_axes = attrs.get("scan_input_axes") or [0] * n_scan
        in_reverse = attrs.get("scan_input_directions") or [0] * n_scan
        out_axes = attrs.get("scan_output_axes") or [0] * n_out
        out_reverse = attrs.get("scan_output_directions") or [0] * n_out
        shape = self.shape_of(inputs[n_state])
        if shape is None:
            return False
        length = shape[in_axes[0] % len(shape)]
        if length == 0 and n_out:
            return False
        states, scans = inputs[:n_state], [[] for _ in range(n_out)]
        for t in range(length):
            step = _suffixed(f"{_label(node)}.{t}", tag)
            inner = scope.new_child()
            inner.update(zip((v.name for v in body.input[:n_state]), states))
            for j, name in enumerate(inputs[n_state:]):
                index = self.constant(np.array(length - 1 - t if in_reverse[j] else t, np.int64), "iter")
                inner[body.input[n_state + j].name] = self.op("Gather", [name, index], step, {"axis": in_axes[j]})
            results = self.inline(body, inner, step)
            states = results[:n_state]
            for parts, name in zip(scans, results[n_state:]):
                parts.append(name)
        scope.update((name, value) for name, value in zip(node.output, states) if name)
        for k, name in enumerate(node.output[n_state:]):
            if name:
                self.stack(scans[k][::-1] if out_reverse[k] else scans[k], out_axes[k], name, scope, tag)
        return True

    def stack(self, parts: list[str], axis: int, name: str, scope: Scope, tag: str) -> None:
        """Per-iteration values stacked along a new ``axis`` into the value ``name``."""
        step = _suffixed(name, tag)
        if self.out.opset_imports.get("", 1) >= 13:
            axes = self.constant(np.array([axis], np.int64), "axes")
            unsqueezed = [self.op("Unsqueeze", [part, axes], step) for part in parts]
        else:
            unsqueezed = [self.op("Unsqueeze", [part], step, {"axes": [axis]}) for part in parts]
        # An Identity names the result, so top-level outputs keep their names.
        source = unsqueezed[0] if len(unsqueezed) == 1 else self.op("Concat", unsqueezed, step, {"axis": axis})
        self.op("Identity", [source], step, output=self.define(name, scope, tag))

    # ----------------------------------------------------------------- evaluation
    def shape_of(self, name: str) -> tuple[int, ...] | None:
        vtype = self.out.values[name].type
        if vtype is not None and vtype.is_static:
            return vtype.shape  # type: ignore[return-value]
        value = self.evaluate(name)
        return None if value is None else np.shape(value)

    def evaluate(self, name: str) -> np.ndarray | None:
        """The value ``name`` takes for this instance, computed with the NumPy interpreter on
        the nodes it depends on that were not evaluated yet; None if that fails."""
        if name in self.known:
            return self.known[name]
        value = self.out.values.get(name)
        if value is None:
            return None
        if value.is_shared:
            return value.const
        node = self.out.producer(name)[0]  # type: ignore[index]
        if node.op_type == "Identity" and not node.domain:  # a loop condition passed on: no run
            return self.evaluate(node.inputs[0])
        needed = self._unevaluated_ancestors(name)
        sub = self.out.subgraph(needed, name="evaluate")
        sub.outputs = [o for i in sorted(needed) for o in self.out.nodes[i].outputs if o]  # memoize all
        results = self.run_graph(sub, {n: self.known[n] for n in sub.inputs})
        if results is None:
            return None
        self.known.update(zip(sub.outputs, results))
        return self.known[name]

    def _unevaluated_ancestors(self, name: str) -> set[int]:
        needed: set[int] = set()
        pending = [name]
        while pending:
            found = self.out.producer(pending.pop())
            if found is None or found[0].id in needed:
                continue
            node = found[0]
            needed.add(node.id)
            reads = [n for n in node.inputs if n] + [n for n in captured_names(node) if n in self.out.values]
            pending.extend(n for n in reads if n not in self.known)
        return needed


# --------------------------------------------------------------------- helpers
def _node_proto(node: Node) -> NodeProto:
    proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name or None,
                             domain=node.domain or None)
    proto.attribute.extend(node.attributes.values())
    return proto


def _label(node: NodeProto) -> str:
    return node.name or f"{node.op_type}:{node.output[0]}"


def _suffixed(name: str, tag: str) -> str:
    return f"{name}/{tag}" if tag else name


_SCALAR_CONSTANTS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                     "value_ints": np.int64}


def _constant_value(node: NodeProto) -> np.ndarray | None:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        return np.asarray(attribute_value(attr))
    dtype = _SCALAR_CONSTANTS.get(attr.name)
    return None if dtype is None else np.array(attribute_value(attr), dtype=dtype)


def _rename_captures(attributes: dict[str, AttributeProto], scope: Scope) -> dict[str, AttributeProto]:
    """Subgraph attributes that read outer values under their names in the unrolled graph."""
    probe = Node(-1, "", "", 0, attributes, [], [], None, "")
    mapping = {n: scope[n] for n in captured_names(probe) if scope.get(n, n) != n}
    if not mapping:
        return dict(attributes)
    renamed = {}
    for name, attr in attributes.items():
        copy = AttributeProto()
        copy.CopyFrom(attr)
        for graph in ([copy.g] if copy.type == AttributeProto.GRAPH else list(copy.graphs)):
            _rename_free(graph, mapping)
        renamed[name] = copy
    return renamed


def _rename_free(graph: GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename, in place, the values ``graph`` reads from outside itself."""
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    local |= {o for node in graph.node for o in node.output}
    outer = {k: v for k, v in mapping.items() if k not in local}
    for node in graph.node:
        node.input[:] = [outer.get(n, n) for n in node.input]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)):
                _rename_free(sub, outer)
    for output in graph.output:
        output.name = outer.get(output.name, output.name)
