"""Counters and histograms per model, written in the Prometheus text format (0.0.4) by hand:
it is small, and keeps prometheus_client out of the dependencies."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus wants them."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        total = 0
        for bound, count in zip([*self.bounds, "+Inf"], self.counts):
            total += count
            le = bound if isinstance(bound, str) else _number(bound)
            yield f'{name}_bucket{{{labels},le="{le}"}} {total}'
        yield f"{name}_sum{{{labels}}} {_number(self.sum)}"
        yield f"{name}_count{{{labels}}} {self.count}"


@dataclass
class Duration:
    """How many of something, and their nanoseconds in all (Triton's statistics' unit)."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class EngineMetrics:
    """What one model's engine has done. Updated only on the engine's event loop."""

    requests: int = 0
    errors: Counter[int] = field(default_factory=Counter)  # by HTTP status
    batches_failed: int = 0  # batched runs that raised, whose instances then ran alone
    instances_rerun: int = 0  # run alone after their batch failed
    instances_alone: int = 0  # run alone by the session's choice: measured faster than batched (``autobatch.ways``)
    worker_restarts: int = 0  # worker processes started again after one died or was killed past a deadline
    batch_sizes: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    succeeded: Duration = field(default_factory=Duration)  # requests answered, and their latency
    failed: Duration = field(default_factory=Duration)
    queued: Duration = field(default_factory=Duration)  # from arrival until their batch ran
    computed: dict[int, Duration] = field(default_factory=dict)  # batch size -> executions and their time
    last_inference_ms: int = 0  # since the epoch

    def stats_json(self, name: str) -> dict:
        """This model's entry of Triton's statistics extension (``/v2/models/{name}/stats``)."""
        compute = Duration(sum(d.count for d in self.computed.values()), sum(d.ns for d in self.computed.values()))
        none = Duration().to_json()
        return {
            "name": name, "version": "1", "last_inference": self.last_inference_ms,
            "inference_count": self.succeeded.count, "execution_count": compute.count,
            "inference_stats": {"success": self.succeeded.to_json(), "fail": self.failed.to_json(),
                                "queue": self.queued.to_json(), "compute_input": none,
                                "compute_infer": compute.to_json(), "compute_output": none,
                                "cache_hit": none, "cache_miss": none},
            "batch_stats": [{"batch_size": size, "compute_input": none, "compute_infer": duration.to_json(),
                             "compute_output": none} for size, duration in sorted(self.computed.items())],
        }


_HELP = {
    "autobatch_requests_total": ("counter", "Inference requests received."),
    "autobatch_request_errors_total": ("counter", "Inference requests that failed, by HTTP status."),
    "autobatch_batches_failed_total": ("counter", "Batched runs that failed; their instances then ran alone."),
    "autobatch_instances_rerun_total": ("counter", "Instances re-run alone after their batch failed."),
    "autobatch_instances_alone_total": ("counter", "Instances of batches run each alone, measured faster than batched."),
    "autobatch_worker_restarts_total": ("counter", "Worker processes started again after one died or ran past a deadline."),
    "autobatch_queue_depth": ("gauge", "Requests waiting in the queue."),
    "autobatch_batch_size": ("histogram", "Instances per executed batch."),
    "autobatch_request_latency_seconds": ("histogram", "Seconds from arrival to response, per request."),
}


def render(models: Iterable[tuple[str, EngineMetrics, int]]) -> str:
    """The exposition text for (model name, metrics, queue depth) of every model."""
    rows: dict[str, list[str]] = {name: [] for name in _HELP}
    for model, m, depth in models:
        labels = f'model="{_escape(model)}"'
        rows["autobatch_requests_total"].append(f"autobatch_requests_total{{{labels}}} {m.requests}")
        for status, count in sorted(m.errors.items()):
            rows["autobatch_request_errors_total"].append(
                f'autobatch_request_errors_total{{{labels},code="{status}"}} {count}')
        rows["autobatch_batches_failed_total"].append(f"autobatch_batches_failed_total{{{labels}}} {m.batches_failed}")
        rows["autobatch_instances_rerun_total"].append(f"autobatch_instances_rerun_total{{{labels}}} {m.instances_rerun}")
        rows["autobatch_instances_alone_total"].append(f"autobatch_instances_alone_total{{{labels}}} {m.instances_alone}")
        rows["autobatch_worker_restarts_total"].append(f"autobatch_worker_restarts_total{{{labels}}} {m.worker_restarts}")
        rows["autobatch_queue_depth"].append(f"autobatch_queue_depth{{{labels}}} {depth}")
        rows["autobatch_batch_size"].extend(m.batch_sizes.lines("autobatch_batch_size", labels))
        rows["autobatch_request_latency_seconds"].extend(m.latency.lines("autobatch_request_latency_seconds", labels))
    out = []
    for name, (kind, text) in _HELP.items():
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *rows[name]]
    return "\n".join(out) + "\n"


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
