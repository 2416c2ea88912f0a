"""Inference throughput of the four tasks, ours against DyNet 2.2 and PyTorch, side by side.

    python -m benchmarks [--minibatch 64] [--size 256] [--json PATH] [--plot PATH] [--sizes 1,4,16,64,256]
    python -m benchmarks --quick          # correctness of every system on a few small instances

Every system sees the same instances, the same weights (the examples' parameters, fixed seed)
and 2 threads. Ours: one instance at a time (a Batch per instance) and batched (one Batch for the
minibatch) with each scheduler, on the numpy and onnxruntime backends, in primitive ops and in
cells. DyNet (a subprocess per autobatch setting 0/1/2) and PyTorch eager (one at a time, and
batched by hand). Before anything is timed, every system's per-instance results are checked
against PyTorch's (same weights) and against ours one instance at a time.

Throughput counts everything a user waits for: tracing / graph building, batching, execution.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import inspect
import json
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from autobatch import arguments
from autobatch import Batch, run_programs
from benchmarks import peers_dynet, peers_torch
from benchmarks.tasks import TASKS, Task, build

THREADS = 2
PROVIDERS: list[str] | None = None  # onnxruntime's for our runs: main sets them by --providers
WHOLE_PLAN = False  # our onnxruntime runs: each plan as one session (``Batch(whole_plan=...)``), by --whole-plan
SCHEDULERS = ("depth", "agenda", "level")
BACKENDS = ("numpy", "onnxruntime")
FORMS = ("primitive", "cells", "sequences", "fold")  # a task's forms are those its example has
SWEEP_TASKS = ("treelstm", "bilstm")
RTOL = ATOL = 2e-3  # float32 sums of ~40-100 NLLs, different summation orders


@dataclass
class Record:
    task: str
    system: str  # ours | dynet | pytorch
    variant: str
    backend: str
    batch_size: int
    instances_per_s: float
    seconds: float = 0.0  # for `timed_instances`
    timed_instances: int = 0
    launches: int | None = None
    lower_bound: int | None = None
    trace_s: float | None = None
    batching_s: float | None = None  # analyse + schedule + rewrite (report.seconds)
    exec_s: float | None = None
    batching_detail: dict[str, float] = field(default_factory=dict)
    exec_detail: dict[str, float] = field(default_factory=dict)  # flat path: gather, kernels, scatter
    gflops: float | None = None
    check: str = ""
    reused: int = 0  # our calls traced once for several callers
    rounds: int = 0  # a lockstep task's: the batch's runs (the parser's transitions, and its BiLSTMs first)


# ---------------------------------------------------------------------------------------- our runs
@dataclass
class OurRun:
    values: list[Any]
    seconds: float
    trace_s: float
    run_s: float
    reports: list[Any]
    reused: int = 0  # calls traced once for several callers (Batch.reused_calls)


def _values(task: Task, results: Sequence[Any]) -> list[Any]:
    if task.is_parser:
        return [r.heads for r in results]
    return [float(v) for v in results]


def run_ours(task: Task, instances: Sequence[Any], form: str, backend: str, scheduler: str) -> OurRun:
    """One minibatch in one Batch (parser: run_programs over one Batch), timed in parts."""
    fn = task.functions()[form]
    params = task.params
    batch = Batch(backend=backend, scheduler=scheduler, threads=THREADS, providers=PROVIDERS, whole_plan=WHOLE_PLAN)
    run_s = 0.0
    start = time.perf_counter()
    if task.is_parser:
        run_pending = batch.run_pending

        def timed_run() -> None:
            nonlocal run_s
            t = time.perf_counter()
            run_pending()
            run_s += time.perf_counter() - t

        batch.run_pending = timed_run  # type: ignore[method-assign]
        results = run_programs(lambda s: fn(s, params), instances, backend=backend, scheduler=scheduler,
                               threads=THREADS, batch=batch)
        failures = [r for r in results if not hasattr(r, "heads")]
        if failures:
            raise RuntimeError(f"parser program failed: {failures[0]}")
        total = time.perf_counter() - start
        return OurRun(_values(task, results), total, total - run_s, run_s, batch.reports, batch.reused_calls)
    with batch:
        losses = [fn(x, params) for x in instances]
        traced = time.perf_counter()
        values = batch.run(losses)
    done = time.perf_counter()
    return OurRun(_values(task, values), done - start, traced - start, done - traced, batch.reports,
                  batch.reused_calls)


def run_ours_one_at_a_time(task: Task, instances: Sequence[Any], form: str, backend: str) -> OurRun:
    values, trace_s, run_s, reports = [], 0.0, 0.0, []
    start = time.perf_counter()
    for x in instances:
        r = run_ours(task, [x], form, backend, "level")
        values += r.values
        trace_s += r.trace_s
        run_s += r.run_s
        reports += r.reports
    return OurRun(values, time.perf_counter() - start, trace_s, run_s, reports)


def best_of(run: Callable[[], Any], repeats: int, seconds: Callable[[Any], float]) -> tuple[Any, Any]:
    """(warm-up result, fastest of ``repeats`` timed results). Every variant starts from a
    collected heap, as each DyNet setting does in its fresh subprocess: garbage that earlier
    variants left would otherwise be collected inside later variants' timings."""
    gc.collect()
    first = run()
    best = None
    for _ in range(repeats):
        r = run()
        if best is None or seconds(r) < seconds(best):
            best = r
    return first, best if best is not None else first  # repeats=0 (--quick): the first run


