"""Ops whose every run may differ. They are never batched with one another, nor merged as
repeats of one call: each call draws anew."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from onnx import FunctionProto

NONDETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
})
# The ONNX ops of the default domain that ``is_nondeterministic`` may say yes to (a cheap first test).
MAYBE_NONDETERMINISTIC = NONDETERMINISTIC | {"Dropout"}


def is_nondeterministic(op_type: str, domain: str, functions: Mapping[tuple[str, str], FunctionProto],
                        inputs: Sequence[str] = ()) -> bool:
    """Whether every run of the op may differ: a random op, a Dropout given a training_mode
    input (which may say to drop), or a function calling one of them. Even with a seed, a
    random op's draws depend on the shape it draws for: batched, it would draw other numbers."""
    if not domain:
        return op_type in NONDETERMINISTIC or op_type == "Dropout" and len(inputs) > 2 and bool(inputs[2])
    function = functions.get((domain, op_type))
    return function is not None and any(is_nondeterministic(n.op_type, n.domain, functions, n.input)
                                        for n in function.node)
