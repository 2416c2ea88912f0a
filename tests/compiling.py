"""Whether this machine builds the package's C extensions (``ir/compiled.py``)."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path


def builds_extensions() -> bool:
    """A C compiler and Python's headers are here, and the Python twins were not asked for."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h").exists()
    return bool(shutil.which("cc") or shutil.which("gcc")) and headers and not os.environ.get("AUTOBATCH_PURE_PYTHON")
