"""The ONNX backend node test cases, each run as several instances at once.

Every node case of the installed onnx (not only ops with a batching rule: an op without one
runs one instance at a time inside the plan, where it must read each instance's own values)
goes through ``InferenceSession.run_batch`` as K instances, float inputs perturbed by a little
seeded noise, on both backends, by the one plan. Each
instance's outputs must equal that instance run alone with ``InferenceSession.run``
(``tests.oracle``). A batch that raises fails, and so does a one-instance run that raises,
unless the case is excluded below with its reason: on onnxruntime those are onnxruntime's own
limits (its one-instance run is onnxruntime itself). The counts are printed at the end.
"""

from __future__ import annotations

import collections
import re
import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from autobatch import InferenceSession
from autobatch.batcher import RULES
from autobatch.ir import is_nondeterministic
from tests.oracle import ATOL, RTOL, assert_same

K = 4


def _load_cases() -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [case for case in load_model_tests(kind="node") if case.data_sets]


CASES = _load_cases()

# One-instance runs that raise, and why that is right. A reason applies where the pattern
# matches the case's name (NumPy) or onnxruntime's error message.
NUMPY_ALONE = {
    r"^test_upsample_nearest$": "the perturbed scales fall below 1, which Upsample's spec forbids (onnxruntime "
                                "refuses them too)",
}
ONNXRUNTIME_ALONE = {
    r"runs opsets up to": "newer than onnxruntime: the model's opset or IR version is one it does not load",
    r"Python API takes and gives no": "onnxruntime's Python API takes and gives no bfloat16, float8 or 4-bit arrays",
    r"NOT_IMPLEMENTED|kernel is not supported": "onnxruntime has no kernel for this op with these types",
    r"is not a registered function/op": "onnxruntime does not implement this preview or training op",
    r"INVALID_GRAPH|Type Error|ValidateOpsetForDomain": "onnxruntime's schema of the op is older than the model's",
    r"ScalesValidation|Batchwise recurrent operations|not defined for empty set|ComputeOutputShapeForAttention"
    r"|conv_integer|lower_edge_hertz|ratio must be in the range": "onnxruntime refuses these inputs (perturbed "
    "scales or ratios, layout=1, an empty bool max, ...)",
    r"Failed to construct locale": "onnxruntime's StringNormalizer needs the en_US.UTF-8 locale, which this "
    "machine does not have",
}
SUMMARY: collections.Counter = collections.Counter()


def _value(value):
    """A case's input as ``InferenceSession`` takes it: an array, a list (sequence) or None."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value if value is None else np.asarray(value)


def _perturbed(value, rng: np.random.Generator):
    if isinstance(value, list):
        return [_perturbed(v, rng) for v in value]
    if value is not None and value.dtype.kind == "f" and value.size:
        return np.asarray(value + rng.standard_normal(value.shape) * 1e-2, value.dtype)
    return value


def _random(model: onnx.ModelProto, backend: str) -> bool:
    """Some op draws random numbers anew on every run: batched or not, runs differ. So do
    seeded ones on onnxruntime, whose generator goes on from one run of a session to the next."""
    def nodes(graph):
        for node in graph.node:
            yield node
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from nodes(sub)
    functions = {(f.domain, f.name): f for f in model.functions}
    return any(is_nondeterministic(n.op_type, n.domain, functions, n.input)
               and (backend == "onnxruntime" or not any(a.name == "seed" for a in n.attribute))
               for n in nodes(model.graph))


def _with_shared_inputs(model: onnx.ModelProto, shared: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The model with these inputs turned into initializers: values every instance shares."""
    variant = onnx.ModelProto()
    variant.CopyFrom(model)
    variant.ir_version = max(variant.ir_version, 4)  # initializers need not be graph inputs from IR 4 on
    kept = [v for v in variant.graph.input if v.name not in shared]
    del variant.graph.input[:]
    variant.graph.input.extend(kept)
    variant.graph.initializer.extend(onnx.numpy_helper.from_array(a, name) for name, a in shared.items())
    return variant


def _round_trips(value) -> bool:
    if not isinstance(value, np.ndarray):
        return False  # sequences and optionals are no initializers
    try:
        back = onnx.numpy_helper.to_array(onnx.numpy_helper.from_array(value))
    except Exception:  # noqa: BLE001 - packed sub-byte types (int4, float4) do not round-trip
        return False
    return back.shape == value.shape and back.dtype == value.dtype


