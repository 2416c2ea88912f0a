"""The test oracle of the correctness contract: a batched result equals the instance run alone.

Exact for integers, booleans and strings; float32 within rtol 1e-5, atol 1e-6 unless a caller
states a looser tolerance (and why); the same dtype and shape always. Sequences compare element
by element, optionals by presence and then value; ml_dtypes values (bfloat16, float8, ...) as
float64, exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

RTOL, ATOL = 1e-5, 1e-6


def assert_same(batched: Any, alone: Any, rtol: float = RTOL, atol: float = ATOL, what: str = "") -> None:
    if isinstance(alone, list) or isinstance(batched, list):
        assert isinstance(batched, list) and isinstance(alone, list), f"{what}: {type(batched)} batched, {type(alone)} alone"
        assert len(batched) == len(alone), f"{what}: a sequence of {len(batched)} batched, {len(alone)} alone"
        for k, (b, a) in enumerate(zip(batched, alone)):
            assert_same(b, a, rtol, atol, f"{what}[{k}]")
        return
    if alone is None or batched is None:
        assert alone is None and batched is None, f"{what}: {batched!r} batched, {alone!r} alone"
        return
    batched, alone = np.asarray(batched), np.asarray(alone)
    assert batched.dtype == alone.dtype, f"{what}: dtype {batched.dtype} batched, {alone.dtype} alone"
    assert batched.shape == alone.shape, f"{what}: shape {batched.shape} batched, {alone.shape} alone"
    if alone.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4, ...): compare the values as float64
        np.testing.assert_array_equal(batched.astype(np.float64), alone.astype(np.float64), err_msg=what)
    elif alone.dtype.kind in "fc":
        np.testing.assert_allclose(batched, alone, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(batched, alone, err_msg=what)


def assert_batched_equals_alone(session: Any, feeds_list: Sequence[Mapping[str, Any]], rtol: float = RTOL,
                                atol: float = ATOL, what: str = "") -> list[list[Any]]:
    """``session.run_batch`` over the instances equals ``session.run`` on each; the batched results."""
    batched = session.run_batch(None, feeds_list)
    assert len(batched) == len(feeds_list)
    stats = getattr(session, "stats", None)  # a batch run alone by choice (``autobatch.ways``) tests nothing
    assert stats is None or not getattr(stats, "alone", 0), f"{what}: the batch ran each instance alone: {stats}"
    for k, (feeds, outputs) in enumerate(zip(feeds_list, batched)):
        alone = session.run(None, feeds)
        assert len(outputs) == len(alone), f"{what} instance {k}: {len(outputs)} outputs batched, {len(alone)} alone"
        for j, (b, a) in enumerate(zip(outputs, alone)):
            assert_same(b, a, rtol, atol, f"{what} instance {k} output {j}")
    return batched


def traced_alone(fn: Any, instance: Any) -> Any:
    """``fn(tracer, instance)`` (a tensor or a list of them) traced for this instance alone,
    each run of its pending records an IR graph run by the NumPy interpreter, unbatched: what a
    batch must equal, apart from the planner that batches it."""
    from autobatch.backends import Interpreter
    from autobatch.frontends.tracing import Tracer

    class Unbatched(Tracer):
        def _execute(self, wanted: list) -> list:
            return Interpreter(self.graph_of(wanted)).run({}, [t.name for t in wanted])

    with Unbatched() as tracer:
        out = fn(tracer, instance)
        tensors = list(out) if isinstance(out, (list, tuple)) else [out]
        values = tracer.run(tensors)
    return values if isinstance(out, (list, tuple)) else values[0]
