"""The ONNX backend node test cases, run with several instances at once.

For every node case whose op has a batching rule, K instances (float inputs perturbed by a
little seeded noise, other inputs as they are) go through ``InferenceSession.run_batch``, by
the flat path (where it applies) and by the general path, on both backends; each
instance's outputs must equal that instance run alone with ``InferenceSession.run`` (the
correctness contract: exact for integers and booleans, rtol 1e-5 / atol 1e-6 for floats unless
the case's own tolerance is looser). The counts are printed at the end of the module.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from autobatch import InferenceSession
from autobatch.batcher import RULES

K = 4
RTOL, ATOL = 1e-5, 1e-6


def _load_cases() -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [c for c in cases if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in RULES]


CASES = _load_cases()
SUMMARY = {"ran": 0, "skipped": 0, "batched_launches": 0, "instances_nodes": 0, "fallback_nodes": 0,
           "flat_asked": 0, "flat_taken": 0}


def _as_array(value):
    """A plain ndarray for a tensor input (stored cases hold TensorProtos), else None."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    return None


def _perturbed(inputs: list, k: int, rng: np.random.Generator) -> list:
    if k == 0:
        return list(inputs)
    result = []
    for array in inputs:
        if array.dtype.kind == "f" and array.dtype.itemsize >= 4 and array.size:
            noise = rng.standard_normal(array.shape) * 1e-2
            result.append((array + noise).astype(array.dtype))
        else:
            result.append(array)
    return result


def _assert_same(batched: np.ndarray, alone: np.ndarray, rtol: float, atol: float, what: str) -> None:
    batched, alone = np.asarray(batched), np.asarray(alone)
    assert batched.dtype == alone.dtype, f"{what}: dtype {batched.dtype} batched, {alone.dtype} alone"
    assert batched.shape == alone.shape, f"{what}: shape {batched.shape} batched, {alone.shape} alone"
    if alone.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4, ...): compare the values as float64
        batched, alone = batched.astype(np.float64), alone.astype(np.float64)
        np.testing.assert_array_equal(batched, alone, err_msg=what)
    elif alone.dtype.kind in "fc":
        np.testing.assert_allclose(batched, alone, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(batched, alone, err_msg=what)


def _round_trips(array: np.ndarray) -> bool:
    try:
        back = onnx.numpy_helper.to_array(onnx.numpy_helper.from_array(array))
    except Exception:  # noqa: BLE001
        return False
    return back.shape == array.shape and back.dtype == array.dtype


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


# Which inputs are shared by all instances: none; all but the first (weights, axes, shapes,
# indices, bounds); only the first (a shared table or left operand).
VARIANTS = ("per_instance", "rest_shared", "first_shared")
PARAMS = [
    pytest.param(case, variant, id=f"{case.name}-{variant}")
    for case in CASES
    for variant in VARIANTS
    if variant == "per_instance" or len(case.model.graph.input) > 1
]


@pytest.mark.parametrize("path", ["flat", "general"])
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize(("case", "variant"), PARAMS)
def test_batched_equals_alone(case, variant: str, backend: str, path: str) -> None:
    model = case.model
    initializers = {t.name for t in model.graph.initializer}
    input_names = [v.name for v in model.graph.input if v.name not in initializers]
    if not case.data_sets:
        SUMMARY["skipped"] += 1
        pytest.skip("no data set")
    inputs = [_as_array(value) for value in case.data_sets[0][0]]
    if any(a is None for a in inputs) or len(inputs) != len(input_names):
        SUMMARY["skipped"] += 1
        pytest.skip("inputs are not plain ndarrays (sequences, optionals)")
    if variant != "per_instance":
        chosen = input_names[1:] if variant == "rest_shared" else input_names[:1]
        shared = {name: a for name, a in zip(input_names, inputs) if name in chosen}
        if not all(_round_trips(a) for a in shared.values()):
            SUMMARY["skipped"] += 1
            pytest.skip("packed sub-byte (int4, float4...) initializers do not round-trip through from_array")
        model = _with_shared_inputs(model, shared)
        inputs = [a for name, a in zip(input_names, inputs) if name not in shared]
        input_names = [name for name in input_names if name not in shared]
    rtol, atol = max(RTOL, case.rtol), max(ATOL, case.atol)
    rng = np.random.default_rng(0)
    feeds_list = [dict(zip(input_names, _perturbed(inputs, k, rng))) for k in range(K)]
    alone = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            session = InferenceSession(model, backend=backend, flat=path == "flat")
            for feeds in feeds_list:
                alone.append(session.run(None, feeds))
        except Exception as error:  # noqa: BLE001 - the unbatched oracle itself cannot run this case
            SUMMARY["skipped"] += 1
            pytest.skip(f"run() raises: {type(error).__name__}: {error}"[:200])
        batched = session.run_batch(None, feeds_list)
    assert len(batched) == K
    for k in range(K):
        assert len(batched[k]) == len(alone[k])
        for j, (b, a) in enumerate(zip(batched[k], alone[k])):
            _assert_same(b, a, rtol, atol, f"{case.name} ({variant}) instance {k} output {j}")
    report = session.stats.report
    assert report.launches >= report.lower_bound
    SUMMARY["ran"] += 1
    SUMMARY["batched_launches"] += report.launches
    SUMMARY["instances_nodes"] += report.nodes
    SUMMARY["fallback_nodes"] += report.fallback_nodes
    if path == "flat":
        SUMMARY["flat_asked"] += 1
        SUMMARY["flat_taken"] += session.general_path_reason is None


@pytest.fixture(scope="module", autouse=True)
def _print_summary(request: pytest.FixtureRequest):
    yield
    ops = {c.model.graph.node[0].op_type for c in CASES}
    line = (
        f"batched node suite (K={K}): {len(RULES)} ops with native rules, {len(ops)} of them in the suite; "
        f"{len(CASES)} cases selected, {len(PARAMS)} runs with shared-input variants: {SUMMARY['ran']} ran, {SUMMARY['skipped']} skipped; "
        f"{SUMMARY['instances_nodes']} nodes in {SUMMARY['batched_launches']} launches, "
        f"{SUMMARY['fallback_nodes']} nodes ran one at a time; the flat path took {SUMMARY['flat_taken']} of the "
        f"{SUMMARY['flat_asked']} runs offered to it (the others: the general path)"
    )
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + line)
    else:
        print(line)
