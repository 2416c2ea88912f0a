"""``python -m benchmarks``: see benchmarks/paper.py (``--help``)."""

import os
import sys

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "2")  # every system gets 2 threads (DyNet's subprocesses inherit it)

from benchmarks.paper import main  # noqa: E402

sys.exit(main())
