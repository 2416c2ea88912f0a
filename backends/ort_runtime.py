"""onnxruntime plumbing: the execution provider (decided once, logged once), session options,
and a cache of sessions keyed by model structure."""

from __future__ import annotations

import contextlib
import functools
import heapq
import importlib.metadata
import io
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from autobatch.backends.nan_reductions import propagate_nans
from autobatch.ir.limits import DeadlineExceeded, remaining
from autobatch.ir.onnx_io import max_onnxruntime_ir_version

log = logging.getLogger("autobatch.onnxruntime")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def check_one_onnxruntime() -> None:
    """Warn where both onnxruntime and onnxruntime-gpu are installed: they share the import name
    and overwrite each other's files, so which one runs is an accident of install order."""
    found = []
    for distribution in ("onnxruntime", "onnxruntime-gpu"):
        try:
            found.append(f"{distribution} {importlib.metadata.version(distribution)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    if len(found) > 1:
        warnings.warn(f"both {found[0]} and {found[1]} are installed; they share the import name 'onnxruntime' and "
                      "overwrite each other's files: pip uninstall -y onnxruntime onnxruntime-gpu, then install one",
                      RuntimeWarning, stacklevel=2)


check_one_onnxruntime()


@functools.cache
def default_providers() -> tuple[str, ...]:
    """CUDA when onnxruntime offers it and its libraries load (``onnxruntime.preload_dlls``
    for the pip-installed CUDA and cuDNN of the ``cuda`` extra), else the CPU."""
    providers: tuple[str, ...] = (CPU,)
    if CUDA in ort.get_available_providers():
        quiet = ort.SessionOptions()
        quiet.log_severity_level = 4
        ort.set_default_logger_severity(4)  # a failed CUDA load is expected on CPU machines
        try:
            if hasattr(ort, "preload_dlls"):
                with contextlib.redirect_stdout(io.StringIO()) as printed:  # it prints what it misses
                    ort.preload_dlls()
                log.debug("onnxruntime.preload_dlls: %s", printed.getvalue().strip())
            probe = _identity_model()
            session = ort.InferenceSession(probe.SerializeToString(), quiet, providers=[CUDA, CPU])
            if session.get_providers()[0] == CUDA:
                providers = (CUDA, CPU)
        except Exception as error:  # any failure to load CUDA means: run on the CPU
            log.debug("CUDA execution provider unusable: %s", error)
        finally:
            ort.set_default_logger_severity(2)
    log.info("onnxruntime %s runs on %s", ort.__version__, providers[0])
    return providers


def _identity_model(opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})


def might_abort_onnxruntime(graph: Any, node: Any) -> bool:
    """Whether onnxruntime could abort the process running ``node`` of ``graph``: it does on an
    LSTM, GRU or RNN over no steps or no sequences, so one whose input may be empty (a 0, or a
    dimension not known) runs on the NumPy interpreter."""
    if node.op_type not in RECURRENT_OPS or node.domain:
        return False
    vtype = graph.values[node.inputs[0]].type
    return vtype is None or not vtype.is_static or 0 in vtype.shape


# Inputs (by index) whose length onnxruntime's shape inference reads when it builds a session:
# unnamed, it takes an unknown length for 0 ("sizes (0) must be same as rank of X").
LENGTH_READ = {"Resize": (1, 2, 3), "Upsample": (1,)}


def declare_ranks_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its inputs' dimensions unnamed (their ranks kept), but the lengths that
    ``LENGTH_READ`` says onnxruntime reads: it checks declared dimensions when it builds a
    session, and shape inference over other values may declare what does not hold (a
    one-element vector where Range takes a scalar of that value)."""
    pinned = {node.input[i] for node in model.graph.node if not node.domain
              for i in LENGTH_READ.get(node.op_type, ()) if i < len(node.input)}
    for value in model.graph.input:
        if value.name not in pinned and value.type.HasField("tensor_type"):
            for dim in value.type.tensor_type.shape.dim:
                dim.Clear()
    return model


# Element types onnxruntime's Python API neither takes from NumPy nor returns.
NUMPY_LESS_TYPES = frozenset(getattr(TensorProto, name) for name in (
    "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "INT4", "UINT4",
    "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, name))


class UnsupportedByOnnxruntime(ValueError):
    """A model the installed onnxruntime cannot load: its IR version or opset is too new, its
    types cannot pass through onnxruntime's Python API, or onnxruntime refused it."""


def new_session(model: onnx.ModelProto, options: ort.SessionOptions, providers: Sequence[str]) -> ort.InferenceSession:
    """An onnxruntime session, refused in one line where onnxruntime would fail with a long
    message because the model is newer than it; its max and min reductions let a NaN win, as
    the spec says (``backends.nan_reductions``)."""
    newest = max_onnxruntime_opset()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if model.ir_version > max_onnxruntime_ir_version() or opset > newest:
        raise UnsupportedByOnnxruntime(
            f"onnxruntime {ort.__version__} runs opsets up to {newest} (IR version {max_onnxruntime_ir_version()}); "
            f"this model needs opset {opset} (IR version {model.ir_version}): run it on the numpy backend")
    try:
        return ort.InferenceSession(propagate_nans(model).SerializeToString(), options, providers=list(providers))
    except Exception as error:  # onnxruntime raises its own exception types, some over several lines
        raise UnsupportedByOnnxruntime(f"onnxruntime refused the model: {' '.join(str(error).split())}") from None


