"""A batching rule's view of an IR node: the graph it writes its batched ops to
(``GraphEmitter``; a template's, ``batcher.templates``), the node's operands, and why a rule
refuses the node's signature class (``refusal``: what ``autobatch inspect`` and the schedulers'
problem are told)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from autobatch.batcher.functions import rule_for
from autobatch.batcher.rule_tables import Operand, Refusal, Shape
from autobatch.batcher.signature import is_shared, sum_of_terms
from autobatch.ir import Graph, Node, is_nondeterministic

# Stacking reshapes values by a shape *input*, which Reshape takes from opset 5 on.
MIN_STACKING_OPSET = 5
RANDOM = "draws random numbers anew each run"
EMPTY = "values without elements are not stacked"


@functools.lru_cache(maxsize=None)
def in_opset(op_type: str, opset: int) -> bool:
    """Whether the standard domain's ``opset`` has the op (some version of it at or below)."""
    try:
        onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True


class OpsetWatch:
    """Notes the first op a rule emits that its graph's opset lacks (a rule written for recent
    opsets, over an old model's node): the rule's result is then refused (``checked``)."""

    opset = onnx.defs.onnx_opset_version()
    missing: str | None = None

    def watch(self, op_type: str) -> None:
        if self.missing is None and not in_opset(op_type, self.opset):
            self.missing = op_type

    def checked(self, result: Any) -> Any:
        """The rule's result, or its refusal where it emitted an op the opset lacks."""
        return result if self.missing is None else \
            Refusal(f"its batched form needs {self.missing}, which opset {self.opset} lacks")


class GraphEmitter(OpsetWatch):
    """Adds fresh-named constants and ops to the batched graph."""

    def __init__(self, out: Graph) -> None:
        self.out = out
        self.count = 0
        self.batch_size = 0  # set for each group
        self.opset = out.opset_imports.get("", 1)

    def _fresh(self, kind: str) -> str:
        while True:
            self.count += 1
            name = f"autobatch/{kind}{self.count}"
            if name not in self.out.values:
                return name

    def const(self, array: np.ndarray) -> str:
        name = self._fresh("c")
        self.out.add_initializer(name, np.asarray(array))
        return name

    def op(self, op_type: str, inputs: Sequence[str], attributes: dict[str, Any] | None = None,
           n_outputs: int = 1, name: str = "", domain: str = "") -> list[str]:
        if not domain:
            self.watch(op_type)
        outputs = [self._fresh("v") for _ in range(n_outputs)]
        self.out.add_node(op_type, list(inputs), outputs, attributes, domain=domain, name=self.node_name(name))
        return outputs

    def node_name(self, prefix: str) -> str:
        """Node names must be unique in ONNX (onnxruntime refuses repeats)."""
        if not prefix:
            return ""
        self.count += 1
        return f"{prefix}/{self.count}"


class DryEmitter(OpsetWatch):
    """Stands in for GraphEmitter while deciding, once per signature class, whether a rule
    batches that class. Records nothing but an op its opset lacks."""

    batch_size = 2

    def __init__(self, opset: int) -> None:
        self.opset = opset

    def const(self, array: np.ndarray) -> str:
        return "dry"

    def op(self, op_type: str, inputs: Sequence[str], attributes: dict[str, Any] | None = None,
           n_outputs: int = 1, domain: str = "") -> list[str]:
        if not domain:
            self.watch(op_type)
        return ["dry"] * n_outputs


def operands(graph: Graph, node: Node, stacked_names: Sequence[str] | None = None) -> list[Operand | None]:
    """The representative's inputs as operands; ``stacked_names`` gives the batched value of
    each per-instance input (its own name while dry-running)."""
    result: list[Operand | None] = []
    for index, name in enumerate(node.inputs):
        if not name:
            result.append(None)
            continue
        value = graph.values[name]
        shape = tuple(value.type.shape) if value.type is not None and value.type.shape is not None else ()
        if is_shared(graph, name):
            result.append(Operand(name, False, shape, value.const))
        else:
            result.append(Operand(stacked_names[index] if stacked_names else name, True, shape))
    return result


def output_shapes(graph: Graph, node: Node) -> list[Shape]:
    return [tuple(graph.values[o].type.shape) if o else () for o in node.outputs]


def has_rule(graph: Graph, node: Node) -> bool:
    """Whether the op's rule batches this node's signature class (decided on a dry run)."""
    return refusal(graph, node) is None


def refusal(graph: Graph, node: Node) -> str | None:
    """Why this node's signature class runs one member at a time (None: its rule batches it)."""
    if is_nondeterministic(node.op_type, node.domain, graph.functions, node.inputs):
        return RANDOM
    if sum_of_terms(graph, node):
        return None
    if not all(_is_tensor(graph, name) for name in [*node.inputs, *node.outputs] if name):
        return "sequences and optionals are not stacked"  # they are Python lists and None
    ins = operands(graph, node)
    if not any(o is not None and o.stacked for o in ins):
        return None  # identical inputs: one run serves every member
    rule = rule_for(node, graph.functions)
    if rule is None:
        return f"no batching rule for {node.qualified_op}"
    if graph.opset_imports.get("", 1) < MIN_STACKING_OPSET:
        return f"opset {graph.opset_imports.get('', 1)} has no Reshape by a shape input"
    outs = output_shapes(graph, node)
    if any(0 in o.shape for o in ins if o is not None and o.stacked) or any(0 in shape for shape in outs):
        return EMPTY  # a 0 in a Reshape's shape copies a dimension
    dry = DryEmitter(graph.opset_imports.get("", 1))
    result = dry.checked(rule(dry, node, ins, outs))
    return result.reason if isinstance(result, Refusal) else None


def _is_tensor(graph: Graph, name: str) -> bool:
    vtype = graph.values[name].type
    return vtype is None or vtype.is_tensor