# ---------------------------------------------------------------------------------------- checks
def agree(task: Task, got: Sequence[Any], want: Sequence[Any]) -> str:
    """'' when they agree, else what differs."""
    n = min(len(got), len(want))
    if task.is_parser:
        same = sum(g == w for g, w in zip(got[:n], want[:n]))
        return "" if same == n else f"{n - same} of {n} parses differ"
    g, w = np.array(got[:n]), np.array(want[:n])
    if np.allclose(g, w, rtol=RTOL, atol=ATOL):
        return ""
    k = int(np.argmax(np.abs(g - w) / (ATOL + RTOL * np.abs(w))))
    return f"instance {k}: {g[k]:.6g} vs {w[k]:.6g}"


class Checker:
    """References: PyTorch one at a time over every instance (same weights), and ours one
    at a time (numpy, primitive ops) over the first instances."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.references: dict[str, list[Any]] = {}
        self.failures: list[str] = []

    def add_reference(self, name: str, values: list[Any]) -> None:
        self.references[name] = values

    def check(self, label: str, values: list[Any]) -> str:
        problems = [f"vs {name}: {why}" for name, ref in self.references.items() if (why := agree(self.task, values, ref))]
        if problems:
            message = f"{self.task.name} {label}: " + "; ".join(problems)
            self.failures.append(message)
            print(f"  CHECK FAILED {message}", flush=True)
            return "FAILED"
        return "ok"


# ---------------------------------------------------------------------------------------- machine
def gemm_peak(n: int = 1024, repeats: int = 8) -> float:
    """GFLOP/s of a float32 n x n x n numpy matmul (fastest of ``repeats``)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------------------------------- one task
