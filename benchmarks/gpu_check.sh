#!/usr/bin/env bash
# The GPU check: the backend benchmark on onnxruntime's CUDA execution provider.
# Run from the repository root on a machine with an NVIDIA GPU:  bash benchmarks/gpu_check.sh
# It installs the `cuda` extra (onnxruntime-gpu with the CUDA and cuDNN libraries from PyPI)
# into .venv-gpu, checks that CUDA loads, and runs the benchmark with --providers cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install --quiet -e ".[cuda]"
.venv-gpu/bin/python - <<'PY'
from autobatch.backends.ort_runtime import default_providers
providers = default_providers()
print("providers:", providers)
raise SystemExit(0 if providers[0] == "CUDAExecutionProvider" else "CUDA did not load")
PY
.venv-gpu/bin/python -m benchmarks.backends_throughput --providers cuda --minibatch 64 --repeats 3
