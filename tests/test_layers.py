"""The layers import only to their left in the data flow (ARCHITECTURE.md):

    ir  <-  frontends, batcher  <-  backends  <-  autobatch (session, CLI)  <-  serving  <-  examples, benchmarks

``frontends`` and ``batcher`` know only ``ir`` (the tracer records; planning and running what it
recorded are the ``autobatch`` layer's), ``backends`` read the plan from ``batcher``. Imports
inside functions count as much as those at the top of a module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEVEL = {"ir": 0, "frontends": 1, "batcher": 1, "backends": 2, "autobatch": 3, "serving": 4, "examples": 5,
         "benchmarks": 6}
# The command line is where every command starts: it hands `serve` to the serving layer and
# `demo` to the examples, which import it in turn only through the commands' modules.
ALLOWED = {("autobatch/cli.py", "serving"), ("autobatch/cli.py", "examples")}


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return "benchmarks"
    if parts[0] != "autobatch":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LEVEL else "autobatch"


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names if node.module == "autobatch"]
    return names


def test_no_module_imports_a_layer_to_its_right():
    wrong = []
    for folder, level in LEVEL.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            here = str(path.relative_to(ROOT))
            for module in _imports(path):
                layer = _layer_of(module)
                if layer is None or layer == folder or (here, layer) in ALLOWED:
                    continue
                if LEVEL[layer] > level or (LEVEL[layer] == level and layer != folder):
                    wrong.append(f"{here} imports {module} ({layer} is not left of {folder})")
    assert not wrong, "\n".join(wrong)