def measure_task(task: Task, args: argparse.Namespace, dynet: dict[int, dict[str, Any]], peak: float) -> tuple[list[Record], list[str]]:
    name, instances = task.name, task.instances
    count = len(instances)
    flops = task.flops()
    one_count = min(count, args.one_at_a_time)
    one_flops = build_flops_subset(task, one_count)
    checker = Checker(task)
    records: list[Record] = []
    print(f"\n== {task.title}: {count} instances from {task.source}, size {task.size}; "
          f"{flops / count / 1e6:.1f} MFLOP an instance (estimate)", flush=True)

    def add(system: str, variant: str, backend: str, seconds: float, timed: int, fl: float, values: list[Any],
            **extra: Any) -> Record:
        status = checker.check(f"{system} {variant} {backend}", values)
        r = Record(name, system, variant, backend, count, timed / seconds, seconds, timed, gflops=fl / seconds / 1e9,
                   check=status, **extra)
        records.append(r)
        print(f"  {system:8} {variant:28} {backend:12} {r.instances_per_s:9.1f} inst/s  [{status}]", flush=True)
        return r

    # references first
    torch_runners = None
    why_not_torch = peers_torch.available() if not args.no_torch else "--no-torch"
    if why_not_torch is None:
        torch_runners = peers_torch.Models(task).runners()
        reference = torch_runners["per-instance"](instances)
        checker.add_reference("pytorch per-instance", reference)
    ours_reference = run_ours_one_at_a_time(task, instances[:one_count], "primitive", "numpy").values
    checker.add_reference("ours one-at-a-time numpy primitive", ours_reference)

    # ours
    for form in [form for form in FORMS if form in task.functions()]:
        for backend in BACKENDS:
            _, r = best_of(lambda: run_ours_one_at_a_time(task, instances[:one_count], form, backend),
                           args.repeats, lambda r: r.seconds)
            add("ours", f"{form}, one at a time", backend, r.seconds, one_count, one_flops, r.values,
                trace_s=r.trace_s, exec_s=r.run_s - sum(sum(x.seconds.values()) for x in r.reports),
                batching_s=sum(sum(x.seconds.values()) for x in r.reports))
            for scheduler in SCHEDULERS:
                _, r = best_of(lambda: run_ours(task, instances, form, backend, scheduler), args.repeats,
                               lambda r: r.seconds)
                detail = _summed(report.seconds for report in r.reports)
                batching = sum(detail.values())
                add("ours", f"{form}, batched {scheduler}", backend, r.seconds, count, flops, r.values,
                    launches=sum(x.launches for x in r.reports), lower_bound=sum(x.lower_bound for x in r.reports),
                    trace_s=r.trace_s, batching_s=batching, exec_s=r.run_s - batching, batching_detail=detail,
                    exec_detail=_summed(report.execution for report in r.reports), reused=r.reused,
                    rounds=len(r.reports) if task.is_parser else 0)

    # PyTorch
    if torch_runners is None:
        print(f"  pytorch  skipped: {why_not_torch}")
    else:
        for variant, run in torch_runners.items():
            def timed(run: Callable = run) -> tuple[list[Any], float]:
                start = time.perf_counter()
                values = run(instances)
                return values, time.perf_counter() - start

            _, (values, seconds) = best_of(timed, args.repeats, lambda r: r[1])
            add("pytorch", variant, "torch-cpu", seconds, count, flops, values)

    # DyNet (already run in subprocesses)
    for autobatch, result in dynet.items():
        if "error" in result:
            continue
        for key, rec in result["results"].items():
            task_name, strategy = key.split("/")
            if task_name != name:
                continue
            variant = f"autobatch={autobatch}" if strategy == "autobatch" else strategy
            add("dynet", variant, "dynet-cpu", rec["seconds"], rec["count"], flops, rec["values"])
    return records, checker.failures


