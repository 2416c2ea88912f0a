"""``autobatch serve``: build the engines the command line asks for and serve them."""

from __future__ import annotations

import argparse

from autobatch.serving.engine import Engine, ModelRegistry
from autobatch.serving.server import Limits, serve


def registry_from_args(args: argparse.Namespace) -> ModelRegistry:
    names = list(args.name) + [None] * (len(args.models) - len(args.name))
    registry = ModelRegistry()
    for model, name in zip(args.models, names):
        registry.add(Engine(model, name=name, max_batch_size=args.max_batch_size,
                            batch_wait_timeout_s=args.batch_wait_timeout_s,
                            max_queue_delay_microseconds=args.max_queue_delay_microseconds,
                            max_queue=args.max_queue, request_timeout_s=args.request_timeout_s,
                            batching=not args.no_batching, backend=args.backend,
                            max_unrolled_nodes=args.max_unrolled_nodes, alone_when_faster=not args.always_batched,
                            worker=args.worker, instances=args.instances, threads=args.threads))
    return registry


def serve_command(args: argparse.Namespace) -> None:
    registry = registry_from_args(args)
    print(f"serving {', '.join(sorted(registry.engines))} on http://{args.host}:{args.port}/v2", flush=True)
    limits = Limits(args.max_body_bytes, args.body_timeout_s, args.head_timeout_s, args.max_connections, args.http)
    serve(registry, args.host, args.port, limits, args.log_level, args.drain_s, args.access_log)
