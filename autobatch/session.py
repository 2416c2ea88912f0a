"""``InferenceSession``: run one ONNX model for one instance or for many, batched."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, helper

from autobatch.axis_batches import AxisBatches
from autobatch.backends import FeedError, Interpreter
from autobatch.backends.baked_weights import WeightSnapshots
from autobatch.backends.interpreter import check_feeds
from autobatch.backends.lowering import lower_plan
from autobatch.backends.axis_feeds import PositionOutOfRange
from autobatch.backends.ort_backend import OrtBackendRep
from autobatch.backends.ort_runtime import CPU, OrtSettings, UnsupportedByOnnxruntime, run_session
from autobatch.backends.parallel_runs import ParallelRuns
from autobatch.backends.whole_plan import WHOLE_PLANS_KEPT, WholePlan, whole_plan_refusal
from autobatch.batcher import get_scheduler
from autobatch.batcher.plan import KEYS_KEPT, FlatPlan, TemplateCache
from autobatch.batcher.sequences import RECURRENT
from autobatch.executors import BACKENDS, flat_executor
from autobatch.feed_keys import input_signature
from autobatch.frontends.onnx_control_flow import MAX_UNROLLED_NODES
from autobatch.ir import Graph, Recent, from_onnx
from autobatch.ir.recent import Budgeted
from autobatch.ir.gc_pause import without_gc
from autobatch.ir.limits import DeadlineExceeded, WorkLimit, work_limit
from autobatch.ir.onnx_io import load_model
from autobatch.ir.select_first import select_first
from autobatch.ir.types import type_of_value
from autobatch.session_info import ModelMetadata, NodeArg, SessionStats
from autobatch.typed_instances import ModelInstances, plan_instances
from autobatch import ways
from autobatch.ways import ALONE, AT_ONCE, BATCHED, IN_TURN, WayChooser

log = logging.getLogger("autobatch")

# A batched plan seen this often runs as one whole-plan onnxruntime session from then on.
WHOLE_PLAN_AFTER = 2
# What a session keeps, most recently used first (its instances' graphs: ``ModelInstances``): a
# long-running server meets ever new mixes of input shapes, and unbounded caches would only grow.
PLANS_KEPT = 256  # plans, per mix of input signatures
# ... while their records add up to at most this: a 64-text BERT plan (4,736 records) holds about
# 1.2 MiB of steps, and a server meets a new mix in almost every batch.
PLAN_RECORDS_KEPT = 262_144


@dataclass
class _FlatPlan:
    """A flat plan with the constants it reads, kept per mix of input signatures: the feeds
    of the next batch of that mix fill its literal rows."""

    plan: FlatPlan
    weights: dict[str, np.ndarray]
    located: list[tuple[int, Any]]  # where each wanted value is, instance by instance
    uses: int = 0
    whole_refusal: str | None = None  # why it does not run as one onnxruntime session
    whole_made: bool = False  # it had one (a session costs tens of milliseconds to make)
    step_seconds: float = 0.0  # what running it step by step has cost so far


class InferenceSession:
    """Like ``onnxruntime.InferenceSession``, plus ``run_batch`` for many instances at once.

    Instances may differ in input shapes where the model allows it; then only nodes whose
    signatures agree are batched together. A batch whose instances have the same input
    shapes as an earlier one reuses that batch's plan.
    """

    def __init__(self, model: ModelProto | Graph | bytes | str, sess_options: Any = None,
                 providers: Sequence[str] | None = None, *, backend: str | None = None, scheduler: str = "level",
                 threads: int | None = None, max_unrolled_nodes: int = MAX_UNROLLED_NODES,
                 whole_plans: int = WHOLE_PLANS_KEPT, alone_when_faster: bool | float = True, node_level: bool = True) -> None:
        """Called as onnxruntime's is: ``InferenceSession(path, sess_options, providers)``, where
        ``sess_options`` is an ``onnxruntime.SessionOptions`` (its ``intra_op_num_threads`` is
        read) and giving ``providers`` (or options) means the onnxruntime backend. ``backend``:
        "numpy" (the default) or "onnxruntime"; ``threads``: onnxruntime's intra-op threads (0:
        its own choice). ``max_unrolled_nodes``: the most nodes an instance's If, Loop and Scan may unroll into
        (``check``, ``run`` and ``run_batch`` refuse an instance past it), so that a trip count
        given with the feeds cannot make a run of any size. ``whole_plans``: on onnxruntime, the
        mixes of input shapes whose plan, once used again, runs as one session
        (``backends.whole_plan``; each holds a copy of the weights; 0: always step by step); on CUDA
        from its first use, so that values stay on the device between steps.
        ``alone_when_faster``: a batch may run each instance alone where that was measured
        faster than batching batches of its kind (``autobatch.ways``: ``MARGIN`` times faster;
        a number: that many times); False: always batched.
        On onnxruntime's CPU such a batch, of at least ``threads`` instances (0: as many as the
        cores this process may use; 1: never), runs that many at once, each on one thread
        (``backends.parallel_runs``), on a second copy of the model made when first needed.
        ``node_level``: where every node of the model batches along its instances' length axis,
        a batch runs as the model's own graph over all their rows, planned once for every mix
        (``autobatch.axis_batches``); False: each mix is planned by the flat planner."""
        margin = ways.margin(alone_when_faster)  # (refused before anything is built)
        if backend is None:
            backend = "onnxruntime" if providers is not None or sess_options is not None else "numpy"
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        if threads is None:
            threads = int(getattr(sess_options, "intra_op_num_threads", 0) or 0)
        self.graph = model if isinstance(model, Graph) else from_onnx(_selects_first(load_model(model)))
        self.instances = ModelInstances(self.graph, max_unrolled_nodes)
        self.backend = backend
        get_scheduler(scheduler)  # an unknown name fails here, not at the first batch
        self.scheduler = scheduler
        self.stats: SessionStats | None = None
        # Control flow is unrolled per instance from its values, so such plans are not reused.
        self._control_flow = self.instances.control_flow
        self._recurrent = any(node.op_type in RECURRENT and not node.domain for node in self.graph.nodes.values())
        self._parallel: ParallelRuns | None = None  # onnxruntime's CPU: a batch run alone, several at once
        self._alone_ways: WayChooser | None = None
        if backend == "onnxruntime":
            self.ort_settings = OrtSettings(providers, threads)
            self._single: Any = OrtBackendRep(self.graph, self.ort_settings.providers, threads)
            callers = threads or usable_cores()
            if self.ort_settings.providers[0] == CPU and callers > 1 and margin is not None:
                self._parallel = ParallelRuns(self.graph, self.ort_settings.providers, callers)
                # ... or in turn on the session's own threads (onnxruntime alone), where measured faster
                self._alone_ways = WayChooser(AT_ONCE, IN_TURN)
        # Plans are kept per mix of input signatures, but not with control flow, where each
        # instance unrolls by its values.
        self.templates = TemplateCache()  # its plans' templates, with the runs prepared for them
        self.weight_snapshots = WeightSnapshots()  # its weights that templates may bake (``backends.baked_weights``)
        self._flat = flat_executor(backend, threads, providers, snapshots=self.weight_snapshots)
        # uses of a mix's plan before it runs as one session: a session costs more to make than a
        # run step by step on the CPU; on CUDA, steps run apart copy each value to the host and back
        self.whole_plan_after = 1 if backend == "onnxruntime" and self.ort_settings.on_cuda else WHOLE_PLAN_AFTER
        # what making the last whole-plan session cost (None: none made yet): a mix is made one
        # once running it step by step has cost as much (rent until the rent paid equals the price)
        self.whole_plan_seconds: float | None = None
        self._flat_plans = Budgeted(PLANS_KEPT, PLAN_RECORDS_KEPT, _records_planned)  # mix -> _FlatPlan
        self._whole_plans: Recent = Recent(whole_plans)  # mix -> WholePlan
        self._known_records: Recent = Recent(KEYS_KEPT)  # what flat plans learnt of their keys (``plan_records``)
        self._ways = WayChooser(margin=margin) if margin is not None else None
        # batches planned once per node of the model, where it allows (not with control flow);
        # ``axis_batches.refusal`` says why not
        self.axis_batches = None if self._control_flow or not node_level else \
            AxisBatches(self.graph, self.instances, self.ort_settings if backend == "onnxruntime" else None)

    def check(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """The feeds, once they fit the model's inputs and, for a model with control flow, once
        the instance unrolls within ``max_unrolled_nodes``; ``FeedError`` saying why not (and
        ``UnrollError`` where its control flow cannot be unrolled)."""
        checked = check_feeds(self.graph, feeds)
        if self._control_flow:
            self.instances.graph_of(checked)
        return checked

    @functools.cached_property
    def _interpreter(self) -> Interpreter:
        """The NumPy interpreter of the model: the numpy backend's one-instance runs, and the
        onnxruntime backend's where onnxruntime would abort (made when first needed)."""
        return Interpreter(self.graph)

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs, as onnxruntime describes them (``.name``, ``.shape``, ``.type``)."""
        return [NodeArg.of(self.graph, name) for name in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [NodeArg.of(self.graph, name) for name in self.graph.outputs]

    def get_providers(self) -> list[str]:
        """onnxruntime's execution providers in order, or ``["NumpyInterpreter"]``."""
        return list(self.ort_settings.providers) if self.backend == "onnxruntime" else ["NumpyInterpreter"]

    def get_modelmeta(self) -> ModelMetadata:
        meta = self.graph.meta
        return ModelMetadata(meta.get("producer_name", ""), self.graph.name, meta.get("domain", ""),
                             meta.get("doc_string", ""), meta.get("graph_doc_string", ""),
                             int(meta.get("model_version", 0) or 0), dict(meta.get("metadata_props", {})))

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None) -> list[Any]:
        """One instance, unbatched, as onnxruntime's ``run`` (``run_options`` is accepted and
        ignored). Its If, Loop and Scan may run at most ``max_unrolled_nodes`` nodes: on NumPy
        they count them as they run; onnxruntime cannot, so there the instance is unrolled
        first, to know. A recurrent layer that may get no steps runs on the NumPy interpreter
        (onnxruntime aborts there) and the rest on onnxruntime, as in a batch."""
        return self._run_alone(self._output_names(output_names), check_feeds(self.graph, feeds))

    def _run_alone(self, names: list[str], feeds: dict[str, Any]) -> list[Any]:
        """``run`` of feeds already checked (a batch run alone checked them once)."""
        if self.backend == "onnxruntime":
            if self._whole_model_runs(feeds):
                return run_session(self._single.session.run, names, feeds)
            # onnxruntime for all but the recurrent layer, as when batched
            key = None if self._control_flow else _plan_key(names, (input_signature(feeds),))
            return self._run_batched(names, [feeds], key, {}, time.perf_counter())[0]
        try:
            with work_limit(self.instances.max_unrolled_nodes):
                return self._interpreter.run(feeds, names)
        except WorkLimit as error:
            raise FeedError(str(error)) from None

    def _whole_model_runs(self, feeds: Mapping[str, Any]) -> bool:
        """Whether onnxruntime's session of the whole model runs this instance alone: not where
        it might abort on a recurrent layer. Control flow is unrolled within
        ``max_unrolled_nodes`` first (or a FeedError), to know."""
        unrolled = self.instances.graph_of(feeds) if self._control_flow else None
        return not self._recurrent or not self.instances.might_abort(feeds, unrolled)

    def _at_once(self, checked: list[dict[str, Any]]) -> list[int] | None:
        """The instances of a batch run alone that run several at once, one per thread: on
        onnxruntime's CPU, those that the whole model's session runs, where there is one for
        each of the ``threads`` (``backends.parallel_runs``); None: each in turn. Its one-thread
        session is made here, before the batch is timed, not inside the time of the way."""
        if self._parallel is None or len(checked) < self._parallel.callers:
            return None
        whole = [k for k, feeds in enumerate(checked) if self._whole_model_runs(feeds)]
        if len(whole) < self._parallel.callers:
            return None
        self._parallel.prepare()
        return whole

    def _run_each_alone(self, names: list[str], checked: list[dict[str, Any]],
                        at_once: list[int] | None) -> list[list[Any]]:
        if at_once is None:
            return [self._run_alone(names, feeds) for feeds in checked]
        results = dict(zip(at_once, self._parallel.run(names, [checked[k] for k in at_once])))  # type: ignore[union-attr]
        return [results[k] if k in results else self._run_alone(names, feeds) for k, feeds in enumerate(checked)]

    def run_batch(self, output_names: Sequence[str] | None,
                  feeds_list: Sequence[Mapping[str, Any]]) -> list[list[np.ndarray]]:
        """Many instances, batched; result ``[i][j]`` is output j of instance i. A batch may run
        each instance alone instead, where that was measured faster for batches of its kind
        (``alone_when_faster``; ``stats.alone`` counts them)."""
        if not feeds_list:
            return []
        names = self._output_names(output_names)
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        checked = []
        for k, feeds in enumerate(feeds_list):
            try:
                checked.append(check_feeds(self.graph, feeds))
            except FeedError as error:
                raise FeedError(f"instance {k}: {error}") from None
        signatures = None if self._control_flow else tuple(input_signature(feeds) for feeds in checked)
        fits = self.axis_batches.fits(checked, signatures) if self.axis_batches is not None else None  # type: ignore[arg-type]
        key = None if signatures is None else _plan_key(names, signatures)
        kept = key is not None and key in self._flat_plans or fits is not None
        way = self._ways.choose(len(checked), kept) if self._ways is not None else BATCHED
        how = self._alone_ways.choose(len(checked), False) if way == ALONE and self._alone_ways else IN_TURN
        at_once = self._at_once(checked) if way == ALONE and how == AT_ONCE else None
        begin = time.perf_counter()
        if way == ALONE:
            results = self._run_each_alone(names, checked, at_once)
            seconds["alone"] = time.perf_counter() - begin
            self.stats = SessionStats(len(checked), None, alone=len(checked),
                                      at_once=1 if at_once is None else self._parallel.callers,  # type: ignore[union-attr]
                                      seconds=seconds, why_alone=self._ways.why(len(checked), kept))  # type: ignore[union-attr]
            if self._alone_ways is not None:  # (a batch that could not run at once ran in turn)
                self._alone_ways.record(len(checked), False, AT_ONCE if at_once else IN_TURN, seconds["alone"])
        else:
            results = self._run_batched(names, checked, key, seconds, start, fits)
        if self._ways is not None and not (fits is not None and self.axis_batches.fresh):  # type: ignore[union-attr]
            self._ways.record(len(checked), kept, way, time.perf_counter() - begin)
        return results

    def _run_batched(self, names: list[str], checked: list[dict[str, Any]], key: tuple | None,
                     seconds: dict[str, float], start: float, fits: list | None = None) -> list[list[np.ndarray]]:
        if fits is not None:  # the model's node-level plan (``axis_batches``)
            begin = time.perf_counter()
            try:
                results, report = self.axis_batches.run(names, checked, fits)  # type: ignore[union-attr]
            except UnsupportedByOnnxruntime as error:
                self.axis_batches.refuse(str(error))  # type: ignore[union-attr]
            except PositionOutOfRange as error:  # this batch's own: planned per mix, where that instance fails alone
                log.info("a batch of %s is planned per mix: %s", self.graph.name, error)
            except DeadlineExceeded:
                raise
            except Exception as error:  # noqa: BLE001 - said at WARNING; this batch is planned per mix instead
                self.axis_batches.refuse(f"its node-level plan failed ({type(error).__name__}: {error})",  # type: ignore[union-attr]
                                  logging.WARNING)
            else:
                seconds.update(plan=begin - start, execute=time.perf_counter() - begin)
                self.stats = SessionStats(len(checked), report, not self.axis_batches.planned_now,  # type: ignore[union-attr]
                                          launches=report.launches, seconds=seconds,
                                          whole_plan=self.backend == "onnxruntime")  # (NumPy: one graph interpreted)
                return results
        # The union graph names instance k's values "i{k}/name", but keeps constants shared.
        union_feeds = {f"i{k}/{name}": value for k, feeds in enumerate(checked) for name, value in feeds.items()}
        width = len(names)
        values = self._run_flat(key, checked, union_feeds, names, start)
        return [values[k * width:(k + 1) * width] for k in range(len(checked))]

    # A plan allocates many objects that live on, and a run many arrays: the collector's passes
    # would walk the whole heap (the model's graphs, every plan kept) again and again.
    @without_gc
    def _run_flat(self, key: tuple | None, checked: list[dict[str, Any]], union_feeds: dict[str, Any],
                  names: list[str], start: float) -> list[np.ndarray]:
        """Output ``names`` of every instance by the flat path (``key``: the outputs and the
        batch's mix of input signatures, under which its plan is kept; None: not kept)."""
        seconds: dict[str, float] = {}
        execution: dict[str, float] = {}  # step by step: its gathers, kernels and writes
        entry = self._flat_plans.get(key) if key is not None else None
        cached = entry is not None
        if entry is None:
            entry = self._flat_plan(key, checked, union_feeds, names)
            seconds["build"] = time.perf_counter() - start - sum(entry.plan.report.seconds.values())
            seconds.update(entry.plan.report.seconds)
            if key is not None:
                self._flat_plans[key] = entry
        entry.uses += 1
        begin = time.perf_counter()
        whole = self._whole_plan(key, entry, checked, union_feeds, names) if entry.uses >= self.whole_plan_after else None
        seconds["prepare"] = time.perf_counter() - begin
        begin = time.perf_counter()
        if whole is not None:
            found = whole.run(union_feeds)
        else:
            values = self._flat.run(entry.plan, entry.weights, union_feeds, execution)
            found = [values[location] for location in entry.located]  # views of this run's arenas
        seconds["execute"] = time.perf_counter() - begin
        if whole is None:
            entry.step_seconds += seconds["execute"]
        self.stats = SessionStats(len(checked), entry.plan.report, cached, launches=1 if whole else len(entry.plan.steps),
                                  seconds=seconds, whole_plan=whole is not None, execution=execution)
        return found

    def _whole_plan(self, key: tuple | None, entry: _FlatPlan, checked: list[dict[str, Any]],
                    union_feeds: dict[str, Any], names: list[str]) -> WholePlan | None:
        """A kept plan's one onnxruntime session (``backends.whole_plan``), made from its
        ``whole_plan_after``-th use on, once its runs step by step have cost what making the last
        one did (``whole_plan_seconds``; on CUDA at once); None before, on NumPy, for a plan not
        kept, or one that cannot run so (said once in the log).
        It is planned again without padding: in one session a launch a length costs microseconds,
        less than padding does (``batcher.padding`` is for plans run a Python call a launch)."""
        if self.backend != "onnxruntime" or key is None or not self._whole_plans.size or entry.whole_refusal is not None:
            return None
        whole = self._whole_plans.get(key)
        if whole is None and entry.whole_made:  # making sessions again and again costs more than it saves
            entry.whole_refusal = f"its session was let go: more mixes recur than the {self._whole_plans.size} kept"
            log.info("a batch plan of %s runs step by step from now on: %s", self.graph.name, entry.whole_refusal)
            return None
        price = self.whole_plan_seconds
        if whole is None and self.whole_plan_after > 1 and price is not None and entry.step_seconds < price:
            return None  # not yet worth it
        if whole is None:
            start = time.perf_counter()
            unpadded = self._flat_plan(None, checked, union_feeds, names, padded=False)
            entry.whole_refusal = whole_plan_refusal(unpadded.plan)
            if entry.whole_refusal is None:
                try:
                    whole = WholePlan(self._lowered(unpadded, checked, union_feeds, names), self.ort_settings)
                except UnsupportedByOnnxruntime as error:
                    entry.whole_refusal = str(error)
            if whole is None:
                log.info("a batch plan of %s runs step by step: %s", self.graph.name, entry.whole_refusal)
                return None
            self._whole_plans[key] = whole
            entry.whole_made = True
            self.whole_plan_seconds = time.perf_counter() - start
        return whole

    def _flat_plan(self, key: tuple | None, checked: list[dict[str, Any]], union_feeds: dict[str, Any],
                   names: list[str], padded: bool = True) -> _FlatPlan:
        # What a plan learns of record keys holds while their constants keep their values:
        # not across unrolled instances, whose constants are their own.
        plan, weights, wanted = plan_instances(
            [self.instances.records_of(feeds) for feeds in checked], [names] * len(checked), union_feeds,
            self.graph.functions, self.graph.opset_imports, self.scheduler,
            known=self._known_records if key is not None else None, padded=padded, cache=self.templates)
        return _FlatPlan(plan, weights, [plan.locations[name] for name in wanted])

    @without_gc  # bulk planning, as run_batch's
    def plan_model(self, feeds_list: Sequence[Mapping[str, Any]]) -> ModelProto:
        """The plan of these instances lowered to one ONNX model (``backends.lowering``): input
        ``i{k}/name`` is instance k's input ``name``, output ``i{k}/name`` its output. It
        holds for inputs of these shapes (and, with control flow, these values)."""
        checked = [check_feeds(self.graph, feeds) for feeds in feeds_list]
        union_feeds = {f"i{k}/{name}": value for k, feeds in enumerate(checked) for name, value in feeds.items()}
        names = list(self.graph.outputs)
        return self._lowered(self._flat_plan(None, checked, union_feeds, names, padded=False), checked, union_feeds,
                             names)

    def _lowered(self, entry: _FlatPlan, checked: list[dict[str, Any]], union_feeds: dict[str, Any],
                 names: list[str]) -> ModelProto:
        inputs = [helper.make_value_info(name, type_of_value(value).proto) for name, value in union_feeds.items()]
        outputs = []
        for k, feeds in enumerate(checked):
            typed = self.instances.graph_of(feeds)
            for name in names:
                vtype = typed.values[name].type
                info = helper.make_value_info(f"i{k}/{name}", vtype.proto) if vtype is not None \
                    else helper.make_empty_tensor_value_info(f"i{k}/{name}")
                outputs.append((info, entry.located[len(outputs)]))
        return lower_plan(entry.plan, inputs, {name: name for name in union_feeds}, outputs, entry.weights,
                          self.graph.opset_imports, f"{self.graph.name}/plan")

    def _output_names(self, output_names: Sequence[str] | None) -> list[str]:
        names = list(output_names) if output_names is not None else list(self.graph.outputs)
        unknown = [n for n in names if n not in self.graph.outputs]
        if unknown:
            raise FeedError(f"unknown output(s) {unknown}; the model's outputs are {self.graph.outputs}")
        return names


def _plan_key(names: Sequence[str], signatures: tuple) -> tuple:
    """What a flat plan is kept under: the outputs it computes and its mix of input signatures
    (one kept for other outputs would hand back its own, shifted)."""
    return tuple(names), signatures


def _records_planned(entry: _FlatPlan) -> int:
    return entry.plan.report.nodes


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system says; a container's
    may be fewer than the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _selects_first(model: ModelProto) -> ModelProto:
    """PyTorch's select of q, k and v moved before its Transpose (``ir.select_first``: the same
    results, the rows kept); where that fails (a bug of ours), the model as written, said at WARNING."""
    try:
        return select_first(model)
    except Exception as error:  # noqa: BLE001 - the model as written still runs
        log.warning("the model's selects are left where it has them (%s: %s)", type(error).__name__, error)
        return model