class _Watchdog:
    """One thread for every onnxruntime run that has a deadline: at the deadline it sets the
    run's ``RunOptions.terminate``, and onnxruntime stops between nodes (a Loop's too). A timer
    thread a run cost ten times the run of a small model."""

    def __init__(self) -> None:
        self._due: list[list] = []  # heaps of [when, order, options, watching]
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, when: float, options: ort.RunOptions) -> list:
        entry = [when, next(self._order), options, True]
        with self._wake:
            heapq.heappush(self._due, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="autobatch-onnxruntime-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()
        return entry

    def _run(self) -> None:
        with self._wake:
            while True:
                while self._due and not self._due[0][3]:
                    heapq.heappop(self._due)  # runs that finished in time
                if not self._due:
                    self._wake.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                _, _, options, watching = heapq.heappop(self._due)
                if watching:
                    options.terminate = True


_WATCHDOG = _Watchdog()


def run_session(run: Callable[..., Any], outputs: Sequence[str] | None, feeds: Mapping[str, Any]) -> Any:
    """``run(outputs, feeds)`` of a session (``run`` or ``run_with_ort_values``), stopped by
    onnxruntime itself once the caller's deadline passes (``DeadlineExceeded``)."""
    seconds = remaining()
    if seconds is None:
        return run(outputs, feeds)
    options = ort.RunOptions()
    entry = _WATCHDOG.watch(time.monotonic() + max(seconds, 0.0), options)
    try:
        return run(outputs, feeds, options)
    except Exception:
        if options.terminate:
            raise DeadlineExceeded("the work went past its deadline and was stopped") from None
        raise
    finally:
        entry[3] = False


@functools.cache
def max_onnxruntime_opset() -> int:
    """The newest opset of the default domain the installed onnxruntime loads (probed once)."""
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 4
    for opset in range(onnx.defs.onnx_opset_version(), 6, -1):
        probe = _identity_model(opset)
        probe.ir_version = min(helper.find_min_ir_version_for(list(probe.opset_import)), max_onnxruntime_ir_version())
        try:
            ort.InferenceSession(probe.SerializeToString(), quiet, providers=[CPU])
            return opset
        except Exception:  # onnxruntime raises its own Fail type for an opset it does not know
            continue
    return 7


def session_options(threads: int = 0, stop_spinning: bool = True) -> ort.SessionOptions:
    """Options for our sessions: ``threads`` intra-op threads (0: onnxruntime's choice) that
    spin while a run lasts and, with ``stop_spinning``, stop when it returns. Spinning between a
    run's ops is what makes a whole model fast (64 texts of the exported BERT one at a time,
    median of 15 rounds: 55 ms spinning against 71 not; the LSTM tagger 30 against 50), but
    threads that went on spinning between runs (onnxruntime's default) would take the cores
    from the many small sessions of a plan and from a server's request handling. A whole
    model's session run for instance after instance keeps spinning between them, as
    onnxruntime's own does: stopped after each, 64 images of the exported CNN took 16.8-39.1 ms
    against 11.9-13.0 (BERT's texts 26.9-28.6 against 22.1-23.9)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # errors come back as exceptions, which we report: no second copy on stderr
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    if stop_spinning:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


@functools.cache
def shared_cpu_arena() -> bool:
    """Whether onnxruntime's environment has a CPU arena that sessions may share (registered
    here once, for the process: sessions that do not ask for it keep their own)."""
    try:
        ort.create_and_register_allocator(
            ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT),
            ort.OrtArenaCfg(0, -1, -1, -1))
    except Exception:  # an allocator registered before by the process, or an onnxruntime without the call
        log.info("onnxruntime's shared CPU arena is not available: templates' sessions keep their own")
        return False
    return True


class OrtSettings:
    """onnxruntime's execution providers and session options, shared by the sessions that a
    backend makes (a template's, a whole plan's); the sessions are kept by their owners."""

    def __init__(self, providers: Sequence[str] | None = None, threads: int = 0) -> None:
        self.providers = tuple(providers) if providers is not None else default_providers()
        self.options = session_options(threads)
        # Templates' sessions (a plan's steps) share one CPU memory arena, the environment's:
        # each of the hundreds that a server's new mixes make kept an arena of its own at its
        # peak. A whole plan's session keeps its own.
        self.template_options = session_options(threads)
        if shared_cpu_arena():
            self.template_options.add_session_config_entry("session.use_env_allocators", "1")

    @property
    def on_cuda(self) -> bool:
        return self.providers[0] == CUDA
