"""The ``autobatch`` command line (``python -m autobatch`` works too)."""

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
    return parser


def _version() -> str:
    from autobatch import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from autobatch.demo import run_demo

        if args.trees < 1 or args.size < 1:
            parser.error("--trees and --size must be positive")
        run_demo(args.trees, args.size, args.scheduler, args.output)
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
