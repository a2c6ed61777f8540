#!/usr/bin/env bash
# Wheels for benchmarks/gpu_check.sh on a GPU machine with no network whose Python lacks some of
# specdec's requirements or holds older ones (the lent H200's image: transformers 5.17, no typer
# 0.29, pydantic, pexpect or pyte). Run here, where pip reaches the package index: downloads the
# versions this checkout's .venv holds (the tested ones), as CPython 3.12 x86-64 wheels, into .whl/
# (git-ignored). gpu_check.sh installs them before anything else; a device run carries `.whl`.
#
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]      (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-3.12}"
venv_python=.venv/bin/python
[ -x "$venv_python" ] || { echo "gpu_wheels: no .venv here; install specdec first (see README)"; exit 1; }

# specdec's requirements, the test suite's (pytest-xdist and its execnet too), and what they need
# newer than such an image may hold (pydantic's core and regex are compiled); torch, numpy, scipy,
# tokenizers, safetensors and huggingface-hub stay the image's (transformers 5.24 takes its hub
# 1.33; hub 2 would need packages an image lacks)
names=(transformers regex typer pydantic pydantic_core typing-inspection typing_extensions annotated-types
       annotated-doc shellingham rich pexpect ptyprocess pyte wcwidth gguf accelerate httpx prometheus_client
       pytest-xdist execnet)
pins=()
for name in "${names[@]}"; do
    pins+=("$name==$("$venv_python" -c "import sys; from importlib.metadata import version; print(version(sys.argv[1]))" "$name")")
done
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
"$venv_python" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    "${platforms[@]}" -d .whl "${pins[@]}"
echo "gpu_wheels: $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/: ${pins[*]}"
