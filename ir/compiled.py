"""The package's compiled extensions (``frontends/_recorder.c``, ``batcher/_scheduling.c``),
each built by ``pip install`` where a C compiler is. Where one did not build, or where
``AUTOBATCH_PURE_PYTHON`` is set in the environment, its Python twin runs instead; tests run
both."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def compiled(module: str) -> ModuleType | None:
    """The extension ``module`` (a full name: ``autobatch.batcher._scheduling``), or None."""
    if os.environ.get("AUTOBATCH_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:  # not built (no compiler at install): the Python runs
        return None
