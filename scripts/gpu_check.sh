#!/usr/bin/env bash
# `make gpu-check`: on the lent GPU machine, install the carried wheels (.whl/, made here by
# `make gpu-wheels`) beside the image's own PyTorch, then run scripts/gpu_check.py. Runs
# without the project's venv: the image's python3 is the one that holds CUDA PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${GPU_PYTHON:-python3}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rft-gpu-site .whl/*.whl
  export PYTHONPATH="/tmp/rft-gpu-site${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "gpu-check: no wheels under .whl/ (make gpu-wheels, then carry .whl): using what the machine has" >&2
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1
# 8 minutes on one H100 at most, the device tool's 10-minute command limit beside it.
exec timeout "${GPU_CHECK_SECONDS:-480}" "$PY" scripts/gpu_check.py "$@"
