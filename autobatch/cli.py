"""The ``autobatch`` command line (``python -m autobatch`` works too). Conventions of ONNX
tools: positional input, ``-o`` for the output, a nonzero exit and a one-line error."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from autobatch import arguments
from autobatch.batcher import SCHEDULERS
from autobatch.ir.draw import MAX_DRAWN_NODES


BACKEND_HELP = "numpy: the NumPy interpreter; onnxruntime: onnxruntime's CPU provider, CUDA where it loads"
CHECK_SIZE = 16  # rewrite --check: a symbolic dimension's size where --dim gives none
SCHEDULER_HELP = ("which batches run in which order: level (ours, nearest the lower bound), agenda (DyNet's), "
                  "depth (by topological generation)")


def build_parser() -> argparse.ArgumentParser:
    parser = arguments.parser("autobatch", "On-the-fly operation batching for dynamic computation graphs over ONNX.",
                              ["autobatch demo", "autobatch inspect model.onnx --instances 8 --draw plan.svg",
                               "autobatch rewrite branches.onnx -o batched.onnx --check",
                               "autobatch ops MatMul LSTM   (what the batcher can do with them)",
                               "autobatch run model.onnx --inputs instances.jsonl -o results.jsonl",
                               "autobatch serve model.onnx --port 8000   (needs: pip install 'onnx-autobatch[serve]')"])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, summary: str, examples: list[str]) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=summary, description=summary, formatter_class=arguments.HelpFormatter,
                                   epilog=arguments._examples(examples))

    positive, non_negative = arguments.integer(1), arguments.integer(0)
    demo = command("demo", "batch a Tree-LSTM over synthetic trees and compare with one tree at a time",
                   ["autobatch demo", "autobatch demo --trees 16 --size 64 -o small.onnx",
                    "autobatch demo --trees 3 --draw plan.png   (a picture of the batch plan)"])
    demo.add_argument("--trees", type=positive, default=64, help="number of trees")
    demo.add_argument("--size", type=positive, default=256, help="hidden and embedding size")
    demo.add_argument("--repeats", type=positive, default=5, help="timed runs of each way; the median is reported")
    demo.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="level", help=SCHEDULER_HELP)
    demo.add_argument("-o", "--output", type=arguments.output_file(".onnx"), default="autobatch-demo.onnx",
                      help="where to write the batched model")
    demo.add_argument("--draw", metavar="FILE", type=arguments.output_file(".png", ".svg", ".dot"),
                      help="also draw the batch plan (.png or .svg: needs the draw extra; .dot: Graphviz)")

    inspect = command("inspect", "ops, inputs and outputs, signature groups and the batch plan of a model",
                      ["autobatch inspect model.onnx", "autobatch inspect model.onnx --instances 8 --draw plan.svg",
                       "autobatch inspect big.onnx --draw plan.dot   (Graphviz; no extra needed)"])
    inspect.add_argument("model", type=arguments.input_file(), help="an ONNX model of one instance")
    inspect.add_argument("--instances", type=non_negative, default=4,
                         help="plan a batch of this many instances with random inputs (0: no plan)")
    inspect.add_argument("--draw", metavar="FILE", type=arguments.output_file(".png", ".svg", ".dot"),
                         help="draw the batch plan: .png or .svg (needs the draw extra), or Graphviz .dot; past "
                              f"{MAX_DRAWN_NODES} nodes, one box a signature class")

    ops = command("ops", "what the batcher can do with each op type: stacked, ragged across lengths, padded, ...",
                  ["autobatch ops", "autobatch ops MatMul LSTM Softmax   (when each way applies)"])
    ops.add_argument("op_types", nargs="*", metavar="OP", help="op types of ONNX's default domain (default: all)")

    rewrite = command("rewrite", "ONNX in, batched ONNX out: batch the isomorphic nodes inside one graph",
                      ["autobatch rewrite branches.onnx -o batched.onnx",
                       "autobatch rewrite branches.onnx -o batched.onnx --check   (outputs compared, latency timed)"])
    rewrite.add_argument("model", type=arguments.input_file(), help="an ONNX model")
    rewrite.add_argument("-o", "--output", required=True, type=arguments.output_file(".onnx"),
                         help="where to write the batched model")
    rewrite.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="level", help=SCHEDULER_HELP)
    rewrite.add_argument("--check", action="store_true",
                         help="run both models on onnxruntime: compare their outputs and time them")
    rewrite.add_argument("--dim", metavar="NAME=SIZE", type=arguments.dimension, action="append", default=[],
                         help=f"with --check: the size a symbolic dimension of the inputs takes (repeatable; default "
                              f"{CHECK_SIZE})")

    run = command("run", "batched inference over a file of instances (each a line or a group of arrays)",
                  ["autobatch run model.onnx --inputs instances.jsonl -o results.jsonl",
                   "autobatch run model.onnx --inputs instances.npz -o results.npz --backend onnxruntime"])
    run.add_argument("model", type=arguments.input_file(), help="an ONNX model of one instance")
    run.add_argument("--inputs", required=True, type=arguments.input_file(".npz", ".jsonl"),
                     help=".npz (arrays named <index>/<input>) or .jsonl (an object of input -> nested lists a line)")
    run.add_argument("-o", "--output", required=True, type=arguments.output_file(".npz", ".jsonl"),
                     help="results: .npz (<index>/<output>, <index>/error) or .jsonl (a line an instance)")
    run.add_argument("--backend", choices=["numpy", "onnxruntime"], default="numpy", help=BACKEND_HELP)
    run.add_argument("--batch-size", type=positive, default=64, help="instances batched together")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    serve = command("serve", "Open Inference Protocol (KServe v2 / Triton) HTTP server that batches concurrent "
                    "requests whose graphs differ (needs: pip install 'onnx-autobatch[serve]')",
                    ["autobatch serve model.onnx", "autobatch serve a.onnx b.onnx --name first --port 9000",
                     "autobatch serve programs.py:decide --backend onnxruntime   (an async program)"])
    serve.add_argument("models", nargs="+", metavar="MODEL_OR_PROGRAM", type=_servable,
                       help="a .onnx file (served under its stem) or module:function / file.py:function (a program)")
    serve.add_argument("--name", action="append", default=[],
                       help="serve the n-th model under this name instead (repeat for several)")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=arguments.integer(0, 65535), default=8000, help="the port (0: any free one)")
    serve.add_argument("--backend", choices=["numpy", "onnxruntime"], default="numpy", help=BACKEND_HELP)
    serve.add_argument("--max-batch-size", type=positive, default=32, help="requests batched together at most")
    serve.add_argument("--batch-wait-timeout-s", type=float, default=0.005,
                       help="how long the first request of a batch waits for more")
    serve.add_argument("--max-queue-delay-microseconds", type=non_negative,
                       help="Triton's name for the wait; overrides --batch-wait-timeout-s")
    serve.add_argument("--max-queue", type=positive, default=1024, help="queued requests per model before 503")
    serve.add_argument("--request-timeout-s", type=arguments.seconds, default=30.0,
                       help="a request's deadline: past it, 504, and its work stops")
    serve.add_argument("--max-body-bytes", type=positive, default=16 * 1024 * 1024, help="larger bodies get 413")
    serve.add_argument("--body-timeout-s", type=arguments.seconds, default=30.0,
                       help="seconds a request's body may take to arrive before 408")
    serve.add_argument("--head-timeout-s", type=arguments.seconds, default=10.0,
                       help="seconds a connection may take to send a whole request head before it is closed")
    serve.add_argument("--max-connections", type=positive, default=1024,
                       help="open connections past which new ones are closed at once")
    serve.add_argument("--http", choices=["auto", "h11", "httptools"], default="auto",
                       help="the HTTP/1.1 parser (auto: httptools where installed, its parser in C; else h11)")
    serve.add_argument("--max-unrolled-nodes", type=positive, default=100_000,
                       help="the most nodes one request's If/Loop/Scan may unroll into; past it, 400")
    serve.add_argument("--drain-s", type=float, default=1.0,
                       help="after SIGTERM, seconds new requests still get an answer (503) before the server stops; "
                            "queued and running requests are answered first")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info",
                       help="uvicorn's and ours")
    serve.add_argument("--access-log", action="store_true", help="log a line for every request")
    serve.add_argument("--no-batching", action="store_true", help="run every request alone (the baseline)")
    serve.add_argument("--always-batched", action="store_true",
                       help="batch every batch, even where running its requests each alone was measured faster")
    serve.add_argument("--instances", type=positive, default=1,
                       help="sessions of each model, each with a worker of its own taking batches from one queue "
                            "and its share of the cores (Triton's instance count): a batch gathers while another runs")
    serve.add_argument("--threads", type=positive,
                       help="onnxruntime's intra-op threads in each session of a model (default: the cores shared "
                            "among its instances; one instance: every core but one, the event loop's)")
    serve.add_argument("--worker", choices=["thread", "process"], default="thread",
                       help="where each model runs: a thread of the server, or a process of its own, which is "
                            "started again if a run crashes it and killed if a run goes past its deadline")
    return parser


def _servable(text: str) -> str:
    """A model file, or a program named as module:function or file.py:function."""
    if text.endswith(".onnx"):
        return arguments.input_file(".onnx")(text)
    module, colon, function = text.rpartition(":")
    if not colon or not module or not function:
        hint = f"; a program is served as {text}:FUNCTION" if text.endswith(".py") else ""
        raise argparse.ArgumentTypeError(f"{text}: expected a .onnx file or module:function{hint}")
    if module.endswith(".py") and not Path(module).is_file():
        raise argparse.ArgumentTypeError(f"{module}: no such file")
    return text


def _require(extra: str, *modules: str) -> None:
    """One line naming the extra to install when one of its packages is missing."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise RuntimeError(f"this needs {', '.join(missing)}: pip install 'onnx-autobatch[{extra}]'")


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
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as Python's docs advise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    except (OSError, ValueError, RuntimeError, MemoryError) as error:  # our errors name what is wrong: one line
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"autobatch {args.command}: error: {message}", file=sys.stderr)
        return 1


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from autobatch import tools

    if args.command == "demo":
        from autobatch.examples.demo import run_demo

        if args.draw and not args.draw.endswith(".dot"):
            _require("draw", "matplotlib")
        run_demo(args.trees, args.size, args.scheduler, args.output, repeats=args.repeats, draw=args.draw)
    elif args.command == "inspect":
        if args.draw and not args.draw.endswith(".dot"):
            _require("draw", "matplotlib")
        tools.inspect_model(args.model, args.instances, args.draw, print)
    elif args.command == "ops":
        from autobatch.capability_text import print_capabilities

        print_capabilities(args.op_types, print)
    elif args.command == "rewrite":
        if args.dim and not args.check:
            parser.error("--dim sizes the inputs --check runs; add --check")
        tools.rewrite_model(args.model, args.output, args.scheduler, args.check, print, dict(args.dim), CHECK_SIZE)
    elif args.command == "run":
        _, failed = tools.run_file(args.model, args.inputs, args.output, args.backend, args.batch_size, print,
                                   progress=not args.no_progress)
        return 2 if failed else 0
    elif args.command == "serve":
        _require("serve", "starlette", "uvicorn")
        from autobatch.serving.cli import serve_command

        if len(args.name) > len(args.models):
            parser.error("more --name options than models")
        serve_command(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