def _summed(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total


def build_flops_subset(task: Task, count: int) -> float:
    return Task(task.name, task.instances[:count], task.params, task.source, task.size).flops()


# ---------------------------------------------------------------------------------------- reporting
def best(records: Sequence[Record], **where: Any) -> Record | None:
    matching = [r for r in records if all(getattr(r, k) == v if not callable(v) else v(getattr(r, k))
                                          for k, v in where.items())]
    return max(matching, key=lambda r: r.instances_per_s, default=None)


def is_batched(variant: str) -> bool:
    return "batched " in variant


def is_autobatched(variant: str) -> bool:
    """A DyNet run with its autobatching on (``autobatch=0`` is one instance at a time)."""
    return variant.startswith("autobatch=") and variant != "autobatch=0"


def table(records: list[Record], peak: float) -> list[str]:
    lines = []
    for name in dict.fromkeys(r.task for r in records):
        rs = [r for r in records if r.task == name]
        dynet = best(rs, system="dynet", variant=is_autobatched)
        hand = best(rs, variant=lambda v: v in ("hand-batched", "hand-padded"))
        lines.append(f"\n{name}: minibatch {rs[0].batch_size}; best DyNet autobatch: "
                     f"{dynet.variant + f' {dynet.instances_per_s:.1f}/s' if dynet else 'n/a'}; best hand batching: "
                     f"{f'{hand.system} {hand.variant} {hand.instances_per_s:.1f}/s' if hand else 'n/a'}")
        lines.append("| system | variant | backend | inst/s | vs DyNet best | vs hand | launches / bound | "
                     "trace ms | batching ms | exec ms | GFLOP/s | % peak | check |")
        lines.append("|" + "---|" * 13)
        for r in rs:
            ratio_d = f"{r.instances_per_s / dynet.instances_per_s:.2f}x" if dynet else "-"
            ratio_h = f"{r.instances_per_s / hand.instances_per_s:.2f}x" if hand else "-"
            launches = f"{r.launches} / {r.lower_bound} ({r.launches / r.lower_bound:.2f})" if r.launches else "-"
            per = 1e3 * r.seconds / r.timed_instances * r.batch_size  # ms for the minibatch
            scale = per / r.seconds / 1e3 if r.seconds else 0
            ms = [f"{v * 1e3 * scale:.0f}" if v is not None else "-" for v in (r.trace_s, r.batching_s, r.exec_s)]
            lines.append(f"| {r.system} | {r.variant} | {r.backend} | {r.instances_per_s:.1f} | {ratio_d} | {ratio_h} | "
                         f"{launches} | {' | '.join(ms)} | {r.gflops:.2f} | {100 * r.gflops / peak:.1f} | {r.check} |")
    return lines


def verdicts(records: list[Record]) -> list[str]:
    lines = []

    def ours_best(task: str) -> Record | None:
        return best(records, task=task, system="ours", variant=is_batched)

    def line(label: str, got: float | None, want: float, strict: bool = False, lower: bool = False) -> None:
        if got is None:
            lines.append(f"- {label}: not measured (a peer missing)")
            return
        ok = (got <= want) if lower else (got > want if strict else got >= want)
        sign = "<=" if lower else (">" if strict else ">=")
        how = "MET" if ok else (f"MISSED: {want / got:.1f}x short of the target" if not lower
                                else f"MISSED: {got:.2f} vs {want}")
        lines.append(f"- {label}: measured {got:.2f} (target {sign} {want}) -> {how}")

    def speed(label: str, task: str, want: float, strict: bool = False, **peer: Any) -> None:
        """A throughput ratio target; when missed, the time a minibatch may take and what the
        template runs (kernels) alone already take of it."""
        ours, other = ours_best(task), best(records, task=task, **peer)
        got = ours.instances_per_s / other.instances_per_s if ours and other else None
        line(label, got, want, strict)
        if ours and other and got is not None and got < want:
            budget = ours.batch_size / (want * other.instances_per_s)
            kernels = ours.exec_detail.get("kernels", 0.0)
            lines.append(f"  needs <= {budget * 1e3:.1f} ms a minibatch (now {ours.seconds * 1e3:.1f}); template runs "
                         f"(kernels) alone take {kernels * 1e3:.1f} ms, leaving {(budget - kernels) * 1e3:.1f} ms for "
                         f"tracing, batching and gathers (now {(ours.seconds - kernels) * 1e3:.1f} ms)")

    autobatch = {"system": "dynet", "variant": is_autobatched}
    speed("Tree-LSTM: ours / DyNet best strategy", "treelstm", 2.0, **autobatch)
    speed("BiLSTM tagger: ours / DyNet best autobatch", "bilstm", 2.0, **autobatch)
    speed("BiLSTM tagger: ours / PyTorch hand-padded (packed)", "bilstm", 1.0, strict=True, system="pytorch",
          variant="hand-batched")
    speed("char tagger: ours / DyNet best", "chartagger", 1.0, strict=True, **autobatch)
    speed("parser: ours / DyNet best", "parser", 1.0, strict=True, **autobatch)
    default = inspect.signature(Batch).parameters["scheduler"].default

    def launch_ratio(r: Record) -> float:
        return r.launches / r.lower_bound

    for task in ("treelstm", "bilstm"):
        for form in FORMS:
            runs = [r for r in records if r.task == task and r.system == "ours" and r.variant == f"{form}, batched {default}"]
            if runs:
                worst = max(runs, key=launch_ratio)
                line(f"{task}, {form}: launches / lower bound with the default scheduler ({default}): {worst.launches} / "
                     f"{worst.lower_bound}", launch_ratio(worst), 1.1, lower=True)
        fastest = ours_best(task)
        if fastest:
            lines.append(f"  (our fastest variant, {fastest.variant}, {fastest.backend}: {fastest.launches} / "
                         f"{fastest.lower_bound} = {launch_ratio(fastest):.2f})")
    return lines


# Issue 19's targets: (column, the form our row is taken from (None: the fastest), the peer, the least ratio)
ISSUE_19 = (("primitive / DyNet", "primitive", "dynet", 0.5), ("cells / DyNet", "cells", "dynet", 2.0),
            ("fastest / PyTorch", None, "pytorch", 1.0))


def issue_19_table(records: list[Record]) -> list[str]:
    """Issue 19's table: per task, instances a second of our best batched row of each form and
    of the peers' best, and each target's ratio, MET or how far short."""
    lines = ["| task | ours, primitive | ours, cells | ours, fastest form | DyNet best | PyTorch hand-batched | "
             + " | ".join(f"{column} (>= {want})" for column, _, _, want in ISSUE_19) + " |",
             "|" + "---|" * (6 + len(ISSUE_19))]
    for task in dict.fromkeys(r.task for r in records):
        ours = {form: best(records, task=task, system="ours",
                           variant=lambda v, form=form: is_batched(v) and (form is None or v.startswith(form + ",")))
                for form in ("primitive", "cells", None)}
        peers = {"dynet": best(records, task=task, system="dynet", variant=is_autobatched),
                 "pytorch": best(records, task=task, system="pytorch", variant="hand-batched")}
        rate = [f"{r.instances_per_s:,.1f}" if r else "-" for r in (ours["primitive"], ours["cells"])]
        fastest = ours[None]
        rate.append(f"{fastest.instances_per_s:,.1f} ({fastest.variant.split(',')[0]})" if fastest else "-")
        rate += [f"{r.instances_per_s:,.1f}" if r else "-" for r in peers.values()]
        verdicts = []
        for _, form, peer, want in ISSUE_19:
            mine, theirs = ours[form], peers[peer]
            if mine is None or theirs is None:
                verdicts.append("not measured")
                continue
            got = mine.instances_per_s / theirs.instances_per_s
            verdicts.append(f"{got:.2f} MET" if got >= want else f"{got:.2f} missed ({want / got:.1f}x short)")
        lines.append(f"| {task} | " + " | ".join(rate + verdicts) + " |")
    return lines


# ---------------------------------------------------------------------------------------- profile
BUCKETS = (
    ("tracing (frontends, examples)", ("/frontends/", "/examples/", "datasets.py")),
    ("batching (batcher: analyse, schedule, plan)", ("/batcher/",)),
    ("gather/scatter/concat/slice kernels (numpy)", ("kernels/shape_ops.py",)),
    ("matmul/gemm kernels (numpy)", ("kernels/linalg.py",)),
    ("other numpy kernels (elementwise, reduce, ...)", ("/kernels/",)),
    ("interpreter dispatch and flat executor", ("interpreter.py", "numpy_backend.py", "flat_executor.py")),
    ("onnxruntime executor: export + session building", ("ort_runtime.py", "ort_backend.py", "whole_plan.py")),
    ("IR graph building / shape inference (ir/, onnx)", ("/ir/", "onnx/")),
)


def profile_split(task: Task, form: str, backend: str, scheduler: str) -> list[str]:
    """cProfile one batched run; self time bucketed by where the code lives."""
    profiler = cProfile.Profile()
    run_ours(task, task.instances, form, backend, scheduler)  # warm
    profiler.enable()
    start = time.perf_counter()
    run_ours(task, task.instances, form, backend, scheduler)
    wall = time.perf_counter() - start
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    totals: dict[str, float] = {}
    for (filename, _, func), (_, _, tottime, _, _) in stats.items():
        if "pybind11_state.run" in func or ("InferenceSession' objects" in func and func.startswith("<method 'run'")):
            bucket = "onnxruntime session.run (kernels + its own gathers)"
        elif "onnxruntime" in func or "onnxruntime" in filename:
            bucket = "onnxruntime executor: export + session building"
        elif "numpy" in func and filename == "~":
            bucket = "numpy C calls outside kernels"
        else:
            bucket = next((b for b, needles in BUCKETS if any(n in filename for n in needles)), "other Python")
        totals[bucket] = totals.get(bucket, 0.0) + tottime
    profiled = sum(totals.values())
    lines = [f"cProfile of {task.name} {form}, batched {scheduler}, {backend}: {wall * 1e3:.0f} ms under the profiler "
             f"(self time by where the code lives; profiling inflates Python-heavy parts)"]
    for bucket, t in sorted(totals.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {bucket:55} {t * 1e3:8.1f} ms  {100 * t / profiled:5.1f}%")
    return lines


def time_split(r: Record) -> str:
    """Where one minibatch's time goes: tracing, batching (analyse, schedule, plan), execution
    (gathers into arenas, template runs = kernels, writes back into arenas, the rest)."""
    total = r.seconds
    batching = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in r.batching_detail.items())
    e = r.exec_detail
    rest = r.exec_s - sum(e.values())
    execution = (f"gathers {e.get('gather', 0) * 1e3:.1f} ms, template runs (kernels) {e.get('kernels', 0) * 1e3:.1f} ms, "
                 f"arena writes {e.get('scatter', 0) * 1e3:.1f} ms, results and pruning {rest * 1e3:.1f} ms")
    split = (f"{r.task} {r.variant}, {r.backend}: {total * 1e3:.0f} ms = tracing {r.trace_s * 1e3:.0f} ms "
             f"({100 * r.trace_s / total:.0f}%) + batching {r.batching_s * 1e3:.0f} ms ({100 * r.batching_s / total:.0f}%: "
             f"{batching}) + execution {r.exec_s * 1e3:.0f} ms ({100 * r.exec_s / total:.0f}%: {execution}); "
             f"{r.reused} repeated calls traced and run once (reuse_calls)")
    if r.rounds > 1:  # issue 19: a round should cost little more than its kernels
        kernels = e.get("kernels", 0) / r.rounds
        around = total / r.rounds - kernels
        split += (f"; {r.rounds} lockstep rounds, {total / r.rounds * 1e6:.0f} us a round = kernels {kernels * 1e6:.0f} us + "
                  f"{around * 1e6:.0f} us around them (tracing and the host's choices {r.trace_s / r.rounds * 1e6:.0f}, "
                  f"batching {r.batching_s / r.rounds * 1e6:.0f}, the rest of running {(r.exec_s / r.rounds - kernels) * 1e6:.0f})")
    return split


# ---------------------------------------------------------------------------------------- sweep and plot
def sweep(args: argparse.Namespace, records: list[Record], dynet_sweeps: dict[int, dict[str, Any]]) -> list[Record]:
    sizes = [int(s) for s in args.sizes.split(",")]
    out: list[Record] = []
    for name in SWEEP_TASKS:
        if name not in args.tasks:
            continue
        task = build(name, max(sizes), args.size)
        fastest = best(records, task=name, system="ours", variant=is_batched)
        form, scheduler = fastest.variant.split(", batched ")
        torch_run = peers_torch.Models(task).runners()["hand-batched"] if peers_torch.available() is None and not args.no_torch else None
        for k in sizes:
            subset = task.instances[:k]
            _, r = best_of(lambda: run_ours(task, subset, form, fastest.backend, scheduler), args.repeats,
                           lambda r: r.seconds)
            out.append(Record(name, "ours", fastest.variant, fastest.backend, k, k / r.seconds, r.seconds, k))
            if torch_run is not None:
                _, seconds = best_of(lambda: _timed(torch_run, subset), args.repeats, lambda seconds: seconds)
                out.append(Record(name, "pytorch", "hand-batched", "torch-cpu", k, k / seconds, seconds, k))
            print(f"  sweep {name} minibatch {k}: done", flush=True)
        for autobatch, result in dynet_sweeps.items():
            for key, rec in result.get("results", {}).items():
                task_name, strategy = key.split("/")
                if task_name != name:
                    continue
                variant = f"autobatch={autobatch}" if strategy == "autobatch" else strategy
                for k, seconds in rec["sweep"].items():
                    out.append(Record(name, "dynet", variant, "dynet-cpu", int(k), int(k) / seconds, seconds, int(k)))
    return out


def _timed(run: Callable[[Any], Any], instances: Sequence[Any]) -> float:
    start = time.perf_counter()
    run(instances)
    return time.perf_counter() - start


def plot(points: list[Record], path: str, size: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(p.task for p in points))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, name in zip(axes[0], tasks):
        lines: dict[str, list[Record]] = {}
        for p in points:
            if p.task == name:
                lines.setdefault(f"{p.system} {p.variant} ({p.backend})", []).append(p)
        for label, ps in lines.items():
            ps.sort(key=lambda p: p.batch_size)
            ax.plot([p.batch_size for p in ps], [p.instances_per_s for p in ps], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("minibatch size")
        ax.set_ylabel("instances / s (inference)")
        ax.set_title(f"{name}, size {size}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print(f"plot written to {path}")


# ---------------------------------------------------------------------------------------- main
def run_dynet(args: argparse.Namespace, count: int, sizes: Sequence[int] = (), tasks: Sequence[str] | None = None) -> dict[int, dict[str, Any]]:
    why = peers_dynet.available() if not args.no_dynet else "--no-dynet"
    if why is not None:
        print(f"dynet skipped: {why}")
        return {}
    results = {}
    for autobatch in (0, 1, 2):
        start = time.perf_counter()
        results[autobatch] = peers_dynet.run_subprocess(autobatch, tasks or args.tasks, count, args.size, args.repeats,
                                                        sizes=sizes)
        state = results[autobatch].get("error", "ok")
        print(f"dynet autobatch={autobatch}{' sweep' if sizes else ''}: {state} ({time.perf_counter() - start:.1f} s)",
              flush=True)
    return results


def task_list(text: str) -> list[str]:
    """The --tasks value, refused before anything runs when it names an unknown task."""
    names = [t for t in text.split(",") if t]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown task(s) {unknown or text!r}; choose from {', '.join(TASKS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = arguments.parser("python -m benchmarks", __doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="correctness on a few small instances of every task")
    parser.add_argument("--minibatch", type=arguments.integer(1), default=64)
    parser.add_argument("--size", type=arguments.integer(1), default=256)
    parser.add_argument("--repeats", type=arguments.integer(0), default=3, help="timed rounds after one warm-up (fastest kept)")
    parser.add_argument("--one-at-a-time", type=arguments.integer(1), default=16,
                        help="instances timed one at a time (the first ones of the minibatch)")
    parser.add_argument("--tasks", default=",".join(TASKS), type=task_list,
                        help=f"comma-separated, from {', '.join(TASKS)}")
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--plot", help="write a PNG of throughput vs minibatch size (Tree-LSTM, BiLSTM) here")
    parser.add_argument("--sizes", default="1,4,16,64,256", help="minibatch sizes of the plot")
    parser.add_argument("--profile", action="store_true", help="cProfile our fastest variant of each task")
    parser.add_argument("--no-dynet", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--whole-plan", action="store_true",
                        help="ours on onnxruntime: each minibatch's plan as one session, values kept on the device")
    arguments.add_providers(parser)
    args = parser.parse_args(argv)
    global PROVIDERS, WHOLE_PLAN
    PROVIDERS = arguments.providers(args.providers)
    WHOLE_PLAN = args.whole_plan
    if args.quick:
        args.minibatch, args.size, args.repeats, args.one_at_a_time = 3, 32, 0, 3
        args.plot = args.plot and None
    started = time.perf_counter()
    import onnxruntime

    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}); python {platform.python_version()}; numpy {np.__version__}; "
          f"onnxruntime {onnxruntime.__version__} on {PROVIDERS[0]}; threads {THREADS}")
    peak = gemm_peak()
    print(f"numpy float32 GEMM peak (1024^3, same run): {peak:.1f} GFLOP/s")
    records, failures = [], []
    for name in tqdm(args.tasks, desc="tasks", unit="task", file=sys.stderr):
        # DyNet's settings for this task run right before ours (a fresh subprocess each), so
        # that both are timed minutes apart at most, whatever else the host does meanwhile.
        dynet = run_dynet(args, args.minibatch, tasks=[name])
        task = build(name, args.minibatch, args.size)
        rs, fs = measure_task(task, args, dynet, peak)
        records += rs
        failures += fs
    print("\n".join(table(records, peak)))
    if not args.quick:
        print("\ntargets (size %d, minibatch %d):" % (args.size, args.minibatch))
        print("\n".join(verdicts(records)))
        print("\nissue 19's targets (instances/s; our best batched row of each form, the peers' best):")
        print("\n".join(issue_19_table(records)))
        print("\nwhere the time goes (our fastest batched variant of each task; report.seconds + timers):")
        for name in args.tasks:
            fastest = best(records, task=name, system="ours", variant=is_batched)
            if fastest:
                print("  " + time_split(fastest))
        if args.profile:
            for name in args.tasks:
                fastest = best(records, task=name, system="ours", variant=is_batched)
                if fastest is None:
                    continue
                form, scheduler = fastest.variant.split(", batched ")
                task = build(name, args.minibatch, args.size)
                print("\n".join(profile_split(task, form, fastest.backend, scheduler)))
                if fastest.backend != "numpy":
                    print("\n".join(profile_split(task, form, "numpy", scheduler)))
    points: list[Record] = []
    if args.plot:
        sizes = [int(s) for s in args.sizes.split(",")]
        sweep_tasks = [t for t in SWEEP_TASKS if t in args.tasks]
        dynet_sweeps = run_dynet(args, max(sizes), sizes, sweep_tasks)
        points = sweep(args, records, dynet_sweeps)
        plot(points, args.plot, args.size)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "gemm_peak_gflops": peak},
                       "records": [asdict(r) for r in records], "sweep": [asdict(r) for r in points]}, f, indent=1)
        print(f"records written to {args.json}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if failures:
        print(f"{len(failures)} CHECKS FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
