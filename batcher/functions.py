"""Batching rules for calls of model-local functions (cells): the body, vectorised.

Each body op is batched with its own rule, operands stacked where the body's values are per
instance and shared where they come only from shared inputs (the cell's parameters), so a
group of N calls becomes the body run once over N rows. A body op without a rule makes the
whole call unbatchable (the calls then run one by one, correctly), with that op's reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from onnx import FunctionProto

from autobatch.batcher.constants import constant_value
from autobatch.batcher.rule_tables import Emitter, Operand, Refusal, Shape, refuse
from autobatch.batcher.rules import RULES, Rule
from autobatch.ir import Node, ValueType

Functions = Mapping[tuple[str, str], FunctionProto]


def rule_for(node: Node, functions: Functions) -> Rule | None:
    """The batching rule of a node: a standard op's, or its function body's."""
    function = functions.get((node.domain, node.op_type))
    if function is not None:
        return FunctionRule(function, functions)
    return RULES.get(node.op_type) if not node.domain else None


class FunctionRule:
    """Vectorises one function's body; callable as a Rule."""

    def __init__(self, function: FunctionProto, functions: Functions) -> None:
        self.function = function
        self.functions = functions
        versions = {o.domain: o.version for o in function.opset_import}
        self.body = [
            Node(k, p.op_type, p.domain, versions.get(p.domain, 1), {a.name: a for a in p.attribute},
                 list(p.input), list(p.output), None, p.name)
            for k, p in enumerate(function.node)
        ]
        self.shapes: dict[str, Shape | None] = {info.name: ValueType(info.type).shape for info in function.value_info}

    def __call__(self, e: Emitter, node: Node, ins: list[Operand | None], outs: list[Shape]) -> list[str] | Refusal:
        env: dict[str, Operand | None] = dict(zip(self.function.input, ins))
        for body_node in self.body:
            results = self._batch(e, body_node, [env.get(n) if n else None for n in body_node.inputs])
            if isinstance(results, Refusal):
                return refuse(f"its {body_node.op_type}: {results.reason}")
            env.update(zip(body_node.outputs, results))
        final = [env.get(name) for name in self.function.output]
        if any(o is None or not o.stacked for o in final):
            return refuse("an output the same for every call (it would need broadcasting)")
        return [o.name for o in final]

    def _batch(self, e: Emitter, node: Node, operands: list[Operand | None]) -> list[Operand] | Refusal:
        shapes = [self.shapes.get(o) for o in node.outputs]
        if node.op_type == "Constant" and not node.domain:
            value = constant_value(node)
            return refuse("a sparse constant") if value is None else [Operand(e.const(value), False, value.shape, value)]
        if not any(o is not None and o.stacked for o in operands):  # only shared inputs: run once
            names = e.op(node.op_type, [o.name if o else "" for o in operands], node.attributes, len(node.outputs),
                         domain=node.domain)
            return [Operand(n, False, s or ()) for n, s in zip(names, shapes)]
        rule = rule_for(node, self.functions)
        if rule is None:
            return refuse(f"no batching rule for {node.qualified_op}")
        if any(s is None for s in shapes):
            return refuse("an output without a static shape")
        results = rule(e, node, operands, [tuple(s) for s in shapes])  # type: ignore[arg-type]
        if isinstance(results, Refusal):
            return results
        return [Operand(n, True, tuple(s)) for n, s in zip(results, shapes)]  # type: ignore[arg-type]

