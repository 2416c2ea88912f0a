#!/usr/bin/env bash
# The GPU check: our benchmarks on onnxruntime's CUDA execution provider, through the same plans
# as on the CPU. Run from the repository root on a machine with an NVIDIA GPU:
#     bash benchmarks/gpu_check.sh
# It installs the `cuda` extra (onnxruntime-gpu with the CUDA and cuDNN libraries from PyPI) into
# .venv-gpu, checks that CUDA loads, then runs the backend benchmark, the paper benchmark (ours:
# Tree-LSTM and BiLSTM tagger; step by step, then each plan as one session) and the exported-model
# benchmark with --providers cuda. The
# exports are read from .exports/ (width 256); a machine without PyTorch (no network) takes a
# folder written beforehand where PyTorch is:  python -m benchmarks.export_files .exports
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
.venv-gpu/bin/python -m benchmarks --providers cuda --tasks treelstm,bilstm --no-dynet --no-torch \
    --repeats 1 --one-at-a-time 4
# The same with each minibatch's plan as one session, its values kept on the device (IOBinding):
# which of the two is faster on a GPU decides Batch's default there.
.venv-gpu/bin/python -m benchmarks --providers cuda --tasks treelstm,bilstm --no-dynet --no-torch \
    --repeats 1 --one-at-a-time 4 --whole-plan
.venv-gpu/bin/python -m benchmarks.exported_models --providers cuda --exports .exports --repeats 3
