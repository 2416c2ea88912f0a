"""Recurrent layers over no steps or no sequences, alone and batched, on onnxruntime, each equal to the NumPy backend; prints "ok". Run in a process of its own: onnxruntime aborts the
process on such layers where it is handed them."""

import numpy as np
import onnx

from autobatch import InferenceSession
from tests.oracle import assert_same

SHAPES = [(0, 1, 3), (2, 0, 3), (0, 0, 3), (3, 1, 3), (2, 2, 3)]  # [steps, sequences, features]

for op, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
    model = onnx.parser.parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[T, B, 3] x) => (float[T, 1, B, 2] y, float[1, B, 2] h) {{ y, h = {op}<hidden_size = 2>(x, W, R) }}""")
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(rng.standard_normal((1, gates * 2, 3)).astype(np.float32), "W"),
        onnx.numpy_helper.from_array(rng.standard_normal((1, gates * 2, 2)).astype(np.float32), "R")])
    feeds = [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in SHAPES]
    want = InferenceSession(model, backend="numpy")
    session = InferenceSession(model, backend="onnxruntime")
    for instance in feeds:
        for got, expected in zip(session.run(None, instance), want.run(None, instance)):
            assert_same(got, expected, what=f"{op} alone {instance['x'].shape}")
    for group in (feeds, feeds[:3], feeds[1:2]):
        for outputs, instance in zip(session.run_batch(None, group), group):
            for got, expected in zip(outputs, want.run(None, instance)):
                assert_same(got, expected, what=f"{op} batched {instance['x'].shape}")
print("ok")
