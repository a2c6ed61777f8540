#!/usr/bin/env bash
# The CUDA dry run (docs/gpu-check.md): every decoding path on fake CUDA tensors, on a machine with no
# GPU. It needs a CUDA build of torch, so it runs in a venv of its own (made once, then reused):
#   bash benchmarks/cuda_dry_run.sh            # all of it, about 2 minutes on 2 cores
#   bash benchmarks/cuda_dry_run.sh -k eagle   # pytest's own options pass through
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SPECDEC_DRY_RUN_VENV:-.cuda-dry-run-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# a pinned CUDA build (PyPI's torch for Linux x86_64 is one): FakeTensorMode fakes CUDA only there
"$venv/bin/python" -m pip install --quiet torch==2.14.1
"$venv/bin/python" -m pip install --quiet -e '.[dev]'
"$venv/bin/python" - <<'PY'
import torch
assert torch.version.cuda is not None, f"torch {torch.__version__} is a CPU build: the dry run needs a CUDA build"
PY
exec "$venv/bin/python" -m pytest tests/cuda_dry_run "$@"
