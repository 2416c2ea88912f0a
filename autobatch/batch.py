"""``Batch``: a tracer (``frontends.tracing.Tracer``) whose pending records are planned by the
batcher and run on a backend, and ``run_programs``, lockstep programs run in one."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.helper import np_dtype_to_tensor_dtype

from autobatch.backends.arena_pool import ArenaPool
from autobatch.backends.baked_weights import WeightSnapshots
from autobatch.ir.graph_tidy import drop_unread
from autobatch.backends.lowering import lower_plan
from autobatch.backends.ort_runtime import UnsupportedByOnnxruntime
from autobatch.backends.whole_plan import WholePlan, whole_plan_refusal
from autobatch.batcher import BatchReport, get_scheduler
from autobatch.batcher.flat import plan_records
from autobatch.batcher.plan import KEYS_KEPT, FlatPlan, NotFlat, TemplateCache
from autobatch.batcher.rounds import RoundPlans
from autobatch.frontends.programs import run_in_lockstep
from autobatch.frontends.tensors import Tensor, TraceError
from autobatch.frontends.tracing import OPSET, Tracer
from autobatch.ir import Recent
from autobatch.executors import flat_executor, shared_ort_settings

log = logging.getLogger("autobatch")

# Templates of traced batches, shared by every ``Batch``: a batch lives for one minibatch, and
# the next one's classes are mostly the same.
TRACED_TEMPLATES = TemplateCache()
# ... and the weights their templates may bake: a weight one minibatch baked, the next reads baked.
TRACED_SNAPSHOTS = WeightSnapshots()
# The memory of traced plans' arenas, from one minibatch for the next (``backends.arena_pool``).
TRACED_ARENAS = ArenaPool()
# What plans learnt of record keys (``plan_records``' ``known``), by what the weight names in
# those keys denote (``Tracer.weights_binding``): the next minibatch of a model, or the next
# lockstep round, names the same weights and need not learn its keys again (the char tagger
# met 305 keys a minibatch, 3-4 ms of 48). Each entry holds weak references to the arrays it
# identifies, so a dead one's id taken by a new array is found out.
BINDINGS_KEPT = 8  # each keeps up to KEYS_KEPT keys: tens of MB at worst
_KNOWN_BY_BINDING: Recent = Recent(BINDINGS_KEPT)


class Batch(Tracer):
    """Traces many instances and runs them batched.

    >>> with Batch() as batch:
    ...     losses = [model(example) for example in examples]   # traced, not run
    ...     values = batch.run(losses)                           # batched and run once
    """

    def __init__(self, backend: str = "numpy", scheduler: str = "level", threads: int = 0,
                 providers: Sequence[str] | None = None, reuse_calls: bool = True,
                 whole_plan: bool = False, reuse_rounds: bool = True) -> None:
        """``backend``: "numpy" or "onnxruntime"; ``scheduler``: "depth", "agenda" or "level".
        ``threads``: onnxruntime's intra-op threads (0: its own choice); NumPy's BLAS takes its
        thread count from the environment (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``), as
        NumPy does everywhere. ``providers``: onnxruntime's execution providers (default: CUDA
        when it loads, else the CPU). ``whole_plan`` (onnxruntime): run each plan lowered to one
        session (``backends.whole_plan``: its values stay on the device between steps; its
        feeds and outputs bound, to the device once and back once), rather than step by step,
        each step's values going to the device and back. A traced plan is new in every
        minibatch, so its session is made every time: on the CPU that made a minibatch 5-240
        times slower than its steps (benchmarks/README.md); on CUDA ``benchmarks/gpu_check.sh``
        measures both. A plan that cannot (``whole_plan_refusal``, or onnxruntime refuses its
        session) runs step by step. ``reuse_calls``: see ``Tracer``. ``reuse_rounds``: a lockstep
        round (``run_programs``) like one planned before is made from that one's plan
        (``batcher.rounds``); False plans every round (``benchmarks.lockstep_rounds`` measures both)."""
        get_scheduler(scheduler)  # an unknown name fails here, not at the first run
        super().__init__(reuse_calls)
        self.backend = backend
        self.scheduler = scheduler
        self._executor = flat_executor(backend, threads, providers, snapshots=TRACED_SNAPSHOTS)
        self._ort_settings = shared_ort_settings(threads, providers) if backend == "onnxruntime" else None
        self.whole_plan = whole_plan and self._ort_settings is not None
        self.reports: list[BatchReport] = []  # one for every time the batch ran
        self.last_plan: FlatPlan | None = None  # the last run's
        self.reuse_rounds = reuse_rounds
        self._rounds = RoundPlans()  # lockstep rounds' plans (``run_programs``), a block's

    # A block names its parameters anew (``Tracer.__exit__``): after it, a name may denote
    # another weight than in the rounds learnt, which read it as the one they met.
    def __enter__(self) -> Batch:
        self._rounds.forget()
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, kind: type | None, *rest: Any) -> None:
        try:
            super().__exit__(kind, *rest)
        finally:
            self._rounds.forget()

    @property
    def reused_rounds(self) -> int:
        """Lockstep rounds made from an earlier round's plan (``reuse_rounds``), by this batch."""
        return self._rounds.reused

    def plan(self, wanted: Sequence[Tensor]) -> FlatPlan:
        """The plan that computing these pending tensors runs (its ``report`` says how it
        batches them); nothing runs, and the batch stays pending."""
        names, producers = [t.name for t in wanted], [t.producer for t in wanted]
        frozen = frozen_weights(self._weights)
        # (A template may hold a small weight by value: one changed in place since is read anew.)
        rounds = self._rounds if self.reuse_rounds and frozen else None
        again = rounds.again(self._records, names, self._literals, self.scheduler) if rounds else None
        if again is not None:
            return again
        try:
            known = self._known_keys() if frozen else None
            return plan_records(self._records, names, producers, self._weights,
                                self._literals, self.functions, self._opsets(), self.scheduler, known,
                                cache=TRACED_TEMPLATES, literals_fixed=True,  # a traced plan runs on its own data once
                                rounds=rounds)
        except NotFlat as why:
            raise TraceError(str(why)) from None

    def _known_keys(self) -> Recent:
        """What earlier plans learnt of keys that name this batch's weights as it does. A key
        names its weights, not their values: only while every weight is read-only
        (``frozen_weights``) does a name's weight stay what it was."""
        binding, arrays = self.weights_binding()
        entry = _KNOWN_BY_BINDING.get(binding)
        if entry is None or any(ref() is None for ref in entry[0]):
            entry = _KNOWN_BY_BINDING[binding] = ([weakref.ref(array) for array in arrays], Recent(KEYS_KEPT))
        return entry[1]

    def plan_model(self, tensors: Sequence[Tensor]) -> onnx.ModelProto:
        """The plan that computing these pending tensors runs, lowered to one ONNX model
        (``backends.lowering``; tree folds included): no inputs, the data it reads as
        initializers, one output a tensor, named by it. Nothing runs, and the batch stays pending."""
        if any(t.value is not None for t in tensors):
            raise TraceError("plan_model takes pending tensors; one of these already has its value")
        model = self._lowered(self.plan(tensors), tensors)
        del model.graph.input[:]  # the literals are this batch's data: the model holds those it reads
        model.graph.initializer.extend(numpy_helper.from_array(array, name) for name, array in self._literals.items())
        drop_unread(model.graph)
        return model

    def _lowered(self, plan: FlatPlan, tensors: Sequence[Tensor]) -> onnx.ModelProto:
        """``plan`` lowered to one ONNX model: its inputs the literals, one output a tensor (a
        name once: a call traced again gives new tensors of its outputs' names)."""
        tensors = list({t.name: t for t in tensors}.values())
        outputs = [(helper.make_tensor_value_info(t.name, np_dtype_to_tensor_dtype(t.dtype), list(t.shape)),
                    plan.locations[t.name]) for t in tensors]
        inputs = [helper.make_tensor_value_info(name, np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                  for name, a in self._literals.items()]
        return lower_plan(plan, inputs, {name: name for name in self._literals}, outputs, self._weights,
                          self._opsets(), "batch/plan")

    def _execute(self, wanted: list[Tensor]) -> list[np.ndarray]:
        plan = self.plan(wanted)
        whole = self._whole_plan(plan, wanted) if self.whole_plan else None
        if whole is not None:
            start = time.perf_counter()
            by_name = dict(zip(whole.outputs, whole.run(self._literals)))
            plan.report.execution["whole plan run"] = time.perf_counter() - start
            values = [by_name[t.name] for t in wanted]
        else:
            arenas = self._executor.run(plan, self._weights, self._literals, plan.report.execution, TRACED_ARENAS)
            values = [arenas[plan.locations[t.name]] for t in wanted]
            # The next run reuses the memory of every arena but those the results are views of
            # (they keep theirs, as they did before arenas were reused).
            if arenas.pooled:
                arenas.release(kept=values)
        self.reports.append(plan.report)
        self.last_plan = plan
        return values

    def _whole_plan(self, plan: FlatPlan, wanted: list[Tensor]) -> WholePlan | None:
        """The plan lowered to one session, timed in its report; None (the plan then runs step
        by step, as ``InferenceSession`` does) where it cannot run so, the reason logged."""
        why = whole_plan_refusal(plan)
        if why is None:
            start = time.perf_counter()
            try:
                whole = WholePlan(self._lowered(plan, wanted), self._ort_settings, bind=True)  # type: ignore[arg-type]
            except UnsupportedByOnnxruntime as error:
                why = str(error)
            else:
                plan.report.execution["whole plan session"] = time.perf_counter() - start
                return whole
        log.info("a traced batch's plan runs step by step: %s", why)
        return None


def frozen_weights(weights: Mapping[str, np.ndarray]) -> bool:
    """Whether no weight can change in place: each read-only and holding its own data
    (``Parameter.freeze``, and the tracer's shared constants), not a view of data that may."""
    return all(not array.flags.writeable and array.base is None for array in weights.values())


def run_programs(fn: Callable[[Any], Coroutine[Any, Any, Any]], inputs: Sequence[Any], backend: str = "numpy",
                 scheduler: str = "level", max_rounds: int = 10_000, threads: int = 0,
                 batch: Batch | None = None) -> list[Any]:
    """Results of ``fn(x)`` for each input, in order, the programs run in lockstep
    (``frontends.programs``) in one batch. A program that raises gets a ``ProgramFailure`` in
    its place; the others complete. Pass ``batch`` to trace into a batch of your own (and read
    its ``reports`` afterwards)."""
    with batch if batch is not None else Batch(backend, scheduler, threads) as batch:
        return run_in_lockstep(fn, inputs, batch, max_rounds)


__all__ = ["OPSET", "Batch", "run_programs"]
