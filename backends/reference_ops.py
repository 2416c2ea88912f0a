"""Fallback: run one node with the op classes of ``onnx.reference``, created once per node."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator, op_run
from onnx.reference.ops import load_op

from autobatch.ir import Graph, Node

OpImpl = Callable[[list[Any], dict[str, Any]], list[Any]]


def node_proto(node: Node) -> onnx.NodeProto:
    proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name or None,
                             domain=node.domain or None)
    proto.attribute.extend(node.attributes.values())
    return proto


def _callees_first(functions: dict[tuple[str, str], onnx.FunctionProto]) -> list[tuple[str, str]]:
    """The functions' keys, each after the functions it calls (the model may list a caller
    first); a cycle's members in the model's order (their evaluator then says what it lacks)."""
    order: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for root in functions:  # depth first, without recursion: a chain of calls may be deep
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(functions[root].node))]
        while stack:
            key, nodes = stack[-1]
            callee = next(((n.domain, n.op_type) for n in nodes if (n.domain, n.op_type) in functions
                           and (n.domain, n.op_type) not in seen), None)
            if callee is None:
                stack.pop()
                order.append(key)
            else:
                seen.add(callee)
                stack.append((callee, iter(functions[callee].node)))
    return order


class ReferenceOps:
    """Creates ``onnx.reference`` implementations for the nodes of one graph."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        functions: dict[tuple[str, str], ReferenceEvaluator] = {}
        for key in _callees_first(graph.functions):  # an evaluator knows the functions it calls when made
            functions[key] = ReferenceEvaluator(graph.functions[key], functions=list(functions.values()))
        self.functions = functions
        self.run_params = {
            "log": lambda *args: None,
            "opsets": graph.opset_imports,
            "verbose": 0,
            "new_ops": {},
            "existing_functions": dict(functions),
            "evaluator_cls": ReferenceEvaluator,
        }

    def implementation(self, node: Node) -> OpImpl:
        proto = node_proto(node)
        op = self._op_class(node, proto)(proto, self.run_params)
        needs_context = op.need_context()

        def run(inputs: list[Any], context: dict[str, Any]) -> list[Any]:
            outputs = op.run(*inputs, context=context) if needs_context else op.run(*inputs)
            return list(outputs)

        return run

    def _op_class(self, node: Node, proto: onnx.NodeProto) -> type:
        key = (node.domain, node.op_type)
        if key in self.functions:
            return load_op(node.domain, node.op_type, node.version, custom=self.functions[key])
        if node.domain == "":
            try:
                return load_op("", node.op_type, node.version, evaluator_cls=ReferenceEvaluator)
            except op_run.RuntimeContextError:
                # Ops defined by a context-dependent function need their input types.
                types = [self._type_proto(name) for name in node.inputs]
                return load_op("", node.op_type, node.version, node=proto, input_types=types,
                               evaluator_cls=ReferenceEvaluator)
        loaders = {
            "ai.onnx.ml": "onnx.reference.ops.aionnxml",
            "ai.onnx.preview": "onnx.reference.ops.aionnx_preview",
            "ai.onnx.preview.training": "onnx.reference.ops.aionnx_preview_training",
            "experimental": "onnx.reference.ops.experimental",
        }
        if node.domain not in loaders:
            raise NotImplementedError(f"{node}: no implementation for domain {node.domain!r}")
        return importlib.import_module(loaders[node.domain]).load_op(node.domain, node.op_type, node.version)

    def _type_proto(self, name: str) -> onnx.TypeProto | None:
        value = self.graph.values.get(name)
        if value is None or value.type is None:
            return None
        return value.type.proto