def _excused(backend: str, case, error: Exception, feeds_list: list[dict]) -> str | None:
    """Why a one-instance run may raise: a stated reason (NumPy), or onnxruntime's own limit,
    which onnxruntime shows by refusing the case's model itself, not only our export of it."""
    if backend == "numpy":
        return next((why for pattern, why in NUMPY_ALONE.items() if re.search(pattern, case.name)), None)
    why = next((why for pattern, why in ONNXRUNTIME_ALONE.items() if re.search(pattern, str(error))), None)
    return why if why is not None and _onnxruntime_refuses(case.model, feeds_list) else None


def _onnxruntime_refuses(model: onnx.ModelProto, feeds_list: list[dict]) -> bool:
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for feeds in feeds_list:
            session.run(None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime's own exception types
        return True
    return False


# Which inputs are shared by all instances: none; all but the first (weights, axes, shapes,
# indices, bounds); only the first (a shared table or left operand). The shared variants are
# run for ops with a batching rule, where sharing changes the batched form.
VARIANTS = ("per_instance", "rest_shared", "first_shared")


def _variants(case) -> list[str]:
    op = case.model.graph.node[0].op_type if len(case.model.graph.node) == 1 else None
    if op in RULES and len(case.model.graph.input) > 1:
        return list(VARIANTS)
    return ["per_instance"]


PARAMS = [pytest.param(case, variant, id=f"{case.name}-{variant}") for case in CASES for variant in _variants(case)]


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize(("case", "variant"), PARAMS)
def test_batched_equals_alone(case, variant: str, backend: str) -> None:
    if _random(case.model, backend):
        SUMMARY[f"excluded ({backend}): draws random numbers anew every run, so no two runs agree"] += 1
        pytest.skip("draws random numbers anew every run")
    model = case.model
    initializers = {t.name for t in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in initializers]
    inputs = [_value(v) for v in case.data_sets[0][0]]
    assert len(inputs) == len(names), f"{case.name}: {len(inputs)} inputs for {len(names)} graph inputs"
    if variant != "per_instance":
        chosen = names[1:] if variant == "rest_shared" else names[:1]
        shared = {name: a for name, a in zip(names, inputs) if name in chosen}
        if not all(_round_trips(a) for a in shared.values()):
            pytest.skip("these inputs cannot be initializers (sequences, packed sub-byte types)")
        model = _with_shared_inputs(model, shared)
        inputs = [a for name, a in zip(names, inputs) if name not in shared]
        names = [name for name in names if name not in shared]
    rtol, atol = max(RTOL, case.rtol), max(ATOL, case.atol)
    rng = np.random.default_rng(0)
    feeds_list = [dict(zip(names, inputs if k == 0 else [_perturbed(v, rng) for v in inputs])) for k in range(K)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            session = InferenceSession(model, backend=backend)
            alone = [session.run(None, feeds) for feeds in feeds_list]
        except Exception as error:  # noqa: BLE001 - sorted below: excused with its reason, or a failure
            why = _excused(backend, case, error, feeds_list)
            if why is None:
                raise
            SUMMARY[f"excluded ({backend}): {why}"] += 1
            pytest.skip(why)
        batched = session.run_batch(None, feeds_list)
    assert len(batched) == K
    for k in range(K):
        assert len(batched[k]) == len(alone[k])
        for j, (b, a) in enumerate(zip(batched[k], alone[k])):
            assert_same(b, a, rtol, atol, f"{case.name} ({variant}, {backend}) instance {k} output {j}")
    report = session.stats.report
    assert report.launches >= report.lower_bound
    SUMMARY["ran"] += 1
    SUMMARY["nodes"] += report.nodes
    SUMMARY["launches"] += report.launches
    SUMMARY["nodes run one at a time"] += report.fallback_nodes


@pytest.fixture(scope="module", autouse=True)
def _print_summary(request: pytest.FixtureRequest):
    yield
    counts = "; ".join(f"{key}: {count}" for key, count in sorted(SUMMARY.items()))
    line = f"batched node suite (K={K}, {len(CASES)} cases, {len(PARAMS)} runs a backend with shared-input variants): " \
           f"{counts}"
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + line)
    else:
        print(line)
