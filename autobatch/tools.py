"""What the command line does: inspect a model, rewrite it batched, run it over files."""

from __future__ import annotations

import json
import math
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from autobatch.arrays import array_from_json
from autobatch.backends import FeedError
from autobatch.backends.ort_runtime import CPU, UnsupportedByOnnxruntime, new_session, session_options
from autobatch.backends.lowering import lower_plan
from autobatch.batcher import build_problem, get_scheduler
from autobatch.batcher.instances import instance_records
from autobatch.batcher.plan import TemplateCache
from autobatch.batcher.problem import UNBATCHABLE
from autobatch.batcher.node_rules import refusal
from autobatch.batcher.signature import describe, node_signature
from autobatch.capability_text import model_ways
from autobatch.ir import Graph, from_onnx, to_onnx
from autobatch.ir.draw import PlanView
from autobatch.ir.gc_pause import without_gc
from autobatch.ir.types import ValueType
from autobatch.fallbacks import batched_else_alone, each_alone
from autobatch.session import InferenceSession
from autobatch.symbolic_sizes import AS_WRITTEN_BELOW_TWO, batched_for_every_size
from autobatch.typed_instances import plan_instances, typed_instance

Print = Callable[[str], None]
RANDOM_FEED_ELEMENTS = 10**8  # the most elements a made-up input may have


