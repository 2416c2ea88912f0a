"""The NumPy reference interpreter, in the style of torch.fx's ``Interpreter``.

``run()`` walks the nodes in topological order and calls the overridable ``run_node`` for each;
every value is freed right after its last use; an error names the failing node, its op and the
shapes of its inputs. Hot ops run on the hand-written kernels of ``backends.kernels``; every
other op runs on ``onnx.reference``, its op object created once per node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from autobatch.backends import control_flow, kernels
from autobatch.backends.reference_ops import ReferenceOps
from autobatch.ir import Graph, Node, accepts, captured_names
from autobatch.ir.limits import DeadlineExceeded, WorkLimit, check_deadline
from autobatch.ir.nodes import schema_version

# (inputs, environment for subgraph captures) -> outputs
NodeImpl = Callable[[list[Any], dict[str, Any]], list[Any]]


class NodeExecutionError(RuntimeError):
    """A node failed while running; the message names the node, its op and input shapes."""


class FeedError(ValueError):
    """The inputs handed to ``run`` do not match the graph's declared inputs."""


class Interpreter:
    """Runs one IR graph with NumPy. Preparation (kernel choice, op objects, liveness) is done
    once in ``__init__``; ``run`` may be called many times."""

    def __init__(self, graph: Graph) -> None:
        graph.validate()
        self.graph = graph
        self.order: list[Node] = graph.topological_order()
        reference = ReferenceOps(graph)
        self.impls: list[NodeImpl] = [self._implementation(node, reference) for node in self.order]
        self.constants = graph.initializers()
        self._free_after = self._liveness()

    # ----------------------------------------------------------------- preparation
    @staticmethod
    def _kernel(node: Node) -> kernels.registry.KernelFn | None:
        since = schema_version(node.op_type, node.version, node.domain)
        return None if since is None else kernels.lookup(node.domain, node.op_type, since)

    def _implementation(self, node: Node, reference: ReferenceOps) -> NodeImpl:
        if node.op_type in control_flow.CONTROL_FLOW and not node.domain:
            return control_flow.implementation(node, self.graph, Interpreter)
        kernel = self._kernel(node)
        if kernel is None:
            return reference.implementation(node)
        # Trailing outputs named "" are not wanted: kernels may skip computing them.
        wanted = max((i + 1 for i, name in enumerate(node.outputs) if name), default=0)
        ctx = kernels.NodeContext({name: node.attr(name) for name in node.attributes},
                                  wanted, node.op_type, node.name)

        def run(inputs: list[Any], _context: dict[str, Any]) -> list[Any]:
            result = kernel(ctx, *inputs)
            return list(result) if isinstance(result, tuple) else [result]

        return run

    def _liveness(self) -> list[list[str]]:
        """For each step, the values whose last reader it is (graph outputs are kept)."""
        last_reader: dict[str, int] = {}
        for step, node in enumerate(self.order):
            for name in node.inputs:
                if name:
                    last_reader[name] = step
            for name in captured_names(node):
                last_reader[name] = step
        keep = set(self.graph.outputs) | set(self.constants)
        free_after: list[list[str]] = [[] for _ in self.order]
        for name, step in last_reader.items():
            if name not in keep:
                free_after[step].append(name)
        return free_after

    # ----------------------------------------------------------------- execution
    def run(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> list[Any]:
        """Outputs (all graph outputs by default) for one set of feeds keyed by input name."""
        env = self._execute(self.check_feeds(feeds))
        given = {id(value) for value in self.constants.values()} | {id(value) for value in feeds.values()}
        wanted = self.graph.outputs if output_names is None else output_names
        missing = [name for name in wanted if name not in env]
        if missing:
            raise FeedError(f"unknown output(s) {missing}; the graph's outputs are {self.graph.outputs}")
        return [_owned(env[name], given) for name in wanted]

    def run_trusted(self, feeds: Mapping[str, Any]) -> list[Any]:
        """The graph outputs for feeds that our own planner made to fit: no checks, and the
        results may be views of the feeds (the caller copies them where they must live)."""
        env = self._execute(feeds)
        return [env[name] for name in self.graph.outputs]

    def _execute(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        env: dict[str, Any] = {"": None}
        env.update(self.constants)
        env.update(feeds)
        for node, impl, dead in zip(self.order, self.impls, self._free_after):
            check_deadline()
            inputs = [env[name] if name else None for name in node.inputs]
            outputs = self.run_node(node, impl, inputs, env)
            for name, value in zip(node.outputs, outputs):
                if name:
                    env[name] = value
            for name in dead:
                env.pop(name, None)
        return env

    def run_node(self, node: Node, impl: NodeImpl, inputs: list[Any], env: dict[str, Any]) -> list[Any]:
        """Run one node; override to observe or replace execution."""
        try:
            outputs = impl(inputs, env)
        except (DeadlineExceeded, WorkLimit):
            raise  # the caller's limits, not this node's failure
        except Exception as error:
            raise NodeExecutionError(
                f"{node} failed on inputs {describe(inputs)}: {type(error).__name__}: {error}"
            ) from error
        if len(outputs) < sum(1 for name in node.outputs if name):
            raise NodeExecutionError(f"{node} returned {len(outputs)} outputs, {len(node.outputs)} expected")
        return outputs

    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        return check_feeds(self.graph, feeds)


def check_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """The feeds, in graph-input order, once every name, dtype and shape fits the graph."""
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise FeedError(f"unknown input(s) {unknown}; the graph's inputs are {graph.inputs}")
    missing = [name for name in graph.inputs if name not in feeds]
    if missing:
        raise FeedError(f"missing input(s) {missing}")
    checked: dict[str, Any] = {}
    for name in graph.inputs:
        value, declared = feeds[name], graph.values[name].type
        if isinstance(value, (np.generic, int, float, bool)):  # a NumPy or Python scalar: a 0-d tensor
            value = np.asarray(value)
        elif isinstance(value, list):  # a sequence: of tensors, 0-d ones too
            value = [np.asarray(v) if isinstance(v, (np.generic, int, float, bool)) else v for v in value]
        if declared is not None and declared.is_tensor:
            if not isinstance(value, np.ndarray):
                raise FeedError(f"input {name!r}: a {type(value).__name__} where a tensor is declared")
            problem = accepts(declared, value)
            if problem:
                raise FeedError(f"input {name!r}: {problem}")
        checked[name] = value
    return checked


def _owned(value: Any, given: set[int]) -> Any:
    """Kernels may return views of their inputs (or the very input, for Identity); a result
    handed to the caller must not alias a weight or a feed that the caller could then change."""
    if isinstance(value, np.ndarray) and (id(value) in given or not (value.flags.owndata and value.flags.writeable)):
        return value.copy()
    return value


def describe(values: Sequence[Any], limit: int = 8) -> str:
    parts = []
    for value in values[:limit]:
        if value is None:
            parts.append("None")
        elif isinstance(value, np.ndarray):
            parts.append(f"{value.dtype}{list(value.shape)}")
        else:
            parts.append(type(value).__name__)
    if len(values) > limit:
        parts.append(f"... {len(values) - limit} more")
    return "(" + ", ".join(parts) + ")"


def evaluate(graph: Graph, feeds: dict[str, Any]) -> list[Any] | None:
    """The outputs of ``graph`` for ``feeds`` on the NumPy interpreter, or None where it cannot
    run them (what ``frontends.unroll_instance`` asks to decide control flow)."""
    try:
        return Interpreter(graph).run(feeds)
    except (NodeExecutionError, NotImplementedError):
        return None
