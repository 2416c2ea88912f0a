"""The exports of ``benchmarks.exports`` as files in a folder, made there once: a machine without
PyTorch (a GPU machine with no network) runs the benchmarks on a folder made elsewhere."""

from __future__ import annotations

import argparse
from pathlib import Path

VOCABULARY = 100
MASKED = "-mask"  # a model exported with its attention mask as an input too: "bert-mask"
MODELS = ("lstm", "gru", "encoder", "bert", "gpt2", "cnn", "roberta", f"bert{MASKED}", f"gpt2{MASKED}",
          f"roberta{MASKED}", f"llama{MASKED}", f"deberta{MASKED}", f"bloom{MASKED}", f"bert-cls{MASKED}",
          f"gpt2-cls{MASKED}")  # (-cls: the model's
# sequence classifier, ``exports.build``; Llama with its mask only: the legacy exporter fails on its
# grouped-query attention without one)
DYNAMO_ONLY = frozenset({"encoder"})  # the legacy exporter writes its head split for the traced length only


def exported(name: str, size: int, folder: Path) -> tuple[Path, Path]:
    """``name`` of width ``size`` exported for one instance and for a padded batch, in ``folder``:
    the files there already, else written now (PyTorch needed)."""
    one, padded = folder / f"{name}-{size}.onnx", folder / f"{name}-{size}-padded.onnx"
    if not (one.is_file() and padded.is_file()):
        from benchmarks import exports  # imports PyTorch

        model = name.removesuffix(MASKED)
        module = exports.build(model, size)
        exports.export(module, one, dynamo=model in DYNAMO_ONLY, mask=name.endswith(MASKED))
        exports.export(module, padded, dynamo=model in DYNAMO_ONLY, padded=True)
    return one, padded


def model_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The models a comma-separated ``--models`` names; a usage error names one unknown."""
    names = text.split(",")
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}: choose from {', '.join(MODELS)}")
    return names


def main(argv: list[str] | None = None) -> None:
    from autobatch import arguments

    parser = arguments.parser("python -m benchmarks.export_files", "Write the exports of some models into a folder.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--models", default=",".join(MODELS), help=f"some of {','.join(MODELS)}")
    parser.add_argument("--size", type=arguments.integer(1), default=256, help="model width")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    args.folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        print(*exported(name, args.size, args.folder))


if __name__ == "__main__":
    main()
