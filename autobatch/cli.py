"""The ``autobatch`` command line (``python -m autobatch`` works too). Conventions of ONNX
tools: positional input, ``-o`` for the output, a nonzero exit and a one-line error."""

from __future__ import annotations

import argparse
import sys

from autobatch.batcher import SCHEDULERS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autobatch",
        description="On-the-fly operation batching for dynamic computation graphs over ONNX.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command")

    demo = commands.add_parser("demo", help="batch a Tree-LSTM over synthetic trees and compare with one-by-one")
    demo.add_argument("--trees", type=int, default=64, help="number of trees (default 64)")
    demo.add_argument("--size", type=int, default=256, help="hidden and embedding size (default 256)")
    demo.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="level")
    demo.add_argument("-o", "--output", default="autobatch-demo.onnx", help="where to write the batched model")

    inspect = commands.add_parser("inspect", help="ops, inputs and outputs, signature groups and the batch plan")
    inspect.add_argument("model")
    inspect.add_argument("--instances", type=int, default=4, help="plan a batch of this many random instances (0: none)")
    inspect.add_argument("--draw", metavar="FILE", help="draw the graph to a .png or .svg file")

    rewrite = commands.add_parser("rewrite", help="ONNX in, batched ONNX out: batch isomorphic nodes inside one graph")
    rewrite.add_argument("model")
    rewrite.add_argument("-o", "--output", required=True)
    rewrite.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="level")
    rewrite.add_argument("--check", action="store_true", help="run both models on onnxruntime and compare")

    run = commands.add_parser("run", help="batched inference over a file of instances")
    run.add_argument("model")
    run.add_argument("--inputs", required=True, help=".npz (arrays <index>/<input>) or .jsonl (one instance a line)")
    run.add_argument("-o", "--output", required=True, help=".npz or .jsonl")
    run.add_argument("--backend", choices=["numpy", "onnxruntime"], default="numpy")
    run.add_argument("--batch-size", type=int, default=64)
    run.add_argument("--no-progress", action="store_true")

    serve = commands.add_parser("serve", help="Open Inference Protocol (KServe v2 / Triton) HTTP server that batches "
                                "concurrent requests whose graphs differ")
    serve.add_argument("models", nargs="+", metavar="MODEL_OR_PROGRAM",
                       help="a .onnx file (served under its stem) or module:function / file.py:function (a program)")
    serve.add_argument("--name", action="append", default=[],
                       help="serve the n-th model under this name instead (repeat for several)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--backend", choices=["numpy", "onnxruntime"], default="numpy")
    serve.add_argument("--max-batch-size", type=int, default=32)
    serve.add_argument("--batch-wait-timeout-s", type=float, default=0.005)
    serve.add_argument("--max-queue-delay-microseconds", type=int, help="Triton's name; overrides the wait timeout")
    serve.add_argument("--max-queue", type=int, default=1024, help="queued requests per model before 503")
    serve.add_argument("--request-timeout-s", type=float, default=30.0)
    serve.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024)
    serve.add_argument("--body-timeout-s", type=float, default=30.0,
                       help="seconds a request's body may take to arrive before 408 (default 30)")
    serve.add_argument("--head-timeout-s", type=float, default=10.0,
                       help="seconds a connection may take to send a whole request head before it is closed (default 10)")
    serve.add_argument("--max-connections", type=int, default=1024,
                       help="open connections past which new ones are closed at once (default 1024)")
    serve.add_argument("--max-unrolled-nodes", type=int, default=100_000,
                       help="the most nodes one request's If/Loop/Scan may unroll into; past it, 400 (default 100000)")
    serve.add_argument("--drain-s", type=float, default=1.0,
                       help="after SIGTERM, seconds new requests still get an answer (503) before the server stops "
                            "(default 1); queued and running requests are answered first")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info",
                       help="uvicorn's and ours (default info)")
    serve.add_argument("--access-log", action="store_true", help="log a line for every request (default: off)")
    serve.add_argument("--no-batching", action="store_true", help="run every request alone (the baseline)")
    return parser


def _version() -> str:
    from autobatch import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return _dispatch(parser, args)
    except (OSError, ValueError, RuntimeError, MemoryError) as error:  # our errors name what is wrong: one line
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"autobatch {args.command}: error: {message}", file=sys.stderr)
        return 1


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from autobatch import tools

    if args.command == "demo":
        from autobatch.demo import run_demo

        if args.trees < 1 or args.size < 1:
            parser.error("--trees and --size must be positive")
        run_demo(args.trees, args.size, args.scheduler, args.output)
    elif args.command == "inspect":
        tools.inspect_model(args.model, args.instances, args.draw, print)
    elif args.command == "rewrite":
        tools.rewrite_model(args.model, args.output, args.scheduler, args.check, print)
    elif args.command == "run":
        if args.batch_size < 1:
            parser.error("--batch-size must be positive")
        _, failed = tools.run_file(args.model, args.inputs, args.output, args.backend, args.batch_size, print,
                                   progress=not args.no_progress)
        return 2 if failed else 0
    elif args.command == "serve":
        from autobatch.serving.cli import serve_command

        if len(args.name) > len(args.models):
            parser.error("more --name options than models")
        serve_command(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
