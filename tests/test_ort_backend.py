"""onnxruntime: OrtBackend for plain models, the provider chosen, and one onnxruntime installed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autobatch.backends import FeedError, OrtBackend
from autobatch.backends.ort_runtime import CPU, default_providers
from tests.test_onnx_io import LIGHT_MODELS, ort_run, random_feeds


def test_provider_is_decided_once_and_runs_here():
    providers = default_providers()
    assert providers is default_providers()
    assert providers[-1] == CPU
    assert OrtBackend.supports_device("CPU")
    assert OrtBackend.supports_device("CUDA") == (providers[0] == "CUDAExecutionProvider")


@pytest.mark.parametrize("path", LIGHT_MODELS[:3], ids=lambda p: p.stem)
def test_plain_models_match_onnxruntime_on_the_original(path):
    original = onnx.load(path)
    feeds = random_feeds(original)
    expected = ort_run(original, feeds)
    got = OrtBackend.prepare(original).run(feeds)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)


def test_bad_feeds_are_named():
    model = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[2] x) => (float[2] y) { y = Relu(x) }
    """)
    rep = OrtBackend.prepare(model)
    with pytest.raises(FeedError, match="input 'x': dtype int64"):
        rep.run([np.array([1, 2])])
    assert rep.run([np.array([-1, 2], np.float32)])[0].tolist() == [0, 2]


def test_both_onnxruntime_packages_installed_is_named(monkeypatch):
    import importlib.metadata

    from autobatch.backends import ort_runtime

    versions = {"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions[name])
    with pytest.warns(RuntimeWarning, match="both onnxruntime 1.31.1 and onnxruntime-gpu 1.31.1 are installed"):
        ort_runtime.check_one_onnxruntime()
    del versions["onnxruntime"]

    def only_gpu(name):
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", only_gpu)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ort_runtime.check_one_onnxruntime()
