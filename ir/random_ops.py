"""Ops whose every run may differ. They are never batched with one another, nor merged as
repeats of one call: each call draws anew."""

from __future__ import annotations

from collections.abc import Mapping

from onnx import FunctionProto

NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
})


def is_nondeterministic(op_type: str, domain: str, functions: Mapping[tuple[str, str], FunctionProto]) -> bool:
    """Whether every run of the op may differ: a random op, or a function calling one."""
    if not domain:
        return op_type in NONDETERMINISTIC
    function = functions.get((domain, op_type))
    return function is not None and any(is_nondeterministic(n.op_type, n.domain, functions) for n in function.node)
