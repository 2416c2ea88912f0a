"""A flat plan run as one onnxruntime session: the plan lowered to one ONNX graph
(``backends.lowering``), for a mix of input shapes seen again and again.

The flat executor calls onnxruntime once a step, from Python; one session over the whole plan
makes one call, and onnxruntime plans its memory and threads across every step. Its weights are
initializers (onnxruntime packs them once, as the executor's baked templates do), so each such
session holds its own copy: sessions keep only the most recent mixes (``WHOLE_PLANS_KEPT``).
Measured on an ONNX BiLSTM tagger of one sentence over 64 WikiNER sentences
(``python -m benchmarks.onnx_tagger``): see benchmarks/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from autobatch.backends.flat_executor import runs_on_onnxruntime
from autobatch.backends.ort_runtime import OrtSettings, new_session, run_session
from autobatch.batcher.plan import FlatPlan, Template
from autobatch.batcher.sequences import RECURRENT

WHOLE_PLANS_KEPT = 4  # sessions of whole plans a model keeps, each with its own copy of the weights


def whole_plan_refusal(plan: FlatPlan) -> str | None:
    """Why this plan cannot run as one onnxruntime session, or None."""
    for step in plan.steps:
        templates: list[Template] = [level.template for level in step.fold] if step.fold else \
            [step.template] if step.template is not None else []
        for template in templates:
            if not runs_on_onnxruntime(template):
                return f"{template.graph.name} runs on the NumPy interpreter"
            if template.solo and any(node.op_type in RECURRENT and not node.domain for node in template.graph.nodes.values()):
                # one member's layer may get no steps, where onnxruntime aborts the process
                return f"{template.graph.name} is a recurrent layer run alone"
    return None


class WholePlan:
    """One session of a lowered plan; ``run(feeds)`` gives its outputs in order. Every value
    between its steps stays where the session runs (on CUDA, on the device). With ``bind``, a
    run whose feeds are all numeric arrays binds them and its outputs (onnxruntime's IOBinding:
    the feeds go to the session's device once and the outputs come back once); other feeds
    (strings, sequences) go through ``session.run``, which IOBinding does not take."""

    def __init__(self, model: onnx.ModelProto, settings: OrtSettings, bind: bool = False) -> None:
        self.session = new_session(model, settings.options, settings.providers)
        self.inputs = [value.name for value in self.session.get_inputs()]
        self.outputs = [value.name for value in self.session.get_outputs()]
        self.device = "cuda" if settings.on_cuda else "cpu"
        self.bind = bind

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        mine = {name: feeds[name] for name in self.inputs}
        return run_session(self._bound if self.binds(mine) else self.session.run, self.outputs, mine)

    def binds(self, feeds: Mapping[str, Any]) -> bool:
        """Whether a run of these feeds binds them (``bind``, and every feed a numeric array)."""
        return self.bind and all(isinstance(value, np.ndarray) and value.dtype.kind in "biufc"
                                 for value in feeds.values())

    def _bound(self, outputs: list[str], feeds: Mapping[str, np.ndarray], options: Any = None) -> list[np.ndarray]:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.asarray(value, order="C"))  # (np.ascontiguousarray makes a scalar a vector)
        for name in outputs:
            binding.bind_output(name, self.device)
        self.session.run_with_iobinding(binding, options)
        return binding.copy_outputs_to_cpu()
