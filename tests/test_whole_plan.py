"""A plan run as one onnxruntime session (``backends.whole_plan``): its runs with feeds and
outputs bound (IOBinding) give what plain runs give, for feeds of every kind a plan reads."""

from __future__ import annotations

import numpy as np
import onnx

from autobatch.backends.ort_runtime import OrtSettings
from autobatch.backends.whole_plan import WholePlan

NUMERIC = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
    g (float s, bool[3] b, float[0, 2] z, float[3, 2] x, int64[2] i) => (float o, bool[3] n, float[0, 2] e,
                                                                         float[2, 3] t, int64[2] j) {
    o = Add(s, s)
    n = Not(b)
    e = Identity(z)
    t = Transpose(x)
    j = Neg(i) }""")
WITH_TEXT = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
    g (float s, string[2] w) => (float o, string[2] v) {
    o = Neg(s)
    v = Identity(w) }""")


def test_bound_runs_equal_plain_runs_for_scalars_bools_empty_and_strided_feeds():
    settings = OrtSettings(["CPUExecutionProvider"])
    feeds = {"s": np.array(1.5, np.float32),  # a scalar stays a scalar (np.ascontiguousarray would not keep it one)
             "b": np.array([True, False, True]), "z": np.zeros((0, 2), np.float32),
             "x": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],  # strided: not contiguous
             "i": np.array([3, -4], np.int64)}
    bound, plain = WholePlan(NUMERIC, settings, bind=True), WholePlan(NUMERIC, settings)
    assert bound.binds(feeds) and not plain.binds(feeds)
    got, want = bound.run(feeds), plain.run(feeds)
    assert [a.shape for a in got] == [(), (3,), (0, 2), (2, 3), (2,)]
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    np.testing.assert_array_equal(got[3], feeds["x"].T)


def test_feeds_that_iobinding_does_not_take_run_plainly():
    whole = WholePlan(WITH_TEXT, OrtSettings(["CPUExecutionProvider"]), bind=True)
    feeds = {"s": np.array(2.0, np.float32), "w": np.array(["a", "bc"], dtype=object)}
    assert not whole.binds(feeds)
    o, v = whole.run(feeds)
    assert o == -2.0 and list(v) == ["a", "bc"]