def random_feeds(graph: Graph, rng: np.random.Generator, symbolic: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs of the declared dtypes; a symbolic dimension takes its value from
    ``symbolic`` or a random size from 1 to 8."""
    sizes = dict(symbolic or {})
    feeds = {}
    for name in graph.inputs:
        vtype = graph.values[name].type
        if vtype is None or vtype.shape is None or vtype.dtype is None:
            raise FeedError(f"input {name!r} has no declared dtype and shape; random inputs need them")
        shape = [d if isinstance(d, int) else sizes.setdefault(str(d), int(rng.integers(1, 9))) for d in vtype.shape]
        if math.prod(shape) > RANDOM_FEED_ELEMENTS:
            raise FeedError(f"input {name!r} declares shape {shape} ({math.prod(shape)} elements): too large to make "
                            f"up random values for (at most {RANDOM_FEED_ELEMENTS})")
        if vtype.dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(vtype.dtype)
        elif vtype.dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[name] = rng.integers(0, 3, shape).astype(vtype.dtype)
    return feeds


def op_counts(graph: Graph) -> Counter[str]:
    return Counter(node.qualified_op for node in graph.nodes.values())


def _type_text(graph: Graph, name: str) -> str:
    vtype = graph.values[name].type
    return repr(vtype) if vtype is not None else "?"


# ----------------------------------------------------------------------------- inspect
def inspect_model(path: str, instances: int, draw: str | None, out: Print) -> None:
    graph = from_onnx(path)
    out(f"{path}: graph {graph.name!r}, {len(graph)} nodes, opsets {graph.opset_imports}")
    for kind, names in (("input", graph.inputs), ("output", graph.outputs)):
        for name in names:
            out(f"  {kind:<6} {name}: {_type_text(graph, name)}")
    out("  ops: " + ", ".join(f"{op} x{n}" for op, n in op_counts(graph).most_common()))
    out("  ways to batch them: " + model_ways([node.op_type for node in graph.nodes.values() if not node.domain]))
    one = typed_instance(graph, {name: graph.values[name].type for name in graph.inputs})
    classes = Counter(node_signature(one, n) for n in one.nodes.values())
    out(f"  signature classes in one instance: {len(classes)} ({classes.get(None, 0)} nodes without static shapes)")
    for signature, count in classes.most_common(5):
        out(f"    {count:>5} x {describe(signature)}")
    if instances > 0:
        rng = np.random.default_rng(0)  # one for all: instances of different sizes, as run_batch meets them
        feeds = [random_feeds(graph, rng) for _ in range(instances)]
        plan = _inspect_plan(graph, feeds, out)
        if draw:
            from_onnx(plan).draw(draw)
            out(f"  drawn to {draw} (the plan of {instances} instances as it runs, lowered to one graph)")
    elif draw:
        graph.draw(draw)
        out(f"  drawn to {draw}")


def _inspect_plan(graph: Graph, feeds: list[dict[str, np.ndarray]], out: Print) -> onnx.ModelProto:
    """The plan ``run_batch`` makes and runs for these instances, printed with its time beside
    onnxruntime's one instance at a time; returns it lowered to one ONNX graph."""
    try:
        # Always batched: this shows and times the plan (by default a mix may run alone: ``autobatch.ways``).
        session = InferenceSession(graph, backend="onnxruntime", alone_when_faster=False)
        alone = new_session(to_onnx(graph), session_options(threads=0), [CPU])
    except UnsupportedByOnnxruntime as error:
        out(f"  onnxruntime cannot run this model ({error}); the plan on the numpy backend:")
        session, alone = InferenceSession(graph, backend="numpy", alone_when_faster=False), None
    session.run_batch(None, feeds)
    report = session.stats.report
    out(f"  plan for {len(feeds)} instances (random sizes for symbolic dimensions): {report}")
    out("  launches by op: " + ", ".join(f"{op} {n}" for op, n in Counter(report.launches_by_op).most_common()))
    for why, nodes in Counter(report.by_shape).most_common():
        out(f"  a class per shape, {nodes} node{'s' if nodes > 1 else ''}: {why}")
    if alone is not None:
        ours = _timed(lambda: session.run_batch(None, feeds))[1]
        theirs = _timed(lambda: [alone.run(None, instance) for instance in feeds])[1]
        how = "one onnxruntime session" if session.stats.whole_plan else "step by step"
        out(f"  verdict: run_batch {ours * 1e3:.3f} ms ({how}), onnxruntime one instance at a time {theirs * 1e3:.3f} ms: "
            f"{theirs / ours:.2f}x")
    node_level = session.axis_batches.model(feeds) if session.axis_batches is not None else None
    return node_level if node_level is not None else session.plan_model(feeds)


def _timed(run: Callable[[], Any], repeats: int = 5) -> tuple[Any, float]:
    """The result of a warm-up run (sessions made, a plan kept and, from its second use, one
    session), and the fastest of ``repeats`` runs after it, in seconds."""
    result = run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return result, min(times)


def plan_view(graph: Graph, scheduler: str) -> PlanView:
    """What a picture shows of the plan of ``graph`` (signature classes, launches in order)."""
    problem = build_problem(graph, refusal=lambda node: refusal(graph, node))
    classes = {node_id: int(cls) for node_id, cls in zip(problem.node_ids, problem.sig.tolist()) if cls != UNBATCHABLE}
    launches = [[problem.node_ids[i] for i in group] for group in get_scheduler(scheduler)(problem)]
    return PlanView(classes, launches)


# ----------------------------------------------------------------------------- rewrite
@dataclass
class RewriteResult:
    before: Counter[str]
    after: Counter[str]
    latency_before_ms: float | None = None
    latency_after_ms: float | None = None
    max_difference: float | None = None


def batch_one_graph(graph: Graph, scheduler: str = "level") -> Graph:
    """Batch the isomorphic nodes inside one graph (parallel branches: K copies of a cell,
    the unrolled per-example loop of an exporter), or the graph unchanged where
    ``batched_graph`` says why not."""
    batched = batched_graph(graph, scheduler)
    return graph if isinstance(batched, str) else batched


def batched_graph(graph: Graph, scheduler: str = "level") -> Graph | str:
    """The graph's isomorphic nodes batched by the flat plan, lowered to one ONNX graph
    (``backends.lowering``), or why not. Inputs and outputs keep their names, order and types.
    Inputs with symbolic dimensions (branches of one length ``L``) are batched for a few trial
    sizes and made one graph that reads them from its inputs (``symbolic_sizes``)."""
    types = {name: graph.values[name].type for name in graph.inputs}
    if all(vtype is not None and vtype.is_tensor and vtype.is_static for vtype in types.values()):
        model = _lowered(graph, types, scheduler)
    else:
        model = batched_for_every_size(graph, lambda trial: _lowered(graph, trial, scheduler))
    return model if isinstance(model, str) else from_onnx(model)


@without_gc  # bulk planning, as run_batch's
def _lowered(graph: Graph, types: Mapping[str, ValueType], scheduler: str) -> onnx.ModelProto | str:
    typed = typed_instance(graph, types)
    literals = {f"i0/{name}": np.broadcast_to(np.zeros((), vtype.dtype), vtype.shape)  # only their types are read
                for name, vtype in types.items()}
    plan, weights, wanted = plan_instances([instance_records(typed)], [graph.outputs], literals, graph.functions,
                                           graph.opset_imports, scheduler, apart=False, cache=TemplateCache())
    exported = to_onnx(graph, check=False)
    outputs = [(info, plan.locations[name]) for info, name in zip(exported.graph.output, wanted)]
    inputs = [onnx.helper.make_value_info(name, types[name].proto) for name in graph.inputs]  # a trial's sizes
    model = lower_plan(plan, inputs, {f"i0/{name}": name for name in graph.inputs}, outputs, weights,
                       graph.opset_imports, graph.name)
    # Against the graph with what its input shapes decide folded: folding is not batching.
    before = compute_ops(typed)
    if compute_ops(from_onnx(model)) >= before:
        return f"batched, it would keep as many compute ops ({before})"
    return model


# Ops that only move or reshape data (what the lowering adds to read and write rows): a graph
# worth batching has fewer of the others.
DATA_MOVEMENT_OPS = frozenset({"Concat", "Constant", "Expand", "Flatten", "Gather", "Identity", "Reshape", "Slice",
                               "Split", "Squeeze", "Transpose", "Unsqueeze"})


def compute_ops(graph: Graph) -> int:
    return sum(node.op_type not in DATA_MOVEMENT_OPS for node in graph.nodes.values())


def rewrite_model(source: str, target: str, scheduler: str, check: bool, out: Print,
                  sizes: Mapping[str, int] | None = None, default_size: int = 16) -> RewriteResult:
    """``autobatch rewrite``; ``--check`` compares both graphs' outputs with every symbolic
    dimension of the inputs at 1, at 2 and at its size in ``sizes`` (else ``default_size``), and
    times them at the last."""
    graph = from_onnx(source)
    dims = [d for name in graph.inputs for d in (graph.values[name].type.shape or ()) if not isinstance(d, int)]
    symbols = {d for d in dims if d is not None}
    unknown = sorted(set(sizes or {}) - symbols)
    if unknown:
        raise ValueError(f"--dim names {', '.join(map(repr, unknown))}, which no input's shape has "
                         f"(its symbolic dimensions: {', '.join(sorted(symbols)) or 'none'})")
    # (``random_feeds`` sizes every unnamed dimension by the key "None")
    check_sizes = {symbol: (sizes or {}).get(symbol, default_size) for symbol in sorted(symbols)} | \
        ({"None": default_size} if None in dims else {})
    batched = batched_graph(graph, scheduler)
    if isinstance(batched, str):
        out(f"not batched: {batched}; written unchanged")
        batched = graph
    model = to_onnx(batched)
    onnx.save(model, target)
    result = RewriteResult(op_counts(graph), op_counts(batched))
    below_two = [node for node in model.graph.node if node.name == AS_WRITTEN_BELOW_TWO]
    if below_two:  # counted: the batched branch, and what picks it
        branch = next(attribute.g for attribute in below_two[0].attribute if attribute.name == "else_branch")
        picks = [node for node in model.graph.node if node.name != AS_WRITTEN_BELOW_TWO]
        result.after = Counter(f"{node.domain}::{node.op_type}" if node.domain else node.op_type
                               for node in [*picks, *branch.node])
        out("batched for every size of its symbolic dimensions of 2 or more; for sizes under 2 it runs the model as "
            "written (an If)")
    out(f"{'op':<24}{'before':>8}{'after':>8}")
    for op in sorted(set(result.before) | set(result.after)):
        out(f"{op:<24}{result.before[op]:>8}{result.after[op]:>8}")
    out(f"{'total':<24}{sum(result.before.values()):>8}{sum(result.after.values()):>8}")
    if check:
        original = to_onnx(graph)  # as we export it (an IR version onnxruntime loads), not as it was saved
        rng = np.random.default_rng(0)
        for size in (1, 2) if check_sizes else ():  # where a size of 1 broadcasts or squeezes
            feeds = random_feeds(graph, rng, dict.fromkeys(check_sizes, size))
            _same_outputs(graph, _ort_run_timed(original, feeds, 1)[0], _ort_run_timed(model, feeds, 1)[0],
                          f"every symbolic dimension at {size}")
        feeds = random_feeds(graph, rng, check_sizes)
        expected, result.latency_before_ms = _ort_run_timed(original, feeds)
        got, result.latency_after_ms = _ort_run_timed(model, feeds)
        at = ", ".join(f"{'?' if symbol == 'None' else symbol}={size}" for symbol, size in check_sizes.items())
        result.max_difference = _same_outputs(graph, expected, got, at or "the inputs' own shapes")
        if batched is not graph and result.latency_after_ms >= result.latency_before_ms:
            out(f"the batched graph ran slower ({result.latency_after_ms:.3f} ms against {result.latency_before_ms:.3f} ms): "
                "written unchanged")
            onnx.save(original, target)
            result.after = op_counts(graph)
        out(f"check{f' at {at}' if at else ''}: outputs equal (largest difference {result.max_difference:.3g}"
            f"{'; also at sizes 1 and 2' if at else ''}); onnxruntime latency {result.latency_before_ms:.3f} ms before, "
            f"{result.latency_after_ms:.3f} ms after")
    out(f"wrote {target}")
    return result


def _same_outputs(graph: Graph, expected: Sequence[np.ndarray], got: Sequence[np.ndarray], where: str) -> float:
    """The largest difference of the rewritten graph's outputs from the original's, or ValueError
    naming the first that differs in shape, dtype or value (rtol 1e-4, atol 1e-5)."""
    largest = 0.0
    for e, g, name in zip(expected, got, graph.outputs):
        if e.shape != g.shape or e.dtype != g.dtype:
            raise ValueError(f"check failed ({where}): output {name!r} is {g.dtype}{list(g.shape)} after the rewrite, "
                             f"{e.dtype}{list(e.shape)} before")
        difference = float(np.max(np.abs(e.astype(np.float64) - g))) if e.size else 0.0
        if not np.allclose(g, e, rtol=1e-4, atol=1e-5):
            raise ValueError(f"check failed ({where}): output {name!r} differs after the rewrite "
                             f"(largest difference {difference:.3g})")
        largest = max(largest, difference)
    return largest


def _ort_run_timed(model: onnx.ModelProto, feeds: dict[str, np.ndarray], repeats: int = 20) -> tuple[list[np.ndarray], float]:
    """Outputs, and the fastest of ``repeats`` runs in ms, on one thread."""
    session = new_session(model, session_options(threads=1), [CPU])
    outputs, seconds = _timed(lambda: session.run(None, feeds), repeats)
    return outputs, seconds * 1e3


# ----------------------------------------------------------------------------- run
def read_instances(path: str, graph: Graph) -> list[dict[str, np.ndarray] | str]:
    """Instances from ``.npz`` (arrays named ``<index>/<input>``) or ``.jsonl`` (one object
    per line, input name -> nested lists); an instance that cannot be read becomes its error
    text, and the others go on."""
    suffix = Path(path).suffix
    if suffix == ".npz":
        return _npz_instances(path)
    if suffix == ".jsonl":
        result: list[dict[str, np.ndarray] | str] = []
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    result.append(_json_instance(line, number, graph))
        return result
    raise ValueError(f"{path}: inputs must be a .npz or a .jsonl file")


def _npz_instances(path: str) -> list[dict[str, np.ndarray] | str]:
    instances: dict[int, dict[str, np.ndarray] | str] = {}
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: not a readable .npz file ({error})") from None
    with data:
        for key in data.files:
            index, _, name = key.partition("/")
            if not index.isdigit() or not name:
                raise ValueError(f"{path}: array {key!r} is not named <index>/<input name>")
            instance = instances.setdefault(int(index), {})
            if isinstance(instance, str):
                continue
            try:
                _check_stored_size(data.zip, key)
                instance[name] = data[key]
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
                instances[int(index)] = f"instance {index}: array {name!r} cannot be read: {error}"
    return [instances[k] for k in sorted(instances)]


def _check_stored_size(archive: zipfile.ZipFile, key: str) -> None:
    """Refuse an array whose header promises more bytes than its file holds, before NumPy tries
    to allocate them (a header can declare 10^12 elements in a few bytes)."""
    names = set(archive.namelist())
    info = archive.getinfo(key + ".npy" if key + ".npy" in names else key)
    with archive.open(info) as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
        declared = math.prod(shape) * dtype.itemsize
        if declared > info.file_size:
            raise ValueError(f"its header declares shape {list(shape)} of {dtype} ({declared} bytes) but it holds "
                             f"{info.file_size} bytes")


def _json_instance(line: bytes, number: int, graph: Graph) -> dict[str, np.ndarray] | str:
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        return f"line {number}: not JSON ({error})"
    except RecursionError:
        return f"line {number}: JSON nested too deeply"
    if not isinstance(record, dict):
        return f"line {number}: expected a JSON object of input name -> array"
    feeds = {}
    for name, value in record.items():
        declared = graph.values[name].type if name in graph.values else None
        dtype = declared.dtype if declared is not None and declared.dtype is not None else None
        try:
            feeds[name] = array_from_json(value, dtype)
        except (ValueError, TypeError, OverflowError) as error:
            return f"line {number}: input {name!r}: {error}"
        except RecursionError:
            return f"line {number}: input {name!r}: nested too deeply"
    return feeds


def run_file(model: str, inputs: str, output: str, backend: str, batch_size: int, out: Print,
             progress: bool = True) -> tuple[int, int]:
    """Batched inference over a file of instances; returns (succeeded, failed)."""
    from tqdm import tqdm

    if Path(output).suffix not in (".npz", ".jsonl"):
        raise ValueError(f"{output}: results go to a .npz or a .jsonl file")
    session = InferenceSession(model, backend=backend)
    instances = read_instances(inputs, session.graph)
    results: list[list[np.ndarray] | str] = [[] for _ in instances]
    with tqdm(total=len(instances), unit="instance", disable=not progress) as bar:
        for start in range(0, len(instances), batch_size):
            chunk = list(range(start, min(start + batch_size, len(instances))))
            _run_chunk(session, instances, chunk, results)
            bar.update(len(chunk))
    _write_results(output, session.graph.outputs, results)
    failed = sum(isinstance(r, str) for r in results)
    out(f"{len(instances) - failed} instances ran, {failed} failed; results in {output}")
    return len(instances) - failed, failed


def _run_chunk(session: InferenceSession, instances: Sequence[Any], chunk: list[int],
               results: list[list[np.ndarray] | str]) -> None:
    """Run the good instances of a chunk batched; a bad one gets its error and the rest go on.
    If the batched run itself fails, each instance runs alone (logged) so that only the guilty fail."""
    readable = [k for k in chunk if not isinstance(instances[k], str)]
    for k in chunk:
        if isinstance(instances[k], str):
            results[k] = instances[k]
    good = []
    for k, checked in zip(readable, each_alone(session.check, [instances[k] for k in readable])):
        if isinstance(checked, Exception):
            results[k] = f"{type(checked).__name__}: {checked}"
        else:
            good.append(k)
    if not good:
        return
    outputs, _ = batched_else_alone(lambda feeds: session.run_batch(None, feeds), lambda feeds: session.run(None, feeds),
                                    [instances[k] for k in good], f"instances {good[0]}..{good[-1]}")
    for k, result in zip(good, outputs):
        results[k] = f"{type(result).__name__}: {result}" if isinstance(result, Exception) else result


def _write_results(path: str, names: Sequence[str], results: Sequence[list[np.ndarray] | str]) -> None:
    suffix = Path(path).suffix
    if suffix == ".npz":
        arrays = {}
        for k, result in enumerate(results):
            if isinstance(result, str):
                arrays[f"{k}/error"] = np.array(result)
            else:
                arrays.update({f"{k}/{name}": value for name, value in zip(names, result)})
        np.savez(path, **arrays)
    else:
        with open(path, "w") as f:
            for k, result in enumerate(results):
                record: dict[str, Any] = {"index": k}
                if isinstance(result, str):
                    record["error"] = result
                else:
                    record["outputs"] = {name: value.tolist() for name, value in zip(names, result)}
                f.write(json.dumps(record) + "\n")
