"""Command-line arguments checked before any work: numbers in their ranges, input files that
are files, outputs that can be written, with the defaults shown in every ``--help``. Shared by
``autobatch``, the examples and the benchmarks."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after each option's help, and examples (epilogs) kept as written."""


def parser(prog: str, description: str, examples: Sequence[str] = ()) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter,
                                   epilog=_examples(examples))


def _examples(examples: Sequence[str]) -> str | None:
    return "examples:\n" + "\n".join(f"  {line}" for line in examples) if examples else None


def integer(low: int, high: int | None = None) -> Callable[[str], int]:
    """An int from ``low`` (to ``high``) inclusive."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: it must be {bound}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its errors
    return parse


def dimension(text: str) -> tuple[str, int]:
    """``NAME=SIZE``: a symbolic dimension's name and a size of at least 1."""
    name, _, size = text.partition("=")
    if not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SIZE with a size of at least 1 (e.g. L=32)")
    return name, int(size)


def seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of seconds")
    return value


def input_file(*suffixes: str) -> Callable[[str], str]:
    """An existing file (of one of ``suffixes``, when given)."""
    def parse(text: str) -> str:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{text}: no such file")
        if suffixes and path.suffix not in suffixes:
            raise argparse.ArgumentTypeError(f"{text}: expected a {' or '.join(suffixes)} file")
        return text

    parse.__name__ = "file"
    return parse


def output_file(*suffixes: str) -> Callable[[str], str]:
    """A file that can be written (its folder exists and is writable; of one of ``suffixes``)."""
    def parse(text: str) -> str:
        path = Path(text)
        if suffixes and path.suffix not in suffixes:
            raise argparse.ArgumentTypeError(f"{text}: the output must be a {' or '.join(suffixes)} file")
        folder = path.parent if str(path.parent) else Path(".")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory")
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: the folder {folder} does not exist")
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise argparse.ArgumentTypeError(f"{text}: not writable")
        return text

    parse.__name__ = "output file"
    return parse


PROVIDERS = ("auto", "cpu", "cuda")


def add_providers(parser: argparse.ArgumentParser) -> None:
    """``--providers``: onnxruntime's execution providers for our runs and its own."""
    parser.add_argument("--providers", choices=PROVIDERS, default="auto",
                        help="onnxruntime's execution providers (auto: CUDA when it loads, else the CPU)")


def providers(choice: str) -> list[str]:
    """The providers ``--providers`` names; exits with a line where CUDA is asked for and does not load."""
    from autobatch.backends.ort_runtime import CPU, CUDA, default_providers  # onnxruntime loads only if asked

    loaded = list(default_providers())
    if choice == "cuda" and loaded[0] != CUDA:
        raise SystemExit("--providers cuda: the CUDA execution provider does not load here")
    return [CPU] if choice == "cpu" else loaded
